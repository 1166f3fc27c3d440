"""Networks that reversing every pair gives again (``Network.is_self_transposed``) and the
ReduceScatter that uses AllGather's trees on them: the check against a plain reading of the
network's pairs and groups, and the packings' times equal (ReduceScatter is AllGather's
time-reverse, so the two reach one fraction of the optimum in the link model)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.cluster.topo_parser import ClusterSpec, InternodeSpec, LinkSpec, NicSpec, NodeSpec, format_topology, parse_topology
from hccc.compiler.synth import network_from_topology, synthesize
from synth_oracles import model_time, optimum, clusters


def _mirrored(net) -> bool:
    """The oracle: every pair's reverse is a pair with the same capacity and bandwidth, and every
    group's reversed pair set, with its capacity, is a group (read from the arrays as dicts and
    sets, not through ``transposed``)."""
    pairs = {(int(s), int(d)): (int(c), None if net.bw is None else float(b))
             for s, d, c, b in zip(net.psrc, net.pdst, net.cap,
                                   net.bw if net.bw is not None else [None] * net.npairs)}
    if any(pairs.get((d, s)) != v for (s, d), v in pairs.items()):
        return False
    members: dict[int, set] = {}
    for p in range(net.npairs):
        for g in net.groups_of(p).tolist():
            members.setdefault(g, set()).add((int(net.psrc[p]), int(net.pdst[p])))
    gbw = net.gbw if net.gbw is not None else np.zeros(net.ngroups)
    groups = sorted((int(net.gcap[g]), float(gbw[g]), tuple(sorted(m))) for g, m in members.items())
    flipped = sorted((int(net.gcap[g]), float(gbw[g]), tuple(sorted((d, s) for s, d in m)))
                     for g, m in members.items())
    return groups == flipped


def _asymmetric_topology(down: float, nic_out: float | None = None):
    """Two nodes of two GPUs; GPU 1 -> 0 at ``down`` GB/s where 0 -> 1 is 50."""
    links = [LinkSpec(0, 1, 50, 1), LinkSpec(1, 0, down, 1)]
    node = NodeSpec(2, {"direct": links}, nics=[NicSpec((0, 1), 25)])
    return parse_topology(format_topology(ClusterSpec([node, node], [InternodeSpec("all", "nic")])), "asym.topo")


@settings(max_examples=examples(25), deadline=None)
@given(topo=clusters())
def test_self_transposed_is_the_plain_reading(topo):
    net = network_from_topology(topo)
    assert net.is_self_transposed() == _mirrored(net)


@settings(max_examples=examples(25), deadline=None)
@given(topo=clusters(), data=st.data())
def test_self_transposed_is_the_plain_reading_of_altered_networks(topo, data):
    """A random pair's bandwidth or capacity, or a random group's, changed (random clusters are
    all mirrored; an altered one may not be)."""
    import dataclasses

    net = network_from_topology(topo)
    what = data.draw(st.sampled_from(["bw", "cap", "gbw", "gcap"]))
    arr = getattr(net, what)
    if arr is None or not len(arr):
        return
    i = data.draw(st.integers(0, len(arr) - 1))
    new = arr.copy()
    new[i] = new[i] * 2 + 1
    altered = dataclasses.replace(net, **{what: new}, _in_csr=None, _out_csr=None, _spread=None,
                                  _self_transposed=None)
    assert altered.is_self_transposed() == _mirrored(altered)


@settings(max_examples=examples(10), deadline=None)
@given(down=st.sampled_from([10.0, 25.0, 50.0]))
def test_an_asymmetric_link_is_not_mirrored(down):
    net = network_from_topology(_asymmetric_topology(down))
    assert net.is_self_transposed() == (down == 50.0) == _mirrored(net)


@settings(max_examples=examples(3), deadline=None)
@given(topo=clusters())
def test_mirrored_reducescatter_packs_allgathers_trees(topo):
    """On a mirrored network ReduceScatter's in-trees are AllGather's out-trees: the same chunks
    per rank and the same time in the link model (apart, the LP's ties could fall otherwise)."""
    net = network_from_topology(topo)
    if not net.is_self_transposed():
        return
    ag = synthesize(topo, "allgather", method="trees", time_limit=30).detail["trees"]["allgather"]
    rs = synthesize(topo, "reducescatter", method="trees", time_limit=30).detail["trees"]["reducescatter"]
    assert rs["trees"] == ag["trees"]
    assert rs["model_fraction"] == ag["model_fraction"]
    assert rs["lp_seconds_per_byte"] == ag["lp_seconds_per_byte"]


def test_reducescatter_on_an_asymmetric_network_packs_its_own_trees():
    """1 -> 0 at a fifth of 0 -> 1: the in-trees must avoid what the out-trees use, and the
    ReduceScatter still runs where its packing puts it (the link model at its own optimum)."""
    topo = _asymmetric_topology(10.0)
    res = synthesize(topo, "reducescatter", method="trees", time_limit=30)
    assert res.detail["trees"]["reducescatter"]["model_fraction"] >= 0.98
    net = network_from_topology(topo)
    # and against the independent flow LP: the program's own transfers in the link model
    assert optimum(net, reverse=True) / model_time(topo, res.rows, res.chunks_per_rank) >= 0.98
    assert not net.is_self_transposed()
