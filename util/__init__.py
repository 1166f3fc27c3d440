"""Shared utilities below every other layer (imports nothing else of hccc): located diagnostics
(``diagnostics``), input and size limits (``limits``), the size syntax (``sizes``), English plurals
(``plural``) and the one mechanism that runs a kernel as plain Python or compiled by numba (``jit``).
"""
