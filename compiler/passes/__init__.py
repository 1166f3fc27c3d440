"""Compile passes from a verified Algorithm to a ProgramIR: verify (the collective's postcondition),
dag (dependency DAG), schedule / hpds / round_robin (sub-pipelines), lower (primitives per rank),
tb_alloc (state- and connection-based thread blocks), channels (blocks per thread block), build
(dag to checked ProgramIR in one call; a compile runs the same steps as the passes of
hccc.compiler.pipeline) and slicing (the model that picks a call's micro-batch slice). May import frontend, cluster and ir.
"""
