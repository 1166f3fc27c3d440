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
  its progress counter (their sync lanes polling): whether waiting blocks slow a working one.

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


def run(exe: Path, mode: str, scale: float, timeout: float) -> list[dict]:
    """The program's rows in ``mode`` (quick, full or copy)."""
    res = subprocess.run([str(exe), mode, repr(scale)], capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(ln) for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not rows or rows[-1].get("exp") != "done":
        raise SystemExit(f"slot_anatomy: the program failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    return rows[:-1]


def tables(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table
    con = Console(width=140)
    dev = next((r for r in rows if r["exp"] == "device"), {})
    con.print(f"# {dev.get('name', '?')}: warp {dev.get('warp')}, {dev.get('nslots')} slots a connection")
    t = Table(title="flag ping-pong between two SMs")
    t.add_column("ordering")
    t.add_column("us a round trip", justify="right")
    for r in rows:
        if r["exp"] == "pingpong":
            t.add_row(r["flavour"], f"{r['us_round_trip']:.3f}")
    con.print(t)
    t = Table(title="one unit beyond its bytes (slope over units, peers pre-satisfied)")
    for c in ("op", "threads", "us a unit", "points"):
        t.add_column(c, justify="right" if c != "op" else "left")
    for r in sorted(fits(rows), key=lambda r: (r["op"], r["threads"])):
        s = r["us_per_unit"]
        t.add_row(r["op"], str(r["threads"]), "-" if s is None else f"{s:.3f}", str(r["points"]))
    con.print(t)
    t = Table(title="one block's copy engine (COPY units)")
    for c in ("threads", "unit", "GB/s", "correct"):
        t.add_column(c, justify="right")
    for r in rows:
        if r["exp"] == "copy":
            t.add_row(str(r["threads"]), f"{r['slice'] // 1024} KiB", f"{r['GBps']:.1f}", str(r["correct"]))
    con.print(t)
    t = Table(title="block 0's COPY units, alone and beside a full grid of waiting blocks")
    for c in ("blocks", "threads", "us"):
        t.add_column(c, justify="right")
    for r in rows:
        if r["exp"] == "grid":
            t.add_row(str(r["blocks"]), str(r["threads"]), f"{r['us']:.1f}")
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
        try:
            rows = run(exe, "copy" if args.copy_only else "quick" if args.quick else "full", scale, args.timeout)
        except subprocess.TimeoutExpired:
            print(f"slot_anatomy: the program did not finish in {args.timeout:.0f} s", file=sys.stderr)
            return 1
    rows += fits(rows)
    tables(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"backend": backend, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
