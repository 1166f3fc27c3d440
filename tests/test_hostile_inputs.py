"""Hostile and accidental inputs get a located error (exit 1) or a usage error (exit 2), never an
internal error (exit 3), a hang or unbounded memory; every limit fires before the work it guards.

Limits run in subprocesses under an address-space cap (``RLIMIT_AS``,
:data:`capped_runs.MEMORY_CAP`) and a CPU-time cap (``RLIMIT_CPU``, :data:`capped_runs.CPU_CAP_S`): a
limit that fires before its work needs the interpreter's start-up and little more, while the work it guards (parsing 200,000 lines, a
4096-node cluster, allocating a huge scratch buffer, a minute of synthesis) would be killed by
either cap. CPU time, unlike wall-clock time, does not grow with the load of a shared test
machine, so the tests assert no wall-clock times (``benchmarks/input_limits.py`` prints them).
Runs that guard no work (names from inputs that must reach the terminal escaped, a small input
refused) are in this process (:func:`cli_runs.run_cli`).
"""
from __future__ import annotations

import json
import os
import re
import resource
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hccc.util.diagnostics import CompileError
from hccc.util.limits import (MAX_JSON_DEPTH, MAX_JSON_INT_DIGITS, loads_json, printable,
                                           read_input_bytes)
from hccc.util.diagnostics import SourceFile
from hccc.compiler.pipeline import load_program
from capped_runs import assert_fires, hccc, hccc_each
from cli_runs import run_cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
LOCATED = re.compile(r"^\S+:\d+:\d+: error: ", re.M)


@pytest.fixture(scope="module")
def ir_text(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("ir") / "k"
    r = run_cli(EXAMPLES / "ring_allgather_8.rccl", "-o", out)      # a valid program: no limit to guard
    assert r.returncode == 0, r.stderr
    return (out / "ring_allgather_8.ir.json").read_text()


def _in_process(*args, env=None) -> tuple[int, str, float]:
    """hccc in this process, for runs that guard no work (a small input refused, names to escape):
    as :func:`capped_runs.hccc` gives it, (exit status, stderr then stdout, 0.0)."""
    r = run_cli(*args, env={"HCCC_DEBUG": None, **(env or {})})
    return r.returncode, r.stderr + r.stdout, 0.0


# ----------------------------------------------------------------------------- input files
def test_dev_zero_and_fifo_inputs_are_refused_at_once(tmp_path):
    fifo, topo_fifo = tmp_path / "algo.rccl", tmp_path / "cluster.topo"
    os.mkfifo(fifo)
    os.mkfifo(topo_fifo)
    cmds = [["/dev/zero", "-o", tmp_path / "o"], ["check", fifo], [fifo, "-o", tmp_path / "o"],
            ["topo", topo_fifo], ["run", fifo, "--backend", "cpu"]]
    dev_zero, *fifos = hccc_each(cmds, timeout=60)      # a read that blocks: the timeout fails it
    assert_fires(dev_zero, pattern="character device")
    for cmd, result in zip(cmds[1:], fifos):
        assert_fires(result, pattern="FIFO")
    assert not (tmp_path / "o").exists()


SIZE_CAP_SUFFIXES = [".rccl", ".topo", ".xml", ".json"]


@pytest.fixture(scope="module")
def huge_input_runs(tmp_path_factory):
    """hccc on a file of 100 GiB of each suffix (sparse: no disk), all in one capped process."""
    d = tmp_path_factory.mktemp("huge")
    cmds = []
    for suffix in SIZE_CAP_SUFFIXES:
        big = d / f"big{suffix}"
        with open(big, "wb") as f:
            f.truncate(100 << 30)
        cmds.append(["topo", big] if suffix == ".topo" else ["check", big])
    return dict(zip(SIZE_CAP_SUFFIXES, hccc_each(cmds)))


@pytest.mark.parametrize("suffix", SIZE_CAP_SUFFIXES)
def test_input_size_cap_fires_before_reading(tmp_path, suffix, huge_input_runs):
    assert_fires(huge_input_runs[suffix], pattern="over the .* input limit")
    # the limit set by the environment, on a file of 4 KiB (no work to guard: in this process)
    small = tmp_path / f"small{suffix}"
    small.write_bytes(b"#" * 4096)
    assert_fires(_in_process(*(["topo", small] if suffix == ".topo" else ["check", small]),
                             env={"HCCC_MAX_INPUT_BYTES": "1K"}), pattern="over the 1.0 KiB input limit")


@settings(max_examples=40)
@given(size=st.integers(0, 3000), cap=st.integers(1, 3000))
def test_read_input_bytes_cap(tmp_path_factory, size, cap):
    p = tmp_path_factory.mktemp("cap") / "f"
    data = bytes(i % 251 for i in range(size))
    p.write_bytes(data)
    if size <= cap:
        assert read_input_bytes(p, limit=cap) == data
    else:
        with pytest.raises(CompileError, match="input limit"):
            read_input_bytes(p, limit=cap)


# ----------------------------------------------------------------------------- JSON
@settings(max_examples=40)
@given(depth=st.integers(1, 3 * MAX_JSON_DEPTH), digits=st.integers(1, 2 * MAX_JSON_INT_DIGITS),
       kind=st.sampled_from("[{"))
def test_json_depth_and_integer_digits(depth, digits, kind):
    """Oracle: the nesting depth and digit count as built here."""
    num = "9" * digits
    if kind == "[":
        text = "[" * depth + num + "]" * depth
    else:
        text = '{"a": ' * depth + num + "}" * depth
    src = SourceFile("<t>", text)
    if depth > MAX_JSON_DEPTH or digits > MAX_JSON_INT_DIGITS:
        with pytest.raises(CompileError) as info:
            loads_json(src)
        d = info.value.diagnostics[0]
        assert d.location is not None and d.location.line == 1
        assert ("nested" in d.message) if digits <= MAX_JSON_INT_DIGITS else True
    else:
        data = loads_json(src)
        for _ in range(depth):
            data = data[0] if kind == "[" else data["a"]
        assert data == int(num)


_FRACTIONAL = st.builds(lambda sign, whole, frac, exp: f"{sign}{whole}{frac}{exp}",
                        st.sampled_from(["", "-"]), st.from_regex(r"\A(0|[1-9][0-9]{0,40})\Z"),
                        st.from_regex(r"\A(\.[0-9]{1,40})?\Z"),
                        st.one_of(st.just(""), st.integers(-10 ** 9, 10 ** 9).map(lambda e: f"e{e}"),
                                  st.integers(-450, 450).map(lambda e: f"E{e:+d}")))


@settings(max_examples=150)
@given(literal=_FRACTIONAL.filter(lambda t: any(c in t for c in ".eE")),
       exact=st.booleans(), where=st.sampled_from(["top", "nested"]))
def test_json_fractional_numbers_are_bounded_before_they_are_converted(literal, exact, where):
    """A fractional literal is read (as a float, or exact as a TACCL profile reads it) exactly when it
    has at most MAX_JSON_NUMBER_CHARS characters and its leading digit's decimal exponent is within
    MAX_JSON_EXPONENT; otherwise a located error at the literal. Oracle: Decimal's own ``adjusted``
    exponent. (``"alpha": 1e-999999999`` in a TACCL profile once ran for minutes building an exact
    fraction; ``1e999`` read as a float was silently infinity.)"""
    from decimal import Decimal
    from hccc.util.limits import MAX_JSON_EXPONENT, MAX_JSON_NUMBER_CHARS
    text = literal if where == "top" else '{"k": [1, ' + literal + ']}'
    dec = Decimal(literal)
    ok = len(literal) <= MAX_JSON_NUMBER_CHARS and (dec.is_zero() or abs(dec.adjusted()) <= MAX_JSON_EXPONENT)
    src = SourceFile("<t>", text)
    if ok:
        data = loads_json(src, parse_float=Decimal if exact else float)
        value = data if where == "top" else data["k"][1]
        assert value == (dec if exact else float(literal))
        return
    with pytest.raises(CompileError) as info:
        loads_json(src, parse_float=Decimal if exact else float)
    d = info.value.diagnostics[0]
    assert d.location is not None and d.location.line == 1
    assert d.location.col == text.index(literal) + 1, (d.location.col, text)


@pytest.mark.parametrize("text", ["5", "-1.5", "true", "false", "null", '"x"'])
def test_a_json_input_that_is_a_bare_value_is_a_located_error(tmp_path, text):
    """Every command that reads a JSON input (a ProgramIR, a plan, a TACCL profile, an OUTDIR's
    manifest) refuses a file holding one scalar with a located error; a number, true, false or null
    once stopped the nesting check with an internal error (exit 3)."""
    p = tmp_path / "bare.json"
    p.write_text(text + "\n")
    out = tmp_path / "od"
    cmds = [["check", p], ["topo", p], ["run", p, "--backend", "cpu"], ["plan", p, "-o", "-"],
            ["xml", p, "-o", "-"], [p, "-o", out], ["sim", "--topology", p, EXAMPLES / "ring_allgather_8.rccl"]]
    for cmd in cmds:
        code, output, _ = _in_process(*cmd)
        assert code == 1, (cmd, output)
        assert re.search(rf"bare\.json:1:1: error: ", output), (cmd, output)
    assert not out.exists()


def test_huge_json_structures_fire_quickly(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    digits = tmp_path / "digits.json"
    digits.write_text('{"schema": "hccc.ir/1", "nranks": ' + "7" * 100_000 + "}")
    nested, long_int = hccc_each([[deep, "-o", tmp_path / "o"], [digits, "-o", tmp_path / "o"]])
    assert_fires(nested, pattern="nested more than")
    assert_fires(long_int, pattern="more than 24 digits")
    for bad in ("NaN", "Infinity", "-Infinity"):          # small files: no work to guard, this process
        p = tmp_path / "nan.json"
        p.write_text('{"schema": "hccc.ir/1", "nranks": %s}' % bad)
        assert_fires(_in_process(p, "-o", tmp_path / "o"), pattern="not a number")
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- ProgramIR fields
HOSTILE = [None, "x", "", True, 1.5, -1, 0, 10 ** 30, -(10 ** 30), 2 ** 63, [], [[1]], {}, {"a": 1}, [1.5],
           ["a"], [None], [10 ** 30]]


def _paths(d: dict):
    for k, v in d.items():
        if isinstance(v, dict) and k in ("buffers", "prims", "deps", "stats"):
            for k2 in v:
                yield (k, k2)
        yield (k,)


def _json_kind(v):
    return "bool" if isinstance(v, bool) else type(v).__name__


@settings(max_examples=120)
@given(data=st.data())
def test_ir_fields_of_wrong_type_or_range_are_located_errors(tmp_path_factory, ir_text, data):
    """Any one field of a valid ProgramIR replaced by a hostile value: loading either succeeds or
    raises a located CompileError, never anything else. A value of another JSON type than the
    original field's (a float for an integer, a string or null for a list, ...) is always refused."""
    doc = json.loads(ir_text)
    path = data.draw(st.sampled_from(sorted(_paths(doc))))
    value = data.draw(st.sampled_from(HOSTILE))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    original = parent[path[-1]]
    parent[path[-1]] = value
    p = tmp_path_factory.mktemp("ir") / "hostile.json"
    p.write_text(json.dumps(doc, indent=1))
    type_changed = _json_kind(value) != _json_kind(original) and path[0] != "stats" \
        and not (isinstance(original, list) and isinstance(value, list) and not value)
    if isinstance(original, list) and isinstance(value, list) and value and original \
            and _json_kind(value[0]) != _json_kind(original[0]):
        type_changed = True
    try:
        load_program(p)
    except CompileError as exc:
        d = exc.diagnostics[0]
        assert d.location is not None and d.location.line >= 1, d.message
        assert str(p) in exc.diagnostics[0].location.source.name
        return
    assert not type_changed, f"{path} = {value!r} (was {original!r}) was accepted"


def test_a_program_of_more_chunk_slots_than_its_proof_holds_is_refused_before_it(tmp_path, ir_text):
    """An 8-rank ProgramIR whose header fields claim 4,096 or 65,536 ranks (and the output buffer to
    match): ``hccc check`` refuses to prove it, located at ``buffers``, under the memory and CPU
    caps, where the proof once took 127 s and 7.8 GB before ending "out of memory"."""
    from hccc.compiler.ir.symbolic import MAX_PROOF_SLOTS
    argvs = []
    for n in (4096, 65536):
        doc = json.loads(ir_text)
        doc["nranks"], doc["nchunks"] = n, n
        doc["buffers"]["output"] = n
        doc["tbs_per_rank"] += [0] * (n - len(doc["tbs_per_rank"]))
        p = tmp_path / f"ir_{n}.json"
        p.write_text(json.dumps(doc))
        argvs.append(["check", p])
    for (_, p), res, n in zip(argvs, hccc_each(argvs, timeout=120), (4096, 65536)):
        assert_fires(res, pattern=rf"{re.escape(p.name)}:1:\d+: error: {n} ranks x {n + 1} chunks each "
                                  rf".* chunk slots, more than the {MAX_PROOF_SLOTS:,} hccc proves")


#: chunk sizes whose acceptance would mean work (a 5000-digit integer to convert, a slot of 10**30
#: bytes): refused under the caps; the others would compile an 8-rank program in a blink if
#: accepted, so their refusal is checked in this process
HUGE_CHUNKS = ("9" * 5000, str(10 ** 30))


@pytest.mark.parametrize("value", ["0", "-16", "24", "1.5", "1e3", "null", '"1M"', *HUGE_CHUNKS],
                         ids=lambda v: v if len(v) < 40 else f"{len(v)}-digits")
def test_chunk_bytes_on_the_compile_path(tmp_path, ir_text, value):
    text = re.sub(r'"chunk_bytes": \d+', f'"chunk_bytes": {value}', ir_text)
    assert text != ir_text
    p = tmp_path / "cb.json"
    p.write_text(text)
    code, out, secs = (hccc if value in HUGE_CHUNKS else _in_process)(p, "-o", tmp_path / "out")
    assert_fires((code, out, secs))
    assert LOCATED.search(out), out
    assert not (tmp_path / "out").exists()


def test_run_refuses_huge_scratch_before_allocating(tmp_path, ir_text):
    doc = json.loads(ir_text)
    doc["buffers"]["scratch"] = 1 << 24
    p = tmp_path / "scratch.json"
    p.write_text(json.dumps(doc))
    assert_fires(hccc("run", p, "--backend", "cpu", "--bytes", "1M"), pattern="over the limit")


# ----------------------------------------------------------------------------- command-line numbers
ABSURD = [
    ["run", "{algo}", "--bytes", "999999999999999999999G"],
    ["run", "{algo}", "--bytes", "2T"],
    ["run", "{algo}", "--bytes", "1" + "0" * 5000],
    ["run", "{algo}", "--timeout", "1e300"],
    ["run", "{algo}", "--timeout", "inf"],
    ["run", "{algo}", "--timeout", "nan"],
    ["run", "{algo}", "--iters", "99999999999999999999"],
    ["run", "{algo}", "--threads", "\u0661"],          # an Arabic-Indic digit
    ["{algo}", "-o", "{tmp}/o", "--chunk-size", "5000T"],
    ["{algo}", "-o", "{tmp}/o", "--max-transfers", "9" * 5000],
    ["xml", "{algo}", "-o", "{tmp}/a.xml", "--max-bytes", "99999999999999G"],
    ["sim", "{algo}", "--topology", "{topo}", "--sizes", "1" + "0" * 30],
    ["synth", "{topo}", "--collective", "allgather", "-o", "{tmp}/s.rccl", "--time-limit", "1e308"],
    ["synth", "{topo}", "--collective", "allgather", "-o", "{tmp}/s.rccl", "--time-limit", "-5"],
    ["synth", "{topo}", "--collective", "allgather", "-o", "{tmp}/s.rccl", "--pod-size", "9" * 50],
    ["balance", "--speeds", "1,2", "--batch", "9" * 40],
]


def test_absurd_command_line_numbers_are_usage_errors(tmp_path):
    """Every command line of :data:`ABSURD` a usage error; all of them in one capped process (each
    the work it guards would take past the caps alone), each with a folder of its own for outputs."""
    argvs = []
    for k, args in enumerate(ABSURD):
        (tmp_path / str(k)).mkdir()
        subs = {"algo": EXAMPLES / "ring_allgather_8.rccl", "tmp": tmp_path / str(k),
                "topo": EXAMPLES / "clusters" / "v100_4_8.topo"}
        argvs.append([a.format(**subs) for a in args])
    for k, (argv, result) in enumerate(zip(argvs, hccc_each(argvs))):
        assert_fires(result, rc=2)
        assert sorted((tmp_path / str(k)).iterdir()) == [], argv


@pytest.mark.parametrize("dtypes, sizes, first", [("all", "4,8", "int64"), ("float32,float64", "8,12", "float64"),
                                                  ("half,int32", "2,6", "int32"), ("all", "1", "float32")])
def test_run_refuses_a_size_some_asked_element_type_cannot_hold_before_any_table(dtypes, sizes, first):
    """A size that is no whole number of elements of one of the element types asked for is a usage
    error before anything runs, naming the first such type (``-d all --sizes 4`` once ran the
    float32, float16, bfloat16 and int32 tables and then stopped at int64 with exit status 2)."""
    r = run_cli("run", EXAMPLES / "ring_allgather_8.rccl", "--backend", "cpu", "-d", dtypes, "--sizes", sizes,
                "-n", "1", "-w", "0")
    assert r.returncode == 2, r.stderr
    assert f"not a whole number of {first} elements" in r.stderr, r.stderr
    assert "out-of-place" not in r.stdout and "#wrong" not in r.stdout, r.stdout


@pytest.mark.parametrize("option", ["--from-nccl", "--from-smi"])
def test_topo_import_of_more_files_than_a_cluster_has_nodes_is_refused_before_reading(tmp_path, option):
    """One file per node: more than MAX_NODES files is a usage error before any is read (5,000 NCCL
    dumps were once all parsed, 7 s, before the cluster was refused); the files here do not exist,
    so reading any would be a different error."""
    from hccc.compiler.cluster.topo_limits import MAX_NODES
    missing = tmp_path / "absent.xml"
    for n, refused in ((MAX_NODES + 1, True), (2, False)):
        r = run_cli("topo", option, *[missing] * n, *(["--gpu", "A100"] if option == "--from-smi" else []))
        assert r.returncode == (2 if refused else 1), r.stderr
        assert (f"a cluster has at most {MAX_NODES} nodes" in r.stderr) == refused, r.stderr


def test_synth_chunks_per_rank_capped_before_work(tmp_path):
    topo = EXAMPLES / "clusters" / "v100_4_8.topo"
    assert_fires(hccc("synth", topo, "--collective", "allgather", "--chunks-per-rank", "1000000",
                      "-o", tmp_path / "s.rccl"), pattern="chunks-per-rank.*limit")
    assert not (tmp_path / "s.rccl").exists()


@settings(max_examples=80, deadline=None)
@given(mantissa=st.integers(1, 99), exp=st.integers(-320, 320), key=st.sampled_from(["node", "remote"]),
       chunk=st.sampled_from([1, 1 << 20, 1 << 40]))
def test_taccl_betas_give_bandwidths_in_the_cluster_range_or_a_located_error(mantissa, exp, key, chunk):
    """A TACCL beta of any size: the profile loads exactly when the bandwidth it gives (chunk bytes
    in beta microseconds) lies in the range a .topo link may have, otherwise a located error at the
    key. Oracle: the bandwidth worked out here in exact fractions. (A beta of 1e-300 once ended in an
    internal error, OverflowError, as the cluster's bandwidth became a float.)"""
    from fractions import Fraction
    from hccc.compiler.cluster.topo_limits import MAX_BANDWIDTH_GBPS, MIN_BANDWIDTH_GBPS
    from hccc.compiler.interop.taccl import parse_taccl
    beta = f"{mantissa}e{exp}"
    prof = {"name": "HubAndSpoke", "topology": "HubAndSpoke", "gpus_per_node": 4, "nics_per_node": 1,
            "alpha": 0.3, "node_betas_list": [beta if key == "node" else 23], "nnodes": 2, "chunk_size": chunk,
            "remote_alpha": 2.6, "remote_beta": beta if key == "remote" else 105}
    text = json.dumps(prof).replace(f'"{beta}"', beta)
    bw = Fraction(chunk) / (Fraction(mantissa) * Fraction(10) ** exp * 1000)
    in_range = MIN_BANDWIDTH_GBPS <= bw <= MAX_BANDWIDTH_GBPS
    other = Fraction(chunk) / ((23 if key == "remote" else 105) * 1000)
    try:
        parse_taccl(text, "p.json")
    except CompileError as exc:
        d = exc.diagnostics[0]
        assert d.location is not None and d.location.line == 1, d.message
        at = text.index('"node_betas_list"' if key == "node" else '"remote_beta"')
        assert not in_range or not MIN_BANDWIDTH_GBPS <= other <= MAX_BANDWIDTH_GBPS \
            or "capacity" in d.message, (d.message, float(bw))
        if not in_range:
            assert d.location.col - 1 >= at or "capacity" in d.message, (d.message, text)
        return
    assert in_range, (beta, float(bw))


# ----------------------------------------------------------------------------- names from inputs
@settings(max_examples=200)
@given(text=st.text(max_size=300), limit=st.integers(8, 400))
def test_printable_is_one_safe_line(text, limit):
    """Oracle: Python's own notion of printable characters."""
    out = printable(text, limit=limit)
    assert all(ch.isprintable() for ch in out)
    assert "*/" not in out and "\x1b" not in out and "\n" not in out
    assert len(out) <= max(limit, 3)
    if all(ch.isprintable() for ch in text) and "*/" not in text and len(text) <= limit:
        assert out == text


EVIL = "x\n#define EVIL 1\n\x1b[31mred\x1b[0m\u202e*/"




def test_taccl_names_reach_the_terminal_escaped(tmp_path):
    prof = {"name": EVIL, "topology": "NDv2", "gpus_per_node": 8, "nics_per_node": 1, "alpha": 0.3, "node_betas_list": [23, 46],
            "node_invbws_list": [23, 46], "remote_invbw": 107, "remote_alpha": 2.6, "remote_beta": 105,
            "nnodes": 1}
    p = tmp_path / "prof.json"
    p.write_text(json.dumps(prof))
    code, out, _ = _in_process("topo", p)
    assert code == 0, out
    assert "\x1b" not in out and "\u202e" not in out and "\n#define EVIL" not in out


def test_topology_file_names_reach_generated_comments_escaped(tmp_path):
    src = EXAMPLES / "clusters" / "mixed_v100_w7800.topo"
    evil = tmp_path / ("c\n#evil\x1b[2J.topo")
    evil.write_text(src.read_text())
    out = tmp_path / "c2c.rccl"
    code, msg, _ = _in_process("gen", "c2c", evil, "--collective", "allgather", "-o", out)
    assert code == 0, msg
    assert "\x1b" not in msg
    text = out.read_text()
    assert "\x1b" not in text
    assert not any(line.startswith("#evil") for line in text.splitlines())
    code, msg, _ = _in_process("check", out)
    assert code == 0, msg


# ----------------------------------------------------------------------------- sizes of source texts
HEADER = ('def ResCCLAlgo(nRanks=2, nChannels=1, nWarps=4, AlgoName="x", OpType="Allgather", '
          'GPUPerNode=2, NICPerNode=1):\n')


def test_long_rccl_refused_before_parsing(tmp_path):
    p = tmp_path / "long.rccl"
    p.write_text(HEADER + "    transfer(0, 1, 0, 0, recv)\n" * 200_000)
    assert_fires(hccc("check", p), pattern=r"long\.rccl:100001:1: error: .*200001 lines, over the "
                                                    r"100000-line limit")


def test_an_nranks_the_transfers_do_not_fill_is_refused_before_its_proof_state(tmp_path):
    """A small program under a header that claims thousands of ranks (a typo, or a hostile file):
    ``hccc check`` refuses it at the header within the memory and CPU caps, where the proof once
    asked for 3.1 GiB of replay state (3,000 ranks: past the cap; 8 GiB at 4,096) or arrays of
    billions (8,192 and 65,536)."""
    body = "".join(f"    transfer({r}, {(r + 1) % 8}, {k}, {(r - k) % 8}, recv)\n" for k in range(7) for r in range(8))
    argvs = []
    for n in (3000, 8192, 65536):
        p = tmp_path / f"ag_{n}.rccl"
        p.write_text(HEADER.replace("nRanks=2", f"nRanks={n}") + body)
        argvs.append(["check", p])
    for (_, p), res in zip(argvs, hccc_each(argvs, timeout=120)):
        assert_fires(res, pattern=rf"{re.escape(p.name)}:1:1: error: nRanks=\d+: .*more than")
        assert "the transfers use ranks 0..7" in res[1]


@settings(max_examples=30)
@given(body=st.integers(1, 40), cap=st.integers(2, 45))
def test_rccl_line_cap_property(body, cap):
    """Oracle: the number of lines as written here; under the cap the program loads."""
    from hccc.compiler.frontend.load import parse_source
    text = HEADER + "".join(f"    transfer({i % 2}, {1 - i % 2}, {i}, 0, recv)\n" for i in range(body))
    src = SourceFile("p.rccl", text)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HCCC_MAX_SOURCE_LINES", str(cap))
        if body + 1 > cap:
            with pytest.raises(CompileError, match="line limit") as info:
                parse_source(src)
            assert info.value.diagnostics[0].location.line == cap + 1
        else:
            try:
                parse_source(src)
            except CompileError as exc:
                assert "line limit" not in str(exc.diagnostics[0].message)


def _nodes_topo(n: int, per_line_entries: int = 1) -> str:
    lines = [f"define nodenum = {n}"]
    for k in range(1, n + 1):
        lines.append(f"define node{k} = 8")
        lines.append("define bandwidth = {switch => [(((0,1,2,3),(4,5,6,7)) >-> (16,1))]}")
    for k in range(1, n):
        lines.append(f"define internode = (node{k}, node{k + 1})")
        lines.append("define interbandwidth = {switch => [(((0,1,2,3,4,5,6,7),(0,1,2,3,4,5,6,7)) >-> (8,1))]}")
    return "\n".join(lines) + "\n"


def test_huge_cluster_files_refused_before_parsing(tmp_path):
    p = tmp_path / "n4096.topo"
    p.write_text(_nodes_topo(4096))
    links = ", ".join(f"(({a},{b}) -> (25,2))" for a in range(256) for b in range(256) if a != b)
    q = tmp_path / "wide.topo"
    q.write_text("define nodenum = 1\ndefine node1 = 256\ndefine bandwidth = {direct => [" + links + "]}\n")
    lines, wide, wide_check = hccc_each([["topo", p], ["topo", q],
                                         ["check", EXAMPLES / "ring_allgather_8.rccl", "--topology", q]])
    assert_fires(lines, pattern="8192-line limit")
    assert_fires(wide, pattern=r"wide\.topo:3:\d+: error: more than 32768 link entries")
    assert_fires(wide_check, pattern="more than 32768 link entries")


@pytest.mark.slow
def test_synth_time_limit_holds(tmp_path):
    """``--time-limit`` bounds the whole synthesis, greedy and the simulations after the search
    included: a problem whose greedy alone runs far longer (24 GPUs, 64 chunks per rank: about a
    minute before), and whose program's channel fitting took another minute, ends within the
    limit plus a few seconds of CPU, with a schedule or a clear error."""
    topo = EXAMPLES / "clusters" / "h20_4x2_8x2.topo"
    for method in ("search", "trees"):   # compiles the kernels of both (small work alone would run plain)
        warm = hccc("synth", EXAMPLES / "clusters" / "v100_4_8.topo", "--collective", "allgather", "--method", method,
                    "--time-limit", "5", "-o", tmp_path / "warm.rccl", timeout=900, capped=False,
                    env={"HCCC_JIT": "numba"})
        assert warm[0] == 0, warm[1]
    limit = 3.0
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    code, out, secs = hccc("synth", topo, "--collective", "allgather", "--method", "search", "--chunks-per-rank", "64",
                           "--time-limit", str(limit), "-o", tmp_path / "s.rccl", timeout=600)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    # under the CPU cap of the other limits: the synthesis (about a minute of CPU before) must end
    # on its own time limit, and its wall time is printed (benchmarks/input_limits.py measures it)
    print(f"synth with --time-limit {limit}: {secs:.1f} s wall, {cpu:.1f} s CPU, exit {code}")
    assert code in (0, 1) and "Traceback" not in out and "internal error" not in out, out
    assert cpu < limit + 20, out       # imports, loading numba's cache, writing: seconds, not a minute
    if code == 1:
        assert "time limit" in out and not (tmp_path / "s.rccl").exists()
    else:
        assert "of the cluster's cut bound" in out, out     # its fraction, or why it was not simulated


@settings(max_examples=40)
@given(digits=st.integers(1, 6000), where=st.sampled_from(["header", "src", "chunk", "assign", "range"]))
def test_long_integer_literals_in_rccl(digits, where):
    """Any integer literal longer than 2**62 allows (19 digits), up to past Python's 4300-digit
    conversion limit, is a located error; shorter ones are not refused for their size."""
    from hccc.compiler.frontend.load import parse_source
    from hccc.compiler.frontend.rccl_parser import INT_LIMIT
    num = "9" * digits
    lines = {"header": f'def ResCCLAlgo(nRanks={num}, OpType="Allgather"):\n    pass\n',
             "src": HEADER + f"    transfer({num}, 1, 0, 0, recv)\n",
             "chunk": HEADER + f"    transfer(0, 1, 0, {num}, recv)\n",
             "assign": HEADER + f"    x = {num}\n",
             "range": HEADER + f"    for i in range({num}):\n        pass\n"}
    src = SourceFile("p.rccl", lines[where])
    too_big = len(num) > len(str(INT_LIMIT)) or int(num) > INT_LIMIT
    try:
        parse_source(src, max_transfers=10)
    except CompileError as exc:
        d = exc.diagnostics[0]
        assert d.location is not None
        if too_big:
            assert "too large" in d.message and d.location.line in (1, 2)
        else:
            assert "integer literal" not in d.message
        return
    assert not too_big


@pytest.mark.parametrize("evil", ["a\x1b[2Jb"] + [pytest.param(e, marks=pytest.mark.slow)
                                                  for e in ("a\nb", "a\u202eb", "a\rb\x07")])
def test_file_names_reach_the_terminal_escaped(tmp_path, evil):
    """Input and output file names printed by check, topo and the compile command: no control
    characters reach the terminal (each is shown escaped)."""
    algo = tmp_path / f"{evil}.rccl"
    algo.write_text((EXAMPLES / "ring_allgather_8.rccl").read_text())
    topo = tmp_path / f"{evil}.topo"
    topo.write_text((EXAMPLES / "clusters" / "v100_4_8.topo").read_text())
    for args in (["check", algo], ["topo", topo], [algo, "-o", tmp_path / f"{evil}out"],
                 ["check", algo, "--topology", topo]):
        code, out, _ = _in_process(*args)
        assert code in (0, 1), out
        bad = [ch for ch in evil if not ch.isprintable() and ch != "\n"]   # output lines end in newlines
        assert not any(ch in out for ch in bad) and evil not in out, (args, out)
        assert "Traceback" not in out


# ----------------------------------------------------------------------------- MSCCL XML
def _xml_gpus(n: int, chunks: int, scratch: int) -> str:
    gpus = "".join(f'<gpu id="{i}" i_chunks="{chunks}" o_chunks="{chunks}" s_chunks="{scratch}"/>'
                   for i in range(n))
    return (f'<algo name="x" proto="Simple" nchannels="1" nchunksperloop="{chunks}" ngpus="{n}" '
            f'coll="allreduce" inplace="0">{gpus}</algo>')


def _xml_moves(chunks: int, steps: int) -> str:
    def tb(peer):
        body = "".join(f'<step s="{2 * i + j}" type="{t}" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" '
                       f'cnt="{chunks}" depid="-1" deps="-1" hasdep="0"/>'
                       for i in range(steps) for j, t in enumerate("sr"))
        return f'<tb id="0" send="{peer}" recv="{peer}" chan="0">{body}</tb>'
    gpus = "".join(f'<gpu id="{g}" i_chunks="{chunks}" o_chunks="{chunks}" s_chunks="0">{tb(1 - g)}</gpu>'
                   for g in range(2))
    return (f'<algo name="x" proto="Simple" nchannels="1" nchunksperloop="{chunks}" ngpus="2" '
            f'coll="allreduce" inplace="0">{gpus}</algo>')


#: name -> (an MSCCL XML whose implied work is too large, what its refusal says)
TOO_LARGE_XML = {
    "1024-gpus-of-1Mi-scratch": (lambda: _xml_gpus(1024, 1024, 1 << 20), r"chunk slots, more than"),
    "4096x4096": (lambda: _xml_gpus(4096, 4096, 0), r"chunk slots, more than"),
    "4000-steps-of-256Ki": (lambda: _xml_moves(1 << 18, 2000), r"move \d+ chunks in all"),
}


@pytest.fixture(scope="module")
def too_large_xml_runs(tmp_path_factory):
    """``hccc check`` of each of :data:`TOO_LARGE_XML`, all in one capped process."""
    d = tmp_path_factory.mktemp("xml")
    paths = []
    for name, (text, _) in TOO_LARGE_XML.items():
        paths.append(d / f"{name}.xml")
        paths[-1].write_text(text())
    return dict(zip(TOO_LARGE_XML, hccc_each([["check", p] for p in paths], timeout=120)))


@pytest.mark.parametrize("name", list(TOO_LARGE_XML))
def test_xml_whose_implied_work_is_too_large_is_refused_before_it(name, too_large_xml_runs):
    res = too_large_xml_runs[name]
    assert_fires(res, pattern=TOO_LARGE_XML[name][1])
    assert LOCATED.search(res[1]), res[1]


def _ring_xml() -> str:
    return (EXAMPLES / "msccl" / "allreduce_ring_4.xml").read_text()


@pytest.mark.parametrize("change, pattern", [
    (lambda t: t.replace('hasdep="0"/>', 'hasdep="0">' + "<x>" * 100_000 + "</x>" * 100_000 + "</step>", 1),
     r"unexpected <x> inside <step>"),
    (lambda t: t.replace('</tb>', '<bogus/></tb>', 1), r"unexpected <bogus> inside <tb>"),
    (lambda t: t.replace('inplace="1"', 'inplace="1" minBytes="4096" maxBytes="1024"'), r"minBytes=4096 is more than maxBytes"),
    (lambda t: t.replace('cnt="1"', 'cnt=" 1 "', 1), r'cnt=" 1 " is not an integer'),
    (lambda t: t.replace('cnt="1"', 'cnt="+1"', 1), r'cnt="\+1" is not an integer'),
], ids=["nested-unknown-elements", "unknown-element", "minBytes-over-maxBytes", "spaces", "plus-sign"])
def test_xml_details_are_refused(change, pattern):
    from hccc.compiler.interop.msccl_import import import_xml_text
    with pytest.raises(CompileError, match=pattern) as err:
        import_xml_text(change(_ring_xml()), "a.xml")
    assert err.value.diagnostics[0].location is not None


def test_xml_size_limits_keep_real_programs():
    from hccc.compiler.interop.msccl_import import import_xml_text
    text = _ring_xml().replace('inplace="1"', 'inplace="1" minBytes="1024" maxBytes="0"')
    assert import_xml_text(text, "a.xml").nranks == 4          # maxBytes 0: no upper limit


def test_a_large_counts_file_stops_at_its_first_line_that_cannot_fit(tmp_path):
    """A 32 MB counts file within the documented limits (4096 counts a row) read for a 2-rank
    program: refused at the first row's third count, having read one block of the file, in memory
    bounded by the program (the 2 x 2 matrix and that block), not by the file."""
    import time
    import tracemalloc
    from hccc.runtime.alltoallv import read_counts_file
    f = tmp_path / "c.txt"
    row = (" ".join(["123456789"] * 4096) + "\n").encode()
    with open(f, "wb") as out:
        for _ in range((32 << 20) // len(row) + 1):
            out.write(row)
    assert f.stat().st_size > 32 << 20
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(CompileError) as exc:
            read_counts_file(f, 2, "a2a2")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t0 < 5
    d = exc.value.diagnostics[0]
    assert (d.location.line, d.location.col) == (1, 21)
    assert "row 0 has more than 2 counts, but a2a2 has 2 ranks" in d.message
    assert peak < 8 << 20, peak


# ----------------------------------------------------------------------------- MSCCL++ plan header
#: the plan header's numeric fields and the ranges the MSCCL++ loader and executor give them, written
#: out here (not read from the importer): uint64 message sizes, a positive alignment of at most a
#: uint32 offset's span, at most a CUDA/HIP thread block's 1,024 threads
_PLAN_HEADER_RANGES = {"min_message_size": (0, (1 << 64) - 1), "max_message_size": (0, (1 << 64) - 1),
                       "buffer_alignment": (1, 1 << 32), "num_threads_per_block": (1, 1024)}
_HEADER_VALUES = st.one_of(st.integers(-3, 2048), st.sampled_from([1 << 32, (1 << 32) + 1, (1 << 64) - 1, 1 << 64]),
                           st.sampled_from([True, False, None, 1.5, "16", [16]]))


@settings(max_examples=60, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(sorted(_PLAN_HEADER_RANGES)), _HEADER_VALUES, min_size=1))
def test_plan_header_fields_are_read_in_range_or_refused_at_their_key(fields):
    """A valid plan with header fields replaced: it loads exactly when every field is an integer in
    its range and the plan serves some size (min_message_size <= max_message_size); otherwise the
    refusal names a bad field on its own line (once, a plan of num_threads_per_block 0,
    buffer_alignment 0 or min_message_size above max_message_size was checked as valid)."""
    from mscclpp_plans import plan_direct_allgather, refused
    from hccc.compiler.interop.mscclpp_import import import_plan_text
    plan = plan_direct_allgather()
    plan.update(fields)
    header = {k: plan.get(k) for k in _PLAN_HEADER_RANGES}
    bad = [k for k, v in header.items()
           if not (type(v) is int and _PLAN_HEADER_RANGES[k][0] <= v <= _PLAN_HEADER_RANGES[k][1])]
    sizes = [header[k] for k in ("min_message_size", "max_message_size")]
    if all(type(v) is int for v in sizes) and sizes[0] > sizes[1]:
        bad.append("min_message_size")
    if not bad:
        import_plan_text(json.dumps(plan, indent=2), "p.json")
        return
    message, line = refused(plan)
    assert any(f'"{k}"' in line for k in bad), (message, line, bad)
    assert any(k in message for k in bad), (message, bad)
