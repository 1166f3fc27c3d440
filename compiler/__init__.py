"""The hccc compiler, one sub-package per pipeline stage (docs/architecture.md draws the picture).

Layers, lowest first; a package imports only from packages below it:

1. :mod:`.frontend` -- the collectives' specs, the Algorithm (header + transfer table), the .rccl grammar,
   parser and bounded evaluator, the algorithm generators.
2. :mod:`.cluster` -- the cluster model (Topology), the .topo grammar and parser, topology checks,
   the vendor hierarchy and the mixed-vendor (C2C) plans.
3. :mod:`.ir` -- ProgramIR, its structural / FIFO / deadlock checks, the symbolic prover.
4. :mod:`.passes` -- verify, dependency DAG, HPDS and round-robin schedules, lowering,
   thread-block allocation, channels, the slice model of a call, and ``build``, which chains them
   into a ProgramIR in one call (a compile runs them as the passes of :mod:`.pipeline`).
5. :mod:`.backend` (code generation, atomic output directories), :mod:`.interop` (MSCCL XML and
   MSCCL++ execution plans both ways, TACCL profiles) and :mod:`.synth` (schedule synthesis), side by side.
6. :mod:`.pipeline` -- loading any input and compiling it to an output directory.

``hccc.runtime`` sits above the compiler (it may import it; the compiler never imports the runtime),
and the ``hccc`` package (driver/: command line, ``hccc.testing``) on top of both.
"""
