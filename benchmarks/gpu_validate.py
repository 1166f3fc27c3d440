"""The first run on a GPU, in one command, with one report.

    python benchmarks/gpu_validate.py [--backend cuda|hip|cpu] [--report FILE.md] [--json FILE.json]
                                      [--small 4K] [--large 64M] [--examples a,b,...]
                                      [--step-timeout S] [--budget S] [--skip tests,examples,...]
                                      [--latency-iters N]
    python benchmarks/gpu_validate.py --quick [--budget 360] [--report FILE.md] [--json FILE.json]

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

``--quick``: what one short lease of a GPU answers, in about 6 minutes (``--budget``, default 360
s: a lease is 15 minutes of device time, so a run and a rerun fit), one line per step in the
report, then a table per group with the model's prediction beside every measured row:

1. ``env``: the GPU, its SMs, the driver, nvcc, torch and NCCL versions; then (after the build
   pass) the device-to-device copy bandwidth (``gpu_common.py copy``, 1 GiB);
2. ``slot``: ``benchmarks/slot_anatomy.py --quick --json FILE`` (unit slopes, flag round trips,
   one block's copy rate) where that script exists, else "not available";
3. ``latency``: ring AllReduce 8 at 4 KiB under Simple and LL, each fused and not; the one-shot
   AllReduce 8 (``examples/one_shot_allreduce_8.json``) under LL and Simple; the one-step
   AllGather 8 under LL (``--latency-iters`` timed calls after 5 warm-up ones; the kernels-v5
   targets: 15 us, 8 us one-shot);
4. ``large``: ring AllGather 8 and ring AllReduce 8 at 256 MiB, each against its HBM bound (the
   target: 0.9 of it);
   ``tma``: the same figures with bulk copies (kernels built with ``HCCC_TMA=1``: sm_90's
   ``cp.async.bulk`` for the copy engine's pure copies): ``slot_anatomy.py --copy-only`` (one
   block's COPY units) and ring AllGather 8 at 256 MiB, then a row setting them beside the portable
   path's (the slot step's copy rows, the large step's AllGather) with the verdict: bulk copies
   win only where both are faster by :data:`TMA_WIN` (else the switch stays off); "n/a" on HIP,
   which has no bulk copies;
5. ``hm``: HM AllReduce 4x8 at 32 MiB in place and out of place with the automatic slice, and in
   place with the fewest micro-batches a chunk (the target: within 2x of its HBM bound);
6. ``examples``: every ``examples/*.rccl`` through ``hccc run``, one grid, out of place: Simple
   at 4 KiB and 32 MiB and LL at 4 KiB only, both in one process: wrong elements, time and busbw;
7. ``torch``: ``benchmarks/torch_gpu_check.py``: the torch backend on CUDA tensors, 2 processes
   on the one GPU, an ``all_reduce`` and an ``all_to_all_single`` with uneven splits, each against
   the same call through gloo on CPU copies;
8. ``vs_nccl``: ``benchmarks/vs_nccl.py --quick`` (4K, 1M, 64M; N = 8 first, then 4 and 2 while
   its share of the budget lasts; the copy bound where the image's NCCL cannot run several ranks
   on one GPU);
9. ``pathology``: ring Broadcast 8 at 32 MiB and AllGather synthesised for
   ``examples/clusters/h20_4_8.topo`` (``hccc synth --time-limit 20``; its cooperative grid fills
   an H100 / H200: 264 blocks) in table mode at 64 MiB, each against its HBM bound
   (``gpu_common.hbm_bytes`` at the copy's bandwidth);
10. ``model``: ``benchmarks/kernel_model.py``'s prediction of every row measured above (hccc's
   kernel costs, the slices, channels and threads the run used), shown in the tables' "model"
   column: a measured row without one says why; and the same from this run's own slot anatomy
   (its units, flag round trip, copy table and launches by blocks:
   ``kernel_model.costs_from_anatomy``), the "model, this run's units" column.

Before anything is timed a ``build`` step builds the kernels of the later steps, ``--build-jobs``
at a time (nvcc takes over a minute for the specialised kernels of 32 ranks on two cores; built once,
cached by content).
Each group of steps gets a share of the budget and whatever the groups before it left unused;
what does not fit is reported "not run (budget spent)". The report has a table per group after
the step lines. ``--backend cpu`` runs the quick steps on the CPU emulation at small sizes (no build
step), which is how they are tested.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import gpu_common as common  # noqa: E402
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
    """One command of the validation, run in a process group of its own (:func:`gpu_common.run_command`).
    ``before``: commands run first, within the same timeout, each of which must pass (skipped when
    the file ``creates`` exists); ``data_file``: where the command writes its JSON (else its stdout);
    an argument equal to :data:`LEFT` becomes the seconds the step may take."""
    group: str
    name: str
    argv: list
    timeout_s: float
    env: dict = field(default_factory=dict)
    before: list = field(default_factory=list)
    creates: str | None = None
    data_file: str | None = None
    keep_stdout: bool = False       # data: {"json": what it wrote, "stdout": what it printed}


@dataclass
class Result:
    group: str
    name: str
    status: str            # ok | failed | timeout | skipped (the budget was spent) | n/a (not available)
    seconds: float
    summary: str
    data: object = None    # the step's JSON output, when it printed one


#: a step argument replaced by the seconds the step may take (a script's own --budget)
LEFT = "@LEFT@"
#: statuses that do not fail the validation
PASSING = ("ok", "n/a")


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


def run_step(step: Step, budget_left: float, summary=None) -> Result:
    """Run ``step`` for at most its timeout and what is left of the budget; its :class:`Result`.
    ``summary(step, data) -> (passed, line)`` reads its JSON (default :func:`summarise`)."""
    timeout = max(1.0, min(step.timeout_s, budget_left))
    t0 = time.monotonic()
    env = dict(step.env)
    if not (step.creates and Path(step.creates).exists()):
        for argv in step.before:
            res = common.run_command(argv, max(0.1, timeout - (time.monotonic() - t0)), cwd=ROOT, env=env)
            if res.status != "ok":
                return Result(step.group, step.name, "timeout" if res.status == "timeout" else "failed",
                              time.monotonic() - t0, f"{_short(argv)}: {res.why()}")
    left = max(0.1, timeout - (time.monotonic() - t0))
    argv = [str(max(1, round(left) - 5)) if a == LEFT else a for a in step.argv]
    res = common.run_command(argv, left, cwd=ROOT, env=env)
    secs = time.monotonic() - t0
    if res.status == "timeout":
        return Result(step.group, step.name, "timeout", secs,
                      f"no answer in {timeout:.0f} s" + (f"; last output: {common.tail(res.stdout, 1, 160)}"
                                                         if res.stdout.strip() else ""), _data(step, res))
    data = _data(step, res)
    passed, line = (summary or summarise)(step, data)
    if res.returncode is None or res.returncode != 0 or not passed:
        what = f"exit {res.returncode}" if res.returncode is not None else "cannot start"
        return Result(step.group, step.name, "failed", secs,
                      (line + "; " if line else "") + f"{what}: {res.tail(1, 200)}", data)
    if not line:
        line = common.tail(res.stdout, 1, 200)
    return Result(step.group, step.name, "ok", secs, line, data)


def _short(argv: list) -> str:
    """``hccc synth`` for a command line of hccc (or a run worker's first), else the program's name."""
    a = [str(x) for x in argv]
    if len(a) > 3 and a[1:3] == ["-m", "hccc"]:
        return f"hccc {a[3]}"
    if "--run-worker" in a:
        try:
            return f"hccc {json.loads(a[a.index('--run-worker') + 1])[0][0]}"
        except (ValueError, IndexError, TypeError):
            pass
    return Path(a[1] if len(a) > 1 and a[0] == sys.executable else a[0]).name


def _data(step: Step, res) -> object:
    """The JSON a step wrote (its ``data_file``, else its stdout), or None."""
    if step.keep_stdout:
        return {"json": _data(Step(step.group, step.name, step.argv, step.timeout_s, data_file=step.data_file), res),
                "stdout": res.stdout[-20000:]}
    if step.data_file:
        try:
            return json.loads(Path(step.data_file).read_text())
        except (OSError, ValueError):
            return None
    out = res.stdout.strip()
    if out.startswith("{"):
        try:
            return json.loads(out)
        except ValueError:
            return None
    return None


# ------------------------------------------------------------------------------ --quick
#: the quick mode's groups in order, each with its share of the budget (fractions of it; a group
#: may also spend what the groups before it left)
QUICK_GROUPS = {"env": 0.03, "build": 0.22, "copy": 0.02, "slot": 0.08, "latency": 0.08, "large": 0.07, "tma": 0.05,
                "hm": 0.08, "examples": 0.14, "torch": 0.06, "vs_nccl": 0.12, "pathology": 0.07, "model": 0.03}
#: the programs earlier runs found pathological: (name, program, size, placement, extra options)
PATHOLOGY = (("ring_broadcast_8", "examples/ring_broadcast_8.rccl", "32M", "--out-of-place", []),
             ("synth h20_4_8 allgather (table)", None, "64M", "--out-of-place", ["--codegen", "table"]))
#: the small-message latency rows of kernels v5 (each its own process): (name, program, [(proto, fuse)])
QUICK_LATENCY = (("ring_allreduce_8 4K", "examples/ring_allreduce_8.rccl",
                  [("simple", "off"), ("simple", "on"), ("ll", "off"), ("ll", "on")]),
                 ("one_shot_allreduce_8 4K", "examples/one_shot_allreduce_8.json", [("ll", None), ("simple", None)]),
                 ("direct_allgather_8 4K", "examples/direct_allgather_8.rccl", [("ll", None)]))
#: the bandwidth rows: (program, size), out of place, Simple, against the HBM bound
QUICK_LARGE = (("ring_allgather_8", "256M"), ("ring_allreduce_8", "256M"))
#: the bulk-copy A/B's program run (kernels v5 item 2): the first bandwidth row, again with bulk
#: copies, so the large group's row is its portable side
TMA_LARGE = QUICK_LARGE[0]
#: what the bulk-copy steps add to the environment: kernels (and slot_anatomy's program) built with
#: -DHCCC_TMA=1 (hccc.runtime.platform.TMA_ENV; cached apart from the default builds by their flags)
TMA_ON = {"HCCC_TMA": "1"}
#: the gain bulk copies must show on both figures (the median of the copy engine's rows and ring
#: AllGather 8's time) before the switch is turned on by default: a decision threshold, not a
#: measurement, above the few per cent by which the fifth GPU run's repeated rows differ
TMA_WIN = 0.05
#: HM AllReduce 4x8 (the 77 ms pathology of kernels v4): (name, size, placement, slice: None for the
#: automatic one, "chunk" for one micro-batch a chunk: the slice as large as a chunk, within a slot)
QUICK_HM = (("in place, auto slices", "32M", "--inplace-only", None),
            ("out of place, auto slices", "32M", "--out-of-place", None),
            ("in place, one micro-batch", "32M", "--inplace-only", "chunk"))
HM_PROGRAM = "examples/hm_allreduce_4x8.rccl"
#: the quick mode's default budget: what one lease of a GPU leaves for one run and a rerun (a lease
#: is 15 minutes of device time, the machine's start included)
QUICK_BUDGET_S = 360.0
SYNTH_TOPO = "examples/clusters/h20_4_8.topo"
SYNTH_TIME_LIMIT = 20
#: benchmarks/slot_anatomy.py: written beside the kernels; run when present
SLOT_ANATOMY = HERE / "slot_anatomy.py"


def all_examples() -> list:
    """Every example program: the full mode's list first (its order is the priority), then the rest."""
    rest = sorted(p.stem for p in (ROOT / "examples").glob("*.rccl") if p.stem not in EXAMPLES)
    return [e for e in EXAMPLES if (ROOT / "examples" / f"{e}.rccl").is_file()] + rest


def run_worker_argv(runs: list) -> list:
    """A command that runs each ``hccc`` command line of ``runs`` in one process (``--run-worker``)."""
    return [sys.executable, str(Path(__file__).resolve()), "--run-worker", json.dumps(runs)]


def example_runs(args, ex: str) -> list:
    """The quick mode's ``hccc run`` command lines of one example: Simple at both sizes, LL at the small."""
    base = ["run", str(ROOT / "examples" / f"{ex}.rccl"), "--backend", args.backend, "--out-of-place",
            "-n", str(args.iters), "-w", "1", "--timeout", str(args.kernel_timeout), "--json"]
    return [base + ["--sizes", f"{args.small},{args.large}", "--proto", "simple"],
            base + ["--sizes", args.small, "--proto", "ll"]]


def synth_output(workdir: Path) -> Path:
    return workdir / "synth_h20_4_8_allgather.rccl"


def synth_command(workdir: Path) -> list:
    return ["synth", str(ROOT / SYNTH_TOPO), "--collective", "allgather", "--time-limit", str(SYNTH_TIME_LIMIT),
            "-o", str(synth_output(workdir))]


def pathology_runs(args, workdir: Path) -> list:
    """(name, hccc run command line, whether it needs the synthesised program) of each pathology."""
    out = []
    for name, prog, size, place, extra in PATHOLOGY:
        path = str(ROOT / prog) if prog else str(synth_output(workdir))
        size = size if args.backend != "cpu" else args.small        # the emulation: the plumbing only
        out.append((name, ["run", path, "--backend", args.backend, "--sizes", size, place, "-n", "2", "-w", "1",
                           "--timeout", str(max(args.kernel_timeout, 30.0)), "--json", *extra], prog is None))
    return out


def vs_nccl_args(args, ranks: str = "8,4,2") -> list:
    if args.backend == "cpu":      # the emulation: one small case, the plumbing only
        return ["--backend", "cpu", "--ranks", "2", "--sizes", args.small, "--collectives", "allreduce",
                "--impls", "comm-ring,grid-ring"]
    return ["--backend", args.backend, "--quick", "--ranks", ranks]


def build_run(args, ex: str) -> list:
    """The build step's ``hccc run`` of one example: its kernels, one small call."""
    return ["run", str(ROOT / "examples" / f"{ex}.rccl"), "--backend", args.backend, "--out-of-place",
            "--sizes", args.small, "-n", "1", "-w", "0", "--timeout", str(args.kernel_timeout), "--json"]


def _run_line(args, prog: str, sizes: str, *extra: str, iters: int | None = None, warm: int = 1) -> list:
    return ["run", str(ROOT / prog), "--backend", args.backend, "--sizes", sizes, *extra,
            "-n", str(iters or args.iters), "-w", str(warm), "--timeout", str(args.kernel_timeout), "--json"]


def _once(line: list) -> list:
    """``line`` (an ``hccc run`` command line) made one untimed call: its kernels built."""
    line = list(line)
    line[line.index("-n") + 1], line[line.index("-w") + 1] = "1", "0"
    return line


def latency_runs(args) -> list:
    """(step name, its ``hccc run`` command lines) of the latency group: :data:`QUICK_LATENCY` at
    the small size, out of place, ``--latency-iters`` timed calls after 5 warm-up ones."""
    out = []
    for name, prog, variants in QUICK_LATENCY:
        runs = [_run_line(args, prog, args.small, "--out-of-place", "--proto", proto,
                          *(["--fuse", fuse] if fuse else []), iters=args.latency_iters, warm=5)
                for proto, fuse in variants]
        out.append((name.replace("4K", args.small), runs))
    return out


def large_runs(args) -> list:
    """(step name, command lines) of the bandwidth group (the CPU emulation: the large size)."""
    return [(f"{prog} {size if args.backend != 'cpu' else args.large}",
             [_run_line(args, f"examples/{prog}.rccl", size if args.backend != "cpu" else args.large,
                        "--out-of-place", "--proto", "simple")])
            for prog, size in QUICK_LARGE]


def fewest_batches_slice(prog: str, nbytes: int) -> int:
    """The slice that gives each chunk of ``prog`` at ``nbytes`` the fewest micro-batches: the
    whole chunk (16-byte aligned) where it fits one slot's share, else that share."""
    from hccc.compiler.passes import slicing
    from hccc.compiler.pipeline import load_program
    ir = load_program(ROOT / prog)
    share = slicing.slot_share_bytes(ir.chunk_bytes, ir.max_step_chunks)
    chunk = nbytes // max(1, ir.nchunks)
    return max(16, min(share, chunk - chunk % 16))


def hm_runs(args) -> list:
    """(step name, command lines) of HM AllReduce 4x8 (:data:`QUICK_HM`)."""
    from hccc.args import parse_size
    out = []
    for name, size, place, slc in QUICK_HM:
        size = size if args.backend != "cpu" else args.large
        extra = [place, "--proto", "simple"]
        if slc == "chunk":
            extra += ["--slice-size", str(fewest_batches_slice(HM_PROGRAM, parse_size(size)))]
        out.append((f"hm_allreduce_4x8 {size} {name}", [_run_line(args, HM_PROGRAM, size, *extra)]))
    return out


def torch_check_argv(args, js: str) -> list:
    return [sys.executable, str(HERE / "torch_gpu_check.py"), "--device", "cpu" if args.backend == "cpu" else "cuda",
            "--ranks", "2", "--sizes", args.small if args.backend == "cpu" else f"{args.small},1M", "--iters", "5",
            "--timeout", LEFT, "--json", js]


def tma_steps(args, workdir: Path) -> list[Step]:
    """The bulk-copy group: the copy engine and :data:`TMA_LARGE` built with bulk copies
    (:data:`TMA_ON`); their portable sides are the slot and large groups' rows."""
    js = str(workdir / "slot_anatomy_tma.json")
    prog, size = TMA_LARGE
    size = size if args.backend != "cpu" else args.large
    return [Step("tma", "copy engine, bulk copies", [sys.executable, str(SLOT_ANATOMY), "--copy-only", "--json", js]
                 + (["--backend", args.backend] if args.backend != "cuda" else []), 90.0, env=dict(TMA_ON),
                 data_file=js),
            Step("tma", f"{prog} {size}, bulk copies",
                 run_worker_argv([_run_line(args, f"examples/{prog}.rccl", size, "--out-of-place", "--proto",
                                            "simple")]), max(args.step_timeout, 90.0), env=dict(TMA_ON))]


def bulk_copies_built(data) -> bool:
    """Whether slot_anatomy's program (its JSON) was built with bulk copies: its device row says."""
    rows = data.get("rows", []) if isinstance(data, dict) else []
    return any(isinstance(r, dict) and r.get("exp") == "device" and r.get("bulk_copies") for r in rows)


def _copy_rates(r: "Result | None") -> dict:
    """(threads, slice) -> GB/s of a slot_anatomy step's correct copy rows (its JSON, or the
    slot step's {"json": ...})."""
    d = r.data if r is not None and isinstance(r.data, dict) else {}
    d = d.get("json") if isinstance(d.get("json"), dict) else d
    return {(x["threads"], x["slice"]): x["GBps"] for x in d.get("rows", [])
            if isinstance(x, dict) and x.get("exp") == "copy" and x.get("correct") and x.get("GBps")}


def tma_comparison(results: list, backend: str) -> "Result | None":
    """The row setting the bulk-copy steps beside the portable path once both have run (None
    before): the copy engine's rows joined on (threads, slice), ring AllGather 8's time, each
    portable over bulk (above 1: bulk copies faster), and the verdict by :data:`TMA_WIN`."""
    tma = [r for r in results if r.group == "tma"]
    if len(tma) < 2:
        return None
    name = "bulk copies vs the portable path"
    if any(r.status == "n/a" for r in tma):
        return Result("tma", name, "n/a", 0.0, tma[0].summary)
    if tma[0].status == "ok" and backend != "cpu" and not bulk_copies_built(tma[0].data):
        return Result("tma", name, "n/a", 0.0, "not built with bulk copies (a GPU before sm_90): nothing to compare")
    off = _copy_rates(next((r for r in results if r.group == "slot"), None))
    on = _copy_rates(tma[0])
    copy = [{"threads": t, "slice": s, "portable_GBps": off[t, s], "bulk_GBps": on[t, s],
             "speedup": on[t, s] / off[t, s]} for (t, s) in sorted(off) if (t, s) in on]
    prog = TMA_LARGE[0]
    ag_off = next((row for r in results if r.group == "large" and r.name.startswith(f"{prog} ")
                   for row in _run_results(r.data)), None)
    ag_on = next((row for row in _run_results(tma[1].data)), None)
    ag = None
    if ag_off and ag_on and ag_off.get("time_us") and ag_on.get("time_us") and not ag_on.get("wrong") \
            and not ag_on.get("stuck"):
        ag = {"bytes": ag_on["bytes"], "portable_us": ag_off["time_us"], "bulk_us": ag_on["time_us"],
              "portable_busbw_GBps": ag_off.get("busbw_GBps"), "bulk_busbw_GBps": ag_on.get("busbw_GBps"),
              "speedup": ag_off["time_us"] / ag_on["time_us"]}
    speedups = sorted(c["speedup"] for c in copy)
    median = speedups[len(speedups) // 2] if speedups else None
    parts = [f"copy engine: median {median:.3g}x over {len(copy)} rows" if median else "copy engine: no pair of rows",
             f"{prog} {_size(ag['bytes'])}: {ag['portable_us']:,.1f} -> {ag['bulk_us']:,.1f} us, {ag['speedup']:.3g}x"
             if ag else f"{prog}: no pair of runs"]
    if median is None or ag is None:
        verdict = "undecided (a side is missing)"
    elif median >= 1 + TMA_WIN and ag["speedup"] >= 1 + TMA_WIN:
        verdict = f"bulk copies win (both >= {1 + TMA_WIN:g}x): turn HCCC_TMA on by default"
    else:
        verdict = f"the portable path stays (bulk copies must gain {TMA_WIN:.0%} on both)"
    status = "ok" if copy and ag else "failed"
    return Result("tma", name, status, 0.0, "; ".join(parts) + f"; {verdict}",
                  {"copy": copy, "allgather": ag, "copy_median_speedup": median, "verdict": verdict,
                   "win_threshold": TMA_WIN})


def plan_quick(args, workdir: Path) -> list[Step]:
    """The quick mode's steps (module docstring), in order."""
    py, me = sys.executable, str(Path(__file__).resolve())
    t = args.step_timeout
    steps = [Step("env", "environment", [py, str(HERE / "gpu_common.py"), "env"], 60.0)]
    if args.build_jobs > 0 and args.backend != "cpu":
        # the same programs and options as the steps below (the kernels are cached by content)
        synth_run = next(list(run) for _, run, synth in pathology_runs(args, workdir) if synth)
        synth_run[synth_run.index("--sizes") + 1] = args.small
        # the latency group's kernels too (the one-shot program, the fused variants), one call each
        extra = [_once(line) for _, lines in latency_runs(args) for line in lines]
        spec = {"jobs": args.build_jobs, "examples": [build_run(args, ex) for ex in args.examples] + extra,
                # the bulk-copy A/B's program, built with bulk copies (TMA_ON)
                "tma": [build_run(args, TMA_LARGE[0])] if args.backend == "cuda" else [],
                "synth": [synth_command(workdir), synth_run],
                "vs_nccl": ([py, str(HERE / "vs_nccl.py"), *vs_nccl_args(args, ranks="8"), "--build-only",
                             "--build-jobs", "2", "--workdir", str(workdir / "vs_nccl_build")]
                            if args.backend == "cuda" else None)}
        steps.append(Step("build", f"kernels of the later steps, {args.build_jobs} at a time",
                          [py, me, "--build-worker", json.dumps(spec)], 600.0))
    steps.append(Step("copy", "device copy", [py, str(HERE / "gpu_common.py"), "copy", "--backend",
                                              "cpu" if args.backend == "cpu" else "cuda",
                                              "--bytes", "16M" if args.backend == "cpu" else "1G"], 60.0))
    js = str(workdir / "slot_anatomy.json")
    steps.append(Step("slot", "slot_anatomy --quick", [py, str(SLOT_ANATOMY), "--quick", "--json", js]
                      + (["--backend", args.backend] if args.backend != "cuda" else []), 120.0, data_file=js,
                      keep_stdout=True))
    for group, runs in (("latency", latency_runs(args)), ("large", large_runs(args)), ("hm", hm_runs(args))):
        if group == "hm":
            steps += tma_steps(args, workdir)
        for name, lines in runs:
            steps.append(Step(group, name, run_worker_argv(lines), max(t, 90.0)))
    for ex in args.examples:
        steps.append(Step("examples", ex, run_worker_argv(example_runs(args, ex)), t))
    js = str(workdir / "torch_gpu_check.json")
    steps.append(Step("torch", "torch backend, 2 processes, vs gloo", torch_check_argv(args, js), 150.0,
                      data_file=js))
    js = str(workdir / "vs_nccl.json")
    steps.append(Step("vs_nccl", "vs_nccl --quick", [py, str(HERE / "vs_nccl.py"), *vs_nccl_args(args),
                                                     "--json", js, "--budget", LEFT, "--build-jobs", "0",
                                                     "--workdir", str(workdir / "vs_nccl")], 600.0, data_file=js))
    for name, run, synth in pathology_runs(args, workdir):
        steps.append(Step("pathology", name, run_worker_argv([run]), max(t, 90.0),
                          before=[run_worker_argv([synth_command(workdir)])] if synth else [],
                          creates=str(synth_output(workdir)) if synth else None))
    steps.append(Step("model", "kernel_model beside every measured row",
                      [py, me, "--model-worker", str(workdir / "model_rows.json")], 60.0))
    return steps


def _fmt_us(t) -> str:
    return f"{t:,.1f} us" if isinstance(t, (int, float)) else "-"


def _run_results(data) -> list:
    """Every ``hccc run`` result row of a run worker's output, each with its protocol and program."""
    rows = []
    for run in (data or {}).get("runs", []):
        res = run.get("result") or {}
        argv = run.get("argv") or []
        opt = {k: argv[argv.index(k) + 1] if k in argv[:-1] else None for k in ("--fuse", "--slice-size")}
        for r in res.get("results", []):
            rows.append(dict(r, algorithm=res.get("algorithm"), nranks_run=res.get("nranks"),
                             nthreads_run=res.get("nthreads"), launch=res.get("launch"),
                             program=argv[1] if len(argv) > 1 and argv[0] == "run" else None,
                             fuse=opt["--fuse"], slice=opt["--slice-size"]))
    return rows


def model_key(row: dict) -> str:
    """What identifies a measured run row to the model step."""
    return "|".join(str(row.get(k)) for k in ("program", "bytes", "proto", "inplace", "fuse", "slice"))


def model_rows(results: list) -> list:
    """Every measured ``hccc run`` row of the results so far, as the model step reads them."""
    out, seen = [], set()
    for r in results:
        if r.group in ("latency", "large", "hm", "examples", "pathology"):
            for row in _run_results(r.data):
                key = model_key(row)
                if row.get("program") and row.get("time_us") and key not in seen:
                    seen.add(key)
                    out.append({"key": key, "program": row["program"], "bytes": row["bytes"],
                                "proto": row.get("proto") or "simple", "fuse": row.get("fuse"),
                                "slice": int(row["slice"]) if str(row.get("slice") or "").isdigit() else None})
    return out


def model_worker(path: str) -> int:
    """The model step: ``benchmarks/kernel_model.py``'s prediction (today's slices, channels and
    threads) of each row in the JSON file ``path`` (``{"rows": [...], "anatomy": slot_anatomy's
    rows or null, "hbm_gbps": the copy step's or null}``), with hccc's kernel costs (the fifth
    run's units, ``predicted_us``) and, where this run's slot anatomy step measured them, this run's
    own (``kernel_model.costs_from_anatomy``: ``predicted_own_us``); one JSON object ``{"rows":
    [{"key", "predicted_us", "predicted_own_us", "error"}], "own": null or why not}``. A row the
    model cannot predict says why."""
    import kernel_model as km
    from hccc.compiler.passes import kernel_cost as kc
    from hccc.compiler.pipeline import CompileOptions, load_program
    data = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
    rows = data.get("rows", []) if isinstance(data, dict) else data
    costs = getattr(kc, "V4_H200", None)
    own, own_error = None, "no slot anatomy rows"
    anatomy = data.get("anatomy") if isinstance(data, dict) else None
    if anatomy:
        try:
            hbm = float(data.get("hbm_gbps") or 0) * 1e9 or costs.hbm_bytes_per_s
            own = km.costs_from_anatomy(anatomy, hbm_bytes_per_s=hbm, source="this run's slot anatomy")
            own_error = None
        except (ValueError, KeyError, TypeError) as exc:
            own_error = f"{type(exc).__name__}: {exc}"[:200]
    progs, out = {}, []
    for r in rows:
        try:
            key = (r["program"], r.get("fuse"))
            if key not in progs:
                progs[key] = load_program(r["program"], CompileOptions(fuse=r["fuse"]) if r.get("fuse") else None)
            t = km.predict(progs[key], int(r["bytes"]), costs, kernels="v4", sms=km.H100_SMS, proto=r["proto"],
                           slice_bytes=r.get("slice"))
            t_own = (km.predict(progs[key], int(r["bytes"]), own, kernels="v5", sms=km.H100_SMS, proto=r["proto"],
                                slice_bytes=r.get("slice")) if own is not None else None)
            out.append({"key": r["key"], "predicted_us": round(t.total * 1e6, 2),
                        "predicted_own_us": None if t_own is None else round(t_own.total * 1e6, 2), "error": None})
        except Exception as exc:      # a row the model does not cover: said, not fatal
            out.append({"key": r["key"], "predicted_us": None, "predicted_own_us": None,
                        "error": f"{type(exc).__name__}: {exc}"[:200]})
    print(json.dumps({"rows": out, "own": own_error}))
    return 0


def add_bounds(data: dict, hbm_gbps: float) -> None:
    """Each run result of a run worker's output gets ``bound_us`` (its collective's HBM bound at
    the copy's bandwidth: :func:`gpu_common.bound_us`) and ``of_bound`` (that over its time)."""
    for run in data.get("runs", []):
        for r in (run.get("result") or {}).get("results", []):
            try:
                r["bound_us"] = common.bound_us(r["collective"], r["nranks"], r["bytes"], hbm_gbps,
                                                bool(r.get("inplace")))
            except (KeyError, ValueError):
                continue
            if r.get("time_us"):
                r["of_bound"] = r["bound_us"] / r["time_us"]


def _runs_failed(data) -> str:
    """Why a run worker's command failed ('' when none did)."""
    for run in (data or {}).get("runs", []):
        if run.get("rc"):
            return f"hccc {run['argv'][0]} exit {run['rc']}: {run.get('error') or 'no result'}"
    return ""


def _size(b: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k}{unit}"
    return f"{b}B"


def summarise_quick(step: Step, data, copy_gbps: float | None) -> tuple[bool, str]:
    """(passed, one line) of a quick-mode step from its JSON."""
    if step.group == "env" and isinstance(data, dict):
        d = data
        return True, (f"{d.get('gpu') or 'no GPU'}, {d.get('sms') or '?'} SMs, {d.get('memory_gib') or '?'} GiB, "
                      f"driver {d.get('driver') or '?'}, CUDA {d.get('cuda_runtime') or '?'}, nvcc "
                      f"{d.get('nvcc') or '?'}, torch {d.get('torch') or '?'}, NCCL {d.get('nccl') or '?'}, "
                      f"CuPy {d.get('cupy') or '?'}, {d.get('cpus')} CPUs")
    if step.group == "copy" and isinstance(data, dict) and data.get("hbm_gbps"):
        return True, (f"{_size(data['bytes'])}: {data['copy_gbps']:,.1f} GB/s copied, {data['hbm_gbps']:,.1f} GB/s "
                      f"read + written ({data['timer']}, median of {data['iters']})")
    if step.group == "build" and isinstance(data, dict):
        jobs = data.get("jobs", [])
        bad = [j for j in jobs if j["status"] != "ok"]
        return not bad, (f"built {len(jobs) - len(bad)}/{len(jobs)} in {data.get('seconds', 0):.0f} s"
                         + ("; " + "; ".join(f"{j['name']}: {j['status']} {j['reason']}"[:140] for j in bad[:4])
                            if bad else ""))
    if step.group == "slot" and isinstance(data, dict):
        js = data.get("json")
        rows = js.get("rows") if isinstance(js, dict) and isinstance(js.get("rows"), list) else None
        return True, (f"{len(rows)} rows" if rows is not None else common.tail(data.get("stdout", ""), 1, 200)
                      or "done")
    if step.group == "tma" and isinstance(data, dict) and "runs" not in data:
        copies = [r for r in data.get("rows", []) if isinstance(r, dict) and r.get("exp") == "copy"]
        bad = [r for r in copies if not r.get("correct")]
        best = max((r["GBps"] for r in copies if r.get("GBps")), default=None)
        return bool(copies) and not bad, (f"bulk copies {'on' if bulk_copies_built(data) else 'not built'}: "
                                          f"{len(copies)} copy rows, {len(bad)} wrong"
                                          + (f", best {best:,.1f} GB/s" if best else ""))
    if step.group == "tma" and isinstance(data, dict):    # (a run: read as the large group's)
        return summarise_quick(Step("large", step.name, step.argv, step.timeout_s), data, copy_gbps)
    if step.group == "torch" and isinstance(data, dict):
        rows = data.get("rows", [])
        parts = [f"{r['collective']} {_size(r['bytes'])}: {r['status']}, {r['hccc_us']:,.1f} us (gloo "
                 f"{r['gloo_us']:,.1f})" for r in rows]
        return bool(data.get("ok")), "; ".join(parts) + (f"; {data['error']}" if data.get("error") else "")
    if step.group == "model" and isinstance(data, dict):
        rows = data.get("rows", [])
        bad = [r for r in rows if r.get("predicted_us") is None]
        return True, (f"{len(rows) - len(bad)}/{len(rows)} measured rows predicted"
                      + (f"; not predicted: {bad[0]['key']}: {bad[0]['error']}" if bad else "")
                      + (f"; this run's own units: {data['own']}" if data.get("own") else
                         "; also from this run's own units" if "own" in data else ""))
    if step.group in ("examples", "pathology", "latency", "large", "hm") and isinstance(data, dict):
        if step.group in ("pathology", "large", "hm") and copy_gbps:
            add_bounds(data, copy_gbps)
        rows = _run_results(data)
        parts = []
        for r in rows:
            b = r.get("busbw_GBps")
            part = (f"{r.get('proto', 'simple')}{' fuse ' + r['fuse'] if r.get('fuse') else ''} {_size(r['bytes'])} "
                    f"{'in' if r.get('inplace') else 'out'}: "
                    + (f"STUCK {r['stuck']}" if r.get("stuck") else
                       f"{r.get('wrong')} wrong, {_fmt_us(r.get('time_us'))}, "
                       + (f"{b:,.2f} GB/s" if isinstance(b, (int, float)) else "- GB/s")))
            if r.get("bound_us") and r.get("of_bound"):
                part += f"; HBM bound {r['bound_us']:,.1f} us: {r['of_bound']:.3g} of it"
            parts.append(part)
        failed = _runs_failed(data)
        bad = any(r.get("wrong") or r.get("stuck") for r in rows) or not rows or bool(failed)
        return not bad, "; ".join(parts + ([failed] if failed else []))
    if step.group == "vs_nccl" and isinstance(data, dict):
        rows = data.get("rows", [])
        mine = [r for r in rows if r["impl"] not in ("nccl", "copy bound")]
        measured = [r for r in mine if r.get("time_us")]
        wrong = [r for r in mine if r.get("wrong")]
        notrun = [r for r in mine if r["status"] == "skipped"]
        failed = [r for r in mine if r["status"] in ("failed", "timeout")]
        best = {}
        for r in measured:
            k = (r["collective"], r["nranks"])
            if r["bytes"] == max(x["bytes"] for x in measured if (x["collective"], x["nranks"]) == k) and \
                    r.get("ratio") and (k not in best or r["ratio"] > best[k]["ratio"]):
                best[k] = r
        line = ((data.get("nccl") or {}).get("line", "") + f"; {len(measured)}/{len(mine)} hccc rows measured, "
                f"{len(wrong)} wrong, {len(failed)} failed, {len(notrun)} not run")
        if best:
            line += "; best at the largest size: " + ", ".join(
                f"{c} N={n} {r['impl']} {_size(r['bytes'])} {r['busbw']:.1f} GB/s = {r['ratio']:.3g} of {r['ratio_to']}"
                for (c, n), r in best.items())
        return not wrong and not failed, line
    return True, ""


def quick_tables(results: list[Result]) -> list:
    """The report's tables after the step lines: examples, hccc vs NCCL, pathology, slot anatomy."""
    out = []
    model = next((r for r in results if r.group == "model" and isinstance(r.data, dict)), None)
    predicted = {m["key"]: m.get("predicted_us") for m in (model.data.get("rows", []) if model else [])}
    own = {m["key"]: m.get("predicted_own_us") for m in (model.data.get("rows", []) if model else [])}
    for group, title in (("latency", "Small messages (one grid, out of place)"),
                         ("large", "Bandwidth (one grid, out of place, Simple)"),
                         ("hm", "HM AllReduce 4x8 (one grid, Simple)")):
        rows = [(r, row) for r in results if r.group == group for row in _run_results(r.data)]
        if not rows:
            continue
        out += ["", f"## {title}", "",
                "| step | proto | fuse | slice | size | placement | #wrong | time (us) | model (us) | "
                "model, this run's units (us) | busbw (GB/s) | HBM bound (us) | of bound |",
                "|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r, row in rows:
            out.append(f"| {r.name} | {row.get('proto')} | {row.get('fuse') or '-'} | "
                       f"{_size(int(row['slice'])) if str(row.get('slice') or '').isdigit() else 'auto'} | "
                       f"{_size(row['bytes'])} | {'in' if row.get('inplace') else 'out of'} place | "
                       f"{'stuck' if row.get('stuck') else row.get('wrong')} | {_num(row.get('time_us'), 1)} | "
                       f"{_num(predicted.get(model_key(row)), 1)} | {_num(own.get(model_key(row)), 1)} | "
                       f"{_num(row.get('busbw_GBps'), 2)} | {_num(row.get('bound_us'), 1)} | "
                       f"{_sig(row.get('of_bound'))} |")
    ex = [(r, row) for r in results if r.group == "examples" for row in _run_results(r.data)]
    if ex:
        out += ["", "## Examples (one grid, out of place)", "",
                "| example | ranks | threads | proto | size | #wrong | time (us) | model (us) | algbw (GB/s) | "
                "busbw (GB/s) |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
        for r, row in ex:
            out.append(f"| {r.name} | {row.get('nranks_run')} | {row.get('nthreads_run')} | {row.get('proto')} | "
                       f"{_size(row['bytes'])} | {'stuck' if row.get('stuck') else row.get('wrong')} | "
                       f"{_num(row.get('time_us'), 1)} | {_num(predicted.get(model_key(row)), 1)} | "
                       f"{_num(row.get('algbw_GBps'), 2)} | {_num(row.get('busbw_GBps'), 2)} |")
    tc = next((r for r in results if r.group == "torch" and isinstance(r.data, dict)), None)
    if tc is not None and tc.data.get("rows"):
        out += ["", f"## The torch backend on {tc.data.get('device')} tensors, {tc.data.get('ranks')} processes, "
                "against gloo on CPU copies", "",
                "| call | bytes | hccc (us) | gloo (us) | status |", "|---|---:|---:|---:|---|"]
        for row in tc.data["rows"]:
            out.append(f"| {row['collective']} | {row['bytes']} | {_num(row['hccc_us'], 1)} | "
                       f"{_num(row['gloo_us'], 1)} | {row['status']} |")
    vs = next((r for r in results if r.group == "vs_nccl" and isinstance(r.data, dict)), None)
    if vs is not None:
        d = vs.data
        copy = d.get("copy") or {}
        out += ["", "## hccc vs NCCL", "", (d.get("nccl") or {}).get("line", ""), "",
                f"Device copy {copy.get('hbm_gbps', 0):,.1f} GB/s read + written; ratio: busbw over NCCL's, or over "
                "the copy bound's where NCCL did not run.", "",
                "| collective | N | impl | size | time (us) | algbw | busbw | ratio | vs | #wrong | status |",
                "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---|"]
        for row in d.get("rows", []):
            if row["impl"] == "nccl" and row["status"] == "skipped":
                continue
            st = row["status"] + (f": {row['note'][:80]}" if row["status"] not in ("ok", "skipped") else "")
            pick = " *" if row.get("catalog_pick") else ""
            out.append(f"| {row['collective']} | {row['nranks']} | {row['impl']}{pick} | {_size(row['bytes'])} | "
                       f"{_num(row.get('time_us'), 1)} | {_num(row.get('algbw'), 2)} | "
                       f"{_num(row.get('busbw'), 2)} | {_sig(row.get('ratio'))} | {row.get('ratio_to') or ''} | "
                       f"{'-' if row.get('wrong') is None else row['wrong']} | {st.replace('|', '/')} |")
        out.append("")
        out.append("`*`: the entry the torch backend's catalog picks for the call.")
    pa = [(r, row) for r in results if r.group == "pathology" for row in _run_results(r.data)]
    if pa:
        out += ["", "## Pathological programs", "",
                "| program | size | placement | #wrong | time (us) | model (us) | HBM bound (us) | of bound |",
                "|---|---:|---|---:|---:|---:|---:|---:|"]
        for r, row in pa:
            out.append(f"| {r.name} | {_size(row['bytes'])} | {'in' if row.get('inplace') else 'out of'} place | "
                       f"{'stuck' if row.get('stuck') else row.get('wrong')} | {_num(row.get('time_us'), 1)} | "
                       f"{_num(predicted.get(model_key(row)), 1)} | "
                       f"{_num(row.get('bound_us'), 1)} | {_sig(row.get('of_bound'))} |")
    ab = next((r for r in results if r.group == "tma" and r.name == "bulk copies vs the portable path"
               and isinstance(r.data, dict)), None)
    if ab is not None:
        d = ab.data
        out += ["", "## Bulk copies (HCCC_TMA=1) beside the portable path", "", d["verdict"], "",
                "| figure | threads | unit / size | portable | bulk copies | bulk over portable |",
                "|---|---:|---:|---:|---:|---:|"]
        for c in d["copy"]:
            out.append(f"| copy engine (GB/s) | {c['threads']} | {_size(c['slice'])} | {_num(c['portable_GBps'], 1)} | "
                       f"{_num(c['bulk_GBps'], 1)} | {_sig(c['speedup'])} |")
        ag = d.get("allgather")
        if ag:
            out.append(f"| {TMA_LARGE[0]} (us) | - | {_size(ag['bytes'])} | {_num(ag['portable_us'], 1)} | "
                       f"{_num(ag['bulk_us'], 1)} | {_sig(ag['speedup'])} |")
    slot = next((r for r in results if r.group == "slot" and r.status != "n/a"), None)
    if slot is not None and isinstance(slot.data, dict) and slot.data.get("stdout"):
        out += ["", "## Slot anatomy", "", "```", slot.data["stdout"].rstrip(), "```"]
    return out


def _num(v, digits: int) -> str:
    return f"{v:,.{digits}f}" if isinstance(v, (int, float)) else "-"


def _sig(v) -> str:
    """Three significant digits (a ratio of the CPU emulation is tiny, a GPU's near 1)."""
    return f"{v:.3g}" if isinstance(v, (int, float)) else "-"


def run_worker(runs: list) -> int:
    """Each ``hccc`` command line of ``runs`` in this process (imports and the device context made
    once), in order, stopping at the first that fails; one JSON object: {"runs": [{"argv", "rc",
    "result" (its --json output), "error"}]}."""
    import contextlib
    import io

    from hccc.cli import main as hccc_main
    out = []
    for argv in runs:
        buf, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
            try:
                rc = hccc_main(list(argv))
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
        out.append({"argv": argv, "rc": rc, "result": common.last_json(buf.getvalue()),
                    "error": common.tail(err.getvalue(), 1, 300) or None})
        sys.stderr.write(err.getvalue())
        if rc:
            break
    print(json.dumps({"runs": out}))
    return 0 if all(r["rc"] == 0 for r in out) else 1


def build_worker(spec: dict) -> int:
    """The build step: every example's kernels (a run at the small size), the synthesised program
    and its table kernels, and vs_nccl's (its --build-only), ``jobs`` at a time."""
    t0 = time.monotonic()
    jobs = [(f"example {Path(run[1]).stem}", run_worker_argv([run]), {}) for run in spec["examples"]]
    jobs += [(f"example {Path(run[1]).stem}, bulk copies", run_worker_argv([run]), dict(TMA_ON))
             for run in spec.get("tma", [])]
    jobs.append(("synth h20_4_8 allgather + table kernels", run_worker_argv(spec["synth"]), {}))
    if spec.get("vs_nccl"):
        jobs.append(("vs_nccl --build-only", spec["vs_nccl"], {}))
    order = sorted(range(len(jobs)), key=lambda i: ("4x8" not in jobs[i][0], "synth" not in jobs[i][0],
                                                    "vs_nccl" not in jobs[i][0], i))   # the longest first
    results = common.run_parallel([(jobs[i][1], 3600.0, jobs[i][2]) for i in order], spec["jobs"])
    out = [None] * len(jobs)
    for i, res in zip(order, results):
        out[i] = {"name": jobs[i][0], "status": res.status, "seconds": round(res.seconds, 1), "reason": res.why()}
    print(json.dumps({"jobs": out, "seconds": time.monotonic() - t0}))
    return 0 if all(j["status"] == "ok" for j in out) else 1


def report_text(results: list[Result], args, device: str, started: str) -> str:
    ok = sum(r.status in PASSING for r in results)
    lines = [f"# hccc GPU validation: {device}", "",
             f"backend {args.backend}{', quick' if getattr(args, 'quick', False) else ''}, started {started}, "
             f"{ok}/{len(results)} steps passed, {sum(r.seconds for r in results):.0f} s", "",
             "| step | name | status | seconds | result |", "|---|---|---|---:|---|"]
    for r in results:
        lines.append(f"| {r.group} | {r.name} | {r.status} | {r.seconds:.1f} | {r.summary.replace('|', '/')} |")
    if getattr(args, "quick", False):
        lines += quick_tables(results)
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


def _write(results: list, args, device: str, started: str) -> None:
    Path(args.report).write_text(report_text(results, args, device, started))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "backend": args.backend, "started": started,
                                               "mode": "quick" if args.quick else "full", "budget": args.budget,
                                               "steps": [asdict(r) for r in results]}, indent=1))


def _log(r: Result) -> None:
    print(f"{r.status:>8}  {r.group}: {r.name}  {r.summary}", file=sys.stderr)


def run_quick(args, started: str) -> list[Result]:
    """The quick mode: each group's steps within its share of the budget (module docstring)."""
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="hccc-gpu-validate-"))
    workdir.mkdir(parents=True, exist_ok=True)
    budget = common.Budget(args.budget)
    steps = plan_quick(args, workdir)
    groups = [g for g in QUICK_GROUPS if any(s.group == g for s in steps)]
    share = {g: QUICK_GROUPS[g] / sum(QUICK_GROUPS[h] for h in groups) * args.budget for g in groups}
    results: list[Result] = []
    device = "CPU emulation" if args.backend == "cpu" else args.backend
    copy_gbps = None
    for step in steps:
        later = sum(share[g] for g in groups[groups.index(step.group) + 1:])
        left = budget.left() - later           # what this group may spend: the later groups keep their shares
        if (step.group == "slot" or step.argv[1:2] == [str(SLOT_ANATOMY)]) and not Path(step.argv[1]).is_file():
            r = Result(step.group, step.name, "n/a", 0.0,
                       f"not available (benchmarks/{Path(step.argv[1]).name} is not in this checkout)")
        elif left < 1.0:
            r = Result(step.group, step.name, "skipped", 0.0, common.NOT_RUN)
        elif step.group == "vs_nccl" and args.backend not in ("cuda", "cpu"):
            r = Result(step.group, step.name, "n/a", 0.0, f"not available on {args.backend} (vs_nccl runs CUDA)")
        elif step.group == "tma" and args.backend not in ("cuda", "cpu"):
            r = Result(step.group, step.name, "n/a", 0.0, f"not available on {args.backend} (no bulk copies)")
        else:
            if step.group == "model":        # the rows measured so far, for the model to predict
                slot = next((x for x in results if x.group == "slot" and isinstance(x.data, dict)), None)
                js = slot.data.get("json") if slot is not None else None
                anatomy = js.get("rows") if isinstance(js, dict) else None
                Path(step.argv[-1]).write_text(json.dumps({"rows": model_rows(results), "anatomy": anatomy,
                                                           "hbm_gbps": copy_gbps}))
            r = run_step(step, left, lambda st, d, c=copy_gbps: summarise_quick(st, d, c))
        if step.group == "env" and isinstance(r.data, dict) and r.data.get("gpu"):
            device = r.data["gpu"]
        if step.group == "copy" and isinstance(r.data, dict):
            copy_gbps = r.data.get("hbm_gbps")
        results.append(r)
        _log(r)
        if step.group == "tma" and not any(x.name == "bulk copies vs the portable path" for x in results):
            row = tma_comparison(results, args.backend)
            if row is not None:
                results.append(row)
                _log(row)
        _write(results, args, device, started)
    return results


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "--model-worker":
        return model_worker(argv[1])
    if len(argv) == 2 and argv[0] in ("--run-worker", "--build-worker"):
        spec = json.loads(argv[1])
        return run_worker(spec) if argv[0] == "--run-worker" else build_worker(spec)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "hip", "cpu"), default="cuda")
    ap.add_argument("--quick", action="store_true", help="what one short lease answers, in about 6 minutes")
    ap.add_argument("--report", default="gpu_validate.md", help="Markdown report (default gpu_validate.md)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument("--small", default=None, help="the small size (default 4K)")
    ap.add_argument("--large", default=None, help="the large size (default 64M; quick 32M)")
    ap.add_argument("--iters", type=int, default=None, help="timed runs per size (default 5; quick 3)")
    ap.add_argument("--examples", type=_names, default=None,
                    help="examples to run (default: a list of twelve; quick: every example)")
    ap.add_argument("--step-timeout", type=float, default=None, help="seconds per step (default 120; quick 40)")
    ap.add_argument("--budget", type=float, default=None,
                    help=f"seconds for the whole validation (default 480; quick {QUICK_BUDGET_S:.0f})")
    ap.add_argument("--skip", type=_names, default=[], help=f"steps to leave out ({', '.join(STEPS)})")
    ap.add_argument("--latency-iters", type=int, default=20, help="timed iterations of each latency step")
    ap.add_argument("--build-jobs", type=int, default=8, help="quick: kernel builds at once before timing (0: none)")
    ap.add_argument("--kernel-timeout", type=float, default=20.0,
                    help="quick: seconds a kernel waits before it reports itself stuck")
    ap.add_argument("--workdir", default=None, help="quick: where the steps write (default: a temporary directory)")
    args = ap.parse_args(argv)
    q = args.quick
    args.small = args.small or "4K"
    args.large = args.large or ("32M" if q else "64M")
    args.iters = args.iters if args.iters is not None else (3 if q else 5)
    args.examples = args.examples if args.examples is not None else (all_examples() if q else list(EXAMPLES))
    args.step_timeout = args.step_timeout if args.step_timeout is not None else (40.0 if q else 120.0)
    args.budget = args.budget if args.budget is not None else (QUICK_BUDGET_S if q else 480.0)
    from hccc.args import parse_size
    bad = [s for s in args.skip if s not in STEPS]
    unknown = [e for e in args.examples if not (ROOT / "examples" / f"{e}.rccl").is_file()]
    try:
        sizes_ok = parse_size(args.small) > 0 and parse_size(args.large) > 0
    except (ValueError, argparse.ArgumentTypeError):
        sizes_ok = False
    if (bad or unknown or not sizes_ok or args.step_timeout <= 0 or args.budget <= 0 or args.iters < 1
            or args.latency_iters < 1 or args.build_jobs < 0 or args.kernel_timeout <= 0
            or (q and args.skip)):
        why = (f"unknown step {bad[0]!r} (steps: {', '.join(STEPS)})" if bad else
               f"no example {unknown[0]!r} in examples/" if unknown else
               "--small / --large must be sizes such as 4K or 64M" if not sizes_ok else
               "--skip is for the full mode (--quick runs its own steps)" if q and args.skip else
               "--build-jobs must be at least 0" if args.build_jobs < 0 else
               "--step-timeout, --budget, --iters, --kernel-timeout and --latency-iters must be positive")
        print(f"gpu_validate: error: {why}", file=sys.stderr)
        return 2
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    if q:
        results = run_quick(args, started)
        device = next((r.data["gpu"] for r in results if r.group == "env" and isinstance(r.data, dict)
                       and r.data.get("gpu")), "CPU emulation" if args.backend == "cpu" else args.backend)
        print(report_text(results, args, device, started))
        return 0 if all(r.status in PASSING for r in results) else 1
    device = device_name(args.backend)
    deadline = time.monotonic() + args.budget
    results: list[Result] = []
    for step in plan(args):
        left = deadline - time.monotonic()
        if left <= 0:
            results.append(Result(step.group, step.name, "skipped", 0.0, common.NOT_RUN))
        else:
            results.append(run_step(step, left))
        _log(results[-1])
        if step.group == "latency" and not any(r.name.endswith("LL vs Simple") for r in results):
            row = latency_comparison(results)
            if row is not None:
                results.append(row)
                _log(row)
        _write(results, args, device, started)
    print(report_text(results, args, device, started))
    return 0 if all(r.status == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
