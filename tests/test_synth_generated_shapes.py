"""Synthesis at any size the limits accept: generated clusters of the example nodes
(``examples/clusters/generate.py``: H20, V100 and A100 nodes of 4 and 8 GPUs, mixed, every pair of
nodes through the NICs) are synthesised for every collective into a program ``hccc check`` accepts
on the cluster, or refused with an error that names the cluster file, never a traceback or an
internal error, and nothing written on a refusal.

The clusters are small, so that each example takes a second or two; what a large cluster does to
the program's numbering is brought within their reach by lowering the largest channel a tree
program may name (``forest.MAX_CHANNEL``, 1023: 74 nodes of 8 H20s put 131 streams on a pair per
half of an AllReduce, 1,024 GPUs hundreds): the streams past it share channels
(:func:`hccc.compiler.synth.forest.fold_channels`) and the program must still be accepted."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.cluster.topo_parser import format_topology
from hccc.compiler.frontend.load import parse_rccl
from hccc.compiler.synth import forest

ROOT = Path(__file__).resolve().parents[1]
COLLECTIVES = ["allgather", "reducescatter", "allreduce", "broadcast", "alltoall"]


def _generator():
    spec = importlib.util.spec_from_file_location("cluster_gen", ROOT / "examples" / "clusters" / "generate.py")
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    return g


GEN = _generator()
#: the example nodes, by name (a V100 4-GPU node's NICs at 64 or 100 Gbps, as in the examples)
NODES = {"h20_8": GEN.h20_node8, "h20_4": GEN.h20_node4, "v100_8": GEN.v100_node8,
         "v100_4": lambda: GEN.v100_node4(100), "a100_4": lambda: GEN.a100_node(4)}


@st.composite
def generated_clusters(draw):
    """1-3 nodes drawn from :data:`NODES`, at most 16 GPUs; the same node repeated (the symmetric
    shape of large clusters, whose programs loop over node shifts) half the time."""
    k = draw(st.integers(1, 3))
    if draw(st.booleans()):
        names = [draw(st.sampled_from(sorted(NODES)))] * k
    else:
        names = draw(st.lists(st.sampled_from(sorted(NODES)), min_size=k, max_size=k))
    gpus = {"h20_8": 8, "v100_8": 8}
    while sum(gpus.get(n, 4) for n in names) > 16:
        names = names[:-1]
    return names


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(generated_clusters(), st.sampled_from(COLLECTIVES), st.sampled_from([None, 0, 2]))
def test_a_generated_cluster_synthesises_a_checked_program_or_is_refused_with_a_located_reason(
        tmp_path_factory, capsys, monkeypatch, names, collective, most):
    d = tmp_path_factory.mktemp("gen")
    topo = d / "gen.topo"
    topo.write_text(format_topology(GEN.cluster([NODES[n]() for n in names], " + ".join(names))))
    out = d / "p.rccl"
    with monkeypatch.context() as m:
        if most is not None:
            m.setattr(forest, "MAX_CHANNEL", most)      # a large cluster's streams on a pair, in small
        capsys.readouterr()
        rc = main(["synth", str(topo), "--collective", collective, "--time-limit", "10", "--no-sim-select",
                   "-o", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err.lower(), err
    assert rc in (0, 1), (rc, err)
    if rc == 1:
        assert not out.exists()
        errors = [ln for ln in err.splitlines() if re.search(r"\berror\b", ln)]
        assert errors and all("gen.topo" in ln for ln in errors), err
        return
    if most is not None:
        # the numbering, as the parser reads the text (loops expanded)
        channels = parse_rccl(out.read_text(), "p.rccl").channels
        assert int(channels.max(initial=0)) <= most, (most, int(channels.max()))
    rc = main(["check", str(out), "--topology", str(topo)])
    got = capsys.readouterr()
    assert rc == 0, got.out[-2000:] + got.err[-2000:]


def test_every_generated_node_is_a_candidate():
    """The nodes drawn are the generator's (a renamed builder would leave a shape untested)."""
    for make in NODES.values():
        assert make().ngpus in (4, 8)
