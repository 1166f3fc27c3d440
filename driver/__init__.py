"""hccc: a compiler for collective-communication algorithms on heterogeneous GPU clusters.

The public Python API, importable from here (loaded on first use, so ``import hccc`` stays cheap):

Compiling
    ``load_algorithm(path)`` (an Algorithm from ``.rccl``), ``load_program(path)``
    (a ProgramIR from ``.rccl``, MSCCL ``.xml`` or ProgramIR ``.json``), ``load_cluster(path)``
    (a Topology from ``.topo`` or a TACCL profile), ``verify(algorithm)``,
    ``build_program(algorithm)`` (schedule, lower, allocate thread blocks), ``compile(algo, outdir,
    CompileOptions(), topology=None)`` (any input into kernels, manifest, build files, MSCCL XML:
    what ``hccc ALGO -o OUTDIR`` writes, byte for byte), ``compile_program(ir, outdir,
    CompileOptions())`` (a ProgramIR as given).
Synthesis
    ``synthesize(cluster, collective, **options)``: the ``.rccl`` text ``hccc synth`` writes with
    the same options, byte for byte (:mod:`hccc.synth_api`); ``synthesize_program(...)``: the same
    program whole, its ``algorithm`` (what the text parses to, for ``build_program``) beside its ``text``.
Running and checking
    ``run_program(ir, backend="cpu", nbytes=...)`` (emitted kernels against the numpy oracle),
    ``Runner`` (the launcher behind it), ``simulate(ir, topology, nbytes)`` (alpha-beta model).
One rank per process
    ``Communicator(algo, rank=..., world_size=..., group=|store=|init_method=)``: this process's
    rank of a compiled algorithm, bootstrapped through torch.distributed (:mod:`hccc.runtime.
    communicator`); ``CommunicatorError``.
Testing
    :mod:`hccc.testing`: hypothesis strategies that draw valid programs, clusters and runs.

The command line is ``hccc`` (:mod:`hccc.cli`, one module per subcommand in :mod:`hccc.commands`).
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> module that defines it
_API = {
    "load_algorithm": "hccc.compiler.pipeline",
    "load_program": "hccc.compiler.pipeline",
    "load_cluster": "hccc.compiler.pipeline",
    "compile": "hccc.runtime.compile",
    "compile_program": "hccc.compiler.pipeline",
    "CompileOptions": "hccc.compiler.pipeline",
    "verify": "hccc.compiler.passes.verify",
    "build_program": "hccc.compiler.passes.build",
    "run_program": "hccc.runtime.launcher",
    "Runner": "hccc.runtime.launcher",
    "simulate": "hccc.runtime.simulator",
    "synthesize": "hccc.synth_api",
    "synthesize_program": "hccc.synth_api",
    "Communicator": "hccc.runtime.communicator",
    "CommunicatorError": "hccc.runtime.communicator",
}

__all__ = ["__version__", "testing", *_API]


def __getattr__(name: str):
    if name == "testing":
        return importlib.import_module("hccc.testing")
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'hccc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
