"""CPU seconds of a mix of CPU-emulation builds from an empty cache, as the test suite builds them.

    python benchmarks/cpu_builds.py [--programs 8] [--instances 4] [--opt -O0] [--json]

Builds each of the first ``--programs`` programs (2 to 16 ranks: ring, hierarchical-mesh and
direct AllToAll programs from ``hccc.compiler.frontend.generators``) for each of the first
``--instances`` (dtype, op) instances, at ``--opt`` (the test suite's -O0), into a fresh cache,
and prints the CPU seconds (user + system of this process and of the compilers it ran) and what
the cache then holds (modules, engine objects, precompiled headers, launcher objects). The test
suite's cold runs build some 340 programs over some 44 instances, about this mix's proportion.
``HCCC_CPU_JOBS`` sets how many units a build compiles at once (the suite under ``-n 2`` on 2
cores: 1). Run it side by side with another tree's (``PYTHONPATH``) to compare builds.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

from hccc.compiler.backend.codegen import generate
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime.cpu import CpuPlatform
from hccc.runtime.platform import Instance

#: the programs, smallest first
PROGRAMS = (lambda: gen.ring_allreduce(2), lambda: gen.ring_allgather(4), lambda: gen.ring_reducescatter(8),
            lambda: gen.ring_allreduce(8), lambda: gen.hm_allreduce(2, 4), lambda: gen.direct_alltoall(8),
            lambda: gen.ring_allgather(16), lambda: gen.hm_allgather(2, 8))
#: the instances, one of each kind of element type
INSTANCES = (("float32", "sum"), ("float16", "max"), ("int32", "min"), ("bfloat16", "sum"))


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its waited-for children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def measure(programs: int, instances: int, opt: str, work: Path) -> dict:
    """Build the mix into a fresh cache under ``work``: CPU seconds and the cache's entries."""
    outs = []
    for i, make in enumerate(PROGRAMS[:programs]):
        ir = build_program(make(), chunk_bytes=64)
        d = work / f"p{i}"
        d.mkdir()
        generate(ir, d, platforms=["cuda"] * ir.nranks)
        outs.append((d, json.loads((d / "manifest.json").read_text())))
    cache = work / "cache"
    pf = CpuPlatform(opt=opt, cache_dir=cache)
    t0 = cpu_seconds()
    for dtype, op in INSTANCES[:instances]:
        for d, man in outs:
            pf.build(d, man, Instance(dtype, op))
    spent = cpu_seconds() - t0
    entries = {kind: len(list((cache / kind).iterdir())) if (cache / kind).is_dir() else 0
               for kind in ("cpu", "cpu_engine", "cpu_pch", "cpu_launcher")}
    return {"builds": len(outs) * instances, "cpu_s": round(spent, 2), "jobs": pf.jobs, "entries": entries}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cpu_builds", description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=len(PROGRAMS), choices=range(1, len(PROGRAMS) + 1))
    ap.add_argument("--instances", type=int, default=len(INSTANCES), choices=range(1, len(INSTANCES) + 1))
    ap.add_argument("--opt", default="-O0")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        got = measure(args.programs, args.instances, args.opt, Path(work))
    if args.json:
        print(json.dumps(got))
    else:
        print(f"{got['cpu_s']:.2f} s of CPU for {got['builds']} builds ({got['jobs']} units at once at most); "
              "cache entries: " + ", ".join(f"{k} {v}" for k, v in got["entries"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
