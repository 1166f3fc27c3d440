"""What kind of file a path names, by its suffix, and the hint when a command is given the wrong
kind: ``hccc topo x.rccl`` or ``hccc cluster.topo -o d`` say which command reads that file.

Commands declare what their positional arguments and options take (``INPUTS = {"algo":
"algorithm", "--topology": "cluster"}``: options with their dashes); :func:`check_inputs` runs
before the command does.
"""
from __future__ import annotations

from pathlib import Path

from hccc.util.diagnostics import CompileError, Diagnostic

def _suffix_kinds() -> dict[str, str]:
    from hccc.compiler.pipeline.readers import algorithm_suffixes
    kinds = {s: "algorithm" for s in algorithm_suffixes() if s != ".json"}   # .json: a TACCL cluster too
    kinds[".topo"] = "cluster"
    return kinds


#: suffix -> kind of file ("algorithm": what the input readers take, :mod:`hccc.compiler.pipeline.readers`;
#: "cluster": what --topology reads)
SUFFIX_KIND = _suffix_kinds()
#: how each kind is described, and the commands that read it
DESCRIBE = {"algorithm": "an algorithm", "cluster": "a cluster description"}
READERS = {"algorithm": "`hccc check {path}` or `hccc {path} -o OUTDIR`",
           "cluster": "`hccc topo {path}` or `--topology {path}`"}
WANTS = {"algorithm": "an algorithm (.rccl, MSCCL .xml, ProgramIR .json)",
         "cluster": "a cluster description (.topo, or a TACCL profile .json)",
         "counts matrix": "a counts matrix (text: one line of counts per sending rank, docs/alltoallv.md)"}


def kind_of(path: str) -> str | None:
    """``"algorithm"``, ``"cluster"``, or None when the suffix does not tell (``.json``, a directory)."""
    return SUFFIX_KIND.get(Path(path).suffix.lower())


def check_inputs(command: str, args, inputs: dict[str, str]) -> None:
    """Raise a :class:`CompileError` naming the right command when an argument of ``args`` holds a
    file of the other kind. ``inputs``: positional name or ``--option`` -> kind it must be."""
    for name, want in inputs.items():
        option = name.startswith("--")
        value = getattr(args, name.lstrip("-").replace("-", "_"), None)
        paths = value if isinstance(value, list) else [value]
        wrong = [(p, kind_of(p)) for p in paths if isinstance(p, str) and kind_of(p) not in (None, want)]
        if not wrong:
            continue
        path, got = wrong[0]
        where = f"`{command} ... {name}`" if option else f"`{command}`"
        raise CompileError([Diagnostic(
            f"{path} is {DESCRIBE[got]}; {where} reads {WANTS[want]}; "
            f"did you mean {READERS[got].format(path=path)}?", None)])
