"""Interoperability: MSCCL XML and MSCCL++ execution plans, exported and imported (with the symbolic
proof of imported programs), and TACCL topology profiles. May import frontend, cluster, ir and passes.
"""
