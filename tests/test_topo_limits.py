"""``.topo`` limits: every numeric field, however tiny or large, is a located error or a usable
cluster (never an internal error such as an OverflowError), and ``internode = all`` is refused by
the link limit before any node pair is built."""
from __future__ import annotations

import time

import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.cluster.topo_parser import MAX_LINKS, MIN_BANDWIDTH_GBPS, parse_topology
from hccc.compiler.cluster.topology import MAX_LOGICAL_CAPACITY
from hccc.util.diagnostics import CompileError, render_all

TEMPLATE = """define nodenum = {nodenum}
define chunksize = {chunksize}
define latency = {{direct => {lat_direct}, switch => 0.5, internode => 1, nic => {lat_nic}}}
define gamma = {gamma}
define node1 = {gpus}
define bandwidth = {{direct => [((0,1) -> ({bw},{lanes})), ((1,0) -> (25,4))]}}
define nic = [((0,1) -> ({nic_bw},1))]
define node2 = 2
define bandwidth = {{switch => [(((0),(1)) >-> ({sw_bw},2))]}}
define nic = [((0) -> (25,1)), (({gpu_id}) -> (12.5,1))]
define internode = all
define interbandwidth = nic
"""
NORMAL = dict(nodenum="2", chunksize="1M", lat_direct="0.7", lat_nic="2", gamma="600", gpus="2", bw="25",
              lanes="4", nic_bw="25", sw_bw="50", gpu_id="1")


def test_the_template_is_a_valid_cluster():
    """The property below varies this cluster; unchanged, it parses (else every case would be a
    syntax error and the property would prove nothing)."""
    topo = parse_topology(TEMPLATE.format(**NORMAL), "x.topo")
    assert topo.nranks == 4 and topo.groups


def _number():
    tiny = st.integers(0, 45).map(lambda k: "0." + "0" * k + "1")
    huge = st.integers(1, 60).map(lambda k: "9" * k)
    mixed = st.tuples(st.integers(1, 30), st.integers(1, 30)).map(lambda t: "7" * t[0] + "." + "3" * t[1])
    plain = st.sampled_from(["0", "1", "-1", "0.5", "1000000000", "1000000001", "0.000001", "0.0000009",
                             "4096", "4097", "65536", "65537", "1024", "1G", "1T", "1.5M", "0.1K"])
    return st.one_of(tiny, huge, mixed, plain)


@settings(max_examples=150)
@given(field=st.sampled_from(sorted(NORMAL)), value=_number(), other=st.sampled_from(sorted(NORMAL)),
       value2=_number())
def test_numeric_fields_never_give_an_internal_error(field, value, other, value2):
    """Two fields at once set to extreme values: the parser returns a cluster whose capacities
    all fit, or raises a located CompileError; any other exception fails the test."""
    vals = dict(NORMAL)
    vals[field] = value
    vals[other] = value2
    text = TEMPLATE.format(**vals)
    try:
        topo = parse_topology(text, "x.topo")
    except CompileError as exc:
        assert exc.diagnostics and exc.diagnostics[0].location is not None, render_all(exc)
        return
    assert int(topo.link_capacity.max()) <= MAX_LOGICAL_CAPACITY
    assert all(g.capacity <= MAX_LOGICAL_CAPACITY for g in topo.groups)
    topo.summary()


def _with(**kw) -> str:
    return TEMPLATE.format(**dict(NORMAL, **kw))


def _error(text: str) -> str:
    with pytest.raises(CompileError) as ei:
        parse_topology(text, "x.topo")
    return render_all(ei.value)


def test_tiny_bandwidth_is_located_at_itself():
    msg = _error(_with(bw="0." + "0" * 37 + "1"))
    assert msg.startswith("x.topo:6:") and "too small" in msg and "at least 0.000001" in msg and MIN_BANDWIDTH_GBPS * 10 ** 6 == 1
    assert _error(_with(gamma="0." + "0" * 30 + "1")).startswith("x.topo:4:")
    assert _error(_with(nic_bw="0." + "0" * 20 + "1")).startswith("x.topo:7:")


def test_speeds_too_far_apart_are_located_at_the_fast_link():
    msg = _error(_with(bw="1000000000", lat_direct="0", sw_bw="0.000001", chunksize="1G"))
    assert msg.startswith("x.topo:6:") and "logical capacity" in msg and str(MAX_LOGICAL_CAPACITY) in msg
    assert "note: the slowest link" in msg


def _all_to_all(nodes: int, gpus: int, interbandwidth: str) -> str:
    lines = [f"define nodenum = {nodes}"]
    members = ",".join(map(str, range(gpus)))
    for k in range(1, nodes + 1):
        lines += [f"define node{k} = {gpus}", f"define nic = [(({members}) -> (25,1))]"]
    lines += ["define internode = all", f"define interbandwidth = {interbandwidth}"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("inter", ["nic", "{switch => [(((0,1,2,3,4,5,6,7),(0,1,2,3,4,5,6,7)) >-> (25,1))]}"])
def test_internode_all_refused_before_building(inter):
    """10,000 GPUs linked all-to-all would be 10**8 links: refused at the internode statement,
    in a fraction of the time and memory of building even a small part of them."""
    text = _all_to_all(1250, 8, inter)
    t0 = time.process_time()
    msg = _error(text)
    assert time.process_time() - t0 < 3.0
    assert msg.startswith(f"x.topo:{2 * 1250 + 2}:") and f"limit of {MAX_LINKS}" in msg, msg


def test_internode_all_under_the_limit_still_builds():
    """The count is exact: G**2 - sum g**2 NIC links for 4 nodes of 8 (independent count below)."""
    topo = parse_topology(_all_to_all(4, 8, "nic"), "x.topo")
    cross = sum(1 for l in topo.links() if l.cls == "nic")
    assert cross == 32 * 32 - 4 * 64
