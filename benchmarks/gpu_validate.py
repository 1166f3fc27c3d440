"""The first run on a GPU, in one command, with one report.

    python benchmarks/gpu_validate.py [--backend cuda|hip|cpu] [--report FILE.md] [--json FILE.json]
                                      [--small 4K] [--large 64M] [--examples a,b,...]
                                      [--step-timeout S] [--budget S] [--skip tests,examples,...]
                                      [--latency-iters N]

On one GPU with no network (every rank on that GPU, the one-grid launch), in order:

1. ``tests``: the GPU tests (``pytest -m gpu`` on the CUDA / HIP runtime tests);
2. ``examples``: every example at a small and a large size, in and out of place (``hccc run
   --json``): wrong elements, a stuck thread block (the kernels' timeout report), the time;
3. ``busbw``: ``benchmarks/gpu_busbw.py`` (ring AllGather 8, ring AllReduce 8, HM AllReduce 4x8
   at 64 MiB and 1 GiB against the device copy measured in the same run, and the bound their HBM
   traffic allows);
4. ``latency``: ring AllReduce 8 at 4 KiB out of place, once with the Simple protocol and once with
   LL (``hccc run --proto simple|ll``, ``--latency-iters`` timed iterations after 5 warm-up ones),
   each a step with its own timeout; a step that asked for LL and ran Simple fails; then a row
   comparing the two (LL's speed-up, and the target: within 2x of 15 us);
5. ``model``: ``benchmarks/kernel_model.py``'s predictions for the same runs, printed beside the
   measurements so the report is read against them.

Every step runs in a process of its own with its own timeout (``--step-timeout``, and never past
what is left of ``--budget``, default 480 s): a hang or a crash costs that step only, the report
says "timeout" or the exit status and the tail of its output, and the next step runs. The report
(Markdown, ``--report``; the same as JSON with ``--json``) is written after every step, so even
an interrupted run leaves what it measured. ``--backend cpu`` runs the same steps on the CPU
emulation (no busbw step: it needs CUDA), which is how the command itself is tested without a GPU.
Exit status: 0 when every step passed, 1 otherwise, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("ring_allgather_8", "ring_allreduce_8", "ring_reducescatter_8", "ring_broadcast_8", "ring_reduce_8",
            "ring_alltoall_6", "direct_allgather_8", "recursive_doubling_allgather_8", "hm_allgather_2x8",
            "hm_allreduce_2x8", "hm_allreduce_4x8", "hierarchical_alltoall_2x8")
STEPS = ("tests", "examples", "busbw", "latency", "model")
#: the latency steps: ring AllReduce 8 at 4 KiB under each protocol, then their comparison
LATENCY, LATENCY_PROTOS = "ring_allreduce_8 4K", ("simple", "ll")
#: the 4 KiB latency target of one H100 (all ranks on one GPU): within 2x of 15 us
LATENCY_TARGET_US = 15.0
GPU_TESTS = {"cuda": ["tests/test_runtime_cuda.py", "tests/test_communicator_gpu.py"],
             "hip": ["tests/test_runtime_hip.py", "tests/test_communicator_gpu.py"]}


@dataclass
class Step:
    """One command of the validation, run in a process of its own."""
    group: str
    name: str
    argv: list
    timeout_s: float
    env: dict = field(default_factory=dict)


@dataclass
class Result:
    group: str
    name: str
    status: str            # ok | failed | timeout | skipped
    seconds: float
    summary: str
    data: object = None    # the step's JSON output, when it printed one


def hccc_argv(*args: str) -> list:
    return [sys.executable, "-m", "hccc", *args]


def plan(args) -> list[Step]:
    """The steps for ``args`` (module docstring), in order."""
    steps = []
    t = args.step_timeout
    skip = set(args.skip)
    if "tests" not in skip:
        if args.backend in GPU_TESTS:
            files = [f for f in GPU_TESTS[args.backend] if (ROOT / f).exists()]
            steps.append(Step("tests", "pytest -m gpu", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                                         "-m", "gpu", *files], t, {"HCCC_REQUIRE_GPU": "1"}))
        else:
            steps.append(Step("tests", "pytest (kernel ABI)", [sys.executable, "-m", "pytest", "-q", "-p",
                                                              "no:cacheprovider", "tests/test_kernel_abi_source.py"], t))
    if "examples" not in skip:
        for ex in args.examples:
            for size in (args.small, args.large):
                steps.append(Step("examples", f"{ex} {size}", hccc_argv(
                    "run", str(ROOT / "examples" / f"{ex}.rccl"), "--backend", args.backend, "-b", size, "-e", size,
                    "-n", str(args.iters), "-w", "1", "--timeout", str(max(1, int(t / 4))), "--json"), t))
    if "busbw" not in skip and args.backend == "cuda":
        steps.append(Step("busbw", "gpu_busbw 64M,1G", [sys.executable, str(ROOT / "benchmarks" / "gpu_busbw.py"),
                                                        "--sizes", "64M,1G", "--json"], t))
    if "latency" not in skip:
        for proto in LATENCY_PROTOS:
            steps.append(Step("latency", f"{LATENCY} {proto}", hccc_argv(
                "run", str(ROOT / "examples" / "ring_allreduce_8.rccl"), "--backend", args.backend, "-b", "4K",
                "-e", "4K", "--out-of-place", "--proto", proto, "-n", str(args.latency_iters), "-w", "5",
                "--json"), t))
    if "model" not in skip:
        steps.append(Step("model", "kernel_model v3", [sys.executable, str(ROOT / "benchmarks" / "kernel_model.py"),
                                                      "--sizes", "4K,64M,1G", "--json"], t))
    return steps


def summarise(step: Step, data) -> tuple[bool, str]:
    """(passed, one line) from a step's JSON output."""
    if step.group in ("examples", "latency") and isinstance(data, dict):
        res = data.get("results", [])
        bad = [r for r in res if r.get("wrong") or r.get("stuck")]
        times = ", ".join(f"{'in' if r.get('inplace') else 'out'} {r.get('time_us', 0):.1f} us" for r in res)
        if bad:
            r = bad[0]
            return False, f"{'STUCK: ' + str(r['stuck']) if r.get('stuck') else 'WRONG: ' + str(r.get('first_wrong'))}"
        if step.group == "latency":
            asked = step.argv[step.argv.index("--proto") + 1] if "--proto" in step.argv else "simple"
            ran = sorted({r.get("proto", "simple") for r in res})
            if ran != [asked]:
                return False, f"asked for {asked}, ran {', '.join(ran) or 'nothing'}"
            times = f"{asked}: {times}"
        return bool(data.get("ok", True)) and bool(res), f"{data.get('nthreads')} threads; {times}"
    if step.group == "busbw" and isinstance(data, dict):
        rows = data.get("rows", [])
        parts = [f"{r['algorithm']} {r['bytes'] >> 20}M: " + (f"{r['busbw']:.0f} GB/s, {r['of_bound']:.0%} of bound, "
                                                             f"{r['ratio']:.2f} of copy" if r.get("time_us")
                                                             else (r.get("error") or "wrong/stuck")) for r in rows]
        return all(r.get("time_us") for r in rows), "; ".join(parts)
    if step.group == "model" and isinstance(data, dict):
        p = data.get("predictions", {})
        ag = p.get("ring_allgather_8 1G", {})
        s4, l4 = p.get("ring_allreduce_8 4K simple", {}), p.get("ring_allreduce_8 4K ll", {})
        return True, (f"predicted: ring AllGather 8 1G {ag.get('busbw', 0):.0f} GB/s busbw "
                      f"({ag.get('of_hbm_bound', 0):.0%} of HBM bound); ring AllReduce 8 4K Simple "
                      f"{s4.get('time_us', 0):.1f} us, LL (predicted) {l4.get('time_us', 0):.1f} us; "
                      f"LL crossover {p.get('ll_crossover_bytes', 0)} B")
    return True, ""


def latency_comparison(results: list) -> "Result | None":
    """The row comparing the latency steps once both have a result (None before)."""
    got = {r.name: r for r in results if r.group == "latency"}
    mine = [got.get(f"{LATENCY} {p}") for p in LATENCY_PROTOS]
    if any(r is None for r in mine):
        return None
    times = []
    for r in mine:
        rows = (r.data or {}).get("results", []) if r.status == "ok" and isinstance(r.data, dict) else []
        t = rows[0].get("time_us") if rows else None
        times.append(float(t) if isinstance(t, (int, float)) and t > 0 else None)
    name = f"{LATENCY} LL vs Simple"
    if None in times:
        missing = [p for p, t in zip(LATENCY_PROTOS, times) if t is None]
        return Result("latency", name, "failed", 0.0, f"no time for {' and '.join(missing)}")
    simple, ll = times
    best = min(simple, ll)
    limit = 2 * LATENCY_TARGET_US
    return Result("latency", name, "ok", 0.0,
                  f"Simple {simple:.1f} us, LL {ll:.1f} us: LL {simple / ll:.2f}x "
                  f"{'faster' if ll < simple else 'of Simple'}; best {best:.1f} us vs target "
                  f"<= {limit:.0f} us (2x {LATENCY_TARGET_US:.0f} us): {'met' if best <= limit else 'not met'}")


def run_step(step: Step, budget_left: float) -> Result:
    timeout = max(1.0, min(step.timeout_s, budget_left))
    t0 = time.monotonic()
    env = dict(os.environ, **step.env)
    try:
        proc = subprocess.run(step.argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return Result(step.group, step.name, "timeout", time.monotonic() - t0,
                      f"no answer in {timeout:.0f} s" + (f"; last output: {out.strip().splitlines()[-1][:160]}"
                                                         if out.strip() else ""))
    except OSError as exc:
        return Result(step.group, step.name, "failed", time.monotonic() - t0, f"cannot start: {exc}")
    secs = time.monotonic() - t0
    data = None
    try:
        data = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    except ValueError:
        data = None
    passed, line = summarise(step, data)
    if proc.returncode != 0 or not passed:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or [""]
        return Result(step.group, step.name, "failed", secs,
                      (line + "; " if line else "") + f"exit {proc.returncode}: {tail[0][:200]}", data)
    if not line:
        last = proc.stdout.strip().splitlines()[-1:] or [""]
        line = last[0][:200]
    return Result(step.group, step.name, "ok", secs, line, data)


def report_text(results: list[Result], args, device: str, started: str) -> str:
    ok = sum(r.status == "ok" for r in results)
    lines = [f"# hccc GPU validation: {device}", "",
             f"backend {args.backend}, started {started}, {ok}/{len(results)} steps passed, "
             f"{sum(r.seconds for r in results):.0f} s", "",
             "| step | name | status | seconds | result |", "|---|---|---|---:|---|"]
    for r in results:
        lines.append(f"| {r.group} | {r.name} | {r.status} | {r.seconds:.1f} | {r.summary.replace('|', '/')} |")
    lines += ["", "Not measured by this command: several GPUs, a network."]
    return "\n".join(lines) + "\n"


def device_name(backend: str) -> str:
    if backend == "cpu":
        return "CPU emulation"
    try:
        from hccc.runtime.platform import get_platform
        pf = get_platform(backend)
        name = getattr(pf, "device_name", backend)
        pf.close()
        return str(name)
    except Exception as exc:     # no device: the steps will say what fails
        return f"{backend} (no device: {exc})"


def _names(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "hip", "cpu"), default="cuda")
    ap.add_argument("--report", default="gpu_validate.md", help="Markdown report (default gpu_validate.md)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument("--small", default="4K")
    ap.add_argument("--large", default="64M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--examples", type=_names, default=list(EXAMPLES))
    ap.add_argument("--step-timeout", type=float, default=120.0, help="seconds per step")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole validation")
    ap.add_argument("--skip", type=_names, default=[], help=f"steps to leave out ({', '.join(STEPS)})")
    ap.add_argument("--latency-iters", type=int, default=20, help="timed iterations of each latency step")
    args = ap.parse_args(argv)
    from hccc.args import parse_size
    bad = [s for s in args.skip if s not in STEPS]
    unknown = [e for e in args.examples if not (ROOT / "examples" / f"{e}.rccl").is_file()]
    try:
        sizes_ok = parse_size(args.small) > 0 and parse_size(args.large) > 0
    except (ValueError, argparse.ArgumentTypeError):
        sizes_ok = False
    if (bad or unknown or not sizes_ok or args.step_timeout <= 0 or args.budget <= 0 or args.iters < 1
            or args.latency_iters < 1):
        why = (f"unknown step {bad[0]!r} (steps: {', '.join(STEPS)})" if bad else
               f"no example {unknown[0]!r} in examples/" if unknown else
               "--small / --large must be sizes such as 4K or 64M" if not sizes_ok else
               "--step-timeout, --budget, --iters and --latency-iters must be positive")
        print(f"gpu_validate: error: {why}", file=sys.stderr)
        return 2
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    device = device_name(args.backend)
    deadline = time.monotonic() + args.budget
    results: list[Result] = []
    for step in plan(args):
        left = deadline - time.monotonic()
        if left <= 0:
            results.append(Result(step.group, step.name, "skipped", 0.0, "the budget was spent"))
        else:
            results.append(run_step(step, left))
        print(f"{results[-1].status:>8}  {step.group}: {step.name}  {results[-1].summary}", file=sys.stderr)
        if step.group == "latency" and not any(r.name.endswith("LL vs Simple") for r in results):
            row = latency_comparison(results)
            if row is not None:
                results.append(row)
                print(f"{row.status:>8}  {row.group}: {row.name}  {row.summary}", file=sys.stderr)
        Path(args.report).write_text(report_text(results, args, device, started))
        if args.json:
            Path(args.json).write_text(json.dumps({"device": device, "backend": args.backend, "started": started,
                                                   "steps": [asdict(r) for r in results]}, indent=1))
    print(report_text(results, args, device, started))
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
