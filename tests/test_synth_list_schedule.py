"""The list scheduler (compiler/synth/compose.py ``_list_schedule``, compiled and plain) gives every
transfer the step its specification says, computed here the plain way: step after step, every
transfer not yet placed whose sender holds its chunk at the step's start is tried in priority
order and placed where its pair, each group of its pair and (one send of a chunk per sender and
step, where asked) its chunk have room; what was received counts from the next step."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from conftest import examples

from hccc.compiler.synth import compose


# ---------------------------------------------------------------- the oracle: the specification, step by step
def _first_fit_steps(has, tu, tv, tk, tp, cap, pg_ptr, pg_idx, gcap, fanout_one, max_steps):
    """The step of each transfer (index order is priority order; -1: never placed), as the
    module docstring says, with Python lists, sets and dictionaries only."""
    holds = {(int(u), int(k)) for u, k in zip(*np.nonzero(has))}
    tu, tv, tk, tp = tu.tolist(), tv.tolist(), tk.tolist(), tp.tolist()
    groups_of = [pg_idx[pg_ptr[p]:pg_ptr[p + 1]].tolist() for p in range(len(cap))]
    step = [-1] * len(tu)
    t = 0
    while t < max_steps and -1 in step:
        on_pair, on_group, sent, placed = {}, {}, set(), []
        for i in range(len(tu)):
            if step[i] >= 0 or (tu[i], tk[i]) not in holds:
                continue
            p = tp[i]
            if on_pair.get(p, 0) >= cap[p] or any(on_group.get(g, 0) >= gcap[g] for g in groups_of[p]):
                continue
            if fanout_one and (tu[i], tk[i]) in sent:
                continue
            on_pair[p] = on_pair.get(p, 0) + 1
            for g in groups_of[p]:
                on_group[g] = on_group.get(g, 0) + 1
            sent.add((tu[i], tk[i]))
            step[i] = t
            placed.append(i)
        if not placed:
            break
        holds.update((tv[i], tk[i]) for i in placed)
        t += 1
    return np.asarray(step, np.int64)


def _args(draw_or_rng, n, pairs, groups, M, nchunks, fanout_one):
    """A random instance: ``n`` ranks, ``pairs`` random pairs with capacities 1-3, ``groups``
    groups of random pairs with capacities 0-3, ``M`` transfers over the pairs in random priority,
    chunks held at random at first."""
    rng = draw_or_rng
    src = rng.integers(0, n, pairs)
    dst = (src + rng.integers(1, n, pairs)) % n
    cap = rng.integers(1, 4, pairs).astype(np.int64)
    members = [np.flatnonzero(rng.random(groups) < 0.35) for _ in range(pairs)]
    pg_ptr = np.r_[0, np.cumsum([len(m) for m in members])].astype(np.int64)
    pg_idx = np.concatenate(members + [np.zeros(0, np.int64)]).astype(np.int64)
    gcap = rng.integers(0, 4, groups).astype(np.int64)
    tp = rng.integers(0, pairs, M).astype(np.int64)
    tk = rng.integers(0, nchunks, M).astype(np.int64)
    has = (rng.random((n, nchunks)) < 0.3).astype(np.uint8)
    return has, src[tp].astype(np.int64), dst[tp].astype(np.int64), tk, tp, cap, pg_ptr, pg_idx, gcap, \
        bool(fanout_one), M + 1


def _same(args, fn) -> None:
    want = _first_fit_steps(args[0].copy(), *args[1:])
    got = fn(args[0].copy(), *args[1:])
    assert np.array_equal(got, want)


@settings(max_examples=examples(150), deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(2, 7), st.integers(1, 25), st.integers(0, 5), st.integers(1, 80),
       st.integers(1, 6), st.booleans())
def test_the_steps_are_the_specifications(seed, n, pairs, groups, M, nchunks, fanout_one):
    _same(_args(np.random.default_rng(seed), n, pairs, groups, M, nchunks, fanout_one), compose._list_schedule)


def test_compiled_steps_are_the_specifications_on_an_alltoall():
    """A 32-GPU AllToAll's transfers (every hop direct, its NIC groups binding), in their priority
    order, compiled: the step the specification gives every transfer."""
    from hccc.compiler.cluster.topo_parser import parse_topology
    from hccc.compiler.synth import synthesize
    from hccc.compiler.synth.alltoall import alltoall_task
    from hccc.compiler.synth.problem import network_from_topology
    from cluster_texts import many_nodes_text

    topo = parse_topology(many_nodes_text(4), "n4.topo")
    net = network_from_topology(topo)
    r = synthesize(topo, "alltoall", time_limit=0.5).rows
    o = np.lexsort((r[:, 3], r[:, 2]))
    tu, tv, tk = r[o, 0], r[o, 1], r[o, 3]
    task = alltoall_task(net.nranks, 1)
    args = (task.initial(), tu, tv, tk, net.pair_index(tu, tv).astype(np.int64), net.cap.astype(np.int64),
            net.pg_ptr, net.pg_idx.astype(np.int64), net.gcap.astype(np.int64), bool(task.fanout_one), len(tu) + 1)
    _same(args, compose.KERNELS.pick("_list_schedule", 1 << 30))
