"""The compile's typed stages: the context carries options and typed representations (no ``Any``,
no flags, no dict of analyses); the ProgramIR's meaning-bearing stats entries are typed records
that its JSON form writes and reads back as before; ``hccc ALGO --dump-after STAGE`` writes each
stage's representation, and a dumped ProgramIR compiles to the same files as the compile it came
from."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_runs import run_cli
from random_programs import algorithms
from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend import parse_rccl
from hccc.compiler.frontend.rccl_text import algorithm_text
from hccc.compiler.ir.check import load_ir_json
from hccc.compiler.ir.program_ir import Allocation, Origin
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.dag import build_dag
from hccc.compiler.pipeline import CompileContext, load_algorithm
from hccc.compiler.pipeline.compile import STAGES
from hccc.testing import valid_programs

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------ the context
def test_the_context_holds_typed_representations_and_no_flags():
    hints = CompileContext.__annotations__           # as written (the types' modules load lazily)
    assert "analyses" not in hints
    for name, hint in hints.items():
        assert "Any" not in str(hint), f"CompileContext.{name}: {hint}"
        assert str(hint) not in ("bool", "<class 'bool'>"), f"CompileContext.{name} is a flag"
    # a representation per stage, each a field of the context
    for name in ("algorithm", "dag", "schedule", "lowered", "ir", "given"):
        assert name in hints
    assert list(STAGES) == ["algorithm", "dag", "schedule", "lowered", "program-ir"]


# ------------------------------------------------------------------------------ typed records
#: the JSON form's stats keys of the typed records, written out here (not taken from the code)
ORIGIN_JSON = {"source": "source", "execution": "execution", "gpus_per_node": "gpus_per_node",
               "inplace": "msccl_inplace", "outofplace": "msccl_outofplace", "note": "note", "proto": "proto",
               "min_bytes": "minBytes", "max_bytes": "maxBytes"}
ALLOCATION_JSON = {k: k for k in ("tb_alloc", "tbs_state_based", "tbs_connection_based", "tbs_per_rank_max",
                                  "fused", "fusion", "phase_order_moved", "tb_alloc_kept", "tbs_search_cut")}

_text = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=12)
_count = st.integers(0, 1 << 40)
origins = st.builds(Origin, source=st.none() | _text, execution=st.none() | st.sampled_from(["task", "algorithm"]),
                    gpus_per_node=st.none() | st.integers(1, 64), inplace=st.none() | st.booleans(),
                    outofplace=st.none() | st.booleans(), note=st.none() | _text,
                    proto=st.none() | st.sampled_from(["Simple", "LL", "LL128"]),
                    min_bytes=st.none() | _count, max_bytes=st.none() | _count)
allocations = st.builds(Allocation, tb_alloc=st.none() | st.sampled_from(["state", "connection"]),
                        tbs_state_based=st.none() | _count, tbs_connection_based=st.none() | _count,
                        tbs_per_rank_max=st.none() | _count, fused=st.none() | _count,
                        fusion=st.none() | st.booleans(), phase_order_moved=st.none() | _count,
                        tb_alloc_kept=st.none() | st.sampled_from(["state", "connection"]),
                        tbs_search_cut=st.none() | _count)

_RING = build_program(gen.ring_allreduce(4), chunk_bytes=256)


@settings(max_examples=60, deadline=None)
@given(origin=origins, allocation=allocations, extra=st.dictionaries(
    st.sampled_from(["transfers", "compile_s", "scheduler", "fusion_kept"]), st.integers(0, 99) | _text, max_size=3))
def test_typed_records_round_trip_through_the_json_form(origin, allocation, extra):
    ir = dataclasses.replace(_RING, stats=dict(extra), origin=origin, allocation=allocation)
    doc = json.loads(ir.to_json())["stats"]
    want = dict(extra)
    for rec, keys in ((origin, ORIGIN_JSON), (allocation, ALLOCATION_JSON)):
        for f, key in keys.items():
            if getattr(rec, f) is not None:
                want[key] = getattr(rec, f)
    assert doc == want                       # the file's stats: as before the records were typed
    back = load_ir_json(ir.to_json())
    assert back.origin == origin and back.allocation == allocation and back.stats == extra
    assert back.to_json() == ir.to_json()
    assert back.algorithm_level == (origin.execution == "algorithm")
    assert back.placements == tuple(p for p, ok in ((False, origin.outofplace), (True, origin.inplace))
                                    if ok is not False)


@pytest.mark.parametrize("key, value, words", [
    ("execution", "sideways", "must be one of task, algorithm"),
    ("execution", 3, "must be a string"),
    ("msccl_inplace", 1, "must be true or false"),
    ("gpus_per_node", "8", "must be an integer"),
    ("tbs_state_based", True, "must be an integer"),
    ("tb_alloc_kept", "both", "must be one of state, connection"),
])
def test_a_typed_entry_of_the_wrong_kind_is_refused_where_it_is(tmp_path, key, value, words):
    doc = json.loads(_RING.to_json())
    doc["stats"][key] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc, indent=1))
    p = run_cli("check", str(bad))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if '"stats"' in t)
    assert f"{bad}:{line}:" in p.stderr and f"'{key}' {words}" in p.stderr, p.stderr


# ------------------------------------------------------------------------------ the algorithm as text
def _same_algorithm(a, b) -> bool:
    strip = dict(location=None)
    return (dataclasses.replace(a.header, **strip) == dataclasses.replace(b.header, **strip)
            and a.header.nchannels_given == b.header.nchannels_given
            and all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("src", "dst", "step", "chunk", "op",
                                                                            "channels")))


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.rccl")), ids=lambda p: p.name)
def test_an_example_algorithm_reads_back_from_its_text(path):
    alg = load_algorithm(path)
    assert _same_algorithm(parse_rccl(algorithm_text(alg), "dumped.rccl"), alg)


@settings(max_examples=40, deadline=None)
@given(alg=st.one_of(valid_programs(max_ranks=6), algorithms(max_ranks=6)), data=st.data())
def test_random_algorithms_read_back_from_their_text(alg, data):
    """Any algorithm (the families of hccc.testing, random ones), with any name, transfers on
    channels and an nChannels written or not."""
    escapes = st.sampled_from(list("\\\"'\n\r\t\x00nrt0"))     # what the string syntax escapes, and after what
    name = data.draw(st.text(escapes | st.characters(min_codepoint=1, max_codepoint=0x24F), min_size=1, max_size=10),
                     label="name")
    given_k = data.draw(st.booleans(), label="nChannels written")
    header = dataclasses.replace(alg.header, name=name, nchannels_given=given_k,
                                 nchannels=data.draw(st.integers(1, 4), label="nChannels") if given_k else 1)
    channel = data.draw(st.none() | st.lists(st.integers(0, 3), min_size=alg.ntransfers, max_size=alg.ntransfers),
                        label="channels")
    alg = dataclasses.replace(alg, header=header, channel=None if channel is None else np.asarray(channel))
    assert _same_algorithm(parse_rccl(algorithm_text(alg), "dumped.rccl"), alg)


# ------------------------------------------------------------------------------ --dump-after
def test_every_stage_dumps_what_it_made(tmp_path):
    algo = EXAMPLES / "ring_allreduce_8.rccl"
    dumps = {}
    for stage in STAGES:
        out = tmp_path / f"d.{stage}"
        p = run_cli(str(algo), "--dump-after", stage, "-o", str(out))
        assert p.returncode == 0, p.stderr
        dumps[stage] = out.read_text()
    alg = load_algorithm(algo)
    assert _same_algorithm(parse_rccl(dumps["algorithm"], "d.rccl"), alg)
    dag, want = json.loads(dumps["dag"]), build_dag(alg)
    assert dag["ntasks"] == alg.ntransfers
    assert dag["edges"] == {"edge_src": want.edge_src.tolist(), "edge_dst": want.edge_dst.tolist()}
    sched = json.loads(dumps["schedule"])
    assert sorted(sched["order"]) == list(range(alg.ntransfers))
    assert len(sched["subpipeline"]) == alg.ntransfers and sched["scheduler"] == "hpds"
    # without a cluster nothing is chosen: the lowered program is the ProgramIR, and both are
    # what the compile writes as <name>.ir.json
    p = run_cli(str(algo), "-o", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    written = (tmp_path / "out" / "ring_allreduce_8.ir.json").read_text()
    assert dumps["lowered"] == dumps["program-ir"] == written
    # standard output
    p = run_cli(str(algo), "--dump-after", "schedule", "-o", "-")
    assert p.returncode == 0 and p.stdout == dumps["schedule"]


@pytest.mark.parametrize("algo, cluster", [
    ("ring_allreduce_8.rccl", None),
    ("hm_allreduce_2x4.rccl", None),
    ("ring_reducescatter_8.rccl", "clusters/a100_topo1.topo"),
])
def test_a_dumped_program_compiles_to_the_same_files(tmp_path, algo, cluster):
    topo = ["--topology", str(EXAMPLES / cluster)] if cluster else []
    dumped = tmp_path / "p.json"
    p = run_cli(str(EXAMPLES / algo), *topo, "--dump-after", "program-ir", "-o", str(dumped))
    assert p.returncode == 0, p.stderr
    p = run_cli(str(EXAMPLES / algo), *topo, "-o", str(tmp_path / "direct"))
    assert p.returncode == 0, p.stderr
    # a ProgramIR of one channel leaves auto to the hardware rule: the count the compile chose is given
    k = json.loads(dumped.read_text())["nchannels"]
    p = run_cli(str(dumped), *topo, "--channels", str(k), "-o", str(tmp_path / "again"))
    assert p.returncode == 0, p.stderr
    # the kernels, the manifest, the IR and the build files; not the exports, which an algorithm
    # makes from what a program does not carry (the MSCCL XML from the step order, the MSCCL++
    # plan's nodes from the header's GPUPerNode)
    again, direct = _files(tmp_path / "again"), _files(tmp_path / "direct")
    exports = {n for n in direct if n.endswith((".xml", ".mscclpp.json"))}
    assert len(exports) <= 2 and set(again) == set(direct)
    assert {n: b for n, b in again.items() if n not in exports} == {n: b for n, b in direct.items() if n not in exports}
    assert any(n.endswith((".cu", ".hip")) for n in direct)


def test_a_program_given_as_input_has_the_last_stage_only(tmp_path):
    prog = EXAMPLES / "one_shot_allreduce_8.json"
    p = run_cli(str(prog), "--dump-after", "dag", "-o", str(tmp_path / "d"))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "is a program, not an algorithm: it has no 'dag' stage" in p.stderr
    assert not (tmp_path / "d").exists()
    p = run_cli(str(prog), "--dump-after", "program-ir", "-o", str(tmp_path / "d"))
    assert p.returncode == 0, p.stderr
    assert load_ir_json((tmp_path / "d").read_text()).name == "one_shot_allreduce_8"


def test_a_dump_never_overwrites_its_input(tmp_path):
    algo = tmp_path / "a.rccl"
    algo.write_text((EXAMPLES / "ring_allreduce_8.rccl").read_text())
    before = algo.read_bytes()
    p = run_cli(str(algo), "--dump-after", "algorithm", "-o", str(algo))
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert algo.read_bytes() == before
    p = run_cli(str(algo), "--dump-after", "algorithm", "-o", str(tmp_path))
    assert p.returncode == 1 and "is a directory" in p.stderr


@pytest.mark.parametrize("extra", [["--list-outputs"], ["--depfile", "d.d"], ["--timings"]])
def test_a_dump_refuses_the_options_of_an_outdir(tmp_path, extra):
    p = run_cli(str(EXAMPLES / "ring_allreduce_8.rccl"), "--dump-after", "dag", "-o", str(tmp_path / "d"), *extra)
    assert p.returncode == 1 and f"{extra[0]} does not apply" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("stage", ["algorithm", "lowered", "program-ir"])
def test_a_dump_of_a_large_compile_joins_the_passes_beside(monkeypatch, stage):
    """In a large compile verification runs beside scheduling and the IR checks beside code
    generation: stopping after a stage still joins them (their errors are reported), and the dump
    is the one-thread compile's."""
    from hccc.compiler.pipeline import CompileOptions, StageTimes, context as pipeline
    from hccc.compiler.pipeline.compile import context_for, run_until
    from hccc.compiler.pipeline.dumps import dump
    alg = load_algorithm(EXAMPLES / "hm_allreduce_2x4.rccl")
    monkeypatch.setattr(pipeline, "BESIDE_FROM", 10 ** 9)
    one = dump(run_until(context_for(alg, CompileOptions()), stage), stage)
    monkeypatch.setattr(pipeline, "BESIDE_FROM", 0)
    times = StageTimes()
    two = dump(run_until(context_for(alg, CompileOptions(), times=times), stage), stage)
    assert one == two
    assert "verify" in times.beside and ("checks" in times.beside) == (stage != "algorithm")

    from hccc.compiler.passes import build

    def failing(ir):
        raise AssertionError("internal error: checks failed")
    monkeypatch.setattr(build, "check_program", failing)
    if stage != "algorithm":
        with pytest.raises(AssertionError, match="checks failed"):
            run_until(context_for(alg, CompileOptions()), stage)
