#!/usr/bin/env python3
"""What numba spends compiling hccc's kernels the first time (a fresh install, an empty cache).

    python benchmarks/jit_compile.py                  # this checkout
    python benchmarks/jit_compile.py --compare DIR    # and another checkout's, side by side

hccc's kernels (``util/jit.py`` ``Kernels``) are compiled on first use and then load from numba's
cache on disk. A user's first ``hccc synth`` or ``hccc sim`` of a large program pays the compile,
and so does every test run on a fresh machine (each pytest worker compiles what its tests use).
This runs, in a process of its own with an empty ``NUMBA_CACHE_DIR`` and ``HCCC_JIT=numba``
(every kernel compiled whatever the size), a set of commands that between them use every kernel
module -- trees and the step search on example clusters, a pod composition, a simulation, a
compile with its text and schedule -- and prints the seconds numba spent per kernel (top-level
compiles; what a kernel's callees cost is in its line), the numba library functions that cost the
most (the sorts, the error paths of array expressions, ...: inclusive, so nested ones count
twice), and the process's wall time. ``--compare DIR`` runs the same with ``DIR``'s sources
(a ``git worktree`` of another commit; its ``hccc`` is imported from its source tree, as
``benchmarks/synth_speed.py`` does).
The figures are CPU-bound and single-threaded but for the parallel kernels; compare runs of one
invocation only.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from synth_speed import LOAD_TREE  # noqa: E402  (imports ``hccc`` from a given source tree)


def commands(root: Path, out: Path) -> list[list[str]]:
    """The workload: every kernel module of ``root``'s checkout compiled at least once."""
    ex, cl = root / "examples", root / "examples" / "clusters"
    return [
        ["synth", str(cl / "a100_topo1.topo"), "--collective", "allgather", "--size", "1G", "-o", str(out / "t.rccl")],
        ["synth", str(cl / "h20_4x2_8.topo"), "--collective", "allgather", "--method", "search", "--size", "1M",
         "-o", str(out / "s.rccl")],
        ["synth", str(cl / "v100_4x2_8x2.topo"), "--collective", "allgather", "--method", "search", "--size", "1M",
         "-o", str(out / "c.rccl")],
        ["sim", str(ex / "hm_allreduce_2x4.rccl"), "--topology", str(cl / "a100_topo1.topo"), "--sizes", "1M"],
        [str(ex / "hm_allreduce_2x4.rccl"), "-o", str(out / "kernels")],
        ["check", str(ex / "ring_allreduce_8.rccl")],
    ]


def child(root: Path) -> None:
    """Run the workload (``root``'s examples, ``hccc`` as already imported) and print what numba
    compiled, as JSON."""
    import contextlib
    import io

    from numba.core import event

    log: list = []

    class Listener(event.Listener):
        def __init__(self):
            self.stack: list = []

        def on_start(self, ev):
            self.stack.append(time.perf_counter())

        def on_end(self, ev):
            t0 = self.stack.pop()
            disp = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
            fn = getattr(disp, "py_func", None)
            mod = getattr(fn, "__module__", "") or ""
            # hccc's twins carry a digest of their sources in their qualified names (util/jit.py),
            # which differs between the trees compared: their plain names line the rows up
            name = getattr(fn, "__name__" if mod.startswith("hccc") else "__qualname__", str(disp))
            log.append([mod, name, time.perf_counter() - t0, len(self.stack)])

    event.register("numba:compile", Listener())
    from hccc.cli import main

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for cmd in commands(root, Path(tmp)):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try:
                    rc = main(cmd)
                except SystemExit as exc:
                    rc = exc.code
            if rc not in (0, None):
                raise SystemExit(f"hccc {' '.join(cmd)} failed ({rc})")
    print(json.dumps({"wall": time.perf_counter() - t0, "log": log}))


#: the child: ``hccc`` from the source tree given first, then :func:`child`
CHILD = LOAD_TREE + r"""
sys.path.insert(0, sys.argv[2])
import jit_compile
from pathlib import Path
jit_compile.child(Path(root))
"""


def measure(src: Path) -> dict:
    env = dict(os.environ, HCCC_JIT="numba")
    with tempfile.TemporaryDirectory() as cache:
        env["NUMBA_CACHE_DIR"] = cache
        p = subprocess.run([sys.executable, "-c", CHILD, str(src), str(ROOT / "benchmarks")], env=env,
                           capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{src}: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def summary(res: dict) -> tuple[dict, dict, float]:
    top, lib = collections.Counter(), collections.Counter()
    for mod, name, sec, depth in res["log"]:
        if depth == 0:
            top[f"{mod.split('.')[-1]}.{name}"] += sec
        if not mod.startswith("hccc"):
            lib[name.split(".<locals>")[0]] += sec
    return top, lib, res["wall"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compare", type=Path, help="another checkout, measured the same way first")
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    runs = ([("other", args.compare.resolve())] if args.compare else []) + [("this", ROOT)]
    got = {name: summary(measure(src)) for name, src in runs}
    names = [n for n, _ in runs]
    def table(title: str, first: str, col: int, rows: list[str], totals: bool) -> Table:
        t = Table(title=title)
        t.add_column(first)
        for n in names:
            t.add_column(n, justify="right")
        for k in rows:
            t.add_row(k, *(f"{got[n][col].get(k, 0.0):.2f}" for n in names))
        if totals:
            t.add_row("all kernels", *(f"{sum(got[n][col].values()):.1f}" for n in names))
            t.add_row("process wall", *(f"{got[n][2]:.1f}" for n in names))
        return t

    def by_cost(col: int) -> list[str]:
        return sorted({k for n in names for k in got[n][col]}, key=lambda k: -max(got[n][col].get(k, 0) for n in names))

    console = Console()
    console.print(table("numba compile seconds, empty cache (HCCC_JIT=numba)", "kernel", 0, by_cost(0), True))
    console.print(table("numba library functions compiled (inclusive seconds)", "function", 1, by_cost(1)[:15], False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
