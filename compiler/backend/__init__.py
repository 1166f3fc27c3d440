"""Back end: code generation from a ProgramIR (CUDA/HIP rank kernels, headers, manifest, build files,
from the Jinja templates of hccc.templates) and atomic, deterministic output files and directories.
May import frontend, cluster, ir and passes.
"""
