"""Set-up cost of the two launchers on the CPU emulation: a single-process ``Runner`` (a
``LocalJob`` with the oracle and its up-front checks on top) against a bare ``LocalJob`` (every
rank a Communicator in a thread of this process, over the in-process bootstrap), per job, at
several rank counts.

    python benchmarks/job_setup.py [--ranks 2,8,32] [--reps 5]
    python benchmarks/job_setup.py --workload [--reps 3]

Program: ``generators.ring_allreduce(N)`` with 64-byte chunks, its kernels built once first (the
build cache's turn), so that what is timed is the set-up itself: the generated program read,
platforms, kernels loaded, memory allocated and, for the job, the ranks' agreement, the exchange
of their memory's handles and the connection tables. ``set-up`` is the least wall time (and CPU
time of the process: every thread of it) of making one over ``--reps`` makings; ``first run`` the
same for the first checked call at 4 N elements that follows (out of place, Simple). The table
ends with the job's set-up as a multiple of the runner's.

``--workload``: what a test file of runs does instead, per launcher: :data:`WORKLOAD`'s programs
(2 to 8 ranks, kernels built once first), each set up, run ``RUNS`` times at a few sizes (checked)
and closed; the least CPU time of the process (every thread) and wall time over ``--reps``, and
the job's as a multiple of the runner's.
"""
from __future__ import annotations

import argparse
import resource
import time

from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime.launcher import Runner
from hccc.runtime.local_job import LocalJob


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _runner(ir):
    return Runner(ir, "cpu", "float32", "sum", timeout_s=30)


def _job(ir):
    return LocalJob(ir, timeout_s=60, proto="simple")


def _run(obj, count: int) -> bool:
    if isinstance(obj, Runner):
        return obj.run(count=count).ok
    return obj.run(count).ok


def measure(nranks: int, reps: int) -> dict[str, tuple[float, float, float, float]]:
    """launcher -> (set-up wall s, set-up CPU s, first run wall s, first run CPU s), each the least
    over ``reps`` makings."""
    ir = build_program(gen.ring_allreduce(nranks), chunk_bytes=64)
    count = 4 * nranks
    out = {}
    for name, make in (("Runner", _runner), ("LocalJob", _job)):
        with make(ir) as warm:                     # the kernels built (and cached) once
            assert _run(warm, count)
        best = [float("inf")] * 4
        for _ in range(reps):
            w0, c0 = time.perf_counter(), _cpu_s()
            obj = make(ir)
            w1, c1 = time.perf_counter(), _cpu_s()
            try:
                assert _run(obj, count)
            finally:
                w2, c2 = time.perf_counter(), _cpu_s()
                obj.close()
            best = [min(b, x) for b, x in zip(best, (w1 - w0, c1 - c0, w2 - w1, c2 - c1))]
        out[name] = tuple(best)
    return out


#: the workload's programs: (generator, ranks), twelve of 2 to 8 ranks as the runner-heavy test
#: files make them
WORKLOAD = [(g, n) for n in (2, 3, 4, 8) for g in (gen.ring_allreduce, gen.ring_allgather, gen.ring_reducescatter)]
#: checked runs of each program of the workload, at these element counts (times the ranks)
RUNS = (1, 4, 33, 250)


def workload(reps: int) -> dict[str, tuple[float, float]]:
    """launcher -> (wall s, CPU s) of the whole workload, each the least over ``reps``."""
    irs = [build_program(g(n), chunk_bytes=64) for g, n in WORKLOAD]
    for make in (_runner, _job):                   # the kernels built (and cached) once
        for ir in irs:
            with make(ir) as warm:
                assert _run(warm, 4 * ir.nranks)
    out = {}
    for name, make in (("Runner", _runner), ("LocalJob", _job)):
        best = [float("inf")] * 2
        for _ in range(reps):
            w0, c0 = time.perf_counter(), _cpu_s()
            for ir in irs:
                with make(ir) as obj:
                    for k in RUNS:
                        assert _run(obj, k * ir.nranks)
            best = [min(b, x) for b, x in zip(best, (time.perf_counter() - w0, _cpu_s() - c0))]
        out[name] = tuple(best)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,8,32", help="rank counts, comma-separated")
    ap.add_argument("--reps", type=int, default=5, help="makings per launcher and rank count")
    ap.add_argument("--workload", action="store_true", help="the test-like workload instead (see above)")
    args = ap.parse_args(argv)
    if args.workload:
        got = workload(max(1, args.reps))
        print(f"{'launcher':9}  {'wall s':>7}  {'CPU s':>7}")
        for name, (w, c) in got.items():
            print(f"{name:9}  {w:7.3f}  {c:7.3f}")
        print(f"job/runner: {got['LocalJob'][0] / got['Runner'][0]:.2f}x wall, "
              f"{got['LocalJob'][1] / got['Runner'][1]:.2f}x CPU", flush=True)
        return
    print(f"{'ranks':>5}  {'launcher':9}  {'set-up ms':>9}  {'(CPU)':>7}  {'first run ms':>12}  {'(CPU)':>7}")
    for n in (int(x) for x in args.ranks.split(",")):
        got = measure(n, max(1, args.reps))
        for name, (sw, sc, rw, rc) in got.items():
            print(f"{n:>5}  {name:9}  {sw * 1e3:9.1f}  {sc * 1e3:7.1f}  {rw * 1e3:12.1f}  {rc * 1e3:7.1f}")
        print(f"{n:>5}  job/runner set-up: {got['LocalJob'][0] / got['Runner'][0]:.1f}x wall, "
              f"{got['LocalJob'][1] / got['Runner'][1]:.1f}x CPU", flush=True)


if __name__ == "__main__":
    main()
