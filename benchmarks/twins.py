"""The algorithms kept twice -- a plain-Python formulation beside a numba kernel -- side by side.

    python benchmarks/twins.py [--sizes 4,16] [--repeat 3] [--only hpds,int_text,tb_share]

The algorithms that have (or had) a plain formulation (lists or numpy) beside an array kernel that
numba compiles (``util/jit.py`` ``Kernels``): the HPDS scheduler (``passes/hpds.py`` list scheduler
/ ``passes/hpds_kernel.py``), the row text of integer columns (``ir/int_text.py`` numpy /
``ir/int_text_kernel.py``) and the thread-block sharing of the TB allocation (``passes/tb_alloc.py``
list version / ``passes/tb_share_kernel.py``). The DAG's transitive reduction and the symbolic
prover's vector clocks were measured here too and kept their plain formulation only (the kernels
were removed). A twin is kept only where it is measurably faster than its kernel run as plain
Python (numba compiles the same function, so one implementation would be the kernel: compiled
above a size, plain below it, and plain throughout where numba is not installed). For each
algorithm and size this prints the seconds of

- ``plain twin``: the plain formulation (what runs below the threshold and without numba), for
  the algorithms that keep one (``-`` for HPDS and the sharing, which have none);
- ``kernel, plain``: the kernel's own function run by the interpreter (what runs there for HPDS
  and the sharing; what one implementation would run there instead for the others);
- ``kernel, compiled``: the kernel compiled, warm (the median of ``--repeat`` calls);
- ``first compiled``: the first compiled call of the process (numba compiling it, or loading it
  from its cache on disk when an earlier run left one).

and the two ratios that decide: ``kernel plain / twin`` (how much slower one implementation would
be without the compiler) and ``twin / compiled`` (what compiling gains; plain / compiled without a
twin). The inputs: HM AllReduce
on N nodes x 8 GPUs (``--sizes`` lists N); the row text renders one ``HCCC_P(...)``-like line per
primitive of that program; the sharing is the state-based TB allocation of its lowering (its work:
the unit pairs the ranks could ask about).
Run it on a quiet machine: the figures are single-process wall times.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from hccc.compiler.frontend.generators import hm_allreduce
from hccc.compiler.ir import int_text_kernel
from hccc.compiler.ir.int_text import RowText
from hccc.compiler.passes import hpds_kernel, tb_alloc, tb_share_kernel
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.dag import build_dag
from hccc.compiler.passes.hpds import hpds
from hccc.compiler.passes.lower import lower

MODES = ("twin", "plain", "compiled")
#: the algorithms that keep a plain formulation beside their kernel (the others run the kernel
#: plain below their threshold: no twin column; their last column is then plain / compiled)
TWINS = ("int_text",)


@contextlib.contextmanager
def path(kernels, mode: str):
    """Every auto choice of ``kernels`` gives: None (the plain twin), the kernel's plain function,
    or its compiled form."""
    compiled = kernels.compiled

    def chosen():
        return {n: kernels._ns[n] for n in kernels._names} if mode == "plain" else compiled()

    def choose(name, work):
        return None if mode == "twin" else chosen()[name]
    kernels.compiled_for = choose
    kernels.pick = lambda name, work: chosen()[name]      # (a kernel without a twin)
    kernels.compiled = chosen          # (a caller that takes the set's other kernels from it)
    try:
        yield
    finally:
        del kernels.compiled_for, kernels.pick, kernels.compiled


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def cases(nnodes: int):
    """(algorithm, Kernels, work, call) for one size; ``call()`` runs the auto path."""
    alg = hm_allreduce(nnodes, 8)
    dag = build_dag(alg)
    out = [("hpds", hpds_kernel.KERNELS, alg.ntransfers, lambda: hpds(alg, dag))]
    ir = build_program(alg)
    p = ir.prims
    rank, tb, op = (p[f].astype(np.int64) for f in ("rank", "tb", "op"))
    odd = (rank & 1).astype(bool)

    def rows():
        rt = RowText(ir.nprims).text("HCCC_P(").int(rank).text(", ").choice(op % 4, ["SEND", "RECV", "RRC", "COPY"])
        rt.text(", ").int(p["count"].astype(np.int64) * 4096).text(", odd", where=odd).text(");")
        return rt.render("\n")
    out.append(("int_text", int_text_kernel.KERNELS, ir.nprims, rows))
    low = lower(alg, dag, hpds(alg, dag))
    _, urank, _, _ = tb_alloc.connection_units(low)
    units = np.bincount(urank)

    def share():
        got = tb_alloc.allocate(low, "state")
        return got.prims["tb"]
    out.append(("tb_share", tb_share_kernel.KERNELS, int((units * units).sum() // 2), share))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4,16", help="nodes of 8 GPUs, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="hpds,int_text,tb_share")
    args = ap.parse_args()
    os.environ.pop("HCCC_JIT", None)
    only = set(args.only.split(","))
    table = Table(title="plain twin vs its kernel (seconds; median of --repeat)")
    for col in ("algorithm", "size", "work", "plain twin", "kernel, plain", "kernel, compiled",
                "first compiled", "kernel plain / twin", "twin / compiled"):
        table.add_column(col, justify="right" if col not in ("algorithm",) else "left")
    results = {}
    for nn in [int(s) for s in args.sizes.split(",")]:
        for name, kernels, work, call in cases(nn):
            if name not in only:
                continue
            got = {}
            ref = None
            first = None
            modes = MODES if name in TWINS else MODES[1:]
            for mode in modes:
                with path(kernels, mode):
                    if mode == "compiled" and kernels._compiled is None:
                        first = timed(call)      # compiles, or loads numba's cache
                    runs = []
                    for _ in range(args.repeat if mode != "plain" else 1):
                        t0 = time.perf_counter()
                        res = call()
                        runs.append(time.perf_counter() - t0)
                    got[mode] = statistics.median(runs)
                    if ref is None:
                        ref = res
                    else:
                        _same(name, ref, res)
            results[(name, nn)] = got
            twin = got.get("twin")
            table.add_row(name, f"{nn}x8", f"{work:,}", "-" if twin is None else f"{twin:.4f}", f"{got['plain']:.4f}",
                          f"{got['compiled']:.4f}", "-" if first is None else f"{first:.2f}",
                          "-" if twin is None else f"{got['plain'] / twin:.1f}x",
                          f"{(got['plain'] if twin is None else twin) / got['compiled']:.1f}x")
            Console(width=160).print(f"[dim]{name} {nn}x8: " + "  ".join(f"{m} {got[m]:.4f} s" for m in modes)
                                     + (f"  first compiled {first:.2f} s" if first is not None else "") + "[/dim]")
    Console(width=160).print(table)
    Console().print(f"load average: {os.getloadavg()[0]:.1f} (1 min), cores: {os.cpu_count()}")


def _same(name, a, b) -> None:
    """The three paths give the same result (the benchmark measures equal work)."""
    if name == "hpds":
        ok = np.array_equal(a.subpipeline, b.subpipeline) and np.array_equal(a.order, b.order)
    elif name == "int_text":
        ok = a[0] == b[0] and np.array_equal(a[1], b[1])
    else:
        ok = np.array_equal(a, b)
    if not ok:
        raise SystemExit(f"{name}: the paths disagree")


if __name__ == "__main__":
    main()
