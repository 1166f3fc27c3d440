"""TB allocation (compiler/passes/tb_alloc.py): interval partitioning and its use on lowered programs."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend import generators as G
from hccc.compiler.passes.build import build_from_schedule, build_program
from hccc.compiler.passes.dag import build_dag
from hccc.compiler.passes.lower import lower
from hccc.compiler.passes.tb_alloc import allocate, connection_units, dense_ids, max_overlap, partition_intervals
from hccc.testing import valid_programs

from random_programs import algorithms, random_program, sharing_rs4, step_schedule


def brute_max_overlap(start, end):
    pts = set(start) | set(end)
    return max((sum(1 for s, e in zip(start, end) if s <= p <= e) for p in pts), default=0)


intervals = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10)), max_size=40).map(
    lambda xs: ([s for s, _ in xs], [s + d for s, d in xs]))


@given(intervals)
@settings(max_examples=200)
def test_partition_is_valid_and_optimal(iv):
    start, end = iv
    track, k = partition_intervals(start, end)
    assert k == brute_max_overlap(start, end) == max_overlap(start, end)
    assert len(track) == len(start)
    if len(start):
        assert set(track.tolist()) == set(range(k))
    for i in range(len(start)):
        for j in range(i + 1, len(start)):
            if track[i] == track[j]:
                assert end[i] < start[j] or end[j] < start[i], "overlapping intervals share a track"


@given(intervals)
@settings(max_examples=50)
def test_partition_is_deterministic_and_permutation_invariant_in_count(iv):
    start, end = iv
    a, k1 = partition_intervals(start, end)
    b, k2 = partition_intervals(start, end)
    assert np.array_equal(a, b) and k1 == k2
    perm = np.random.default_rng(0).permutation(len(start))
    _, k3 = partition_intervals(np.array(start, dtype=np.int64)[perm], np.array(end, dtype=np.int64)[perm])
    assert k3 == k1


def test_partition_examples():
    assert partition_intervals([], [])[1] == 0
    # touching closed intervals overlap
    assert partition_intervals([0, 2], [2, 3])[1] == 2
    assert partition_intervals([0, 3], [2, 5])[1] == 1
    tr, k = partition_intervals([0, 0, 1, 4], [3, 0, 2, 5])
    assert k == 2 and tr[1] != tr[0] and tr[2] != tr[0]


def test_dense_ids():
    keys = np.array([5, -1, 3, 5, 9], dtype=np.int64)
    for space in (16, 1 << 30):
        ids, n = dense_ids(keys, space)
        assert n == 3 and ids.tolist() == [1, -1, 0, 1, 2]


def _check_allocation(ir, low):
    """Per rank: units sharing a TB never overlap; TB count == max overlap (state-based)."""
    unit, urank, ustart, uend = connection_units(low)
    # independent recomputation of spans from the IR itself: connection end -> TB, pipelines
    p = ir.prims
    ends = {}
    for i in range(ir.nprims):
        r, tb, pipe = int(p["rank"][i]), int(p["tb"][i]), int(p["pipeline"][i])
        for peer, d in ((int(p["send_peer"][i]), "s"), (int(p["recv_peer"][i]), "r")):
            if peer >= 0:
                ends.setdefault((r, peer, d, int(p["channel"][i])), []).append((tb, pipe))
    for key, lst in ends.items():
        assert len({tb for tb, _ in lst}) == 1, f"connection end {key} on two TBs"
    for r in range(ir.nranks):
        m = urank == r
        k = max_overlap(ustart[m], uend[m])
        if ir.allocation.tb_alloc == "state":
            floor = 1 if (p["rank"] == r).any() else 0
            assert max(k, floor) <= int(ir.ntbs[r]) <= max(int(m.sum()), floor)
    if ir.allocation.tb_alloc == "state":
        _sharing_is_free(ir, low, unit)


def _wait_graph(low, unit):
    """networkx oracle of the wait graph without sharing: data dependencies, send -> receive of
    each task, and each unit's primitives in order-key order."""
    import networkx as nx
    c = low.cols
    g = nx.DiGraph()
    g.add_nodes_from(range(low.nprims))
    g.add_edges_from(zip(low.dep_on.tolist(), low.dep_prim.tolist()))
    recv_of = {int(c["task"][i]): i for i in range(low.nprims) if c["recv_peer"][i] >= 0}
    for i in range(low.nprims):
        if c["send_peer"][i] >= 0:
            t = int(c["task2"][i]) if c["recv_peer"][i] >= 0 else int(c["task"][i])
            g.add_edge(i, recv_of[t])
    for u in set(unit.tolist()) - {-1}:
        ps = sorted(np.flatnonzero(unit == u).tolist(), key=lambda i: int(low.key[i]))
        g.add_edges_from(zip(ps, ps[1:]))
    return g


def _sharing_is_free(ir, low, unit):
    """Units that follow each other on one TB: the later one's first primitive already waits for
    the earlier one's last primitive (module docstring of tb_alloc)."""
    import networkx as nx
    g = _wait_graph(low, unit)
    tb_low = _tb_of_low(ir, low)
    seq = {}
    for i in range(low.nprims):
        if unit[i] >= 0:
            seq.setdefault((int(low.cols["rank"][i]), int(tb_low[i])), []).append(i)
    for lst in seq.values():
        lst.sort(key=lambda i: int(low.key[i]))
        for a, b in zip(lst, lst[1:]):
            if unit[a] != unit[b]:
                assert nx.has_path(g, a, b), "a TB holds a unit that sharing could delay"


def _tb_of_low(ir, low):
    """TB of every primitive of ``low``, recomputed from the IR's connection ends."""
    p = ir.prims
    tb_of_end = {}
    for i in range(ir.nprims):
        r, ch = int(p["rank"][i]), int(p["channel"][i])
        for peer, d in ((int(p["send_peer"][i]), "s"), (int(p["recv_peer"][i]), "r")):
            if peer >= 0:
                tb_of_end[(r, peer, d, ch)] = int(p["tb"][i])
    c = low.cols
    out = np.zeros(low.nprims, np.int64)
    for i in range(low.nprims):
        r, ch = int(c["rank"][i]), int(c["channel"][i])
        if c["recv_peer"][i] >= 0:
            out[i] = tb_of_end[(r, int(c["recv_peer"][i]), "r", ch)]
        elif c["send_peer"][i] >= 0:
            out[i] = tb_of_end[(r, int(c["send_peer"][i]), "s", ch)]
    return out


@given(algorithms(max_ranks=6), st.sampled_from(["hpds", "rr", "step"]))
@settings(max_examples=40)
def test_lowered_programs_tb_invariants(alg, scheduler):
    dag = build_dag(alg)
    if scheduler == "step":
        sched = step_schedule(alg)
    else:
        from hccc.compiler.passes.build import schedule_algorithm
        sched = schedule_algorithm(alg, dag, scheduler)
    low = lower(alg, dag, sched)
    ir_s = allocate(low, "state")
    ir_c = allocate(low, "connection")
    assert ir_s.allocation.tbs_state_based == ir_c.allocation.tbs_state_based == int(ir_s.ntbs.sum())
    assert ir_c.allocation.tbs_connection_based == int(ir_c.ntbs.sum())
    assert (ir_s.ntbs <= ir_c.ntbs).all()
    _spans_disjoint_per_tb(ir_s)
    _check_allocation(ir_s, low)
    # connection-based: one unit per TB
    unit, urank, _, _ = connection_units(low)
    for r in range(alg.header.nranks):
        nu = int((urank == r).sum())
        assert int(ir_c.ntbs[r]) == max(nu, 1 if (low.cols["rank"] == r).any() else 0)


def _spans_disjoint_per_tb(ir):
    """Independent oracle on the IR alone: group primitives by connection end (+ fused links via a
    small union-find), take each group's pipeline span, and check groups on one TB never overlap."""
    p = ir.prims
    parent = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for i in range(ir.nprims):
        r, ch = int(p["rank"][i]), int(p["channel"][i])
        ends = []
        if p["send_peer"][i] >= 0:
            ends.append((r, int(p["send_peer"][i]), "s", ch))
        if p["recv_peer"][i] >= 0:
            ends.append((r, int(p["recv_peer"][i]), "r", ch))
        for e in ends:
            find(e)
        if len(ends) == 2:
            a, b = find(ends[0]), find(ends[1])
            if a != b:
                parent[a] = b
    spans, tbs = {}, {}
    for i in range(ir.nprims):
        r, ch = int(p["rank"][i]), int(p["channel"][i])
        peer, d = (int(p["send_peer"][i]), "s") if p["send_peer"][i] >= 0 else (int(p["recv_peer"][i]), "r")
        if peer < 0:
            continue
        u = find((r, peer, d, ch))
        pipe = int(p["pipeline"][i])
        lo, hi = spans.get(u, (pipe, pipe))
        spans[u] = (min(lo, pipe), max(hi, pipe))
        tbs.setdefault(u, set()).add((r, int(p["tb"][i])))
    for u, s in tbs.items():
        assert len(s) == 1, "an allocation unit spans two TBs"
    by_tb = {}
    for u, s in tbs.items():
        by_tb.setdefault(next(iter(s)), []).append(spans[u])
    for key, lst in by_tb.items():
        lst.sort()
        for (a0, a1), (b0, b1) in zip(lst, lst[1:]):
            assert a1 < b0, f"TB {key} holds two units active at once"


@pytest.mark.parametrize("make", [lambda: G.hm_allreduce(4, 8), lambda: G.ring_allreduce(8),
                                  lambda: G.hm_allgather(4, 4)])
@pytest.mark.parametrize("scheduler", ["hpds", "rr"])
def test_examples_state_not_worse_than_connection(make, scheduler):
    alg = make()
    s = build_program(alg, scheduler=scheduler).record()
    c = build_program(alg, scheduler=scheduler, tb_alloc="connection").record()
    assert s["tbs_state_based"] == c["tbs_state_based"] <= s["tbs_connection_based"] == c["tbs_connection_based"]


def test_state_based_shares_tbs_when_spans_are_disjoint():
    # ring AllGather with one step per sub-pipeline: rank r's send and receive ends are each active
    # in every sub-pipeline, so nothing to share; but with a hand-made schedule where the first
    # half of the transfers runs before the second, connections used only in one half share a TB.
    alg = G.direct_allgather(4)
    dag = build_dag(alg)
    sched = step_schedule(alg)
    low = lower(alg, dag, sched)
    ir_s = allocate(low, "state")
    ir_c = allocate(low, "connection")
    assert ir_s.allocation.tbs_state_based <= ir_c.allocation.tbs_connection_based
    if alg.nsteps > 1:
        assert ir_s.allocation.tbs_state_based < ir_c.allocation.tbs_connection_based


def test_connection_mode_ir_is_valid():
    ir = build_program(G.hm_allreduce(2, 4), tb_alloc="connection")
    assert ir.allocation.tb_alloc == "connection"
    assert int(ir.ntbs.sum()) == ir.allocation.tbs_connection_based


def test_unknown_mode_rejected():
    alg = G.ring_allgather(3)
    dag = build_dag(alg)
    with pytest.raises(ValueError):
        allocate(lower(alg, dag, step_schedule(alg)), "magic")
    with pytest.raises(ValueError):
        build_from_schedule(alg, dag, step_schedule(alg), tb_alloc="magic")


# ------------------------------------------------------------------ sharing on HM, and its cost
def test_hm_allreduce_4x8_has_no_disjoint_spans_under_hpds():
    """Why state-based equals connection-based on HM AllReduce: HPDS packs every sub-pipeline with
    one task per link, so the 8 uses of each intra-node link fill all 8 sub-pipelines and the two
    ring connections are active from sub-pipeline 0 too; every connection end of a rank is active in
    sub-pipeline 0 and interval partitioning cannot share. 16 TBs per rank is also ResCCL Table 3's
    count for its expert AllReduce on Topo4 (4 x 8 GPUs)."""
    alg = G.hm_allreduce(4, 8)
    dag = build_dag(alg)
    from hccc.compiler.passes.build import schedule_algorithm
    low = lower(alg, dag, schedule_algorithm(alg, dag, "hpds"), fuse=False)
    unit, urank, ustart, uend = connection_units(low)
    assert low.npipelines == 8
    assert (ustart == 0).all()                       # every end active in sub-pipeline 0
    ir = allocate(low, "state")
    assert ir.allocation.tbs_state_based == ir.allocation.tbs_connection_based == 32 * 16


def _mesh(n: int):
    from hccc.compiler.cluster.topo_parser import parse_topology
    links = ", ".join(f"(({u},{v}) -> (25,1))" for u in range(n) for v in range(n) if u != v)
    return parse_topology(f"define nodenum = 1\ndefine node1 = {n}\ndefine bandwidth = {{direct => [{links}]}}\n",
                          "mesh.topo")


#: the allocation choice is checked under the link model (no per-block limit): the sharing costs
#: quoted below are link-model numbers
BLOCK = None


def _state_vs_connection(alg, scheduler: str, nbytes: int):
    from hccc.runtime.simulator import build_for_execution, simulate
    topo = _mesh(alg.header.nranks)
    out = []
    for mode in ("state", "connection"):
        ir = build_for_execution(alg, "task", scheduler=scheduler, tb_alloc=mode, chunk_bytes=1 << 16)
        out.append((int(ir.ntbs.sum()), simulate(ir, topo, nbytes, slice_bytes="auto", block_gbps=BLOCK).time_s))
    return out


def test_state_based_sharing_that_is_free():
    """A random 5-rank ReduceScatter: interval partitioning alone would pack its units into 24 TBs
    (connection-based: 32); only one of those pairings cannot delay its later unit, so state-based
    allocation keeps that one (31 TBs) and costs no simulated time at 16 MB on a mesh."""
    alg = random_program("reducescatter", 5, 5, 1)
    (ts, t_s), (tc, t_c) = _state_vs_connection(alg, "hpds", 16 << 20)
    assert (ts, tc) == (31, 32) and t_s <= 1.02 * t_c
    low_units = connection_units(_lowered(alg))
    assert sum(max_overlap(low_units[2][low_units[1] == r], low_units[3][low_units[1] == r])
               for r in range(5)) == 24


def _lowered(alg):
    from hccc.compiler.passes.build import schedule_algorithm
    dag = build_dag(alg)
    return lower(alg, dag, schedule_algorithm(alg, dag, "hpds"), fuse=False)


@pytest.mark.parametrize("coll,n,seed", [("reducescatter", 4, 13), ("allreduce", 6, 38)])
def test_sharing_that_could_cost_time_is_refused(coll, n, seed):
    """Random programs where plain interval partitioning shares TBs (16 vs 18, 47 vs 56) at a cost
    of 27 % of simulated time; state-based allocation must stay within 2 % of connection-based."""
    (ts, t_s), (tc, t_c) = _state_vs_connection(random_program(coll, n, seed, 1), "hpds", 1 << 20)
    assert ts <= tc
    assert t_s <= 1.02 * t_c


def _chosen(alg, scheduler: str, nbytes: int):
    """(TBs, simulated time) of the allocation the tool keeps on the mesh for ``nbytes``."""
    from hccc.runtime.simulator import build_for_execution, simulate
    topo = _mesh(alg.header.nranks)
    ir = build_for_execution(alg, "task", scheduler=scheduler, tb_alloc="state", chunk_bytes=1 << 16,
                             topology=topo, sizes=[nbytes], block_gbps=BLOCK)
    return ir, int(ir.ntbs.sum()), simulate(ir, topo, nbytes, slice_bytes="auto", block_gbps=BLOCK).time_s


@given(st.one_of(valid_programs(max_ranks=6), algorithms(max_ranks=6)), st.sampled_from(["hpds", "rr"]))
@settings(max_examples=examples(40), deadline=None)
def test_state_based_never_costs_time(alg, scheduler):
    """State-based allocation never uses more TBs than connection-based. Sharing a TB can still
    delay the later unit by a little (a random 4-rank ReduceScatter: 2-3 %, below), so where it
    shares anything the tool simulates both allocations and keeps the faster: on the cluster it
    was given, what it keeps is never slower than connection-based, and never uses more TBs."""
    if not alg.ntransfers:
        return
    (ts, t_s), (tc, t_c) = _state_vs_connection(alg, scheduler, 1 << 20)
    assert ts <= tc
    ir, tk, t_k = _chosen(alg, scheduler, 1 << 20)
    assert tk <= tc and t_k <= t_c * (1 + 1e-12)
    step_ordered = t_s if tk == ts else t_c
    if ir.stats.get("phase_order_kept") == "key":   # the schedule's order, kept where strictly faster
        assert t_k < step_ordered
    else:
        assert t_k == step_ordered
    assert ir.allocation.tb_alloc == "state"


@pytest.mark.parametrize("coll,n,seed", [("allreduce", 4, 28)])
def test_sharing_that_costs_time_is_undone_by_the_choice(coll, n, seed):
    """A random AllReduce where state-based sharing (21 vs 22 TBs) costs a third of the simulated
    time at 1 MB on a mesh: the tool keeps the connection-based allocation. (Since TBs run their
    primitives in step order, compiler/passes/phase_order.py, the random ReduceScatters of seeds
    32 and 40 no longer lose time by sharing; since the simulator charges the kernels' units, the
    one of seed 80 loses 0.3 % instead of 3.2 %, and none of seeds 0-399 more than 2 %.)"""
    alg = random_program(coll, n, seed, 1)
    (ts, t_s), (tc, t_c) = _state_vs_connection(alg, "hpds", 1 << 20)
    assert ts < tc and t_s > 1.02 * t_c
    ir, tk, t_k = _chosen(alg, "hpds", 1 << 20)
    assert (tk, t_k) == (tc, t_c)
    st = ir.stats
    assert ir.allocation.tb_alloc_kept == "connection" and st["tb_alloc_state_s"] == t_s and st["tb_alloc_connection_s"] == t_c


def test_compile_with_a_cluster_keeps_the_faster_allocation(tmp_path):
    """`hccc ALGO -o OUT --topology T` simulates both allocations where state-based sharing happens
    (a random ReduceScatter: 19 TBs state-based, 20 connection-based) and emits the faster at the
    sizes it weighs, recording both times; without a cluster it keeps the state-based one."""
    from hccc.cli import main
    src, topo = sharing_rs4(tmp_path)
    # fusion off: with the kernels' units charged, --fuse auto keeps the fused program here (2.0
    # against 2.7 ms at the sizes weighed), whose allocation shares nothing
    assert main([str(src), "-o", str(tmp_path / "a"), "--topology", str(topo), "--chunk-size", "64K",
                 "--fuse", "off"]) == 0
    assert main([str(src), "-o", str(tmp_path / "b"), "--chunk-size", "64K", "--fuse", "off"]) == 0
    from hccc.compiler.pipeline import load_program
    with_cluster = load_program(tmp_path / "a" / "rs4.ir.json")
    without = load_program(tmp_path / "b" / "rs4.ir.json")
    st = with_cluster.stats
    kept = "state" if st["tb_alloc_state_s"] <= st["tb_alloc_connection_s"] else "connection"
    assert with_cluster.allocation.tb_alloc_kept == kept and st["tb_alloc_state_s"] != st["tb_alloc_connection_s"]
    assert int(with_cluster.ntbs.sum()) == {"state": 19, "connection": 20}[kept] and int(without.ntbs.sum()) == 19
    assert st["tb_alloc_topology"] and without.allocation.tb_alloc_kept is None


# ------------------------------------------------------------- the compiled sharing kernel
def _csr_of(n, edges):
    es = np.array([a for a, _ in edges], dtype=np.int64)
    ed = np.array([b for _, b in edges], dtype=np.int64)
    o = np.lexsort((ed, es))
    return np.searchsorted(es[o], np.arange(n + 1)).astype(np.int64), ed[o]


dags = st.integers(1, 14).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n)))


@given(dags)
@settings(max_examples=examples(150))
def test_interval_labels_never_reject_a_reachable_pair(g):
    """The kernel's filter (interval_labels, both child orders) against networkx's reachability on
    random graphs: on a DAG every reachable pair passes it; a graph with a cycle is reported as
    such (the kernel then searches every question)."""
    import networkx as nx
    from hccc.compiler.passes.tb_share_kernel import interval_labels
    n, raw = g
    dag_edges = [(min(a, b), max(a, b)) for a, b in raw if a != b]     # forward edges: acyclic
    ptr, adj = _csr_of(n, dag_edges)
    G_ = nx.DiGraph()
    G_.add_nodes_from(range(n))
    G_.add_edges_from(dag_edges)
    labels = [interval_labels(ptr, adj, rev) for rev in (False, True)]
    assert all(ok for _, _, ok in labels)
    for a in range(n):
        for b in nx.descendants(G_, a):
            for post, low, _ in labels:
                assert post[b] <= post[a] and low[a] <= low[b]
    if raw:
        a, b = raw[0]
        cyc = dag_edges + [(b, a)] if a != b else dag_edges + [(a, a)]
        G_.add_edge(*cyc[-1])
        ptr, adj = _csr_of(n, cyc)
        if not nx.is_directed_acyclic_graph(G_):
            assert not any(interval_labels(ptr, adj, rev)[2] for rev in (False, True))


def _oracle_sharing(low):
    """The state-based tracks by their definition (tb_alloc's module docstring), reachability by
    networkx: per rank, sweeping its units by (span start, span end, unit), a unit joins the
    lowest-numbered track whose last unit ended before it starts and whose last primitive its
    first primitive waits for, else opens a track. Waiting is reaching ``first(U)`` from
    ``last(V)`` over primitives whose order key does not exceed ``first(U)``'s (all paths where
    keys never decrease along the wait graph; a fused lowering's graph before its back-off may
    have a cycle, where they can). Returns {(rank, units of one track)}."""
    import networkx as nx
    unit, urank, ustart, uend = connection_units(low)
    g = _wait_graph(low, unit)
    prims: dict[int, list[int]] = {}
    for i in np.flatnonzero(unit >= 0).tolist():
        prims.setdefault(int(unit[i]), []).append(i)
    first = {u: min(ps, key=lambda i: (int(low.key[i]), i)) for u, ps in prims.items()}
    last = {u: max(ps, key=lambda i: (int(low.key[i]), i)) for u, ps in prims.items()}
    key = low.key

    def waits(a, b):
        kb = key[b]
        return nx.has_path(nx.subgraph_view(g, filter_node=lambda y: y == a or key[y] <= kb), a, b)

    out = set()
    for r in sorted(set(urank.tolist())):
        units = sorted(np.flatnonzero(urank == r).tolist(), key=lambda u: (int(ustart[u]), int(uend[u]), u))
        tail, members = [], []
        for u in units:
            for k, v in enumerate(tail):
                if uend[v] < ustart[u] and waits(last[v], first[u]):
                    break
            else:
                k = len(tail)
                tail.append(u)
                members.append([])
            tail[k] = u
            members[k].append(u)
        out |= {(r, frozenset(m)) for m in members}
    return out


def _ir_sharing(ir, low):
    """{(rank, units on one TB)} of a state-based allocation."""
    unit, _, _, _ = connection_units(low)
    tb = _tb_of_low(ir, low)
    groups: dict[tuple, set] = {}
    for i in np.flatnonzero(unit >= 0).tolist():
        groups.setdefault((int(low.cols["rank"][i]), int(tb[i])), set()).add(int(unit[i]))
    return {(r, frozenset(us)) for (r, _), us in groups.items()}


JIT_MODES = ["python", pytest.param("numba", marks=pytest.mark.skipif(
    not __import__("hccc.util.jit", fromlist=["have_numba"]).have_numba(), reason="needs numba"))]


@pytest.mark.parametrize("jit", JIT_MODES)
@pytest.mark.parametrize("coll,n,seed,k", [("reducescatter", 5, 5, 1), ("reducescatter", 4, 32, 1),
                                           ("reducescatter", 4, 40, 1), ("allreduce", 6, 38, 1),
                                           ("allreduce", 6, 7, 3), ("allgather", 7, 3, 2)])
def test_sharing_is_the_definition(coll, n, seed, k, jit, monkeypatch):
    """The tracks of the sharing kernel (tb_share_kernel.share_tracks with its label filter), run
    plain and compiled, are those of the definition on random programs where sharing is decided
    both ways (the first four share some TBs and refuse others)."""
    monkeypatch.setenv("HCCC_JIT", jit)
    low = _lowered(random_program(coll, n, seed, k))
    ir = allocate(low, "state")
    assert _ir_sharing(ir, low) == _oracle_sharing(low)
    assert ir.allocation.tbs_state_based <= ir.allocation.tbs_connection_based


@pytest.mark.parametrize("jit", JIT_MODES)
@given(alg=st.one_of(valid_programs(max_ranks=6), algorithms(max_ranks=6)), fuse=st.booleans())
@settings(max_examples=examples(25), deadline=None)
def test_sharing_is_the_definition_on_random_programs(jit, alg, fuse):
    """As above on generated programs, fused lowerings included (their wait graph may have a cycle
    before fusion's back-off: the kernel then searches without the labels)."""
    from hccc.compiler.passes.build import schedule_algorithm
    if not alg.ntransfers:
        return
    dag = build_dag(alg)
    low = lower(alg, dag, schedule_algorithm(alg, dag, "hpds"), fuse=fuse)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HCCC_JIT", jit)
        ir = allocate(low, "state")
    assert _ir_sharing(ir, low) == _oracle_sharing(low)


@pytest.mark.parametrize("jit", JIT_MODES)
@given(alg=st.one_of(valid_programs(max_ranks=6), algorithms(max_ranks=6)))
@settings(max_examples=examples(15), deadline=None)
def test_sharing_past_its_search_budget_shares_nothing_more(jit, alg):
    """A rank whose sharing searches ran past their budget gives every later unit a thread block
    of its own (spans alone can deadlock): with no budget at all, a rank's units share only where
    the labels or an identical primitive decide without a search, so the tracks are exactly those
    of the definition's sharing minus every pair that needed a search, every rank that asked one is
    counted in ``tbs_search_cut``, and the program passes the deadlock check."""
    from hccc.compiler.ir.check import DeadlockError, check_deadlock
    from hccc.compiler.passes import tb_alloc
    from hccc.compiler.passes.build import schedule_algorithm
    if not alg.ntransfers:
        return
    dag = build_dag(alg)
    low = lower(alg, dag, schedule_algorithm(alg, dag, "hpds"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HCCC_JIT", jit)
        mp.setattr(tb_alloc, "SHARE_SEARCH_FLOOR", 0)
        mp.setattr(tb_alloc, "SHARE_SEARCH_PER_PRIM", 0)
        ir = allocate(low, "state")
    exact = allocate(low, "state")
    unit, urank, _, _ = connection_units(low)
    for r in range(low.nranks):
        units = int(np.count_nonzero(urank == r))
        assert int(exact.ntbs[r]) <= int(ir.ntbs[r]) <= max(units, 1)
    if ir.allocation.tbs_state_based > exact.allocation.tbs_state_based:
        assert ir.allocation.tbs_search_cut
    try:
        check_deadlock(exact)
    except DeadlockError:       # (a random program may deadlock however its units share)
        return
    check_deadlock(ir)


def test_an_allocation_says_whether_its_search_budget_bound(monkeypatch):
    """Within the budget, nothing is said and the tracks are the definition's; with none, the same
    program (its sharing needs searches) keeps more thread blocks and says on how many ranks."""
    from hccc.compiler.passes import tb_alloc
    low = _lowered(random_program("allreduce", 6, 38, 1))
    exact = allocate(low, "state")
    assert exact.allocation.tbs_search_cut is None and _ir_sharing(exact, low) == _oracle_sharing(low)
    monkeypatch.setattr(tb_alloc, "SHARE_SEARCH_FLOOR", 0)
    monkeypatch.setattr(tb_alloc, "SHARE_SEARCH_PER_PRIM", 0)
    cut = allocate(low, "state")
    assert cut.allocation.tbs_state_based > exact.allocation.tbs_state_based
    assert 1 <= cut.allocation.tbs_search_cut <= low.nranks
