"""Shared utilities below every other layer (imports nothing else of hccc): located diagnostics
(``diagnostics``), input and size limits (``limits``), the size syntax (``sizes``), English plurals
(``plural``), the one mechanism that runs a kernel as plain Python or compiled by numba (``jit``),
the work clock every time limit is measured on, which stands still while numba compiles (``clock``),
the guard that keeps native libraries from writing into hccc's standard output (``native_output``),
the one table of the kernels' element types and reduction operators (``dtypes``), sorting inside
numba kernels (``kernel_sort``) and the one safe reading of XML (``safe_xml``).
"""
