"""Start-up cost of a small check: ``hccc check`` of the 8-GPU ring vs msccl-tools' ring script.

    python benchmarks/startup.py [--runs 15] [--algo examples/ring_allreduce_8.rccl]
                                 [--msccl-script PATH/examples/mscclang/simple/allreduce_ring.py]
                                 [--msccl-python PYTHON] [--msccl-args "8 1"]

At 8-16 GPUs a compile is all start-up: interpreter, imports, then a few milliseconds of work. Each
command runs ``--runs`` times in a fresh process (after one untimed warm-up run; the commands take
turns) and the table shows the minimum and the median wall time, the same for a bare interpreter (``python -c pass``,
what site-packages alone cost in that environment) and what is left once that is subtracted.
Every child gets a private bytecode cache (``PYTHONPYCACHEPREFIX`` in a temporary directory,
filled by the warm-up run), as an installed package has, whatever ``PYTHONDONTWRITEBYTECODE`` says.

msccl-tools is optional and not a dependency: give its example script (``--msccl-script``, e.g.
``examples/mscclang/simple/allreduce_ring.py`` of a checkout, with ``--msccl-args "8 1"``: 8 GPUs,
one instance; the script builds the program, checks it and prints MSCCL XML) and the Python that
has it installed (``--msccl-python``, default this one). Without a script, or when it does not run,
only hccc's figures are printed.
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent


def wall_times(cmds: list[list[str]], runs: int, env: dict) -> list[list[float] | None]:
    """Seconds per run of each command (after one untimed warm-up run each), or None for a command
    that fails. The commands take turns, run by run, so that a change of machine load falls on all
    of them alike."""
    ok = [subprocess.run(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
          for c in cmds]
    out: list[list[float] | None] = [[] if good else None for good in ok]
    for _ in range(runs):
        for i, cmd in enumerate(cmds):
            if out[i] is None:
                continue
            t0 = time.perf_counter()
            rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            out[i].append(time.perf_counter() - t0)
            if rc:
                out[i] = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--algo", default=str(ROOT / "examples" / "ring_allreduce_8.rccl"))
    ap.add_argument("--msccl-script", default=None, help="an msccl-tools MSCCLang example script")
    ap.add_argument("--msccl-python", default=sys.executable, help="the Python that has msccl-tools")
    ap.add_argument("--msccl-args", default="8 1", help="the script's arguments (default: 8 GPUs, 1 instance)")
    args = ap.parse_args()
    console = Console(width=120)

    name = Path(args.algo).name
    # (label, command, its interpreter): both ways of starting hccc, then msccl-tools
    todo = [(f"python -m hccc check {name}", [sys.executable, "-m", "hccc", "check", args.algo], sys.executable)]
    script = Path(sys.executable).with_name("hccc")
    if script.is_file():
        todo.append((f"hccc check {name} (console script)", [str(script), "check", args.algo], sys.executable))
    else:
        console.print(f"no hccc console script beside {sys.executable}; python -m hccc only", style="dim")
    if args.msccl_script is None:
        console.print("msccl-tools: no --msccl-script given; hccc only", style="dim")
    elif not Path(args.msccl_script).is_file():
        console.print(f"msccl-tools: {args.msccl_script} not found; hccc only", style="dim")
    else:
        todo.append((f"msccl-tools {Path(args.msccl_script).name} {args.msccl_args}",
                     [args.msccl_python, args.msccl_script, *shlex.split(args.msccl_args)], args.msccl_python))
    pythons = list(dict.fromkeys(py for _, _, py in todo))

    with tempfile.TemporaryDirectory(prefix="hccc-startup-") as tmp:
        env = dict(os.environ, PYTHONPYCACHEPREFIX=tmp)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.setdefault("HCCC_CACHE_DIR", str(Path(tmp) / "hccc-cache"))
        times = wall_times([[py, "-c", "pass"] for py in pythons] + [cmd for _, cmd, _ in todo], args.runs, env)
    bare = dict(zip(pythons, times[:len(pythons)]))
    rows = []   # (label, times, bare interpreter times)
    for (label, cmd, py), ts in zip(todo, times[len(pythons):]):
        if ts is None:
            if label.startswith("msccl-tools"):
                console.print(f"msccl-tools: {' '.join(cmd)} failed (is msccl installed for {py}?); "
                              "hccc only", style="dim")
                continue
            raise SystemExit(f"{' '.join(cmd)} failed")
        rows.append((label, ts, bare[py]))

    table = Table(title=f"start-up: wall seconds over {args.runs} runs (fresh process each, commands in turn)")
    for col in ("command", "min", "median", "bare python min", "min - bare"):
        table.add_column(col, justify="left" if col == "command" else "right")
    for label, ts, bs in rows:
        table.add_row(label, f"{min(ts):.3f}", f"{statistics.median(ts):.3f}", f"{min(bs):.3f}",
                      f"{min(ts) - min(bs):.3f}")
    console.print(table)
    if rows[-1][0].startswith("msccl-tools"):
        _, m, mb = rows[-1]
        for label, h, hb in rows[:-1]:
            console.print(f"{label.split(' check')[0]} / msccl-tools: {min(h) / min(m):.2f}x (minimum), "
                          f"{statistics.median(h) / statistics.median(m):.2f}x (median), "
                          f"{(min(h) - min(hb)) / (min(m) - min(mb)):.2f}x without the bare interpreters")
    console.print(f"machine load (1-minute average): {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
