"""The command line as a user meets it: exit codes, located errors, atomic and deterministic output."""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hccc.args import parse_size
from hccc.cli import main

from cli_runs import run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

RING4 = """\
# ring AllReduce on 4 ranks
def ResCCLAlgo(nRanks=4, nChannels=1, nWarps=16, AlgoName="ring4", OpType="Allreduce", GPUPerNode=4, NICPerNode=0):
    n = 4
    for s in range(0, n - 1):
        for r in range(n):
            transfer(r, (r + 1) % n, s, (r - s + n) % n, rrc)
    for s in range(0, n - 1):
        for r in range(n):
            transfer(r, (r + 1) % n, n - 1 + s, (r + 1 - s + n) % n, recv)
"""


def run_process(*args: str) -> subprocess.CompletedProcess:
    """hccc in a fresh process: output compared across runs must not depend on one process's state."""
    return subprocess.run([sys.executable, "-m", "hccc.cli", *args], capture_output=True, text=True, timeout=600)


def tree_digest(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def write(tmp_path: Path, text: str | bytes, name: str = "algo.rccl") -> Path:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text)
    return p


def assert_located_error(proc: subprocess.CompletedProcess, path: Path, pattern: str) -> None:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert re.search(rf"{re.escape(str(path))}:\d+:\d+: error: .*{pattern}", proc.stderr), proc.stderr


def test_compile_writes_manifest_and_is_deterministic(tmp_path):
    algo = write(tmp_path, RING4)
    out1, out2 = tmp_path / "k1", tmp_path / "k2"
    p1 = run_process(str(algo), "-o", str(out1))
    assert p1.returncode == 0, p1.stderr
    p2 = run_process(str(algo), "-o", str(out2))
    assert p2.returncode == 0, p2.stderr
    assert tree_digest(out1) == tree_digest(out2)
    man = json.loads((out1 / "manifest.json").read_text())
    assert man["algorithm"] == "ring4" and man["collective"] == "allreduce" and man["nranks"] == 4
    assert [r["rank"] for r in man["ranks"]] == [0, 1, 2, 3]
    for r in man["ranks"]:
        assert r["platform"] == "cuda" and (out1 / r["source"]).is_file() and r["tbs"] >= 1
    for key in ("transfers", "subpipelines", "tbs_state_based", "tbs_connection_based"):
        assert key in man["stats"]
    assert man["stats"]["transfers"] == 24
    # a rerun into the same directory replaces it with identical content (in this process: the
    # determinism across processes is the two runs' above)
    p3 = run_cli("compile", str(algo), "-o", str(out1))
    assert p3.returncode == 0 and tree_digest(out1) == tree_digest(out2)


def test_check_json(tmp_path):
    algo = write(tmp_path, RING4)
    p = run_cli("check", str(algo), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"valid": True, "collective": "allreduce", "nranks": 4,
                                    "transfers": 24, "steps": 6}


def test_failed_compile_leaves_nothing(tmp_path):
    bad = write(tmp_path, RING4.replace("(r + 1) % n, n - 1 + s", "(r + 1) % n, 0"))
    out = tmp_path / "kernels"
    p = run_cli(str(bad), "-o", str(out))
    assert p.returncode == 1
    assert not out.exists()
    assert [f.name for f in tmp_path.iterdir()] == ["algo.rccl"]


def test_existing_foreign_directory_is_not_overwritten(tmp_path):
    algo = write(tmp_path, RING4)
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    p = run_cli(str(algo), "-o", str(out))
    assert p.returncode == 1 and "refusing" in p.stderr
    assert (out / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("text,pattern", [
    ("def ResCCLAlgo(nRanks=4, OpType=\"Allgather\"):\n    transfer(0, 1, 0, 0, recv\n", ""),
    ("def ResCCLAlgo(nRanks=4, OpType=\"Allgather\"):\n    x = y + 1\n", "not defined"),
    ("def ResCCLAlgo(nRanks=4, OpType=\"Allgather\"):\n    for i in range(1000000):\n"
     "        for j in range(1000000):\n            transfer(0, 1, i, j, recv)\n", ""),
    ("def ResCCLAlgo(nRanks=2, OpType=\"Allgather\"):\n    transfer(0, 7, 0, 0, recv)\n", "rank"),
    ("def ResCCLAlgo(nRanks=2, OpType=\"Allgather\"):\n    transfer(0, 1, 0, 0, recv)\n", ""),
    ("def ResCCLAlgo(nRanks=2, OpType=\"Allreduce\"):\n    transfer(0, 1, 0, 0, rrc)\n"
     "    transfer(0, 1, 1, 0, rrc)\n", ""),
    ("def ResCCLAlgo(nRanks=2, OpType=\"Alltoall\"):\n    transfer(0, 1, 0, 0, recv)\n", ""),
])
def test_bad_programs_fail_with_located_errors(tmp_path, text, pattern):
    algo = write(tmp_path, text)
    for args in (["check", str(algo)], [str(algo), "-o", str(tmp_path / "out")]):
        p = run_cli(*args)
        assert_located_error(p, algo, pattern)
    assert not (tmp_path / "out").exists()


def test_binary_garbage(tmp_path):
    algo = write(tmp_path, b"\x7fELF\x02\x01\x01\x00\x00\xff\xfe" * 20)
    p = run_cli("check", str(algo))
    assert_located_error(p, algo, "")


def test_hostile_algo_name_is_sanitised(tmp_path):
    hostile = RING4.replace('AlgoName="ring4"', 'AlgoName=\'../../evil"; system(rm -rf /); //\'')
    algo = write(tmp_path, hostile)
    out = tmp_path / "k"
    p = run_cli(str(algo), "-o", str(out))
    assert p.returncode == 0, p.stderr
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert all(f == algo or f.is_relative_to(out) for f in files)
    man = json.loads((out / "manifest.json").read_text())
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", man["algorithm"])
    for f in out.iterdir():
        if f.suffix in (".cu", ".hip", ".h"):
            text = f.read_text()
            assert "rm -rf" not in text and "../" not in text and "evil\"" not in text


def test_usage_errors_exit_2(tmp_path):
    assert run_cli().returncode == 2
    assert run_cli(str(tmp_path / "x.rccl")).returncode == 2  # -o missing
    assert run_cli("check").returncode == 2
    p = run_cli(str(write(tmp_path, RING4)), "-o", str(tmp_path / "o"), "--scheduler", "fifo")
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_missing_file_is_error_1(tmp_path):
    p = run_cli("check", str(tmp_path / "nope.rccl"))
    assert p.returncode == 1 and "cannot read" in p.stderr and "Traceback" not in p.stderr


def test_parse_size():
    assert parse_size("4096") == 4096 and parse_size("64K") == 65536
    assert parse_size("1M") == 1 << 20 and parse_size("2g") == 2 << 30 and parse_size("1MiB") == 1 << 20
    assert parse_size("1.5M") == 3 << 19 and parse_size("0.5k") == 512 and parse_size("512B") == 512
    for bad in ("", "M", "-1", "0", "1.5", "0.3K", "1T", "1e6", "1,5M"):
        with pytest.raises(Exception):
            parse_size(bad)


def test_in_process_main_returns_codes(tmp_path, capsys):
    algo = write(tmp_path, RING4)
    assert main(["check", str(algo)]) == 0
    assert "valid Allreduce on 4 ranks" in capsys.readouterr().out


#: examples the default set compiles here (one of each shape: ring, direct, recursive doubling,
#: hierarchical, AllToAll); the slow set compiles every example
DEFAULT_EXAMPLES = {"ring_allreduce_8.rccl", "ring_alltoall_6.rccl", "direct_alltoall_8.rccl",
                    "recursive_doubling_allgather_8.rccl", "hm_allreduce_2x4.rccl", "hierarchical_alltoall_2x4.rccl"}


@pytest.mark.parametrize("example", [p.name if p.name in DEFAULT_EXAMPLES else pytest.param(p.name, marks=pytest.mark.slow)
                                     for p in sorted(EXAMPLES.glob("*.rccl"))])
def test_every_example_checks_and_compiles(tmp_path, example):
    p = run_cli("check", str(EXAMPLES / example), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["valid"] is True
    p = run_cli(str(EXAMPLES / example), "-o", str(tmp_path / "k"), "--target", "all")
    assert p.returncode == 0, p.stderr
    man = json.loads((tmp_path / "k" / "manifest.json").read_text())
    assert set(man["libraries"]) == {"cuda", "hip"}
    for r in man["ranks"]:
        assert set(r["sources"]) == {"cuda", "hip"}
        assert all((tmp_path / "k" / f).is_file() for f in r["sources"].values())


@pytest.mark.slow
def test_hm_allreduce_4x8_tb_counts(tmp_path):
    """ResCCL Table 3: at most 16 TBs per rank state-based, never more than connection-based."""
    for alloc in ("state", "connection"):
        p = run_cli(str(EXAMPLES / "hm_allreduce_4x8.rccl"), "-o", str(tmp_path / alloc), "--tb-alloc", alloc)
        assert p.returncode == 0, p.stderr
    st = json.loads((tmp_path / "state" / "manifest.json").read_text())
    cn = json.loads((tmp_path / "connection" / "manifest.json").read_text())
    assert max(r["tbs"] for r in st["ranks"]) <= 16
    assert st["stats"]["tbs_state_based"] <= st["stats"]["tbs_connection_based"]
    for a, b in zip(st["ranks"], cn["ranks"]):
        assert a["tbs"] <= b["tbs"]


@pytest.mark.parametrize("tty, spent, said", [(True, 12.0, True), (True, 1.0, False), (False, 12.0, False)])
def test_a_long_first_compile_is_said_on_a_terminal(monkeypatch, capsys, tty, spent, said):
    """A command during which numba compiled hccc's kernels for a while says so on a terminal
    (its own figures leave the compiles out); piped, or when the compiles were short, nothing."""
    import hccc.progress
    import hccc.util.clock

    monkeypatch.setattr(hccc.progress, "interactive", lambda stream=None: tty)
    calls = iter([100.0, 100.0 + spent, 200.0, 200.0 + spent])    # before and after each command
    monkeypatch.setattr(hccc.util.clock, "compile_seconds", lambda: next(calls))
    assert main(["check", str(EXAMPLES / "ring_allgather_8.rccl")]) == 0
    err = capsys.readouterr().err
    assert ("numba compiled hccc's kernels for 12 s of this run" in err) == said
    assert main(["check", "--json", str(EXAMPLES / "ring_allgather_8.rccl")]) == 0
    assert "numba compiled" not in capsys.readouterr().err       # --json: silent on stderr
