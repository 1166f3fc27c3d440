"""ProgramIR (ranks -> thread blocks -> primitives, buffer layout; JSON form), its checks (structure,
FIFO order, deadlock; ``check.load_ir_json`` reads a file and checks it), the extents proof (every
access in bounds and exact for every element count) and the symbolic prover (every chunk slot as
"chunk c reduced over ranks S"). May import frontend and cluster.
"""
