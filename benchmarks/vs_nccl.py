"""hccc and NCCL side by side on one GPU: AllReduce, AllGather and ReduceScatter, N processes sharing it.

    python benchmarks/vs_nccl.py [--backend cuda|cpu] [--ranks 2,4,8] [--quick | --sizes 4K,...,256M]
                                 [--collectives allreduce,allgather,reducescatter]
                                 [--impls nccl,comm-ring,comm-direct,grid-ring,grid-direct]
                                 [--iters N] [--warmup N] [--proto auto|simple|ll] [--step-timeout S]
                                 [--budget S] [--build-jobs J] [--build-only] [--nccl-lib PATH]
                                 [--force-nccl] [--json PATH]

Implementations (``--impls``), float32 sum, for each rank count N (``--ranks``) and size:

* ``nccl``: ``torch.distributed`` with the ``nccl`` backend, N processes on GPU 0, with
  ``NCCL_MULTI_RANK_GPU_ENABLE=1`` (``all_reduce`` in place, ``all_gather_into_tensor``,
  ``reduce_scatter_tensor``). Several ranks of one communicator on one GPU need NCCL 2.30 or later:
  the script asks a worker with the same environment which NCCL torch loads
  (``torch.cuda.nccl.version()``) and, below 2.30, says so and compares hccc with the copy bound
  only. An NCCL rank that fails anyway (at init or later) is reported with its reason; the rest
  runs. ``--nccl-lib PATH`` preloads another ``libnccl.so.2`` (``LD_PRELOAD``) into the NCCL
  workers (and into the version probe); ``--force-nccl`` runs NCCL whatever its version (on the
  CPU backend gloo stands in for it, which tests this side of the script).
* ``comm-ring``, ``comm-direct``: ``hccc.Communicator``, one rank per process (CUDA IPC between
  the processes on a GPU; POSIX shared memory on the CPU emulation), with the ring and the direct
  (full-mesh) algorithm of an algorithm catalog written for N ranks (the torch backend's catalog,
  ``hccc.catalog``; ``pick`` marks the entry the backend would choose for the call). AllReduce
  runs out of place (``out=``), ``proto`` per call as the backend's (``--proto auto``: LL up to the
  crossover).
* ``grid-ring``, ``grid-direct``: the same programs through the launcher behind ``hccc run``
  (``hccc.runtime.launcher.Runner``): every rank in one process and one cooperative launch.

Timing: after ``--warmup`` calls, ``--iters`` calls each between two CUDA events on the caller's
stream (on the CPU emulation, the host clock). A Communicator call returns when its kernel is done
(host barriers around it), so its events hold the whole call; NCCL's calls are queued back to
back. Per iteration the slowest rank's time counts; a row's time is the median over the
iterations. The launcher's rows are the median of single launches (its events hold the kernel).
Every implementation's result is checked once per size against a torch reference (small
integers, exact in float32): the first call's output; ``#wrong`` counts the wrong elements over
all ranks.

Columns follow nccl-tests: size (the collective's full buffer S), count (S / 4), type, time (us),
algbw = S / time, busbw = algbw x 2(N-1)/N (AllReduce) or (N-1)/N; ``ratio`` is the row's busbw
over NCCL's at the same point, or, where NCCL did not run, over the copy bound's (``vs`` says
which; NCCL's own rows are against the bound).

The copy bound. A device-to-device copy of ``--copy-bytes`` (default 1 GiB) measured in the same
run gives the HBM bandwidth ``B`` (bytes read + written per second). All N ranks share one GPU's
memory, so a collective of size S moves at least H bytes through it (out of place)::

    AllReduce      H = 2 N S     (read every rank's input, write every rank's output)
    AllGather      H = (N+1) S   (read each S/N input once, write N outputs of S)
    ReduceScatter  H = (N+1) S   (read N inputs of S, write N outputs of S/N)

and cannot take less than ``t_bound = H / B``; the ``copy bound`` rows give that time and the busbw
it would reach (``benchmarks/gpu_common.py`` has the formula for every collective).

Each measurement is a step in a process group of its own with its own timeout (``--step-timeout``;
``--budget`` caps the whole run): one (implementation, collective, N) at every size; its workers
write a line per size as they finish, so a step that hangs or fails costs its own remaining
sizes only, reported in its rows; what does not fit the budget is reported "not run (budget
spent)". On CUDA, a build pass first runs every hccc step at the smallest size ``--build-jobs`` at a
time (kernels are built once and cached; nothing is timed then); ``--build-only`` stops after it.

``--backend cpu`` runs the hccc side on the CPU emulation (default sizes 4K,64K, N = 2,4; the times
are the emulator's) and reports NCCL as "no CUDA GPU: skipped": that is how the script is tested
without a GPU. Output: a table on stdout (``rich``), every row in ``--json PATH``. Exit status 0 when
every step that ran passed with every element right, 1 otherwise and for bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import gpu_common as common  # noqa: E402

IMPLS = ("nccl", "comm-ring", "comm-direct", "grid-ring", "grid-direct")
COLLECTIVES = ("allreduce", "allgather", "reducescatter")
DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,256M"
QUICK_SIZES = "4K,1M,64M"
CPU_SIZES = "4K,64K"
BOUND = "copy bound"
#: the catalog's file name of (algorithm, collective, N)
ENTRY = "{algo}_{coll}_{n}.rccl"
_OPTYPE = {"allreduce": "Allreduce", "allgather": "Allgather", "reducescatter": "Reducescatter"}


class UsageError(Exception):
    """A bad argument: message, exit status 1."""


# ------------------------------------------------------------------------------ the catalog
def _direct_text(coll: str, n: int, name: str) -> str:
    """ResCCLang of the full-mesh ReduceScatter / AllReduce (``generators.direct_reducescatter`` /
    ``direct_allreduce``): at step o rank s reduces chunk (s+o+1)%N into its owner; AllReduce then
    sends every reduced chunk to every rank in one step."""
    head = (f'def ResCCLAlgo(nRanks={n}, nChannels=1, nWarps=16, AlgoName="{name}", '
            f'OpType="{_OPTYPE[coll]}", GPUPerNode={n}, NICPerNode=1):\n    N = {n}\n')
    rs = ("    # full mesh: at step o every rank reduces chunk (s + o + 1) % N into the rank that owns it\n"
          "    for s in range(0, N):\n"
          "        for o in range(0, N - 1):\n"
          "            transfer(s, (s + o + 1) % N, o, (s + o + 1) % N, rrc)\n")
    if coll == "reducescatter":
        return head + rs
    return head + rs + ("    # then every rank sends its reduced chunk to every other rank, all at step N - 1\n"
                        "    for r in range(0, N):\n"
                        "        for o in range(0, N - 1):\n"
                        "            transfer(r, (r + o + 1) % N, N - 1, r, recv)\n")


def entry_text(algo: str, coll: str, n: int) -> str:
    from hccc.compiler.frontend import generators as gen
    name = ENTRY.format(algo=algo, coll=coll, n=n)[:-5]
    if algo == "ring":
        return {"allreduce": gen.ring_allreduce_rccl, "allgather": gen.ring_allgather_rccl,
                "reducescatter": gen.ring_reducescatter_rccl}[coll](n, name=name)
    if coll == "allgather":
        return gen.direct_allgather_rccl(n, name=name)
    return _direct_text(coll, n, name)


def write_catalog(directory: Path, n: int, collectives=COLLECTIVES) -> Path:
    """The catalog of ``n`` ranks: ring and direct algorithm of every collective."""
    directory.mkdir(parents=True, exist_ok=True)
    for coll in collectives:
        for algo in ("ring", "direct"):
            (directory / ENTRY.format(algo=algo, coll=coll, n=n)).write_text(
                f"# {algo} {coll}, {n} ranks: written by benchmarks/vs_nccl.py\n" + entry_text(algo, coll, n))
    return directory


# ------------------------------------------------------------------------------ steps
@dataclass
class Step:
    impl: str
    coll: str
    n: int
    sizes: list
    ident: str
    argv: list = field(default_factory=list)
    env: dict = field(default_factory=dict)
    timeout_s: float | None = None       # None: --step-timeout


@dataclass
class StepRecord:
    ident: str
    impl: str
    coll: str
    n: int
    status: str          # ok | failed | timeout | skipped
    seconds: float
    reason: str = ""


def algo_of(impl: str) -> str:
    return impl.split("-", 1)[1] if "-" in impl else impl


def step_spec(args, impl: str, coll: str, n: int, sizes: list, workdir: Path, ident: str) -> dict:
    return {"impl": impl, "coll": coll, "n": n, "sizes": list(sizes), "iters": args.iters,
            "warmup": args.warmup, "backend": args.backend, "dir": str(workdir / ident),
            "catalog": str(workdir / f"catalog{n}"), "entry": ENTRY.format(algo=algo_of(impl), coll=coll, n=n),
            "timeout": args.kernel_timeout, "proto": args.proto}


def step_command(spec: dict) -> list:
    """The command of one step (a coordinator of N rank processes, or the one-grid runner)."""
    return [sys.executable, str(Path(__file__).resolve()), "--step-worker", json.dumps(spec)]


def nccl_env(args) -> dict:
    env = dict(common.NCCL_MULTI_RANK_ENV)
    if args.nccl_lib:
        pre = os.environ.get("LD_PRELOAD", "")
        env["LD_PRELOAD"] = str(Path(args.nccl_lib).resolve()) + (":" + pre if pre else "")
    return env


def plan(args, workdir: Path, nccl_runs: bool) -> list[Step]:
    """Every (implementation, collective, N) step, N in the order given."""
    steps = []
    for n in args.ranks:
        for coll in args.collectives:
            for impl in args.impls:
                if impl == "nccl" and not nccl_runs:
                    continue
                ident = f"{impl}-{coll}-{n}"
                spec = step_spec(args, impl, coll, n, args.sizes, workdir, ident)
                steps.append(Step(impl, coll, n, list(args.sizes), ident, step_command(spec),
                                  nccl_env(args) if impl == "nccl" else {}))
    return steps


def build_steps(args, workdir: Path) -> list[Step]:
    """Every hccc step at the smallest size, one call (the build pass)."""
    out = []
    small = [min(args.sizes)]
    b = argparse.Namespace(**vars(args))
    b.iters, b.warmup = 1, 0
    for n in args.ranks:
        for coll in args.collectives:
            for impl in args.impls:
                if impl == "nccl":
                    continue
                ident = f"build-{impl}-{coll}-{n}"
                out.append(Step(impl, coll, n, small, ident, step_command(step_spec(b, impl, coll, n, small,
                                                                                        workdir, ident))))
    return out


# ------------------------------------------------------------------------------ results
def read_lines(directory: Path) -> dict:
    """{worker file stem: [its JSON lines]} of a step's directory."""
    out = {}
    if directory.is_dir():
        for p in sorted(directory.glob("*.jsonl")):
            out[p.stem] = common.json_lines(p.read_text(errors="replace"))
    return out


def combine(lines: dict, n: int, sizes: list, impl: str) -> dict:
    """{size: measurement} from a step's worker lines: for the N rank files, the sizes every rank
    reported (time per iteration: the slowest rank's; then the median; wrong elements summed);
    for the one-grid runner its own lines. A size some worker reported an error for carries it."""
    out: dict = {}
    if impl.startswith("grid"):
        for ln in lines.get("grid", []):
            if "size" in ln:
                out[int(ln["size"])] = _measurement([ln])
        return out
    ranks = [lines.get(f"rank{r}", []) for r in range(n)]
    for size in sizes:
        per = [next((ln for ln in rl if ln.get("size") == size), None) for rl in ranks]
        if all(p is not None for p in per):
            out[size] = _measurement(per)
    return out


def _measurement(per: list) -> dict:
    errors = [p["error"] for p in per if p.get("error")]
    m = {"wrong": sum(int(p.get("wrong", 0)) for p in per), "error": errors[0] if errors else None,
         "first_wrong": next((p["first_wrong"] for p in per if p.get("first_wrong")), None),
         "proto": per[0].get("proto"), "time_us": None, "iters": 0}
    series = [p.get("times_us") or [] for p in per]
    k = min(len(s) for s in series) if series else 0
    if k and not errors:
        m["time_us"] = common.median([max(s[i] for s in series) for i in range(k)])
        m["iters"] = k
    for key in ("launch", "nthreads"):
        if key in per[0]:
            m[key] = per[0][key]
    return m


def worker_error(lines: dict) -> str:
    """The first error a worker wrote (rank files in rank order)."""
    for stem in sorted(lines):
        for ln in lines[stem]:
            if ln.get("error"):
                return f"{stem}: {ln['error']}"
    return ""


def make_row(coll: str, n: int, impl: str, size: int, m: dict | None, status: str, note: str = "") -> dict:
    row = {"collective": coll, "nranks": n, "impl": impl, "algorithm": "nccl" if impl == "nccl" else
           (ENTRY.format(algo=algo_of(impl), coll=coll, n=n)[:-5] if impl != BOUND else BOUND),
           "bytes": size, "count": size // 4, "type": "float", "time_us": None, "algbw": None, "busbw": None,
           "ratio": None, "ratio_to": None, "wrong": None, "status": status, "note": note, "proto": None,
           "iters": 0, "catalog_pick": None}
    if m:
        row.update(wrong=m.get("wrong"), proto=m.get("proto"), iters=m.get("iters", 0))
        for key in ("launch", "nthreads"):
            if key in m:
                row[key] = m[key]
        if m.get("error"):
            row.update(status="failed", note=m["error"])
        elif m.get("wrong"):
            row.update(status="wrong", note=m.get("first_wrong") or "")
        if m.get("time_us"):
            set_time(row, m["time_us"])
    return row


def set_time(row: dict, time_us: float) -> None:
    row["time_us"] = float(time_us)
    row["algbw"] = row["bytes"] / (time_us * 1e3)
    row["busbw"] = common.busbw_gbps(row["collective"], row["nranks"], row["bytes"], time_us)


def add_bounds_and_ratios(rows: list, hbm_gbps: float | None) -> list:
    """A ``copy bound`` row per (collective, N, size) (when the copy was measured), and every
    measured row's ratio: hccc over NCCL where NCCL has a time at that point, else over the bound;
    NCCL over the bound."""
    out = []
    keys = []
    for r in rows:
        k = (r["collective"], r["nranks"], r["bytes"])
        if k not in keys:
            keys.append(k)
    bound = {}
    if hbm_gbps:
        for coll, n, size in keys:
            b = make_row(coll, n, BOUND, size, None, "ok", f"H = {common.hbm_bytes(coll, n, size)} B at "
                                                            f"{hbm_gbps:.0f} GB/s")
            set_time(b, common.bound_us(coll, n, size, hbm_gbps))
            bound[(coll, n, size)] = b
    nccl = {(r["collective"], r["nranks"], r["bytes"]): r for r in rows
            if r["impl"] == "nccl" and r["busbw"] and r["status"] == "ok"}
    for k in keys:
        if k in bound:
            out.append(bound[k])
        for r in rows:
            if (r["collective"], r["nranks"], r["bytes"]) != k:
                continue
            if r["busbw"]:
                ref = nccl.get(k) if r["impl"] != "nccl" else None
                if ref is not None:
                    r.update(ratio=r["busbw"] / ref["busbw"], ratio_to="nccl")
                elif k in bound:
                    r.update(ratio=r["busbw"] / bound[k]["busbw"], ratio_to=BOUND)
            out.append(r)
    return out


def nccl_decision(backend: str, probe: dict | None, probe_error: str = "") -> tuple[bool, str, tuple | None]:
    """(whether NCCL runs, the line that says why, its version) from the probe worker's answer."""
    if backend != "cuda":
        return False, f"no CUDA GPU: skipped (--backend {backend})", None
    if probe is None:
        return False, f"NCCL not probed ({probe_error or 'no answer'}): skipped", None
    if not probe.get("cuda"):
        return False, "no CUDA GPU: skipped", common.nccl_version(probe.get("nccl"))
    runs, line = common.nccl_gate(probe.get("nccl"))
    return runs, line, common.nccl_version(probe.get("nccl"))


# ------------------------------------------------------------------------------ output
def _size(b: int) -> str:
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k}{unit}"
    return f"{b}B"


def print_table(rows: list, title: str, lines: list) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=max(140, shutil.get_terminal_size((140, 40)).columns))
    for ln in lines:
        con.print(ln, markup=False, highlight=False)
    t = Table(title=title)
    for col in ("collective", "N", "impl", "size", "count", "type", "time (us)", "algbw", "busbw", "ratio", "vs",
                "#wrong", "note"):
        t.add_column(col, justify="left" if col in ("collective", "impl", "vs", "note", "type") else "right")
    for i, r in enumerate(rows):
        group = (r["collective"], r["nranks"])
        last = i + 1 == len(rows) or (rows[i + 1]["collective"], rows[i + 1]["nranks"]) != group
        note = "" if r["status"] == "ok" else r["status"] if r["status"] == "skipped" or not r["note"] else \
            f"{r['status']}: {r['note']}"
        t.add_row(r["collective"], str(r["nranks"]), r["impl"] + (" *" if r.get("catalog_pick") else ""),
                  _size(r["bytes"]), str(r["count"]), r["type"],
                  f"{r['time_us']:.1f}" if r["time_us"] else "-", f"{r['algbw']:.2f}" if r["algbw"] else "-",
                  f"{r['busbw']:.2f}" if r["busbw"] else "-", f"{r['ratio']:.3g}" if r["ratio"] else "-",
                  r["ratio_to"] or "", "-" if r["wrong"] is None else str(r["wrong"]), note[:100], end_section=last)
    con.print(t)
    con.print("* the entry the torch backend's catalog picks for the call", markup=False, highlight=False)


# ------------------------------------------------------------------------------ workers
def _pattern(torch, rank: int, count: int, device: str, offset: int = 0):
    """Small integers (-8..8) of ``rank``: sums over 8 ranks stay exact in float32."""
    i = torch.arange(offset, offset + count, device=device, dtype=torch.int64)
    return ((i * 7 + rank * 13) % 17 - 8).to(torch.float32)


def _buffers(torch, coll: str, n: int, rank: int, count: int, device: str):
    """(input, output, expected output) of ``rank`` for a call of ``count`` elements (the full buffer)."""
    c = count // n
    if coll == "allreduce":
        x = _pattern(torch, rank, count, device)
        want = sum(_pattern(torch, q, count, device) for q in range(n))
        return x, torch.empty_like(x), want
    if coll == "allgather":
        x = _pattern(torch, rank, c, device)
        want = torch.cat([_pattern(torch, q, c, device) for q in range(n)])
        return x, torch.empty(count, dtype=torch.float32, device=device), want
    x = _pattern(torch, rank, count, device)
    want = sum(_pattern(torch, q, c, device, offset=rank * c) for q in range(n))
    return x, torch.empty(c, dtype=torch.float32, device=device), want


class _Timer:
    def __init__(self, torch, cuda: bool):
        self.torch, self.cuda = torch, cuda
        self.marks = []

    def around(self, fn):
        if self.cuda:
            a = self.torch.cuda.Event(enable_timing=True)
            b = self.torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            self.marks.append((a, b))
        else:
            t0 = time.perf_counter()
            fn()
            self.marks.append(time.perf_counter() - t0)

    def times_us(self) -> list:
        if self.cuda:
            self.torch.cuda.synchronize()
            return [a.elapsed_time(b) * 1e3 for a, b in self.marks]
        return [t * 1e6 for t in self.marks]


def _wrong(torch, got, want) -> tuple[int, str | None]:
    bad = (got != want)
    k = int(bad.sum().item())
    if not k:
        return 0, None
    i = int(bad.nonzero()[0].item())
    return k, f"element {i}: got {float(got[i])}, expected {float(want[i])}"


def rank_worker(spec: dict) -> int:
    """One rank of a Communicator or NCCL step: a JSON line per size into ``dir/rank{r}.jsonl``."""
    rank, n, coll, impl = spec["rank"], spec["n"], spec["coll"], spec["impl"]
    out = open(Path(spec["dir"]) / f"rank{rank}.jsonl", "a", buffering=1)
    try:
        import torch
        cuda = spec["backend"] == "cuda"
        device = "cuda" if cuda else "cpu"
        if cuda:
            torch.cuda.set_device(0)
        url = f"file://{spec['dir']}/store"
        proto = lambda: None  # noqa: E731
        if impl == "nccl":
            import warnings

            import torch.distributed as dist
            warnings.simplefilter("ignore", FutureWarning)       # reduce_scatter_tensor's new name
            if cuda:
                dist.init_process_group("nccl", init_method=url, rank=rank, world_size=n,
                                        device_id=torch.device("cuda", 0))
            else:                                                  # the CPU backend's stand-in
                dist.init_process_group("gloo", init_method=url, rank=rank, world_size=n)
            if coll == "allreduce":
                def call(x, y):
                    dist.all_reduce(x)
            elif coll == "allgather":
                def call(x, y):
                    dist.all_gather_into_tensor(y, x)
            else:
                def call(x, y):
                    dist.reduce_scatter_tensor(y, x)
        else:
            from hccc.catalog import Catalog
            from hccc.runtime.communicator import Communicator
            entry = next(e for e in Catalog.load(spec["catalog"]).entries if e.name == spec["entry"])
            comm = Communicator(entry.ir, rank=rank, world_size=n, init_method=url, backend=spec["backend"],
                                device=0 if cuda else None, timeout_s=max(60.0, spec["timeout"]),
                                kernel_timeout_s=spec["timeout"], proto=spec["proto"])
            proto = lambda: comm.last_proto  # noqa: E731
            if coll == "allreduce":
                def call(x, y):
                    comm.all_reduce(x, out=y)
            elif coll == "allgather":
                def call(x, y):
                    comm.all_gather(x, y)
            else:
                def call(x, y):
                    comm.reduce_scatter(x, y)
        for size in spec["sizes"]:
            x, y, want = _buffers(torch, coll, n, rank, size // 4, device)
            call(x, y)                                  # the checked call
            got = x if (impl == "nccl" and coll == "allreduce") else y
            if cuda:
                torch.cuda.synchronize()
            wrong, first = _wrong(torch, got, want)
            if impl == "nccl" and coll == "allreduce":
                x.zero_()                               # in place: keep the timed calls' values finite
            for _ in range(spec["warmup"]):
                call(x, y)
            timer = _Timer(torch, cuda)
            for _ in range(spec["iters"]):
                timer.around(lambda: call(x, y))
            out.write(json.dumps({"size": size, "times_us": timer.times_us(), "wrong": wrong,
                                  "first_wrong": first, "proto": proto() or ("nccl" if impl == "nccl" else None)})
                      + "\n")
            del x, y, want
        if impl == "nccl":
            import torch.distributed as dist
            dist.destroy_process_group()
        else:
            comm.close()
        return 0
    except BaseException as exc:      # reported through the file, and the exit status
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
        out.write(json.dumps({"error": msg}) + "\n")
        print(f"rank {rank}: {msg}", file=sys.stderr)
        return 1


def grid_worker(spec: dict) -> int:
    """The one-grid runner of a step: a JSON line per size into ``dir/grid.jsonl``."""
    out = open(Path(spec["dir"]) / "grid.jsonl", "a", buffering=1)
    os.environ.setdefault("HCCC_CUDA_DEVICES", "1")      # every rank on GPU 0
    try:
        import numpy as np

        from hccc.catalog import Catalog
        from hccc.runtime.launcher import Runner
        entry = next(e for e in Catalog.load(spec["catalog"]).entries if e.name == spec["entry"])
        with Runner(entry.ir, spec["backend"], "float32", "sum", timeout_s=spec["timeout"]) as runner:
            for size in spec["sizes"]:
                count = size // 4
                lay = runner.layout(count)
                inputs = [((np.arange(lay[r][0], dtype=np.int64) * 7 + r * 13) % 17 - 8).astype(np.float32)
                          for r in range(len(lay))]
                res = runner.run(size, iters=1, warmup=spec["warmup"], inputs=inputs, proto=spec["proto"])
                line = {"size": size, "wrong": int(res.wrong), "first_wrong": res.first_wrong, "proto": res.proto,
                        "launch": "grid" if getattr(runner, "grid_fn", None) is not None else "per-rank",
                        "nthreads": int(res.nthreads), "times_us": []}
                if res.stuck or not res.iters:
                    line["error"] = f"stuck: {res.stuck}" if res.stuck else "no iteration completed"
                else:
                    line["times_us"] = [float(res.time_us)]
                    for _ in range(spec["iters"] - 1):
                        more = runner.run(size, iters=1, inputs=inputs, check=False, proto=spec["proto"])
                        if more.stuck or not more.iters:
                            line["error"] = f"stuck in a timed call: {more.stuck or 'no iteration completed'}"
                            break
                        line["times_us"].append(float(more.time_us))
                out.write(json.dumps(line) + "\n")
        return 0
    except BaseException as exc:
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
        out.write(json.dumps({"error": msg}) + "\n")
        print(msg, file=sys.stderr)
        return 1


def step_worker(spec: dict) -> int:
    """A step: the one-grid runner, or N rank processes (the first to fail ends the others)."""
    d = Path(spec["dir"])
    d.mkdir(parents=True, exist_ok=True)
    if spec["impl"].startswith("grid"):
        rc = grid_worker(spec)
        print(json.dumps({"ok": rc == 0, "error": worker_error(read_lines(d)) or None}))
        return rc
    procs = []
    for r in range(spec["n"]):
        err = open(d / f"rank{r}.err", "w")
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--rank-worker",
                                       json.dumps(dict(spec, rank=r))], stdout=subprocess.DEVNULL, stderr=err))
    failed = None
    while failed is None and any(p.poll() is None for p in procs):
        for r, p in enumerate(procs):
            if p.poll() not in (None, 0):
                failed = r
                break
        time.sleep(0.05)
    if failed is None:
        failed = next((r for r, p in enumerate(procs) if p.returncode), None)
    if failed is not None:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        lines = read_lines(d)
        why = next((ln["error"] for ln in lines.get(f"rank{failed}", []) if ln.get("error")), None)
        if why is None:
            why = common.tail((d / f"rank{failed}.err").read_text(errors="replace"), 1, 300) or \
                f"exit status {procs[failed].returncode}"
        print(json.dumps({"ok": False, "error": f"rank {failed}: {why}"}))
        return 1
    print(json.dumps({"ok": True}))
    return 0


def probe_worker() -> int:
    """Which NCCL torch loads here (with this process's environment, LD_PRELOAD included)."""
    info = {"cuda": False, "device": None, "nccl": None, "torch": None}
    try:
        import torch
        info["torch"] = torch.__version__
        info["cuda"] = bool(torch.cuda.is_available())
        if info["cuda"]:
            info["device"] = torch.cuda.get_device_name(0)
        try:
            v = torch.cuda.nccl.version()
            info["nccl"] = list(v) if isinstance(v, tuple) else v
        except Exception as exc:
            info["nccl_error"] = str(exc)[:200]
    except Exception as exc:
        info["error"] = str(exc)[:200]
    print(json.dumps(info))
    return 0


# ------------------------------------------------------------------------------ main
def _csv(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--ranks", default=None, help="rank counts, processes sharing the GPU (default 2,4,8; cpu 2,4)")
    ap.add_argument("--sizes", default=None, help=f"sizes (default {DEFAULT_SIZES}; cpu {CPU_SIZES})")
    ap.add_argument("--quick", action="store_true", help=f"three sizes ({QUICK_SIZES}) and fewer iterations")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"implementations ({', '.join(IMPLS)})")
    ap.add_argument("--iters", type=int, default=None, help="timed calls per size (default 20; quick 10; cpu 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed calls after the checked one (default 5; "
                                                             "quick 2; cpu 0)")
    ap.add_argument("--proto", choices=("auto", "simple", "ll"), default="auto", help="hccc's FIFO protocol")
    ap.add_argument("--step-timeout", type=float, default=None, help="seconds per step (default 180; cpu 120)")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default: no limit)")
    ap.add_argument("--kernel-timeout", type=float, default=30.0, help="seconds a kernel waits before it "
                                                                       "reports itself stuck")
    ap.add_argument("--build-jobs", type=int, default=None, help="build pass: hccc steps run at once at the "
                                                                 "smallest size first (default 4; cpu 0: none)")
    ap.add_argument("--build-only", action="store_true", help="stop after the build pass")
    ap.add_argument("--copy-bytes", default=None, help="size of the reference copy (default 1G; cpu 16M)")
    ap.add_argument("--nccl-lib", default=None, metavar="PATH", help="a libnccl.so.2 to preload into the NCCL workers")
    ap.add_argument("--force-nccl", action="store_true",
                    help="run NCCL on a GPU even where its version says it cannot (its failure is then reported)")
    ap.add_argument("--json", default=None, metavar="PATH", help="write every row here")
    ap.add_argument("--workdir", default=None, help="where the steps write (default: a temporary directory)")
    args = ap.parse_args(argv)
    from hccc.args import parse_size

    cpu = args.backend == "cpu"
    try:
        args.ranks = [int(x) for x in _csv(args.ranks or ("2,4" if cpu else "2,4,8"))]
    except ValueError:
        raise UsageError(f"--ranks must be a list of integers such as 2,4,8: {args.ranks!r}") from None
    if not args.ranks or any(n < 2 for n in args.ranks):
        raise UsageError("--ranks: every rank count must be at least 2")
    text = args.sizes or (QUICK_SIZES if args.quick else CPU_SIZES if cpu else DEFAULT_SIZES)
    try:
        args.sizes = [parse_size(s) for s in _csv(text)]
    except (ValueError, argparse.ArgumentTypeError):
        raise UsageError(f"--sizes must be sizes such as 4K,1M,64M: {text!r}") from None
    if not args.sizes:
        raise UsageError("--sizes: no size given")
    for s in args.sizes:
        bad = [n for n in args.ranks if s <= 0 or s % (4 * n)]
        if bad:
            raise UsageError(f"size {s} B is not a positive multiple of 4 x {bad[0]} bytes (float32 over "
                             f"{bad[0]} ranks)")
    args.collectives = _csv(args.collectives)
    unknown = [c for c in args.collectives if c not in COLLECTIVES]
    if unknown or not args.collectives:
        raise UsageError(f"unknown collective {unknown[0] if unknown else ''!r} (known: {', '.join(COLLECTIVES)})")
    args.impls = _csv(args.impls)
    unknown = [i for i in args.impls if i not in IMPLS]
    if unknown or not args.impls:
        raise UsageError(f"unknown implementation {unknown[0] if unknown else ''!r} (known: {', '.join(IMPLS)})")
    if args.iters is None:
        args.iters = 2 if cpu else 10 if args.quick else 20
    if args.warmup is None:
        args.warmup = 0 if cpu else 2 if args.quick else 5
    if args.step_timeout is None:
        args.step_timeout = 120.0 if cpu else 180.0
    if args.build_jobs is None:
        args.build_jobs = 0 if cpu else 4
    if args.iters < 1 or args.warmup < 0 or args.step_timeout <= 0 or args.kernel_timeout <= 0 \
            or args.build_jobs < 0 or (args.budget is not None and args.budget <= 0):
        raise UsageError("--iters, --step-timeout, --kernel-timeout and --budget must be positive, "
                         "--warmup and --build-jobs at least 0")
    try:
        args.copy_bytes = parse_size(args.copy_bytes or ("16M" if cpu else "1G"))
    except (ValueError, argparse.ArgumentTypeError):
        raise UsageError(f"--copy-bytes must be a size such as 1G: {args.copy_bytes!r}") from None
    if args.nccl_lib is not None and not Path(args.nccl_lib).is_file():
        raise UsageError(f"--nccl-lib {args.nccl_lib}: no such file (give the path of a libnccl.so.2)")
    return args


def run(args) -> dict:
    """Every step (module docstring); the report as a dict."""
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="hccc-vs-nccl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    budget = common.Budget(args.budget)
    t = args.step_timeout
    report: dict = {"backend": args.backend, "ranks": args.ranks, "sizes": args.sizes,
                    "collectives": args.collectives, "impls": args.impls, "iters": args.iters,
                    "warmup": args.warmup, "proto": args.proto, "workdir": str(workdir), "steps": [], "build": []}
    for n in args.ranks:
        write_catalog(workdir / f"catalog{n}", n, args.collectives)
    # which NCCL, and whether it can run here
    probe, probe_err = None, ""
    if args.backend == "cuda" and not args.build_only:
        res = common.run_command([sys.executable, str(Path(__file__).resolve()), "--probe-worker"],
                             budget.timeout(min(t, 60.0)), cwd=ROOT, env=nccl_env(args))
        probe = common.last_json(res.stdout) if res.status == "ok" else None
        probe_err = res.why()
    nccl_runs, nccl_line, version = nccl_decision(args.backend, probe, probe_err)
    if args.force_nccl and not nccl_runs and probe is not None and probe.get("cuda"):
        nccl_runs, nccl_line = True, nccl_line.split(":")[0] + ": run anyway (--force-nccl)"
    elif args.force_nccl and args.backend == "cpu":
        nccl_runs, nccl_line = True, "no CUDA GPU: gloo stands in for NCCL (--force-nccl on the CPU backend)"
    if "nccl" not in args.impls:
        nccl_runs = False
    report["device"] = (probe or {}).get("device") or ("CPU emulation" if args.backend == "cpu" else "unknown")
    report["torch"] = (probe or {}).get("torch")
    report["nccl"] = {"version": common.version_text(version) if version else None, "runs": nccl_runs,
                      "line": nccl_line, "lib": args.nccl_lib}
    print(nccl_line, file=sys.stderr)
    # the copy bound (not for a build pass alone)
    report["copy"] = {"error": "not measured (--build-only)"}
    if not args.build_only:
        res = common.run_command([sys.executable, str(HERE / "gpu_common.py"), "copy", "--backend", args.backend,
                                  "--bytes", str(args.copy_bytes)], budget.timeout(min(t, 120.0)), cwd=ROOT)
        report["copy"] = common.last_json(res.stdout) if res.status == "ok" else {"error": res.why() or "no answer"}
    hbm = report["copy"].get("hbm_gbps")
    if not args.build_only:
        print(f"device copy: {hbm:.1f} GB/s read + written" if hbm else f"device copy: {report['copy'].get('error')}",
              file=sys.stderr)
    # the build pass
    if args.build_jobs and not budget.spent():
        steps = build_steps(args, workdir)
        for s in steps:
            shutil.rmtree(workdir / s.ident, ignore_errors=True)
        t0 = time.monotonic()
        results = common.run_parallel([(s.argv, budget.timeout(t), s.env) for s in steps], args.build_jobs)
        for s, r in zip(steps, results):
            report["build"].append({"step": s.ident, "status": r.status, "seconds": round(r.seconds, 1),
                                    "reason": r.why() or (worker_error(read_lines(workdir / s.ident)))})
        print(f"build pass: {sum(r.status == 'ok' for r in results)}/{len(results)} steps in "
              f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
    rows: list = []
    if not args.build_only:
        for s in plan(args, workdir, nccl_runs):
            rows += run_step(s, budget, t, workdir, report)
    # steps NCCL did not run: its rows say why
    if "nccl" in args.impls and not nccl_runs and not args.build_only:
        for n in args.ranks:
            for coll in args.collectives:
                rows += [make_row(coll, n, "nccl", size, None, "skipped", nccl_line) for size in args.sizes]
    picks = catalog_picks(args, workdir)
    for r in rows:
        if r["impl"].startswith(("comm-", "grid-")):
            r["catalog_pick"] = picks.get((r["collective"], r["nranks"], r["bytes"])) == r["algorithm"] + ".rccl"
    report["rows"] = add_bounds_and_ratios(sort_rows(rows, args), hbm)
    return report


def sort_rows(rows: list, args) -> list:
    order = {name: i for i, name in enumerate(IMPLS)}
    return sorted(rows, key=lambda r: (args.collectives.index(r["collective"]), args.ranks.index(r["nranks"]),
                                       r["bytes"], order.get(r["impl"], -1)))


def catalog_picks(args, workdir: Path) -> dict:
    """{(collective, N, size): the catalog entry the torch backend would choose}."""
    from hccc.catalog import Catalog
    out = {}
    for n in args.ranks:
        cat = Catalog.load(workdir / f"catalog{n}")
        for coll in args.collectives:
            for size in args.sizes:
                entry, _ = cat.select(coll, n, size, "float32", "sum")
                out[(coll, n, size)] = entry.name if entry is not None else None
    return out


def run_step(s: Step, budget: common.Budget, step_timeout: float, workdir: Path, report: dict) -> list:
    """Run one step; its rows (every size: measured, or why not)."""
    if budget.spent():
        report["steps"].append(asdict(StepRecord(s.ident, s.impl, s.coll, s.n, "skipped", 0.0, common.NOT_RUN)))
        return [make_row(s.coll, s.n, s.impl, size, None, "skipped", common.NOT_RUN) for size in s.sizes]
    shutil.rmtree(workdir / s.ident, ignore_errors=True)      # a directory of an earlier run
    res = common.run_command(s.argv, budget.timeout(s.timeout_s or step_timeout), cwd=ROOT, env=s.env)
    lines = read_lines(workdir / s.ident)
    got = combine(lines, s.n, s.sizes, s.impl)
    reason = ""
    if res.status == "timeout":
        reason = f"timeout: the step had no answer in {res.timeout_s:.0f} s"
    elif res.status != "ok":
        summary = common.last_json(res.stdout) or {}
        reason = summary.get("error") or worker_error(lines) or res.why()
    report["steps"].append(asdict(StepRecord(s.ident, s.impl, s.coll, s.n, res.status, round(res.seconds, 1), reason)))
    print(f"{res.status:>8}  {s.ident}  {res.seconds:.1f} s  {reason}", file=sys.stderr)
    rows = []
    for size in s.sizes:
        m = got.get(size)
        if m is not None:
            rows.append(make_row(s.coll, s.n, s.impl, size, m, "ok"))
        else:
            rows.append(make_row(s.coll, s.n, s.impl, size, None, "timeout" if res.status == "timeout" else "failed",
                                 reason or "no result"))
    return rows


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--step-worker", "--rank-worker") and len(argv) == 2:
        spec = json.loads(argv[1])
        return step_worker(spec) if argv[0] == "--step-worker" else rank_worker(spec)
    if argv == ["--probe-worker"]:
        return probe_worker()
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"vs_nccl: error: {exc}", file=sys.stderr)
        return 1
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.build_only:
        bad = [b for b in report["build"] if b["status"] != "ok"]
        print(json.dumps({"build": report["build"], "ok": not bad}))
        return 0 if not bad else 1
    copy = report["copy"]
    lines = [f"# {report['nccl']['line']}",
             f"# device copy: {copy['hbm_gbps']:.1f} GB/s read + written ({_size(copy['bytes'])}, {copy['timer']})"
             if copy.get("hbm_gbps") else f"# device copy: not measured ({copy.get('error')}): no copy bound",
             f"# float32 sum, {args.iters} timed calls after {args.warmup} warm-up ones, median of the slowest "
             f"rank's times; hccc protocol {args.proto}"]
    if args.backend == "cpu":
        lines.append("# CPU emulation: the times are the emulator's, not a GPU's")
    print_table(report["rows"], f"hccc vs NCCL, N processes on {report['device']}", lines)
    ok = all(s["status"] in ("ok", "skipped") for s in report["steps"]) and \
        all(r["status"] in ("ok", "skipped") for r in report["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
