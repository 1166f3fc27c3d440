"""Compile passes from a verified Algorithm to a ProgramIR: verify (the collective's postcondition),
dag (dependency DAG), schedule / hpds / round_robin (sub-pipelines), slicing (micro-batch slice
policy), lower (primitives per rank), tb_alloc (state- and connection-based thread blocks) and build
(the driver that chains them). May import frontend, cluster and ir.
"""
