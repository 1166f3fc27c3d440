"""Schedule synthesis for heterogeneous clusters (HeteCCL section 5, Appendix H-I)."""
