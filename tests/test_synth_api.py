"""``hccc.synthesize``: the Python API returns exactly the bytes ``hccc synth`` writes with the
same options (one selection loop serves both), and refuses what the command refuses."""
from __future__ import annotations

from pathlib import Path

import pytest

import hccc
from hccc.cli import main
from hccc.util.diagnostics import CompileError

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


# a cluster not in the repository: two 2-GPU nodes, NVLink inside, one NIC per node, unequal
TOPO = """define nodenum = 2
define node1 = 2
define bandwidth = {direct => [((0,1) -> (50,2)), ((1,0) -> (50,2))]}
define nic = [((0,1) -> (12.5,1))]
define node2 = 3
define bandwidth = {direct => [((0,1) -> (25,2)), ((1,0) -> (25,2)), ((1,2) -> (25,1)), ((2,1) -> (25,1))]}
define nic = [((0,1,2) -> (25,1))]
define internode = all
define interbandwidth = nic
"""


@pytest.fixture
def c5(tmp_path) -> Path:
    p = tmp_path / "c5.topo"
    p.write_text(TOPO)
    return p


def _flags(options: dict) -> list[str]:
    """``hccc synth``'s flags for the API's options (an independent spelling of the mapping)."""
    out = []
    for k, v in options.items():
        if k == "sizes":
            out += ["--size", ",".join(str(s) for s in v)]
        elif k == "smt":
            out += [] if v else ["--no-smt"]
        elif k == "engine":
            out += ["--for", v]
        else:
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


CASES = [
    ("c5", "allgather", {}),
    ("c5", "allreduce", {"time_limit": 30}),
    ("c5", "broadcast", {"root": 1, "method": "search"}),
    ("c5", "reducescatter", {"chunks_per_rank": 2}),
    ("c5", "alltoall", {}),
    ("c5", "allgather", {"sizes": (65536, 1 << 20)}),
    ("c5", "allreduce", {"engine": "xml"}),
    ("heteccl_fig10", "allgather", {"method": "trees", "select_size": 64 << 20}),
]


@pytest.mark.parametrize("cluster,collective,options", CASES)
def test_api_returns_the_bytes_the_command_writes(c5, tmp_path, capsys, cluster, collective, options):
    topo = c5 if cluster == "c5" else CLUSTERS / f"{cluster}.topo"
    out = tmp_path / "prog.rccl"
    assert main(["synth", str(topo), "--collective", collective, *_flags(options), "-o", str(out)]) == 0
    capsys.readouterr()
    got = hccc.synthesize(topo, collective, **options)
    if "sizes" in options:
        from hccc.args import format_size
        assert set(got) == set(options["sizes"])
        for size, text in got.items():
            assert (tmp_path / f"prog_{format_size(size)}.rccl").read_text() == text
    else:
        assert out.read_text() == got


def test_api_refuses_what_the_command_refuses(c5):
    with pytest.raises(CompileError, match="--method trees builds"):
        hccc.synthesize(c5, "alltoall", method="trees")
    with pytest.raises(CompileError, match="--chunks-per-rank applies to --method search"):
        hccc.synthesize(c5, "allgather", method="trees", chunks_per_rank=2)
    with pytest.raises(TypeError, match="unknown option"):
        hccc.synthesize(c5, "allgather", chunk_per_rank=2)


#: options the command's parser refuses, as Python values: (options, the flag named, the command's
#: flags where it can spell the value; None where only Python can: a type no command line makes)
BAD_OPTIONS = [
    ({"time_limit": -1}, "--time-limit", ["--time-limit", "-1"]),
    ({"time_limit": 0}, "--time-limit", ["--time-limit", "0"]),
    ({"time_limit": float("nan")}, "--time-limit", ["--time-limit", "nan"]),
    ({"time_limit": 8 * 24 * 3600}, "--time-limit", ["--time-limit", str(8 * 24 * 3600)]),
    ({"time_limit": "10"}, "--time-limit", None),
    ({"root": -1}, "--root", ["--root", "-1"]),
    ({"chunks_per_rank": 0, "method": "search"}, "--chunks-per-rank", ["--chunks-per-rank", "0", "--method", "search"]),
    ({"pod_size": 1 << 40, "method": "search"}, "--pod-size", ["--pod-size", str(1 << 40), "--method", "search"]),
    ({"variants": 0}, "--variants", ["--variants", "0"]),
    ({"select_size": 0}, "--select-size", ["--select-size", "0"]),
    ({"select_size": 1.5}, "--select-size", ["--select-size", "1.5"]),
    ({"sizes": (4096, 0)}, "--size", ["--size", "4096,0"]),
    ({"sizes": tuple(range(1, 66))}, "--size", ["--size", ",".join(str(i) for i in range(1, 66))]),
    ({"sizes": 4096}, "--size", None),
    ({"smt": "no"}, "--no-smt", None),
    ({"sim_select": 0}, "--no-sim-select", None),
]


@pytest.mark.parametrize("options,flag,argv", BAD_OPTIONS,
                         ids=[f"{i}-{next(iter(o))}" for i, (o, _, _) in enumerate(BAD_OPTIONS)])
def test_api_refuses_each_value_the_command_refuses_naming_its_option(c5, tmp_path, capsys, options, flag, argv):
    """Before any work, and naming the option as the command spells it; where the command line can
    spell the value, the command refuses it too (a usage error)."""
    with pytest.raises(CompileError, match="^" + flag + ": "):
        hccc.synthesize(c5, "allgather", **options)
    if argv is not None:
        out = tmp_path / "p.rccl"
        assert main(["synth", str(c5), "--collective", "allgather", *argv, "-o", str(out)]) == 2
        assert flag.split("-")[-1] in capsys.readouterr().err and not out.exists()


def test_api_refuses_an_unknown_collective_and_a_cluster_it_cannot_read_as_the_command_does(c5):
    with pytest.raises(CompileError, match="^--collective: expected one of allgather, .*got 'allgathr'"):
        hccc.synthesize(c5, "allgathr")
    with pytest.raises(CompileError, match="^--collective: .*got 'sendrecv'"):
        hccc.synthesize(c5, "sendrecv")      # a collective, but not one synthesis makes
    with pytest.raises(TypeError, match="cluster is a path .* not bytes"):
        hccc.synthesize(c5.read_bytes(), "allgather")
    # the method in any case, as the command takes it
    assert hccc.synthesize(c5, "allgather", method="SEARCH") == hccc.synthesize(c5, "allgather", method="search")


def test_the_emitter_writes_the_plan_it_is_given(c5):
    """The header's choices come from the SynthPlan alone: a plan with other channels and slices
    gives a header with those, whatever the result's report says."""
    from dataclasses import replace

    from hccc.compiler.frontend.slice_policy import SlicePolicy
    from hccc.compiler.pipeline import load_cluster
    from hccc.compiler.synth.emit import header
    from hccc.compiler.synth.plan import SynthOptions
    from hccc.synth_select import synthesize_programs

    topo = load_cluster(c5)
    [p] = synthesize_programs(topo, SynthOptions("allgather", method="search", time_limit=20))
    other = replace(p.plan, channels=p.plan.channels + 3, slicing=SlicePolicy(4, 4096))
    h = header(p.result, topo, other)
    assert (h.nchannels, h.micro_batches, h.min_slice_bytes) == (p.plan.channels + 3, 4, 4096)
    assert header(p.result, topo, p.plan).nchannels == p.plan.channels


@pytest.mark.parametrize("cluster,collective,options", [
    ("c5", "allgather", {}),
    ("c5", "broadcast", {"root": 1, "method": "search"}),
    ("c5", "reducescatter", {"chunks_per_rank": 2}),
    ("c5", "alltoall", {}),
    ("c5", "allgather", {"sizes": (65536, 1 << 20)}),
])
def test_synthesize_program_hands_over_the_algorithm_its_text_parses_to(c5, monkeypatch, cluster, collective,
                                                                        options):
    """The Algorithm comes from the synthesis, not from its text read back, and is exactly what the
    parser makes of that text: the same header (nChannels given included) and transfers in the
    same order, so the compiler builds the same program from either."""
    import dataclasses

    from hccc.compiler.frontend import load, parse_rccl
    from hccc.compiler.passes.build import build_program

    def no_parse(*a, **k):
        raise AssertionError("synthesis parsed .rccl text")
    with monkeypatch.context() as m:
        m.setattr(load, "parse_program", no_parse)
        got = hccc.synthesize_program(c5, collective, **options)
    progs = list(got.values()) if "sizes" in options else [got]
    assert len(progs) == len(options.get("sizes", (0,)))
    for prog in progs:
        back = parse_rccl(prog.text, "synth.rccl")
        assert list(prog.algorithm.rows()) == list(back.rows())
        assert list(prog.algorithm.channels) == list(back.channels)
        assert dataclasses.replace(prog.algorithm.header, location=None) == \
            dataclasses.replace(back.header, location=None)
        assert prog.algorithm.header.nchannels_given == back.header.nchannels_given
        assert build_program(prog.algorithm).to_json() == build_program(back).to_json()
    if "sizes" not in options:
        assert hccc.synthesize(c5, collective, **options) == got.text    # synthesize() is its text
