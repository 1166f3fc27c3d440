"""Interoperability: MSCCL XML export and import (with the symbolic proof of imported programs) and
TACCL topology profiles. May import frontend, cluster, ir and passes.
"""
