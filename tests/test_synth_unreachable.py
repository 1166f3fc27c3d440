"""``hccc synth`` on clusters where paths are missing, and on one GPU: a clear error naming an
unreachable rank (said once, before any synthesis), or the trivial program that runs."""
from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.pipeline import load_algorithm
from hccc.compiler.synth.bounds import unreachable
from hccc.compiler.synth.problem import Network

from synth_networks import unit_network


def _node(i: int, gpus: int, nic: bool = True) -> str:
    links = ", ".join(f"(({a},{b}) -> (50,1))" for a in range(gpus) for b in range(gpus) if a != b)
    text = f"define node{i} = {gpus}\ndefine vendor = amd\ndefine gpu = MI250\n"
    if links:
        text += f"define bandwidth = {{direct => [{links}]}}\n"
    if nic:
        text += "define nic = [" + ", ".join(f"(({g}) -> (16,1))" for g in range(gpus)) + "]\n"
    return text


def _cluster(sizes, internode: bool = True) -> str:
    text = f"define nodenum = {len(sizes)}\n" + "".join(_node(i + 1, g) for i, g in enumerate(sizes))
    return text + ("define internode = all\ndefine interbandwidth = nic\n" if internode else "")


def _network(n: int, pairs: list[tuple[int, int]]) -> Network:
    """The pairs as a network of unit capacities and no shared groups."""
    pairs = sorted(set(pairs))
    return unit_network(n, pairs, [1] * len(pairs), [], [])


@st.composite
def digraphs(draw):
    n = draw(st.integers(1, 7))
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    keep = draw(st.lists(st.booleans(), min_size=len(pairs), max_size=len(pairs)))
    return n, [p for p, k in zip(pairs, keep) if k], draw(st.integers(0, n - 1))


@given(digraphs(), st.sampled_from(["allgather", "reducescatter", "allreduce", "alltoall", "broadcast"]))
def test_unreachable_agrees_with_networkx(graph, collective):
    """Refused exactly where networkx says a rank cannot be reached: from the root for a
    broadcast, from some other rank for the rest (strong connectivity); the rank named really is
    unreachable from the rank named."""
    n, pairs, root = graph
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(pairs)
    ok = (nx.descendants(g, root) | {root}) == set(range(n)) if collective == "broadcast" else \
        nx.is_strongly_connected(g)
    why = unreachable(_network(n, pairs), collective, root)
    assert (why is None) == ok, why
    if why is not None:
        words = why.split()
        dst, src = int(words[1]), int(words[7])
        assert dst not in nx.descendants(g, src) and dst != src


def test_the_hint_names_internode_only_where_no_link_joins_two_nodes():
    # two nodes of two ranks, joined: rank 3 cannot send back, and the nodes are joined
    joined = _network(4, [(0, 1), (1, 0), (1, 2), (2, 3)])
    why = unreachable(joined, "allgather", 0, node_of=[0, 0, 1, 1])
    assert why is not None and "internode" not in why
    apart = _network(4, [(0, 1), (1, 0), (2, 3), (3, 2)])
    assert "no link joins two nodes" in unreachable(apart, "allgather", 0, node_of=[0, 0, 1, 1])
    assert "no link at all" in unreachable(_network(3, []), "allgather", 0, node_of=[0, 1, 2])


@pytest.mark.parametrize("method", ["trees", "search", "auto"])
def test_nodes_not_joined_are_refused_clearly(tmp_path, capsys, method):
    """Four one-GPU nodes with NICs but no 'internode': refused before any work, exit status 1,
    the unreachable rank and the missing declaration named, nothing written."""
    topo = tmp_path / "apart.topo"
    topo.write_text(_cluster([1, 1, 1, 1], internode=False))
    out = tmp_path / "p.rccl"
    assert main(["synth", str(topo), "--collective", "allgather", "--method", method, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "apart.topo: rank 1 cannot be reached from rank 0" in err, err
    assert "'internode'" in err and "Traceback" not in err and "zero-size" not in err
    assert not out.exists()


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "broadcast", "alltoall"])
def test_one_gpu_gets_the_empty_program(tmp_path, capsys, collective):
    """A cluster of one GPU: every collective (the default method too, which packs trees for the
    others) gives the program of no transfers, which checks."""
    topo = tmp_path / "one.topo"
    topo.write_text(_cluster([1]))
    out = tmp_path / f"{collective}.rccl"
    assert main(["synth", str(topo), "--collective", collective, "-o", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["nranks"] == 1 and summary["transfers"] == 0 and summary["method"] == "search"
    alg = load_algorithm(out)
    assert alg.header.nranks == 1 and alg.ntransfers == 0
    text = out.read_text()
    assert "(1 GPU, 1 node: 1)" in text and "no byte moves" in text and "..-1" not in text
    assert main(["check", str(out)]) == 0


def test_one_gpu_program_runs(tmp_path, capsys):
    topo = tmp_path / "one.topo"
    topo.write_text(_cluster([1]))
    out = tmp_path / "ar.rccl"
    assert main(["synth", str(topo), "--collective", "allreduce", "-o", str(out)]) == 0
    out_text = capsys.readouterr().out
    assert "allreduce on 1 GPU by search" in out_text and "not simulated (no transfers: one GPU)" in out_text
    assert main(["run", str(out), "--sizes", "4K,1M"]) == 0
    assert "Out of bounds values : 0 OK" in capsys.readouterr().out
    eight = Path(__file__).resolve().parents[1] / "examples" / "ring_allgather_8.rccl"
    assert main(["sim", str(eight), "--topology", str(topo), "--sizes", "1M"]) == 1
    assert "error: the algorithm has nRanks=8 but cluster 'one.topo' has 1 GPU (" in capsys.readouterr().err


def test_alltoall_says_its_method(tmp_path, capsys):
    topo = tmp_path / "two.topo"
    topo.write_text(_cluster([2, 2]))
    out = tmp_path / "a2a.rccl"
    assert main(["synth", str(topo), "--collective", "alltoall", "-o", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    # auto: the fastest candidate (the step search's routing, or one of hccc's generators)
    assert s["method"] == s["selection"]["kept"] and "search" in s["methods_tried"]
    assert main(["synth", str(topo), "--collective", "alltoall", "-o", str(out)]) == 0
    assert f"alltoall on 4 GPUs by {s['method']}:" in capsys.readouterr().out
    assert main(["synth", str(topo), "--collective", "alltoall", "--method", "search", "-o", str(out)]) == 0
    assert "alltoall on 4 GPUs by search:" in capsys.readouterr().out
