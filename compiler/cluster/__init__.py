"""Cluster model: the Topology (links, lanes, shared groups, vendors, HeteCCL chunking), the .topo
grammar and parser, checks of an Algorithm against a Topology, the vendor hierarchy (HetCCL's
homogeneous clusters and border ranks) and the mixed-vendor cluster-to-cluster (C2C) plans.
May import :mod:`hccc.compiler.frontend` only.
"""
