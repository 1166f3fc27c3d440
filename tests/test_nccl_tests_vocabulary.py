"""nccl-tests' vocabulary on ``hccc run``, ``sim`` and ``fuzz``: ``-d all -o all`` leaves out the
(type, operator) pairs the kernels lack with one note and exits 0, while a pair named explicitly is
refused; ``-t`` is nccl-tests' thread count (a file given to it gets "did you mean --topology");
nccl-tests' other flags are accepted with their meaning, the ones that change nothing saying so."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hccc.args import Every
from hccc.cli import command_parser, main
from hccc.sweep import instance_combos, nccl_noop_flags
from hccc.util import dtypes as dtypes_table
from hccc.util.diagnostics import CompileError

ROOT = Path(__file__).resolve().parent.parent
RING = str(ROOT / "examples" / "ring_allreduce_8.rccl")
TOPO = str(ROOT / "examples" / "clusters" / "a100_topo1.topo")
DTYPES, OPS = dtypes_table.DTYPE_NAMES, dtypes_table.OP_NAMES


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _integer(dtype: str) -> bool:
    """The oracle: numpy's own kind of the type (bfloat16, which numpy lacks, is floating)."""
    return dtype != "bfloat16" and np.issubdtype(np.dtype(dtype), np.integer)


@given(st.lists(st.sampled_from(DTYPES), min_size=1, unique=True), st.lists(st.sampled_from(OPS), min_size=1, unique=True),
       st.booleans(), st.booleans())
def test_all_leaves_out_exactly_the_integer_averages(dtypes, ops, every_d, every_o):
    d = Every(DTYPES) if every_d else dtypes
    o = Every(OPS) if every_o else ops
    want = [(x, y) for x in d for y in o if not (_integer(x) and y == "avg")]
    lacking = [(x, y) for x in d for y in o if _integer(x) and y == "avg"]
    if lacking and (not (every_d or every_o) or not want):
        with pytest.raises(CompileError) as err:
            instance_combos(d, o)
        x, y = lacking[0]
        assert err.value.diagnostics[0].message.startswith(f"-d {x} -o {y}: ")
        return
    pairs, note = instance_combos(d, o)
    assert pairs == want
    assert (note is None) == (not lacking)
    if note:
        assert "\n" not in note and all(x in note for x, _ in lacking)


def test_run_all_all_runs_every_instance_and_exits_0(capsys, monkeypatch):
    """``hccc run -d all -o all``: a table for every pair the kernels have, one note for the rest
    (each table's run stubbed: the selection is what is tested; the kernels' tests run them)."""
    import hccc.commands.run as run_cmd
    ran = []
    monkeypatch.setattr(run_cmd, "_run_one", lambda a: ran.append((a.dtype, a.op)) or 0)
    rc, out, err = cli(capsys, "run", RING, "-d", "all", "-o", "all")
    assert rc == 0, err
    assert ran == [(d, o) for d in DTYPES for o in OPS if not (_integer(d) and o == "avg")]
    notes = [ln for ln in out.splitlines() if "left out of all" in ln]
    assert len(notes) == 1 and notes[0].startswith("# ")
    ran.clear()
    rc, out, err = cli(capsys, "run", RING, "-d", "all", "-o", "all", "--json")
    assert rc == 0 and out == "" and err.count("left out of all") == 1


@pytest.mark.parametrize("command", ["run", "sim"])
def test_an_explicit_integer_average_is_refused_before_anything_runs(capsys, command):
    extra = ["--topology", TOPO] if command == "sim" else []
    rc, out, err = cli(capsys, command, RING, *extra, "-d", "int32", "-o", "avg", "--sizes", "4K")
    assert rc == 1 and out == ""
    assert "-d int32 -o avg: op avg has no kernel for the integer type int32" in err
    assert "Traceback" not in err and "building" not in err


def test_sim_all_all_exits_0_with_one_note(capsys):
    rc, out, err = cli(capsys, "sim", RING, "--topology", TOPO, "--sizes", "1M", "-d", "int32,float", "-o", "all")
    assert rc == 0, err
    assert out.count("left out of all: -o avg with -d int32") == 1
    rows = [ln.split() for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    assert [(r[2], r[3]) for r in rows] == [(d, o) for d in ("int32", "float32") for o in OPS
                                            if (d, o) != ("int32", "avg")]


@pytest.mark.parametrize("command", ["run", "sim", "fuzz"])
def test_t_is_the_thread_count_and_a_file_gets_the_topology_hint(capsys, command):
    rc, _, err = cli(capsys, command, RING, "-t", TOPO)
    assert rc == 2
    first = err.splitlines()[0]
    assert f"hccc {command}: error: argument -t/--nthreads" in first and f"did you mean --topology {TOPO}?" in first
    extra = ["--topology", TOPO] if command == "sim" else []
    ns = command_parser(command).parse_args([RING, *extra, "-t", "2", "-g", "4"])
    assert (ns.nthreads, ns.ngpus) == (2, 4)
    rc, _, err = cli(capsys, command, RING, "-t", "0")
    assert rc == 2 and "thread count >= 1" in err and "did you mean" not in err


@pytest.mark.parametrize("command", ["run", "fuzz"])
@pytest.mark.parametrize("t, g", [(1, None), (3, None), (2, 2), (None, 4), (16, 1)])
def test_t_times_g_must_be_the_ranks(capsys, command, t, g):
    argv = [command, RING, "--sizes", "4K"] if command == "run" else [command, RING]
    argv += (["-t", str(t)] if t else []) + (["-g", str(g)] if g else [])
    rc, _, err = cli(capsys, *argv)
    assert rc == 2 and "product is 8" in err, err


def test_sim_takes_t_and_g_whose_product_is_the_ranks(capsys):
    rc, out, err = cli(capsys, "sim", RING, "--topology", TOPO, "--sizes", "1M", "-t", "2", "-g", "4")
    assert rc == 0, err
    rc, out, err = cli(capsys, "sim", RING, "--topology", TOPO, "--sizes", "1M", "-t", "8")
    assert rc == 0, err


@pytest.mark.parametrize("command, model", [("run", False), ("sim", True)])
def test_the_no_op_flags_are_accepted_and_say_so(capsys, command, model):
    flags = nccl_noop_flags(command, model=model)
    assert {f.short for f in flags} >= {"-z", "-G", "-m", "-p", "-C", "-R"}
    argv = [RING] + (["--topology", TOPO] if model else [])
    for f in flags:
        ns = command_parser(command).parse_args(argv + [f.short, str(f.default + 1)])
        assert getattr(ns, "nccl_" + f.long[2:].replace("-", "_")) == f.default + 1
    if model:
        given = [x for f in flags for x in (f.short, str(f.default + 1))]
        rc, out, err = cli(capsys, "sim", *argv, "--sizes", "1M", *given)
        assert rc == 0, err
        notes = [ln for ln in out.splitlines() if "no effect on hccc sim" in ln]
        assert len(notes) == len(flags) and all(ln.startswith("# nccl-tests' -") for ln in notes)
        rc, out, err = cli(capsys, "sim", *argv, "--sizes", "1M", "-z", "1", "-G", "0", "--json")
        assert rc == 0 and json.loads(out)["results"]
        assert err.count("no effect on hccc sim") == 1 and "-z 1" in err
        # nccl-tests' defaults given explicitly say nothing
        rc, out, _ = cli(capsys, "sim", *argv, "--sizes", "1M", "-m", "1", "-z", "0")
        assert rc == 0 and "no effect" not in out


def test_run_cycles_and_timeout_spellings():
    ns = command_parser("run").parse_args([RING, "-N", "3", "-T", "4"])
    assert (ns.run_cycles, ns.timeout) == (3, 4.0)
    ns = command_parser("fuzz").parse_args([RING, "-T", "2"])
    assert ns.timeout == 2.0


@pytest.mark.parametrize("command, argv", [("check", [RING, "-t", TOPO]), ("topo", ["-t", TOPO])])
def test_t_for_the_cluster_elsewhere_still_works_and_warns(capsys, command, argv):
    rc, out, err = cli(capsys, command, *argv)
    assert rc == 0, err
    assert f"hccc {command}: warning: -t is deprecated for the cluster" in err and "use --topology" in err


@pytest.mark.parametrize("command", ["run", "sim", "fuzz"])
def test_nccl_tests_long_names_are_read_as_hccc_spells_them(command):
    """nccl-tests' ``--datatype``, ``--warmup_iters``, ``--run_cycles``, ... where the command has
    the option: the same value as hccc's spelling gives, and hidden from the help."""
    from hccc.sweep import NCCL_LONG_NAMES
    base = [RING] + (["--topology", TOPO] if command == "sim" else [])
    parser = command_parser(command)
    values = {"--datatype": "half", "--run_cycles": "2", "--agg_iters": "3"}
    tried = 0
    for theirs, ours in NCCL_LONG_NAMES.items():
        if ours not in parser._option_string_actions:
            continue
        value = values.get(theirs, "1")
        a = parser.parse_args(base + [theirs, value])
        b = parser.parse_args(base + [ours, value])
        assert vars(a) == vars(b), theirs
        assert theirs not in parser.format_help()
        tried += 1
    assert tried >= (1 if command == "fuzz" else 6)
