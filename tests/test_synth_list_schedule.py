"""The list scheduler (compiler/synth/compose.py ``_list_schedule``) ends a step's scan early once
every transfer left in it needs a full group; the steps it gives every transfer are the ones the
full scan gives (the scheduler as it was before, kept here as the oracle), compiled and plain."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st

from conftest import examples

from hccc.compiler.synth import compose
from hccc.util.kernel_sort import argsort_stable, sort_range


# ---------------------------------------------------------------- the oracle: every step scans every
# ready transfer (the scheduler before the early end)
def _scan_all(has, tu, tv, tk, tp, cap, pg_ptr, pg_idx, gcap, fanout_one, max_steps):
    """Pack transfers (in priority order) into steps: a transfer runs at the first step at which its
    sender holds the chunk and every capacity it needs is free. Returns the step of each transfer
    (-1 when it never could run)."""
    N, NC = has.shape
    M = tu.shape[0]
    step_of = np.full(M, -1, np.int64)
    # transfers waiting for (u, k): CSR by key
    key = tu * NC + tk
    order = argsort_stable(key)
    skey = key[order]
    ready = np.zeros(M, np.uint8)
    nready = 0
    rlist = np.zeros(M, np.int64)
    for i in range(M):
        if has[tu[i], tk[i]]:
            rlist[nready] = i
            nready += 1
            ready[i] = 1
    P = cap.shape[0]
    G = gcap.shape[0]
    used_p = np.zeros(P, np.int64)
    used_g = np.zeros(max(G, 1), np.int64)
    sent = np.zeros((N, NC), np.uint8) if fanout_one else np.zeros((1, 1), np.uint8)
    done = 0
    t = 0
    acc = np.zeros(M, np.int64)
    nsorted = nready                   # rlist[:nsorted] is in priority order already
    rl = np.zeros(M, np.int64)
    while done < M and t < max_steps:
        # ready transfers in priority order (index order = priority): the ones kept from the last
        # step are in order, the ones released since are sorted and merged in (sorting the whole
        # list each step made a 512-GPU AllToAll's 2,016 steps take 87 s)
        sort_range(rlist, nsorted, nready)
        x, y, z = 0, nsorted, 0
        while x < nsorted or y < nready:
            if y >= nready or (x < nsorted and rlist[x] < rlist[y]):
                rl[z] = rlist[x]
                x += 1
            else:
                rl[z] = rlist[y]
                y += 1
            z += 1
        used_p[:] = 0
        used_g[:] = 0
        if fanout_one:
            sent[:, :] = 0
        nacc = 0
        keep = 0
        for j in range(nready):
            i = rl[j]
            p = tp[i]
            ok = used_p[p] < cap[p]
            if ok:
                for q in range(pg_ptr[p], pg_ptr[p + 1]):
                    if used_g[pg_idx[q]] >= gcap[pg_idx[q]]:
                        ok = False
                        break
            if ok and fanout_one and sent[tu[i], tk[i]]:
                ok = False
            if ok:
                used_p[p] += 1
                for q in range(pg_ptr[p], pg_ptr[p + 1]):
                    used_g[pg_idx[q]] += 1
                if fanout_one:
                    sent[tu[i], tk[i]] = 1
                step_of[i] = t
                acc[nacc] = i
                nacc += 1
            else:
                rl[keep] = i
                keep += 1
        if nacc == 0:
            break
        nready = keep
        for j in range(keep):          # (a loop: a slice assignment costs numba seconds to compile)
            rlist[j] = rl[j]
        nsorted = keep
        # receptions: new holders release their waiting transfers
        for a in range(nacc):
            i = acc[a]
            v = tv[i]
            k = tk[i]
            if has[v, k] == 0:
                has[v, k] = 1
                kk = v * NC + k
                lo = np.searchsorted(skey, kk)
                while lo < M and skey[lo] == kk:
                    w = order[lo]
                    if ready[w] == 0:
                        ready[w] = 1
                        rlist[nready] = w
                        nready += 1
                    lo += 1
        done += nacc
        t += 1
    return step_of


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
    want = _scan_all(args[0].copy(), *args[1:])
    got = fn(args[0].copy(), *args[1:])
    assert np.array_equal(got, want)


@settings(max_examples=examples(150), deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(2, 7), st.integers(1, 25), st.integers(0, 5), st.integers(1, 80),
       st.integers(1, 6), st.booleans())
def test_early_end_gives_the_full_scans_steps(seed, n, pairs, groups, M, nchunks, fanout_one):
    _same(_args(np.random.default_rng(seed), n, pairs, groups, M, nchunks, fanout_one), compose._list_schedule)


def test_compiled_early_end_gives_the_full_scans_steps_on_an_alltoall():
    """A 32-GPU AllToAll's transfers (every hop direct, its NIC groups binding), in their priority
    order, compiled: the same step for every transfer as the full scan."""
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
