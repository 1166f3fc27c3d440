"""The command line itself: subcommands with did-you-mean, ``hccc help``, ``--version`` everywhere,
help text for every option with defaults shown one way, the one size parser/formatter (the
``.topo`` syntax), the one comma-list parser, nccl-tests size sweeps, counted nouns, located notes,
hints for a file given to the wrong command, progress output, and the cache location."""
from __future__ import annotations

import argparse
import io
import os
import re
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc import __version__
from hccc.args import HelpFormatter, choice_list, comma_list, format_size, parse_size, size_or_zero
from hccc.cli import COMMANDS, SUMMARIES, USAGE, command_parser, main
from hccc.util.limits import MAX_OPTION_BYTES
from hccc.util.plural import plural

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
RING = str(EX / "ring_allreduce_8.rccl")
TOPO = str(EX / "clusters" / "a100_topo1.topo")


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---------------------------------------------------------------------------- commands and help
@pytest.mark.parametrize("typo, meant", [("chek", "check"), ("rnu", "run"), ("simm", "sim"), ("topoo", "topo"),
                                         ("synt", "synth"), ("hepl", "help"), ("balnce", "balance")])
def test_unknown_command_suggests_the_closest(capsys, typo, meant):
    rc, out, err = cli(capsys, typo, "x.rccl")
    assert rc == 2 and f"unknown command '{typo}' (did you mean '{meant}'?)" in err


def test_unknown_command_without_a_close_one(capsys):
    rc, _, err = cli(capsys, "frobnicate")
    assert rc == 2 and "unknown command 'frobnicate'" in err and "did you mean" not in err


def test_usage_lists_the_commands_and_help_works(capsys):
    rc, out, _ = cli(capsys, "help")
    assert rc == 0 and out.startswith("usage: " + USAGE)
    for name in COMMANDS:
        assert re.search(rf"^  {name}\s+\S", out, re.M), name
        if name != "compile":
            assert name in USAGE.splitlines()[1]
    for name in COMMANDS:
        rc, out, _ = cli(capsys, "help", name)
        assert rc == 0 and out.startswith(f"usage: hccc{'' if name == 'compile' else ' ' + name} ")
    rc, _, err = cli(capsys, "help", "chek")
    assert rc == 2 and "did you mean 'check'" in err
    rc, out, _ = cli(capsys, "-h")
    assert rc == 0 and "hccc help" in out
    rc, _, err = cli(capsys)
    assert rc == 2 and "usage:" in err


@pytest.mark.parametrize("argv", [["--version"]] + [[name, "--version"] for name in COMMANDS if name != "compile"]
                         + [["x.rccl", "--version"]])
def test_version_everywhere(capsys, argv):
    rc, out, _ = cli(capsys, *argv)
    assert rc == 0 and out.strip() == f"hccc {__version__}"


def test_summaries_are_the_modules_own():
    import importlib
    for name, mod in COMMANDS.items():
        assert importlib.import_module(mod).SUMMARY == SUMMARIES[name], name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help_and_defaults_are_shown_one_way(name):
    p = command_parser(name)
    fmt = HelpFormatter("x")
    for action in p._actions:
        if action.help == argparse.SUPPRESS:
            continue
        assert action.help and len(action.help) > 5, f"hccc {name}: {action.option_strings or action.dest} has no help"
        text = fmt._get_help_string(action)
        assert not re.search(r"\(default [^:]", text), f"hccc {name} {action.option_strings}: '(default X' form"
        shown = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
        if shown:
            assert "(default: " in text, f"hccc {name} {action.option_strings}: default not shown"


def test_one_option_name_per_idea():
    """Sizes are --sizes in both run and sim; the shared options mean the same in every command."""
    opts = {name: {o for a in command_parser(name)._actions for o in a.option_strings} for name in COMMANDS}
    assert "--sizes" in opts["run"] and "--sizes" in opts["sim"]
    for name, have in opts.items():
        if "--chunk-size" in have:
            assert "--scheduler" in have or name in ("sim",), name


# ---------------------------------------------------------------------------- sizes and lists
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@given(st.integers(min_value=0, max_value=MAX_OPTION_BYTES))
@settings(max_examples=examples(100))
def test_format_size_is_exact_and_parses_back(n):
    text = format_size(n)
    assert re.fullmatch(r"[0-9]+(\.[0-9]{1,2})?[KMG]?", text)
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([KMG]?)", text)
    assert Fraction(m.group(1)) * UNITS[m.group(2)] == n          # independent reading of the text
    assert size_or_zero(text) == n
    if n:
        assert parse_size(text) == n


@given(st.integers(min_value=0, max_value=10 ** 6), st.integers(min_value=0, max_value=99),
       st.sampled_from(["", "K", "M", "G"]), st.sampled_from(["", "B", "iB"]), st.booleans())
@settings(max_examples=examples(100))
def test_parse_size_reads_the_topo_syntax(whole, frac, unit, suffix, lower):
    text = f"{whole}.{frac:02d}{unit}" if frac else f"{whole}{unit}"
    if unit or suffix == "B":
        text += suffix if unit else "B"
    if lower:
        text = text.lower()
    value = (Fraction(whole) + Fraction(frac, 100)) * UNITS[unit]
    if value.denominator != 1 or value == 0 or value > MAX_OPTION_BYTES:
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(text)
    else:
        assert parse_size(text) == value
    # the .topo parser reads the same text the same way (one syntax)
    from hccc.util.sizes import size_value
    assert size_value(text) == value


@given(st.lists(st.integers(min_value=1, max_value=1 << 40), min_size=1, max_size=64))
@settings(max_examples=examples(50))
def test_comma_list_reads_what_format_writes(sizes):
    assert comma_list(parse_size, "sizes")(",".join(format_size(s) for s in sizes)) == sizes
    assert comma_list(parse_size, "sizes")(" , ".join(str(s) for s in sizes)) == sizes


@pytest.mark.parametrize("text", ["", ",", "1M,", ",1M", "1M,,2M", "1M,x", ",".join(["1"] * 65)])
def test_comma_list_errors(text):
    with pytest.raises(argparse.ArgumentTypeError):
        comma_list(parse_size, "sizes")(text)


def test_choice_list():
    assert choice_list(("a", "b"))("b,a") == ["b", "a"]
    with pytest.raises(argparse.ArgumentTypeError, match="not one of"):
        choice_list(("a", "b"))("a,c")


@given(st.integers(min_value=0, max_value=1 << 30), st.integers(min_value=0, max_value=1 << 34),
       st.integers(min_value=2, max_value=64))
@settings(max_examples=examples(100))
def test_factor_sweep_is_nccl_tests(lo, hi, f):
    from hccc.commands.run import DEFAULT_BYTES
    from hccc.util.diagnostics import CompileError
    from hccc.sweep import sweep_sizes
    args = argparse.Namespace(sizes=None, minbytes=lo, maxbytes=hi, stepfactor=f, stepbytes=None,
                              sweep_default=[4096])
    expect = [lo * f ** k for k in range(0, 200) if lo * f ** k <= hi] if lo else ([0] if hi == 0 else None)
    if hi < lo or expect is None or len(expect) > 64:
        with pytest.raises(CompileError):
            sweep_sizes(args)
        return
    sw = sweep_sizes(args)
    assert sw.sizes == expect and sw.min_bytes == lo and sw.max_bytes == hi and sw.step == f"{f}(factor)"
    assert DEFAULT_BYTES


def test_step_bytes_sweep_and_defaults():
    from hccc.sweep import sweep_sizes
    ns = dict(sizes=None, minbytes=None, maxbytes=None, stepfactor=None, stepbytes=None, sweep_default=[7])
    assert sweep_sizes(argparse.Namespace(**{**ns, "minbytes": 1024, "maxbytes": 4096, "stepbytes": 1024})).sizes \
        == [1024, 2048, 3072, 4096]
    assert sweep_sizes(argparse.Namespace(**{**ns, "minbytes": 1024})).sizes == [1024]     # -e defaults to -b
    assert sweep_sizes(argparse.Namespace(**{**ns, "maxbytes": 8})).sizes == [8]
    assert sweep_sizes(argparse.Namespace(**ns)).sizes == [7]


# ---------------------------------------------------------------------------- messages
@pytest.mark.parametrize("count, noun, text", [
    (0, "step", "0 steps"), (1, "step", "1 step"), (2, "step", "2 steps"), (1, "thread block", "1 thread block"),
    (3, "thread block", "3 thread blocks"), (2, "micro-batch", "2 micro-batches"), (2, "entry", "2 entries"),
    (2, "key", "2 keys"), (1, "class", "1 class"), (2, "class", "2 classes"), (2, "index", "2 indices"),
    (5, "linked rank pair", "5 linked rank pairs"), (2, "GPU", "2 GPUs")])
def test_plural(count, noun, text):
    assert plural(count, noun) == text


def test_check_pluralises(tmp_path, capsys):
    one = tmp_path / "one.rccl"
    one.write_text('def ResCCLAlgo(nRanks=2, OpType="Allgather"):\n    transfer(0, 1, 0, 0, recv)\n'
                   '    transfer(1, 0, 0, 1, recv)\n')
    rc, out, err = cli(capsys, "check", one)
    assert rc == 0, err
    assert out.strip().endswith("valid Allgather on 2 ranks (2 transfers, 1 step)")


def test_notes_are_located():
    from hccc.util.diagnostics import Diagnostic, Location, SourceFile, render
    src = SourceFile("algo.rccl", "line one\n    transfer(0, 1, 0, 0, recv)\n")
    d = Diagnostic("bad", Location(src, 2, 5), notes=("about here", (Location(src, 1, 1), "and there")))
    lines = render(d).splitlines()
    assert lines[0] == "algo.rccl:2:5: error: bad"
    assert lines[-2:] == ["algo.rccl:2:5: note: about here", "algo.rccl:1:1: note: and there"]
    assert render(Diagnostic("x", None, notes=("y",))).splitlines() == ["hccc: error: x", "hccc: note: y"]


@pytest.mark.parametrize("argv, says", [
    (["topo", RING], "is an algorithm; `hccc topo` reads a cluster description"),
    (["synth", RING, "--collective", "allgather", "-o", "x.rccl"], "is an algorithm; `hccc synth` reads a cluster"),
    ([TOPO, "-o", "OUT"], "is a cluster description; `hccc` reads an algorithm"),
    (["check", TOPO], "is a cluster description; `hccc check` reads an algorithm"),
    (["sim", TOPO, "--topology", TOPO], "is a cluster description; `hccc sim` reads an algorithm"),
    (["run", TOPO], "is a cluster description; `hccc run` reads an algorithm"),
    (["check", RING, "--topology", RING], "`hccc check ... --topology` reads a cluster description"),
])
def test_a_file_for_another_command_says_which(capsys, tmp_path, argv, says):
    argv = [str(tmp_path / a) if a == "OUT" else a for a in argv]
    rc, out, err = cli(capsys, *argv)
    assert rc == 1 and says in err and "did you mean `hccc" in err, err
    if TOPO in argv and argv[0] == TOPO:
        assert f"`hccc topo {TOPO}` or `--topology {TOPO}`" in err
        assert not (tmp_path / "OUT").exists()
    if argv[0] == "topo":
        assert f"`hccc check {RING}`" in err


# ---------------------------------------------------------------------------- progress
class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_plain_lines_off_a_terminal(monkeypatch):
    from hccc.progress import Progress
    monkeypatch.delenv("HCCC_PROGRESS", raising=False)
    stream = io.StringIO()
    with Progress("hccc x", stream=stream) as p:
        with p.phase("building a", limit_s=60) as ph:
            ph.update("half way")
        t = p.task("running 3 sizes", total=3)
        for _ in range(3):
            t.advance()
        with p.phase("plotting"):
            pass
    assert stream.getvalue().splitlines() == ["hccc x: building a (time limit 60 s)", "hccc x: running 3 sizes",
                                              "hccc x: plotting"]
    quiet = io.StringIO()
    with Progress("hccc x", enabled=False, stream=quiet) as p:
        with p.phase("building"):
            pass
    assert quiet.getvalue() == ""


def test_progress_is_live_on_a_terminal_and_leaves_no_trace(monkeypatch):
    from hccc.progress import Progress, interactive
    monkeypatch.delenv("HCCC_PROGRESS", raising=False)
    stream = _Tty()
    assert interactive(stream)
    with Progress("hccc x", stream=stream) as p:
        assert p.live is not None
        with p.phase("building", limit_s=5) as ph:
            ph.update("step 1")
        t = p.task("running", total=2)
        t.advance(2)
    assert p.lines == []                      # no plain lines: the live display (transient) instead
    monkeypatch.setenv("HCCC_PROGRESS", "plain")
    assert not interactive(stream)


def test_sim_prints_one_line_per_phase_on_stderr(capsys):
    rc, out, err = cli(capsys, "sim", RING, "--topology", TOPO, "--sizes", "1M,2M")
    assert rc == 0
    assert err.splitlines() == ["hccc sim: building " + RING, "hccc sim: simulating 2 sizes of ring_allreduce_8"]
    rc, out, err = cli(capsys, "sim", RING, "--topology", TOPO, "--sizes", "1M", "--json")
    assert rc == 0 and err == ""


# ---------------------------------------------------------------------------- cache location
def test_cache_location(monkeypatch, tmp_path):
    from hccc.runtime.cache import cache_root
    monkeypatch.setenv("HCCC_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("HCCC_CACHE_DIR")
    if os.name == "posix" and not str(os.uname().sysname).startswith("Darwin"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert cache_root() == tmp_path / "xdg" / "hccc"


# ---------------------------------------------------------------------------- one vocabulary
def _options(name: str) -> dict[str, argparse.Action]:
    return {o: a for a in command_parser(name)._actions for o in a.option_strings}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_mistyped_options_get_did_you_mean(capsys, name):
    """Every command: each shown long option, mistyped by one dropped letter, is suggested back."""
    shown = [o for o, a in _options(name).items() if o.startswith("--") and a.help is not argparse.SUPPRESS
             and len(o) > 6 and o not in ("--help", "--version")]
    for opt in shown[:6]:
        typo = opt[:4] + opt[5:]              # one letter dropped
        if typo in _options(name) or any(o.startswith(typo) for o in _options(name)):
            continue                          # an abbreviation argparse accepts
        rc, _, err = cli(capsys, name, typo, "x")
        assert rc == 2 and "did you mean '--" in err, (name, typo, err)


@pytest.mark.parametrize("concept, spellings", [
    ("topology", {name: ("--topology",) for name in ("compile", "check", "run", "sim", "topo", "synth", "gen")}),
    ("thread count (nccl-tests' -t)", {name: ("-t", "--nthreads") for name in ("run", "sim", "fuzz")}),
    ("GPUs per thread (nccl-tests' -g)", {name: ("-g", "--ngpus") for name in ("run", "sim", "fuzz")}),
    ("smallest size", {"run": ("-b", "--min-bytes"), "sim": ("-b", "--min-bytes")}),
    ("element type", {"run": ("-d", "--dtype"), "sim": ("-d", "--dtype"), "fuzz": ("-d", "--dtype")}),
    ("reduction", {"run": ("-o", "--op"), "sim": ("-o", "--op"), "fuzz": ("-o", "--op")}),
    ("fusion", {"compile": ("--fuse",), "run": ("--fuse",), "fuzz": ("--fuse",), "sim": ("--fuse",)}),
])
def test_one_spelling_per_concept(concept, spellings):
    for name, opts in spellings.items():
        have = _options(name)
        for o in opts:
            assert o in have, f"hccc {name} lacks {o} ({concept})"
        dests = {have[o].dest for o in opts}
        assert len(dests) == 1, (name, concept, dests)


@pytest.mark.parametrize("name, old, new", [("run", "--minbytes", "--min-bytes"), ("run", "--maxbytes", "--max-bytes"),
                                            ("sim", "--stepfactor", "--step-factor"), ("fuzz", "--dtypes", "--dtype"),
                                            ("fuzz", "--ops", "--op")])
def test_old_spellings_are_hidden_aliases(name, old, new):
    have = _options(name)
    assert have[old].dest == have[new].dest and have[old].help is argparse.SUPPRESS
    assert old not in command_parser(name).format_help()


def test_dtypes_and_backends_agree_across_commands():
    for name in ("sim", "fuzz", "run"):
        parse = _options(name)["--dtype"].type
        assert parse("float32") in ("float32", ["float32"]) and parse("FLOAT") in ("float32", ["float32"])
        assert parse("half") in ("float16", ["float16"]) and parse("int32") in ("int32", ["int32"])
    assert set(_options("fuzz")["--backend"].choices) == set(_options("run")["--backend"].choices)


def test_topology_as_option_on_commands_that_take_it_positionally(capsys):
    rc, out, _ = cli(capsys, "topo", "--topology", TOPO, "--json")
    assert rc == 0 and '"ranks"' in out or '"gpus"' in out or "nodes" in out
    rc2, out2, _ = cli(capsys, "topo", TOPO, "--json")
    assert rc2 == 0 and out2 == out
    rc, _, err = cli(capsys, "topo")
    assert rc == 2 and "required: T" in err


@pytest.mark.parametrize("name", ["run", "sim"])
def test_o_given_a_folder_explains_itself(capsys, name, tmp_path):
    extra = ["--topology", TOPO] if name == "sim" else []
    rc, _, err = cli(capsys, name, RING, *extra, "-o", f"{tmp_path}/out/")
    assert rc == 2
    assert "is not a reduction operator" in err and "nccl-tests' -o" in err and "hccc ALGO -o OUTDIR" in err
    from hccc.args import NCCL_OPS
    from hccc.runtime.launcher import OPS
    rc, _, err = cli(capsys, name, RING, *extra, "-o", "mulsum")
    assert rc == 2 and f"is not a reduction operator ({', '.join(OPS)})" in err and "OUTDIR" not in err
    for op in NCCL_OPS:          # nccl-tests' operators: the kernels' own, or a clear error naming them
        rc, _, err = cli(capsys, name, RING, *extra, "-o", op.upper(), "--help")
        if op not in OPS:
            assert rc == 2 and f"have no '{op}' reduction" in err.splitlines()[0]


def test_cpu_emulation_times_are_labelled(capsys):
    rc, out, _ = cli(capsys, "run", str(EX / "ring_allgather_8.rccl"), "--sizes", "4K", "-n", "1", "-w", "0")
    assert rc == 0 and "CPU emulation" in out and "not a GPU" in out
    assert re.search(r"^\s+4096\s+1024\s+float32\s", out, re.M), out      # the dtype as -d spells it
    rc, out, _ = cli(capsys, "run", str(EX / "ring_allgather_8.rccl"), "--sizes", "4K", "-n", "1", "-w", "0", "--json")
    import json
    assert json.loads(out)["emulated"] is True


def test_sim_explains_its_columns_and_plots_a_curve(capsys, tmp_path, monkeypatch):
    import hccc.runtime.sim_plot as sim_plot
    seen = {}
    real = sim_plot.plot_busbw

    def spy(curves, path, **kw):
        seen.update(curves=curves, **kw)
        seen["result"] = real(curves, path, **kw)
        return seen["result"]
    monkeypatch.setattr(sim_plot, "plot_busbw", spy)
    png = tmp_path / "bw.png"
    rc, out, _ = cli(capsys, "sim", RING, "--topology", TOPO, "--plot-busbw", png, "--scheduler", "hpds,rr")
    assert rc == 0 and png.stat().st_size > 0
    for word in ("bound:", "slice:", "mbatch:", "idle avg / max:"):
        assert word in out
    assert "bound:" in command_parser("sim").format_help()
    (sizes, busbw), = list(seen["curves"].values())[:1]
    assert len(sizes) >= 8                                  # a curve, not three points
    assert set(seen["bounds"]) == set(seen["curves"])
    for label, (bs, bb) in seen["bounds"].items():          # the bound is above what the schedule reaches
        assert all(b >= v * (1 - 1e-9) for b, v in zip(bb, seen["curves"][label][1]))
    assert "scheduler hpds,rr" in seen["title"]
    assert seen["result"][1][0] == 0                         # y axis from 0


def test_interrupt_while_starting_prints_no_traceback():
    """Ctrl-C while hccc imports its modules (numpy first, the window right after start-up) and
    later: 'interrupted', exit 130, no traceback. The interrupt is sent once numpy is being loaded
    (its extension mapped: hccc's own code runs), then later."""
    import signal
    import subprocess
    import sys
    import time
    for delay in (0.0, 0.05, 0.3):
        p = subprocess.Popen([sys.executable, "-m", "hccc.cli", "check", RING], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and p.poll() is None:
            try:
                if "_multiarray_umath" in Path(f"/proc/{p.pid}/maps").read_text():
                    break
            except OSError:
                break
            time.sleep(0.001)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert "Traceback" not in err, (delay, err)
        assert p.returncode in (0, 130), (delay, p.returncode, err)
        if p.returncode == 130:
            assert "hccc: interrupted" in err


@pytest.mark.parametrize("script", ["generate.py", "c2c/generate.py", "clusters/generate.py", "msccl/generate.py",
                                    "torch/make_catalog.py"])
def test_example_scripts_answer_help_and_write_nothing(tmp_path, script, monkeypatch, capsys):
    import runpy
    import sys
    # the script as `python SCRIPT --help` runs it, in this process (it imports hccc's modules only)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(EX / script), "--help"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(EX / script), run_name="__main__")
    out = capsys.readouterr()
    assert done.value.code in (0, None) and "usage:" in out.out, out.err
    assert list(tmp_path.iterdir()) == []                 # no folder named --help
    assert not (EX / "--help").exists() and not (EX / script).parent.joinpath("--help").exists()


def test_program_options_always_give_a_slot_size():
    """Without --chunk-size (whose default `hccc run` leaves unset, to size the slot itself)
    the compile options keep CompileOptions' slot (an IR always
    has one: its JSON, the emitted code and the channel rule read it); with it, that size."""
    from hccc.args import program_options
    from hccc.compiler.pipeline import CompileOptions, load_program
    from hccc.compiler.passes.channels import auto_channels

    algo = str(Path(__file__).resolve().parent.parent / "examples" / "ring_allgather_8.rccl")
    plain = program_options(command_parser("run").parse_args([algo]))
    assert plain.chunk_bytes == CompileOptions().chunk_bytes
    ir = load_program(algo, plain)
    assert '"chunk_bytes": %d' % CompileOptions().chunk_bytes in ir.to_json() and auto_channels(ir, "cuda") >= 1
    assert program_options(command_parser("run").parse_args([algo, "--chunk-size", "64K"])).chunk_bytes == 64 << 10


# ---------------------------------------------------------------------------- one vocabulary
def _parse(capsys, name, *argv):
    """(namespace or exit status, stderr) of parsing a command line of ``name`` (nothing runs)."""
    try:
        ns = command_parser(name).parse_args([str(a) for a in argv])
    except SystemExit as exc:
        ns = exc.code
    return ns, capsys.readouterr().err


@pytest.mark.parametrize("name, has", [("run", ("auto", "simple", "ll")), ("xml", ("simple", "ll", "ll128")),
                                       ("plan", ("simple", "ll"))])
def test_proto_is_spelled_one_way_in_any_case(capsys, name, has):
    from hccc.args import PROTOCOL_NAMES
    action = _options(name)["--proto"]
    assert action.metavar == "|".join(has)
    out = [] if name == "run" else ["-o", "x"]        # run's -o is the reduction
    for proto in PROTOCOL_NAMES:
        for spelled in (proto, proto.upper(), proto.capitalize()):
            ns, err = _parse(capsys, name, RING, *out, "--proto", spelled)
            if proto in has:
                assert not isinstance(ns, int) and ns.proto.lower() == proto, (name, spelled)
            else:             # another engine's protocol: the one line says which this one has
                assert ns == 2 and f"no '{proto}' protocol (it has {'|'.join(has)})" in err.splitlines()[0]
    ns, err = _parse(capsys, name, RING, *out, "--proto", "fast")
    assert ns == 2 and "'fast' is not a protocol" in err


def test_nccl_tests_type_and_operator_names(capsys):
    from hccc.args import NCCL_OPS, NCCL_TYPE_NAMES
    from hccc.runtime.launcher import DTYPES, OPS
    for nccl, ours in NCCL_TYPE_NAMES.items():
        ns, err = _parse(capsys, "run", RING, "-d", nccl.upper())
        if ours in DTYPES:
            assert ns.dtype == [ours]
        else:                 # nccl-tests has it, the kernels' table does not (yet): say which they have
            assert ns == 2 and f"have no {ours} type" in err.splitlines()[0]
    ns, _ = _parse(capsys, "run", RING, "-d", "all", "-o", "all")
    assert ns.dtype == list(DTYPES) and ns.op == list(OPS)
    ns, _ = _parse(capsys, "run", RING, "-d", "float,half,float32", "-o", "MAX,sum")
    assert ns.dtype == ["float32", "float16"] and ns.op == ["max", "sum"]
    ns, _ = _parse(capsys, "fuzz", RING, "-d", "half", "-o", "all")
    assert ns.dtypes == ["float16"] and ns.ops == list(OPS)
    ns, _ = _parse(capsys, "sim", RING, "--topology", TOPO, "-d", "all", "-o", "all")
    assert ns.dtype == list(DTYPES) and ns.op == list(OPS)
    ns, _ = _parse(capsys, "sim", RING, "--topology", TOPO, "-d", "half", "-o", "Min", "-n", "20", "-w", "5")
    assert ns.dtype == ["float16"] and ns.op == ["min"]
    for op in NCCL_OPS:
        ns, err = _parse(capsys, "sim", RING, "--topology", TOPO, "-o", op)
        assert (ns.op == [op]) if op in OPS else (ns == 2 and f"no '{op}' reduction" in err)
    ns, _ = _parse(capsys, "run", RING, "-c", "0", "-a", "3", "-g", "8", "-n", "20", "-w", "5")
    assert (ns.check, ns.average, ns.ngpus, ns.iters, ns.warmup) == (0, 3, 8, 20, 5)


def test_run_takes_nccl_tests_flags(capsys):
    ag = str(EX / "ring_allgather_8.rccl")
    rc, _, err = cli(capsys, "run", ag, "-g", "4", "--sizes", "4K")
    assert rc == 2 and "-g 4: ring_allgather_8 runs on 8 ranks" in err
    rc, out, err = cli(capsys, "run", ag, "-g", "8", "-c", "0", "-a", "0", "-d", "float,int32", "--sizes", "4K",
                       "-n", "1", "-w", "0", "--out-of-place-only", "-N", "2", "-t", "1", "-z", "1")
    assert rc == 0, err
    rows = [ln.split() for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    assert [r[2] for r in rows] == ["float32"] * 2 + ["int32"] * 2   # a table per type, -N 2: each row twice
    assert out.count("# nccl-tests' -z 1 (wait for each collective before the next): no effect on hccc run") == 1
    assert all(r[-1] == "N/A" for r in rows)                      # -c 0: nothing is reported checked
    assert out.count("validation: 0") == 2


def test_sim_takes_nccl_tests_flags(capsys, tmp_path):
    """hccc sim with nccl-tests' -c, -a, -g, -n, -w and -d/-o lists: accepted with what they mean
    for a model (a table per element type and operator; -g must be the ranks)."""
    rc, out, err = cli(capsys, "sim", RING, "--topology", TOPO, "--sizes", "1M", "-c", "5", "-a", "3", "-g", "8", "-n",
                       "20", "-w", "5", "-d", "float,half", "-o", "sum,MAX")
    assert rc == 0, err
    rows = [ln.split() for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    assert [(r[1], r[2], r[3]) for r in rows] == [("262144", "float32", "sum"), ("262144", "float32", "max"),
                                                   ("524288", "float16", "sum"), ("524288", "float16", "max")]
    assert len({r[5] for r in rows}) == 1                    # the model's time does not depend on them
    rc, _, err = cli(capsys, "sim", RING, "--topology", TOPO, "--sizes", "1M", "-g", "4")
    assert rc == 2 and any(ln.startswith("hccc sim: error: -g 4: ring_allreduce_8 runs on 8 ranks (its nRanks)") for ln in err.splitlines())
    rc, _, err = cli(capsys, "sim", RING, "--topology", TOPO, "--sizes", "1M", "-d", "all", "--plot-busbw",
                     str(tmp_path / "b.png"))
    assert rc == 2 and "give one -d and one -o" in err and not (tmp_path / "b.png").exists()


def test_old_spellings_warn_and_still_work(capsys):
    ns, err = _parse(capsys, "xml", RING, "-o", "x.xml", "--min-bytes", "4K", "--max-bytes", "1M")
    assert (ns.min_bytes, ns.max_bytes) == (4096, 1 << 20)
    assert "--min-bytes is deprecated here" in err and "use --select-min-bytes" in err and "use --select-max-bytes" in err
    ns, err = _parse(capsys, "plan", RING, "-o", "x.json", "--select-min-bytes", "4K", "--select-max-bytes", "1M")
    assert (ns.min_bytes, ns.max_bytes) == (4096, 1 << 20) and not err
    ns, err = _parse(capsys, "plan", RING, "-o", "x.json", "--inplace")
    assert ns.inplace and "use --for-inplace" in err
    ns, err = _parse(capsys, "plan", RING, "-o", "x.json", "--for-inplace")
    assert ns.inplace and not err
    ns, err = _parse(capsys, "run", RING, "--inplace")
    assert ns.inplace and "use --inplace-only" in err
    ns, err = _parse(capsys, "run", RING, "--inplace-only")
    assert ns.inplace and not err
    ns, err = _parse(capsys, "run", RING, "--inplace-only", "--out-of-place-only")
    assert ns == 2
    # neither command shows the other's name, nor the sweep's name for the band
    assert "--inplace" not in command_parser("plan").format_help().replace("--for-inplace", "")
    assert "--min-bytes" not in command_parser("xml").format_help()


@pytest.mark.parametrize("name, argv, first", [
    ("run", ["-b", "8K", "-e", "4K"], "hccc run: error: -e 4K is below -b 8K"),
    ("sim", ["--topology", TOPO, "--sizes", "1M", "-b", "1M"], "hccc sim: error: give sizes either as --sizes"),
    ("xml", ["-o", "x.xml", "--select-min-bytes", "4K", "--select-max-bytes", "1K"],
     "hccc xml: error: --select-max-bytes 1K is below --select-min-bytes 4K"),
    ("run", ["--frobnicate"], "hccc run: error: unrecognized arguments: --frobnicate")])
def test_usage_errors_exit_2_with_the_error_line_first(capsys, name, argv, first):
    rc, _, err = cli(capsys, name, RING, *argv)
    lines = err.splitlines()
    assert rc == 2 and lines[0].startswith(first) and lines[1].startswith(f"usage: hccc {name}")


def test_unknown_command_error_line_first(capsys):
    rc, _, err = cli(capsys, "frobnicate")
    assert rc == 2 and err.startswith("hccc: error: unknown command") and "usage:" in err.splitlines()[1]


@pytest.mark.parametrize("folder, warns", [("sum", True), ("PROD", True), ("all", True), ("kernels", False)])
def test_output_folder_named_like_an_operator_warns(capsys, tmp_path, folder, warns):
    rc, _, err = cli(capsys, RING, "-o", tmp_path / folder, "--list-outputs")
    assert rc == 0 and ("named like a reduction operator" in err) == warns


def test_header_nchannels_is_honoured_one_included(capsys, tmp_path):
    """--channels auto takes the .rccl header's nChannels where it is written, 1 included; a header
    without one gets the hardware rule (more than one channel for this ring on a CUDA device)."""
    text = Path(RING).read_text()
    assert "nChannels=1, " in text
    none = tmp_path / "none.rccl"
    none.write_text(text.replace("nChannels=1, ", ""))
    four = tmp_path / "four.rccl"
    four.write_text(text.replace("nChannels=1, ", "nChannels=4, "))
    got = {}
    for path in (RING, none, four):
        rc, out, err = cli(capsys, path, "-o", tmp_path / f"out_{Path(path).stem}", "--target", "cuda")
        assert rc == 0, err
        got[Path(path).stem] = int(re.search(r"(\d+) channels? \(blocks per TB\)", out).group(1))
    assert got["ring_allreduce_8"] == 1 and got["four"] == 4 and got["none"] > 1
