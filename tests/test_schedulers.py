"""Tests for hccc.compiler.passes.hpds and hccc.compiler.passes.round_robin."""
from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings

from hccc.compiler.frontend.algorithm import RECV
from hccc.compiler.passes.dag import build_dag
from hccc.compiler.passes import hpds_kernel
from hccc.compiler.passes.hpds import hpds
from hccc.compiler.passes.round_robin import round_robin
from hccc.compiler.passes.schedule import Schedule

from dag_programs import (hm_allreduce, make_alg, naive_relation, programs,  # noqa: E402
                          ring_allgather)

SCHEDULERS = {"hpds": hpds, "rr": round_robin}
SLICE = 1.0 / 16   # the clock's pipelining lag (hccc.compiler.passes.hpds._SLICE)


# ------------------------------------------------------------------ oracle: Algorithm 1, literally
def reference_schedule(alg, policy: str, i7: bool | None = None) -> tuple[list[int], list[int]]:
    """A slow, literal reading of ResCCL Algorithm 1 (and of the RR baseline), plus hccc's rule
    I7 for HPDS (see hccc.compiler.passes.hpds): a ready task does not take a link while another ready
    task of that link has an earlier estimated ready time on the unit-cost clock.

    Readiness comes from the all-pairs dependency relation (not from the DAG under test); every
    visit rescans the chunk's whole task list; the queue is re-sorted on every selection.
    ``i7`` (default: on for HPDS) applies rule I7. Returns (sub-pipeline per row, insertion order
    of rows).
    """
    if i7 is None:
        i7 = policy == "hpds"
    rows = list(alg.rows())
    n = len(rows)
    dep = naive_relation(alg)
    preds = [set(np.flatnonzero(dep[:, t]).tolist()) for t in range(n)]
    chunks = sorted({r[3] for r in rows})
    tasks_of = {c: sorted((t for t in range(n) if rows[t][3] == c), key=lambda t: (rows[t][2], t))
                for c in chunks}
    prio = {c: 0 for c in chunks}
    done: set[int] = set()
    sp_of = [-1] * n
    order: list[int] = []
    # Rule I7 (HPDS only): unit-cost clock; a link goes to the ready task that is ready earliest.
    est_s, est_e = [0.0] * n, [0.0] * n
    link_end: dict[tuple[int, int], float] = {}
    link_of = [(rows[t][0], rows[t][1]) for t in range(n)]

    def ready_time(t):
        return max((est_e[p] for p in preds[t]), default=0.0)

    sp = 0
    while len(done) < n:
        used: set[tuple[int, int]] = set()
        flag = {c: True for c in chunks}
        ptr = 0
        while any(flag.values()):
            if policy == "hpds":
                c = min((c for c in chunks if flag[c]), key=lambda c: (-prio[c], c))
            else:  # circular queue in chunk-id order
                while not flag[chunks[ptr % len(chunks)]]:
                    ptr += 1
                c = chunks[ptr % len(chunks)]
                ptr += 1
            ready = [t for t in tasks_of[c] if t not in done and preds[t] <= done]
            node_list = []
            for t in ready:
                lk = link_of[t]
                if lk in used:
                    continue
                if i7:
                    rivals = [u for u in range(n) if u not in done and preds[u] <= done
                              and link_of[u] == lk]
                    if min(ready_time(u) for u in rivals) < ready_time(t) - 1e-9:
                        continue
                used.add(lk)
                node_list.append(t)
            if not node_list:
                flag[c] = False
            else:
                for t in node_list:
                    sp_of[t] = sp
                    order.append(t)
                    same = [p for p in preds[t] if sp_of[p] == sp]
                    start = max([link_end.get(link_of[t], 0.0)]
                                + [est_s[p] + SLICE for p in same]
                                + [est_e[p] for p in preds[t] if sp_of[p] != sp])
                    end = max([start + 1.0] + [est_e[p] + SLICE for p in preds[t]])
                    est_s[t], est_e[t] = start, end
                    link_end[link_of[t]] = end
                done.update(node_list)
                prio[c] -= 1
        sp += 1
    return sp_of, order


def check_valid(alg, dag, sched: Schedule) -> None:
    n = len(alg)
    assert sched.subpipeline.dtype == np.int32 and sched.order.dtype == np.int64
    assert len(sched.subpipeline) == n
    assert sorted(sched.order.tolist()) == list(range(n))  # every task exactly once
    pos = sched.position()
    sp = sched.subpipeline
    # Never before its producers (all-pairs relation, independent of the DAG under test).
    a, b = np.nonzero(naive_relation(alg)) if n <= 200 else (dag.edge_src, dag.edge_dst)
    assert (pos[a] < pos[b]).all()
    assert (sp[a] <= sp[b]).all()
    # Sub-pipelines are contiguous along the insertion order and numbered from 0.
    assert (np.diff(sp[sched.order]) >= 0).all()
    if n:
        assert sp.min() == 0 and set(np.unique(sp).tolist()) == set(range(sched.nsubpipelines))
    # No two tasks of one sub-pipeline share a link (a pair and channel: a connection).
    pairs = {(int(s), int(x), int(y), int(c)) for s, x, y, c in zip(sp, alg.src, alg.dst, alg.channels)}
    assert len(pairs) == n


# ------------------------------------------------------------------ property tests
@settings(max_examples=120)
@given(programs)
def test_hpds_matches_reference(alg):
    dag = build_dag(alg)
    s = hpds(alg, dag)
    check_valid(alg, dag, s)
    sp_ref, order_ref = reference_schedule(alg, "hpds")
    assert s.subpipeline.tolist() == sp_ref
    assert s.order.tolist() == order_ref
    assert s.scheduler == "hpds"


needs_numba = pytest.mark.skipif(not hpds_kernel.HAVE_NUMBA, reason="the compiled HPDS engine needs numba")



@pytest.mark.parametrize("engine", ["python", pytest.param("compiled", marks=[needs_numba, pytest.mark.slow])])
def test_channels_of_a_pair_run_side_by_side(engine):
    # Two chunks over the pair 0->1: on one channel they take two sub-pipelines, on channels of
    # their own (connections and thread blocks of their own) one.
    one = make_alg([(0, 1, 0, 0, RECV, 0), (0, 1, 0, 1, RECV, 0)], 2)
    two = make_alg([(0, 1, 0, 0, RECV, 0), (0, 1, 0, 1, RECV, 1)], 2)
    assert hpds(one, build_dag(one), engine=engine).subpipeline.tolist() == [0, 1]
    s = hpds(two, build_dag(two), engine=engine)
    check_valid(two, build_dag(two), s)
    assert s.subpipeline.tolist() == [0, 0]

@pytest.mark.slow   # compiles the numba kernel (cold: tens of seconds)
@needs_numba
@settings(max_examples=80)
@given(programs)
def test_compiled_hpds_matches_reference(alg):
    # the numba kernel against the literal Algorithm 1 (not against the list scheduler)
    dag = build_dag(alg)
    s = hpds(alg, dag, engine="compiled")
    check_valid(alg, dag, s)
    sp_ref, order_ref = reference_schedule(alg, "hpds")
    assert s.subpipeline.tolist() == sp_ref
    assert s.order.tolist() == order_ref


@pytest.mark.parametrize("engine", ["python", pytest.param("compiled", marks=[needs_numba, pytest.mark.slow])])
def test_hpds_on_hm_allreduce(engine):
    """A program of the examples' size: Algorithm 1's literal schedule at 2 x 4 GPUs, a valid
    schedule (every dependency and link rule held) at 4 x 8."""
    alg = hm_allreduce(2, 4)
    s = hpds(alg, build_dag(alg), engine=engine)
    sp_ref, order_ref = reference_schedule(alg, "hpds")
    assert s.subpipeline.tolist() == sp_ref and s.order.tolist() == order_ref
    alg = hm_allreduce(4, 8)
    dag = build_dag(alg)
    check_valid(alg, dag, hpds(alg, dag, engine=engine))


def test_auto_engine_picks_by_the_work(monkeypatch):
    """HCCC_JIT=numba sends the auto engine to the compiled kernel (here its plain function standing
    in for the compiled one, so nothing compiles), =python to the kernel run plain; both give
    Algorithm 1's literal schedule."""
    calls = []

    def kernel(*args):
        calls.append(len(args[2]))
        return hpds_kernel.hpds_arrays(*args)
    monkeypatch.setattr(hpds_kernel.KERNELS, "compiled", lambda: {"hpds_arrays": kernel})
    monkeypatch.setenv("HCCC_JIT", "numba")
    monkeypatch.setattr("hccc.util.jit.have_numba", lambda: True)
    alg = hm_allreduce(2, 2)
    dag = build_dag(alg)
    s = hpds(alg, dag)
    assert calls == [alg.ntransfers]
    sp_ref, order_ref = reference_schedule(alg, "hpds")
    assert s.subpipeline.tolist() == sp_ref and s.order.tolist() == order_ref
    monkeypatch.undo()
    monkeypatch.setenv("HCCC_JIT", "python")
    calls.clear()
    assert hpds(alg, dag).order.tolist() == order_ref and calls == []


def test_unknown_hpds_engine_is_rejected():
    alg = ring_allgather([0, 1, 2])
    with pytest.raises(ValueError, match="engine"):
        hpds(alg, build_dag(alg), engine="fast")


@settings(max_examples=120)
@given(programs)
def test_round_robin_matches_reference(alg):
    dag = build_dag(alg)
    s = round_robin(alg, dag)
    check_valid(alg, dag, s)
    sp_ref, order_ref = reference_schedule(alg, "rr")
    assert s.subpipeline.tolist() == sp_ref
    assert s.order.tolist() == order_ref
    assert s.scheduler == "rr"


@settings(max_examples=60)
@given(programs)
def test_deterministic_and_link_lower_bound(alg):
    dag = build_dag(alg)
    for f in SCHEDULERS.values():
        s1, s2 = f(alg, dag), f(alg, build_dag(alg))
        assert np.array_equal(s1.subpipeline, s2.subpipeline)
        assert np.array_equal(s1.order, s2.order)
        if len(alg):
            # A link carries at most one task per sub-pipeline.
            _, counts = np.unique(dag.link, return_counts=True)
            assert s1.nsubpipelines >= counts.max()


# ------------------------------------------------------------------ hand-derived shapes
def test_ring_allgather_4_ranks_one_step_per_subpipeline():
    # Chunk c travels c -> c+1 -> c+2 -> c+3; its k-th hop (row 4k + i, i = c + k) uses link
    # (c+k) -> (c+k+1). In sub-pipeline 0 chunks 0..3 each take their first hop on four distinct
    # links; on the second round every chunk's next hop needs the link its neighbour just took,
    # so all are unflagged. Hence sub-pipeline k = the k-th hops of all chunks, chunk 0 first.
    alg = ring_allgather([0, 1, 2, 3])
    dag = build_dag(alg)
    for f in SCHEDULERS.values():
        s = f(alg, dag)
        assert s.nsubpipelines == 3
        assert s.subpipeline.tolist() == [k for k in range(3) for _ in range(4)]
        expected_order = [4 * k + (c + k) % 4 for k in range(3) for c in range(4)]
        assert s.order.tolist() == expected_order


def test_chain_pipelines_inside_one_subpipeline():
    # A single chunk forwarded 0 -> 1 -> 2 -> 3: the successors become ready and join on later
    # visits of the same chunk, so the whole chain is one sub-pipeline.
    alg = make_alg([(0, 1, 0, 0, RECV), (1, 2, 1, 0, RECV), (2, 3, 2, 0, RECV)], 4)
    dag = build_dag(alg)
    for f in SCHEDULERS.values():
        s = f(alg, dag)
        assert s.subpipeline.tolist() == [0, 0, 0]
        assert s.order.tolist() == [0, 1, 2]


def test_priority_favours_under_used_chunks():
    # Chunk 0 sends twice over link 0->1 (rows 0, 1, a WAW chain); chunk 1 once (row 2).
    # Sub-pipeline 0 holds row 0 either way. Then HPDS picks chunk 1 (priority 0 > -1) while
    # round-robin restarts at chunk 0.
    alg = make_alg([(0, 1, 0, 0, RECV), (0, 1, 1, 0, RECV), (0, 1, 0, 1, RECV)], 2)
    dag = build_dag(alg)
    assert hpds(alg, dag).subpipeline.tolist() == [0, 2, 1]
    assert round_robin(alg, dag).subpipeline.tolist() == [0, 1, 2]


def test_empty_algorithm():
    alg = make_alg([], 2)
    dag = build_dag(alg)
    for f in SCHEDULERS.values():
        s = f(alg, dag)
        assert s.nsubpipelines == 0 and len(s.order) == 0


@pytest.mark.parametrize("engine", ["python", pytest.param("compiled", marks=[needs_numba, pytest.mark.slow])])
def test_dag_of_another_algorithm_is_rejected(engine):
    a = ring_allgather([0, 1, 2])
    b = ring_allgather([0, 1, 2, 3])
    with pytest.raises(ValueError):
        hpds(a, build_dag(b), engine=engine)


def test_hm_allreduce_4x8_hpds_not_worse_than_rr():
    alg = hm_allreduce(4, 8)
    dag = build_dag(alg)
    h, r = hpds(alg, dag), round_robin(alg, dag)
    check_valid(alg, dag, h)
    check_valid(alg, dag, r)
    # Every intra-node link carries 4 reduce-scatter and 4 all-gather transfers: 8 is optimal.
    assert h.nsubpipelines <= r.nsubpipelines
    assert h.nsubpipelines == 8
    print(f"HM AllReduce 4x8: HPDS {h.nsubpipelines} sub-pipelines, RR {r.nsubpipelines}")


@pytest.mark.slow
def test_hm_allreduce_1024_gpus_performance():
    alg = hm_allreduce(128, 8)
    assert len(alg) == 2_095_104
    t0 = time.perf_counter()
    dag = build_dag(alg)
    t1 = time.perf_counter()
    h = hpds(alg, dag)
    t2 = time.perf_counter()
    r = round_robin(alg, dag)
    t3 = time.perf_counter()
    print(f"1024 GPUs: dag {t1 - t0:.2f}s hpds {t2 - t1:.2f}s ({h.nsubpipelines} sub-pipelines) "
          f"rr {t3 - t2:.2f}s ({r.nsubpipelines})")
    # Cheap whole-schedule checks (vectorised).
    for s in (h, r):
        pos = s.position()
        assert (pos[dag.edge_src] < pos[dag.edge_dst]).all()
        assert (s.subpipeline[dag.edge_src] <= s.subpipeline[dag.edge_dst]).all()
        key = s.subpipeline.astype(np.int64) * dag.nlinks + dag.link
        assert len(np.unique(key)) == len(key)
    assert h.nsubpipelines <= r.nsubpipelines
    # Times are printed, not asserted: speed is measured by benchmarks/compile_scale.py.


def test_link_goes_to_the_task_ready_earliest():
    # Rule I7. Sub-pipeline 0: chunk 0 takes 3->4 and 1->3, chunk 2 takes 5->6 (its 3->4 task u is
    # parked), chunk 1's 1->3 task p is parked. Sub-pipeline 1: chunk 1 (priority 0) goes first,
    # takes p, and on its next visit its successor t (3->4) is ready, but only once p ends (clock
    # 2), while u has been ready since 0: t waits and u takes 3->4; Algorithm 1 alone would give
    # the link to t and push u to sub-pipeline 2.
    alg = make_alg([(3, 4, 0, 0, RECV), (1, 3, 0, 0, RECV), (1, 3, 0, 1, RECV), (3, 4, 1, 1, RECV),
                    (3, 4, 0, 2, RECV), (5, 6, 0, 2, RECV)], 7)
    dag = build_dag(alg)
    s = hpds(alg, dag)
    check_valid(alg, dag, s)
    assert s.subpipeline.tolist() == [0, 0, 1, 2, 1, 0]
    assert s.subpipeline.tolist() == reference_schedule(alg, "hpds")[0]
    assert reference_schedule(alg, "hpds", i7=False)[0] == [0, 0, 1, 1, 2, 0]
