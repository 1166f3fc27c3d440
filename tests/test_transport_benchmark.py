"""benchmarks/transport.py runs end to end (tiny settings) with either reader, and reports what it
measured: every path row, the steps of one message, and how the reader waited."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from net_ranks import have_ucx

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed"),
              pytest.mark.skipif(shutil.which("ucx_perftest") is None or not have_ucx(),
                                 reason="UCX and ucx_perftest (libucx-dev ucx-utils) not installed")]


@pytest.mark.parametrize("reader", ["poll", "sleep"])
def test_transport_benchmark_reports_both_sides(reader):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "transport.py"), "--sizes", "8,4K",
                        "--repeats", "1", "--lat-iters", "40", "--bw-bytes", "64K", "--call-iters", "0",
                        "--allreduce", "", "--stages", "40", "--reader", reader, "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(r.stdout)
    assert d["reader"] == reader and d["tls"] == "tcp"
    assert [row["bytes"] for row in d["path"]] == [8, 4096]
    for row in d["path"]:
        for k in ("hccc_p50_us", "ucx_p50_us", "hccc_mib_s", "ucx_mib_s"):
            assert math.isfinite(row[k]) and row[k] > 0, (k, row)
        assert row["p50_ratio"] == pytest.approx(row["hccc_p50_us"] / row["ucx_p50_us"])
    st = d["stages"]
    assert st["messages"] > 0
    assert st["one_way"] >= max(st["seen"], st["delivered"]) > 0
