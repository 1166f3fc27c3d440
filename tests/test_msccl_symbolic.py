"""The symbolic proof behind MSCCL import (compiler/ir/symbolic.py), checked against independent oracles:
the numpy reference executor, brute-force reachability and a brute-force run of the deadlock model."""
from __future__ import annotations

import copy
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.interop.msccl_format import SUPPORTED_COLLECTIVES
from hccc.compiler.passes.build import build_program
from hccc.compiler.ir.check import IRFormatError, check_deadlock, check_fifo_order, check_structure, match_connections
from hccc.compiler.interop.msccl_export import export_xml
from hccc.compiler.interop.msccl_import import import_xml_text
from hccc.compiler.ir.symbolic import (ProofError, _tb_components, check_deadlock_buffered, happens_before, prim_order,
                                       prove)
from hccc.compiler.pipeline import load_program
from hccc.compiler.ir.extents import check_extents
from hccc.compiler.ir.levels import NARROW_LEVEL
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.runtime.reference import execute, expected, make_inputs
from hccc.testing import valid_programs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.rccl"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_compiled_examples_are_proven_in_both_modes(path):
    ir = load_program(path)
    prove(ir, False)
    prove(ir, True)


@given(valid_programs(max_ranks=6), st.sampled_from(["state", "connection"]))
@settings(max_examples=40)
def test_compiled_random_programs_are_proven(alg, tb_alloc):
    ir = build_program(alg, tb_alloc=tb_alloc)
    prove(ir, False)
    prove(ir, True)


def _numeric_ok(ir, inplace, seeds=(0, 1, 2)):
    for s in seeds:
        inp = make_inputs(ir.collective, ir.nranks, 3 * ir.nchunks, nchunks=ir.nchunks, seed=s,
                          low=-10 ** 5, high=10 ** 5)
        got = execute(ir, inp, inplace=inplace, seed=s)
        want = expected(ir.collective, inp, nchunks=ir.nchunks)
        if not all(np.array_equal(a, b) for a, b in zip(got, want)):
            return False
    return True


@st.composite
def mutants(draw):
    alg = draw(valid_programs(SUPPORTED_COLLECTIVES, max_ranks=5))
    ir = build_program(alg, tb_alloc=draw(st.sampled_from(["state", "connection"])))
    m = copy.deepcopy(ir)
    p = m.prims
    kind = draw(st.sampled_from(["dst", "src", "dep", "op"]))
    if kind == "dep" and len(m.dep_prim):
        j = draw(st.integers(0, len(m.dep_prim) - 1))
        m.dep_prim = np.delete(m.dep_prim, j)
        m.dep_on = np.delete(m.dep_on, j)
    elif kind == "op":
        cand = np.flatnonzero(np.isin(p["op"], [Op.RECV, Op.RECV_REDUCE_COPY]))
        if len(cand):
            i = int(cand[draw(st.integers(0, len(cand) - 1))])
            if p["op"][i] == Op.RECV:
                p["op"][i] = Op.RECV_REDUCE_COPY
                p["src_buf"][i], p["src_off"][i] = p["dst_buf"][i], p["dst_off"][i]
            else:
                p["op"][i] = Op.RECV
                p["src_buf"][i], p["src_off"][i] = Buf.NONE, 0
    else:
        col = "dst" if kind == "dst" else "src"
        used = p[f"{col}_buf"] != Buf.NONE
        cand = np.flatnonzero(used)
        if len(cand):
            i = int(cand[draw(st.integers(0, len(cand) - 1))])
            size = {Buf.INPUT: m.in_chunks, Buf.OUTPUT: m.out_chunks, Buf.SCRATCH: m.scratch_chunks}[int(p[f"{col}_buf"][i])]
            p[f"{col}_off"][i] = draw(st.integers(0, max(0, size - int(p["count"][i]))))
    return m, draw(st.booleans())


@given(mutants())
@settings(max_examples=examples(100))     # the thorough profile: ten times as many
def test_proof_agrees_with_the_reference_executor(case):
    """Proven => every run computes the collective; a value error => some run does not."""
    ir, inplace = case
    try:
        check_structure(ir)
        check_fifo_order(ir)
        check_deadlock(ir)       # the reference executor needs hccc's own (task-level) order
        check_extents(ir)        # and chunks of one size wherever a step moves data
    except IRFormatError:
        return
    try:
        prove(ir, inplace)
    except ProofError as e:
        if e.kind == "value":
            assert not _numeric_ok(ir, inplace), f"proof says wrong but the runs agree: {e}"
        return
    assert _numeric_ok(ir, inplace)


def _assert_happens_before_is_reachability(ir, seed, budget_cols, same_rank_only=True, narrow=NARROW_LEVEL):
    n = ir.nprims
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    p = ir.prims
    for i in range(n - 1):
        if p["rank"][i] == p["rank"][i + 1] and p["tb"][i] == p["tb"][i + 1]:
            g.add_edge(i, i + 1)
    g.add_edges_from(zip(ir.dep_on.tolist(), ir.dep_prim.tolist()))
    s, r = match_connections(ir)
    g.add_edges_from(zip(s.tolist(), r.tolist()))
    rng = np.random.default_rng(seed)
    pairs = [(a, b) for a in range(n) for b in range(n)
             if a != b and (not same_rank_only or p["rank"][a] == p["rank"][b])]
    if not pairs:
        return
    pick = rng.choice(len(pairs), size=min(200, len(pairs)), replace=False)
    qa = np.array([pairs[k][0] for k in pick])
    qb = np.array([pairs[k][1] for k in pick])
    # a tiny memory budget forces the column-block path; ``narrow`` mixes numpy's wide levels with
    # the per-primitive narrow ones (0: every level in numpy)
    got = happens_before(ir, qa, qb, budget=4 * n * budget_cols, narrow=narrow)
    want = np.array([nx.has_path(g, int(a), int(b)) for a, b in zip(qa, qb)])
    assert np.array_equal(got, want)


@given(valid_programs(SUPPORTED_COLLECTIVES, max_ranks=5), st.integers(0, 2 ** 31), st.integers(1, 64),
       st.sampled_from([0, 2, 4, NARROW_LEVEL]))
@settings(max_examples=40)
def test_happens_before_is_reachability(alg, seed, budget_cols, narrow):
    _assert_happens_before_is_reachability(build_program(alg), seed, budget_cols, narrow=narrow)


@given(valid_programs(SUPPORTED_COLLECTIVES, max_ranks=4), st.integers(2, 3), st.integers(0, 2 ** 31),
       st.integers(1, 8), st.sampled_from([0, 3, NARROW_LEVEL]))
@settings(max_examples=15)
def test_happens_before_across_independent_instances(alg, instances, seed, budget_cols, narrow):
    """MSCCL instances are disjoint components of the thread-block graph: their clock columns share
    storage, and a query between two components is never ordered."""
    ir = import_xml_text(export_xml(build_program(alg), instances=instances))
    _assert_happens_before_is_reachability(ir, seed, budget_cols, same_rank_only=False, narrow=narrow)


@given(st.integers(1, 40).flatmap(lambda t: st.tuples(
    st.just(t), st.lists(st.tuples(st.integers(0, t - 1), st.integers(0, t - 1)), max_size=60))))
def test_tb_components_are_networkx_components(case):
    T, edges = case
    lab = _tb_components(T, np.array([a for a, _ in edges], np.int64), np.array([b for _, b in edges], np.int64))
    g = nx.Graph()
    g.add_nodes_from(range(T))
    g.add_edges_from(edges)
    for comp in nx.connected_components(g):
        assert set(lab[sorted(comp)].tolist()) == {min(comp)}


def _stuck(ir, capacity):
    """Brute force: run the model (program order, dependencies, FIFO matching, capacity)."""
    p = ir.prims
    n = ir.nprims
    s, r = match_connections(ir)
    sender = np.full(n, -1, np.int64)
    sender[r] = s
    conn = {}
    for i in range(n):
        if Op(int(p["op"][i])).sends:
            conn[i] = (int(p["rank"][i]), int(p["send_peer"][i]), int(p["channel"][i]))
    deps = {}
    for a, b in zip(ir.dep_prim.tolist(), ir.dep_on.tolist()):
        deps.setdefault(a, []).append(b)
    done = np.zeros(n, bool)
    inflight = {}
    tbs = {}
    for i in range(n):
        tbs.setdefault((int(p["rank"][i]), int(p["tb"][i])), []).append(i)
    pc = {k: 0 for k in tbs}
    progress = True
    while progress:
        progress = False
        for k, lst in tbs.items():
            while pc[k] < len(lst):
                i = lst[pc[k]]
                o = Op(int(p["op"][i]))
                if any(not done[d] for d in deps.get(i, [])):
                    break
                if o.receives and not done[sender[i]]:
                    break
                if o.sends and capacity is not None and inflight.get(conn[i], 0) >= capacity:
                    break
                if o.receives:
                    c = conn[int(sender[i])]
                    inflight[c] -= 1
                if o.sends:
                    inflight[conn[i]] = inflight.get(conn[i], 0) + 1
                done[i] = True
                pc[k] += 1
                progress = True
    return not done.all()


@st.composite
def shuffled_programs(draw):
    """Valid programs whose thread blocks run their primitives in a random order (may deadlock)."""
    ir = build_program(draw(valid_programs(SUPPORTED_COLLECTIVES, max_ranks=5)))
    m = copy.deepcopy(ir)
    p = m.prims
    keys = p["rank"].astype(np.int64) * (1 << 20) + p["tb"]
    for k in np.unique(keys):
        idx = np.flatnonzero(keys == k)
        perm = draw(st.permutations(list(range(len(idx)))))
        p["seq"][idx] = np.asarray(perm, np.int32)
    m.sort_canonical()
    return m


@given(shuffled_programs(), st.sampled_from([None, 1, 2, 3]))
@settings(max_examples=examples(80))     # the thorough profile: ten times as many
def test_buffered_deadlock_check_matches_brute_force(ir, capacity):
    try:
        check_structure(ir)
    except IRFormatError:
        return
    stuck = _stuck(ir, capacity)
    try:
        check_deadlock_buffered(ir, capacity)
        ok = True
    except ProofError as e:
        assert e.kind == "deadlock" and e.prims
        ok = False
    assert ok == (not stuck)
    if capacity is None:
        try:
            order = prim_order(ir)
            assert not stuck and sorted(order.tolist()) == list(range(ir.nprims))
        except ProofError:
            assert stuck


def test_ring_needs_two_buffered_messages():
    """One TB per rank around a ring (s, rrs, ..., r): fine with two messages in flight, not one."""
    from hccc.compiler.interop.msccl_xml import import_xml
    ir = import_xml(ROOT / "examples" / "msccl" / "allreduce_ring_4.xml")
    for cap in (1, 2, 3):
        stuck = _stuck(ir, cap)
        assert stuck == (cap == 1)
        if stuck:
            with pytest.raises(ProofError, match="deadlock"):
                check_deadlock_buffered(ir, cap)
        else:
            check_deadlock_buffered(ir, cap)


@pytest.mark.parametrize("make", ["ring_broadcast", "ring_reduce"])
def test_rooted_programs_are_proven_for_their_root_only(make):
    """A Broadcast / Reduce IR proves for the root it was built for and fails for any other."""
    import hccc.compiler.frontend.generators as G

    ir = build_program(getattr(G, make)(4, root=2, chunks_per_rank=2))
    for inplace in (False, True):
        prove(ir, inplace)
    ir.root = 1
    with pytest.raises(ProofError, match="output chunk 0 must hold chunk 0"):
        prove(ir, False)
