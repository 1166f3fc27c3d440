"""docs/tutorial.md, followed as written: every command of its ``sh`` blocks runs, in order, from an
empty directory holding a link to ``examples/``, and exits 0; the first line of the output shown
after a command is what the command prints (``...`` and numbers with a decimal point stand for what
the machine decides, :func:`shown_pattern`); the table of which example
program fits which example cluster is what ``hccc check --topology`` accepts."""
from __future__ import annotations

import pytest

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import require_tool

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
#: tools other than hccc the tutorial uses, and the tool each needs
EXTERNAL = {"make": "nvcc"}


def steps(text: str) -> list[tuple[list[str], str | None]]:
    """(commands of one ``sh`` block, first line of the ``text`` block right after it or None)."""
    blocks = [(m.group(1), m.group(2), m.start(), m.end()) for m in BLOCK.finditer(text)]
    out = []
    for i, (kind, body, _, end) in enumerate(blocks):
        if kind != "sh":
            continue
        cmds = [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        shown = None
        if i + 1 < len(blocks) and blocks[i + 1][0] == "text" and not text[end:blocks[i + 1][2]].strip():
            shown = blocks[i + 1][1].splitlines()[0]
        out.append((cmds, shown))
    return out


def shown_pattern(line: str) -> re.Pattern:
    """A line the tutorial shows as a pattern of what the command prints: ``...`` stands for any
    text (the machine's folder, options left out), a decimal number for any number (timings), runs
    of spaces for any spacing (columns widen with their numbers)."""
    out = []
    for i, part in enumerate(line.strip().split("...")):
        if i:
            out.append(".*")
        for j, piece in enumerate(re.split(r"\d+\.\d+(?:e[-+]?\d+)?", part)):
            if j:
                out.append(r"(?:[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)")
            words = piece.split()
            if not words:
                out.append(r"\s*" if piece else "")
                continue
            if piece.startswith(" ") and out[-1:] != [r"\s+"]:      # space after a number
                out.append(r"\s+")
            out.append(r"\s+".join(re.escape(w) for w in words))
            if piece.endswith(" "):                                  # space before a number
                out.append(r"\s+")
    return re.compile("".join(out))


def shows(shown: str, output: str) -> bool:
    """Whether the command's ``output`` holds the first line the tutorial shows after it."""
    pat = shown_pattern(shown)
    return any(pat.fullmatch(ln.strip()) for ln in output.splitlines())


def test_shown_lines_are_compared_not_skipped():
    out = "make: Entering directory '/tmp/x/kernels'\n        4096   1024  float32  sum   -1   12.5  0.00\n"
    assert shows("make: Entering directory '.../kernels'", out)
    assert not shows("make: Entering directory '.../other'", out)
    assert shows("4096          1024   float32     sum      -1   103175.4     0.00", out)
    assert not shows("4096          1024     float     sum      -1   103175.4     0.00", out)
    # text between two numbers keeps its spaces on both sides
    assert shows("56 transfers, 0.997 of the bound, 3.41 s -> x", "56 transfers, 0.5 of the bound, 1.17 s -> x")
    assert not shows("56 transfers, 0.997 of the bound, 3.41 s -> x", "56 transfers, 0.5of the bound, 1.17 s -> x")


def test_the_tutorial_has_the_whole_story():
    text = TUTORIAL.read_text()
    cmds = [c.split()[:2] for block, _ in steps(text) for c in block]
    firsts = [c[1] if c[0] == "hccc" else c[0] for c in cmds]
    for word in ("topo", "synth", "check", "sim", "run", "fuzz", "xml", "make"):
        assert word in firsts, f"the tutorial never runs {word}"
    assert any(c[0] == "hccc" and c[1].endswith(".rccl") for c in cmds), "the compile command (hccc ALGO -o OUT)"


@pytest.mark.slow
def test_every_tutorial_command_works_as_written(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    env = dict(os.environ, HCCC_CPU_OPT="-O0")
    env.pop("HCCC_DEBUG", None)
    for block, shown in steps(TUTORIAL.read_text()):
        output = ""
        for cmd in block:
            argv = shlex.split(cmd)
            if argv[0] == "hccc":
                argv = [sys.executable, "-m", "hccc.cli", *argv[1:]]
            else:
                assert argv[0] in EXTERNAL, f"unexpected command in the tutorial: {cmd}"
                require_tool(EXTERNAL[argv[0]])
            r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
            assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
            output += r.stdout + r.stderr
        if shown is not None:
            assert shows(shown, output), f"{block}: the tutorial shows {shown!r}; the command printed\n{output}"


def test_the_fit_table_is_what_check_accepts():
    from hccc.compiler.cluster.topology_check import check_on_topology
    from hccc.compiler.pipeline import load_algorithm, read_cluster

    text = TUTORIAL.read_text()
    rows = [ln for ln in text.splitlines() if ln.startswith("| `") and "|" in ln[1:]]
    assert len(rows) >= 5
    clusters = {}
    for row in rows:
        progs, nranks, fit, shaped = [c.strip() for c in row.strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", progs)
        fits = re.findall(r"`([^`]+)`", fit)
        files = sorted({p for n in names for p in (ROOT / "examples").glob(n.replace("*", "*") + ".rccl")})
        assert files, row
        for f in files:
            alg = load_algorithm(f)
            assert alg.header.nranks == int(nranks), f
            for c in fits + re.findall(r"`([^`]+)`", shaped):
                if c not in clusters:
                    clusters[c] = read_cluster(ROOT / "examples" / "clusters" / f"{c}.topo")
                check_on_topology(alg, clusters[c].topology, clusters[c].name)   # raises if it does not fit
