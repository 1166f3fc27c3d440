"""(Re)write ``catalog4/``: the 4-rank algorithm catalog the torch examples and tests use (ring
AllReduce, AllGather, ReduceScatter, Broadcast, Reduce and Scatter from rank 0, direct AllToAll: every
collective the torch backend carries), from the text generators in ``hccc.compiler.frontend.generators``.

    python examples/torch/make_catalog.py            # (re)write catalog4/
    python examples/torch/make_catalog.py --check    # exit 1 if a file is missing, edited or left over
    python examples/torch/make_catalog.py OUTDIR     # write somewhere else

Each entry is a twin as in examples/generate.py (whose functions write them): the file parses to its
builder's Algorithm, transfer for transfer, in order. Deterministic; tests/test_examples.py checks
the committed files are current and equal to their builders.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from hccc.compiler.frontend import generators as gen

HERE = Path(__file__).resolve().parent
# examples/generate.py, by its path (a module named "generate" elsewhere must not stand in for it)
_spec = importlib.util.spec_from_file_location("hccc_examples_generate", HERE.parent / "generate.py")
_twins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_twins)
run, texts, write = _twins.run, _twins.texts, _twins.write

#: file stem -> (builder, text generator)
ENTRIES = {
    "ring_allreduce_4": (lambda: gen.ring_allreduce(4, name="ring_allreduce_4"),
                         lambda: gen.ring_allreduce_rccl(4, name="ring_allreduce_4")),
    "ring_allgather_4": (lambda: gen.ring_allgather(4, name="ring_allgather_4"),
                         lambda: gen.ring_allgather_rccl(4, name="ring_allgather_4")),
    "ring_reducescatter_4": (lambda: gen.ring_reducescatter(4, name="ring_reducescatter_4"),
                             lambda: gen.ring_reducescatter_rccl(4, name="ring_reducescatter_4")),
    "ring_broadcast_4": (lambda: gen.ring_broadcast(4, root=0, name="ring_broadcast_4"),
                         lambda: gen.ring_broadcast_rccl(4, root=0, name="ring_broadcast_4")),
    "ring_reduce_4": (lambda: gen.ring_reduce(4, root=0, name="ring_reduce_4"),
                      lambda: gen.ring_reduce_rccl(4, root=0, name="ring_reduce_4")),
    "ring_scatter_4": (lambda: gen.ring_scatter(4, root=0, name="ring_scatter_4"),
                       lambda: gen.ring_scatter_rccl(4, root=0, name="ring_scatter_4")),
    "direct_alltoall_4": (lambda: gen.direct_alltoall(4, name="direct_alltoall_4"),
                          lambda: gen.direct_alltoall_rccl(4, name="direct_alltoall_4")),
}
SCRIPT = "examples/torch/make_catalog.py"


def generate(outdir: Path) -> list[Path]:
    """Write the catalog to ``outdir``; return the paths written, in name order."""
    return write(outdir, texts(ENTRIES, SCRIPT))


def main(argv: list[str] | None = None) -> int:
    return run(argv, texts(ENTRIES, SCRIPT), HERE / "catalog4", SCRIPT, __doc__.splitlines()[0])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
