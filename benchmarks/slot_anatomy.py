"""What one unit of hccc's kernels costs a thread block, taken apart on one GPU.

Builds ``benchmarks/slot_anatomy.cu`` against the headers hccc emits (the kernels' own engine,
``hccc_run`` of ``hccc_prims.h``), runs it, and prints four tables:

* **ping-pong**: two blocks on two SMs pass a flag back and forth, for each ordering flavour (the
  kernels' relaxed poll + acquire fence / release fence + relaxed post at GPU and at system scope,
  acquire loads / release stores, full fences, NCCL's volatile pattern; a relaxed floor);
* **units**: one block runs one primitive (COPY, SEND, RECV, RECV_REDUCE_COPY, a SEND after a met
  dependency) over a fixed byte count in units of 64 KiB down to 1 KiB, its peers pre-satisfied;
  the slope of the time against the units is what a unit costs beyond its bytes (the issue's
  target: at most 0.5 us, a COPY unit's at most 0.2 us), per threads a block;
* **copy**: one block's COPY units of 4 KiB to 512 KiB over 64 MiB: the engine's GB/s;
* **grid**: block 0's COPY units alone, and with every other block of a full grid waiting for
  its progress counter (their sync lanes polling): whether waiting blocks slow a working one;
* **launch**: what a launch costs by its blocks (1 to 512, up to what is resident at once): an
  empty kernel, and the engine whose every block runs 1 or 16 NOP rows and waits for nothing,
  plainly and cooperatively (as a one-grid call is launched); one launch alone (start to end) and
  one of a back-to-back series. The kernel cost model's launch cost is a hypothesis until a run
  has these rows (:data:`hccc.compiler.passes.kernel_cost.LAUNCH_SECONDS_PER_BLOCK`);
* **timer**: empty kernels timed as the runtime times a call (``GpuTimer``: a gate kernel on a
  control stream, every rank's stream waiting for the start event, an event of each joined before
  the stop event; 1 or 8 streams, one kernel or one a stream) against a plain event pair: what
  the measurement itself adds to a small call's time.

``--backend cpu`` builds the same program for the CPU emulation at a hundredth of the sizes: the
program and this script are tested that way (the times then measure the emulation, not a GPU).
``--copy-only``: the copy engine's rows alone (a few seconds on a GPU). The program is built with
the kernels' build switches of the environment (``HCCC_TMA=1``: bulk copies, which the device
row's ``bulk_copies`` reports), so ``HCCC_TMA=1 python benchmarks/slot_anatomy.py --copy-only`` measures
the copy engine with them (``benchmarks/gpu_validate.py --quick`` sets both side by side).

    python benchmarks/slot_anatomy.py [--quick | --copy-only] [--json FILE] [--backend cuda|cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "slot_anatomy.cu"


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs (None with fewer than two distinct xs)."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def fits(rows: list[dict]) -> list[dict]:
    """Per (op, threads): the slope of us over units (what a unit costs beyond its bytes) and the
    intercept's share, from the "units" rows."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("exp") == "units":
            groups.setdefault((r["op"], r["threads"]), []).append(r)
    out = []
    for (op, threads), rs in groups.items():
        s = slope([float(r["units"]) for r in rs], [float(r["us"]) for r in rs])
        out.append(dict(exp="unit_cost", op=op, threads=threads, us_per_unit=s,
                        points=len(rs), bytes=rs[0]["bytes"]))
    return out


def build(backend: str, workdir: Path) -> Path:
    """The headers (emitted for a small example) and the program, compiled for ``backend`` with
    the environment's build switches (:func:`hccc.runtime.platform.build_switches`)."""
    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.runtime.platform import PlatformError, build_switches
    try:
        switches = build_switches()
    except PlatformError as exc:
        raise SystemExit(f"slot_anatomy: {exc}") from None
    hdr = workdir / "headers"
    hdr.mkdir()
    generate(build_program(gen.ring_allgather(2), chunk_bytes=1 << 20), hdr, platforms=["cuda"] * 2)
    exe = workdir / "slot_anatomy"
    if backend == "cpu":
        cmd = [os.environ.get("HCCC_CXX", "g++"), "-std=c++17", "-O1", "-pthread", "-DHCCC_PLATFORM_CPU",
               "-DHCCC_SINGLE_GPU=1", *switches, "-x", "c++", "-I", str(hdr), str(SOURCE), "-o", str(exe)]
    else:
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        arch = os.environ.get("HCCC_CUDA_ARCH", "native")
        cmd = [nvcc, "-std=c++17", "-O3", f"-arch={arch}", "-DHCCC_SINGLE_GPU=1", *switches, "-I", str(hdr),
               str(SOURCE), "-o", str(exe)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"slot_anatomy: building the program failed:\n{res.stderr[-3000:]}")
    return exe


def _text(out) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def run(exe: Path, mode: str, scale: float, timeout: float) -> tuple[list[dict], str | None]:
    """(the rows the program printed in ``mode``: quick, full or copy; None, or why it stopped short: its exit status or the
    timeout, with the end of its stderr). The rows of a program that stopped short are kept: a
    failure in a late experiment (a launch the device refuses) costs that experiment only."""
    try:
        res = subprocess.run([str(exe), mode, repr(scale)], capture_output=True, text=True, timeout=timeout)
        out, err, why = res.stdout, res.stderr, (None if res.returncode == 0 else f"exit {res.returncode}")
    except subprocess.TimeoutExpired as exc:
        out, err, why = _text(exc.stdout), _text(exc.stderr), f"did not finish in {timeout:.0f} s"
    rows = []
    for ln in out.splitlines():
        if ln.startswith("{"):
            try:
                rows.append(json.loads(ln))
            except json.JSONDecodeError:      # a line cut short by the end of the program
                break
    if rows and rows[-1].get("exp") == "done":
        rows.pop()
    elif why is None:
        why = "its output ended before the last experiment"
    return rows, None if why is None else f"{why}: {err[-3000:]}".rstrip(": ")


#: the tables :func:`tables` prints after the device line: (title, the rows' experiment, columns
#: (the first left-aligned), each row's cells)
TABLES = (
    ("flag ping-pong between two SMs", "pingpong", ("ordering", "us a round trip"),
     lambda r: (r["flavour"], f"{r['us_round_trip']:.3f}")),
    ("one unit beyond its bytes (slope over units, peers pre-satisfied)", "unit_cost",
     ("op", "threads", "us a unit", "points"),
     lambda r: (r["op"], str(r["threads"]), "-" if r["us_per_unit"] is None else f"{r['us_per_unit']:.3f}",
                str(r["points"]))),
    ("one block's copy engine (COPY units)", "copy", ("threads", "unit", "GB/s", "correct"),
     lambda r: (str(r["threads"]), f"{r['slice'] // 1024} KiB", f"{r['GBps']:.1f}", str(r["correct"]))),
    ("block 0's COPY units, alone and beside a full grid of waiting blocks", "grid", ("blocks", "threads", "us"),
     lambda r: (str(r["blocks"]), str(r["threads"]), f"{r['us']:.1f}")),
    ("a launch by its blocks (us: one alone, start to end; each: one of a series)", "launch",
     ("kind", "blocks", "rows a block", "threads", "us", "us each"),
     lambda r: (r["kind"], str(r["blocks"]), str(r["rows"]), str(r["threads"]), f"{r['us']:.1f}",
                f"{r['us_each']:.1f}")),
    ("empty kernels timed as the runtime times a call (streams 0: a plain event pair)", "timer",
     ("streams", "kernels", "blocks", "us"),
     lambda r: (str(r["streams"]), str(r["kernels"]), str(r["blocks"]), f"{r['us']:.1f}")),
)


def tables(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table
    con = Console(width=140)
    dev = next((r for r in rows if r["exp"] == "device"), {})
    con.print(f"# {dev.get('name', '?')}: warp {dev.get('warp')}, {dev.get('nslots')} slots a connection")
    for title, exp, columns, cells in TABLES:
        t = Table(title=title)
        for i, c in enumerate(columns):
            t.add_column(c, justify="left" if i == 0 and exp in ("pingpong", "unit_cost", "launch") else "right")
        mine = [r for r in rows if r["exp"] == exp]
        if exp == "unit_cost":
            mine.sort(key=lambda r: (r["op"], r["threads"]))
        for r in mine:
            t.add_row(*cells(r))
        con.print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "cpu"), default=None,
                    help="cuda (default where nvcc and a GPU answer) or cpu (the emulation, small sizes)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer slices and thread counts (about 40 s)")
    mode.add_argument("--copy-only", action="store_true",
                      help="the copy engine's rows alone, quick's thread counts (a few seconds)")
    ap.add_argument("--json", default=None, help="write every row here")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for the program's run")
    args = ap.parse_args(argv)
    backend = args.backend
    if backend is None:
        backend = "cuda" if shutil.which("nvidia-smi") and (shutil.which("nvcc") or
                                                              Path("/usr/local/cuda/bin/nvcc").exists()) else "cpu"
    scale = 0.01 if backend == "cpu" else 1.0
    with tempfile.TemporaryDirectory() as d:
        exe = build(backend, Path(d))
        rows, why = run(exe, "copy" if args.copy_only else "quick" if args.quick else "full", scale,
                        args.timeout)
    if why:
        print(f"slot_anatomy: the program stopped short ({why}); the {len(rows)} rows it printed are kept",
              file=sys.stderr)
    rows += fits(rows)
    tables(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"backend": backend, "rows": rows, "incomplete": why}, indent=1)
                                   + "\n")
    return 1 if why else 0


if __name__ == "__main__":
    raise SystemExit(main())
