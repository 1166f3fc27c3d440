"""How fast each input limit fires: hostile and oversized inputs through the ``hccc`` command, timed.

    python benchmarks/input_limits.py [--json] [--only NAME,...]

Every case runs ``hccc`` in a subprocess (as a user would) on an input generated here and prints
one row: the exit code (1: located error, 2: usage error), wall seconds, CPU seconds (user + system
of the child), the largest peak memory (max RSS) of the children so far (getrusage keeps a maximum)
and the first line of the message. ``--version`` is the first
row: the interpreter's own start-up, which every other row includes. A limit "fires before the
work" when its row costs about as much as that start-up.

The cases: ``/dev/zero`` and a FIFO as input, a 100 GiB sparse file,
JSON nested 200,000 deep and a 100,000-digit integer, a ProgramIR whose scratch needs terabytes,
a 200,000-line ``.rccl``, a 4096-node ``.topo``, ``synth --chunks-per-rank 1000000``,
``synth --time-limit 3`` on a problem whose greedy alone ran about a minute, absurd sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
HCCC = [sys.executable, "-m", "hccc.cli"]
HEADER = ('def ResCCLAlgo(nRanks=2, nChannels=1, nWarps=4, AlgoName="x", OpType="Allgather", '
          'GPUPerNode=2, NICPerNode=1):\n')


def _topo(n: int) -> str:
    lines = [f"define nodenum = {n}"]
    for k in range(1, n + 1):
        lines += [f"define node{k} = 8", "define bandwidth = {switch => [(((0,1,2,3),(4,5,6,7)) >-> (16,1))]}"]
    for k in range(1, n):
        lines += [f"define internode = (node{k}, node{k + 1})",
                  "define interbandwidth = {switch => [(((0,1,2,3,4,5,6,7),(0,1,2,3,4,5,6,7)) >-> (8,1))]}"]
    return "\n".join(lines) + "\n"


def cases(d: Path) -> dict[str, list]:
    """name -> hccc arguments (inputs written into ``d``)."""
    fifo = d / "fifo.rccl"
    os.mkfifo(fifo)
    sparse = d / "sparse.rccl"
    with open(sparse, "wb") as f:
        f.truncate(100 << 30)
    (d / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    (d / "digits.json").write_text('{"schema": "hccc.program/2", "nranks": ' + "7" * 100_000 + "}")
    (d / "long.rccl").write_text(HEADER + "    transfer(0, 1, 0, 0, recv)\n" * 200_000)
    (d / "n4096.topo").write_text(_topo(4096))
    subprocess.run([*HCCC, str(EXAMPLES / "ring_allgather_8.rccl"), "-o", str(d / "k")], check=True,
                   capture_output=True)
    ir = json.loads((d / "k" / "ring_allgather_8.ir.json").read_text())
    ir["buffers"]["scratch"] = 1 << 24
    (d / "scratch.json").write_text(json.dumps(ir))
    v100 = EXAMPLES / "clusters" / "v100_4_8.topo"
    h20 = EXAMPLES / "clusters" / "h20_4x2_8x2.topo"
    return {
        "--version (start-up)": ["--version"],
        "/dev/zero as input": ["/dev/zero", "-o", d / "o"],
        "FIFO as input": ["check", fifo],
        "100 GiB sparse input": ["check", sparse],
        "JSON nested 200k deep": [d / "deep.json", "-o", d / "o"],
        "100k-digit JSON integer": [d / "digits.json", "-o", d / "o"],
        "IR scratch 2^24 chunks, run 1M": ["run", d / "scratch.json", "--backend", "cpu", "--bytes", "1M"],
        "200k-line .rccl": ["check", d / "long.rccl"],
        "4096-node .topo": ["topo", d / "n4096.topo"],
        "run --bytes 10^21 G": ["run", EXAMPLES / "ring_allgather_8.rccl", "--bytes", "999999999999999999999G"],
        "run --timeout 1e300": ["run", EXAMPLES / "ring_allgather_8.rccl", "--timeout", "1e300"],
        "synth --chunks-per-rank 1000000": ["synth", v100, "--collective", "allgather", "--chunks-per-rank",
                                            "1000000", "-o", d / "s.rccl"],
        "synth K=64 --time-limit 3 (24 GPUs)": ["synth", h20, "--collective", "allgather", "--chunks-per-rank", "64",
                                                "--time-limit", "3", "-o", d / "s.rccl"],
    }


def measure(args: list) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([*HCCC, *map(str, args)], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                       timeout=900, env=dict(os.environ, HCCC_DEBUG=""))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    msg = (r.stderr or r.stdout).strip().splitlines()
    return {"exit": r.returncode, "wall_s": round(wall, 2),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            "max_rss_mib": round(after.ru_maxrss / 1024, 1), "message": (msg[0] if msg else "")[:90]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        todo = cases(Path(tmp))
        want = [w for w in a.only.split(",") if w]
        rows = []
        for name, args in todo.items():
            if want and not any(w in name for w in want) and not name.startswith("--version"):
                continue
            rows.append({"case": name, **measure(args)})
            if not a.json:
                r = rows[-1]
                if len(rows) == 1:
                    print(f"{'case':36s} {'exit':>4s} {'wall s':>7s} {'CPU s':>6s} {'max RSS MiB':>11s}  message")
                print(f"{r['case']:36s} {r['exit']:4d} {r['wall_s']:7.2f} {r['cpu_s']:6.2f} {r['max_rss_mib']:11.1f}  "
                      f"{r['message']}", flush=True)
    if a.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
