"""Verification of a candidate schedule against the model (HeteCCL Eqs. 2-6, 8): counterexamples.

:func:`check` replays a :class:`~.problem.Schedule` step by step (numpy, vectorised per step) and
returns every violated constraint as a :class:`Counterexample`, in step order:

* ``no-link``: a transfer between ranks the network does not connect;
* ``causality``: the sender does not hold the chunk at the start of the step (Eq. 2), or the receiver
  already holds it (Eq. 2's second half);
* ``receive-once``: a rank receives a chunk a second time (Eq. 6; also two senders in one step);
* ``link``: more than C(u, v) chunks on a pair in a step (Eq. 4);
* ``group``: more than C_g chunks through a shared group in a step (Eq. 5);
* ``fanout``: a rank forwards one chunk to two peers in one step when the task forbids it (Eq. 8);
* ``postcondition``: a rank lacks a chunk at the end (step = number of steps).

The CEGIS loop takes the earliest step with a counterexample as its checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.synth.problem import Network, Schedule, Task

KINDS = ("no-link", "causality", "receive-once", "link", "group", "fanout", "postcondition")


@dataclass(frozen=True)
class Counterexample:
    kind: str
    step: int
    resource: int            # pair id (link), group id (group), rank (fanout / receive-once), else -1
    transfers: np.ndarray    # indices into the checked schedule
    message: str


def _dup_groups(keys: np.ndarray):
    """(unique key, count, member indices) for keys occurring more than once."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sk)) + 1]
    counts = np.diff(np.r_[starts, sk.size])
    for s, c in zip(starts.tolist(), counts.tolist()):
        if c > 1:
            yield int(sk[s]), c, order[s:s + c]


def check(net: Network, task: Task, sched: Schedule, *, enforce_groups: np.ndarray | None = None,
          max_examples: int = 10_000, stop_after_first_step: bool = False) -> list[Counterexample]:
    """All counterexamples of ``sched`` (see the module docstring); empty when valid.

    ``enforce_groups`` (bool mask) limits the group check to some groups (default: all).
    ``stop_after_first_step`` returns only the counterexamples of the earliest violating step.
    """
    out: list[Counterexample] = []
    nc = task.nchunks
    T = sched.nsteps
    src, dst, step, chunk = sched.src, sched.dst, sched.step, sched.chunk
    pidx = net.pair_index(src, dst) if len(sched) else np.zeros(0, np.int64)
    genf = np.ones(net.ngroups, bool) if enforce_groups is None else np.asarray(enforce_groups, bool)
    has = task.initial().astype(bool)
    got = has.copy()  # received (or held) so far, for receive-once across steps
    order = np.argsort(step, kind="stable")
    bounds = np.r_[0, np.flatnonzero(np.diff(step[order])) + 1, len(order)] if len(order) else np.r_[0]
    for bi in range(len(bounds) - 1):
        idx = order[bounds[bi]:bounds[bi + 1]]
        t = int(step[idx[0]])
        s, d, k, p = src[idx], dst[idx], chunk[idx], pidx[idx]
        bad = p < 0
        for i in np.flatnonzero(bad).tolist():
            out.append(Counterexample("no-link", t, -1, idx[i:i + 1],
                                      f"step {t}: no link {int(s[i])} -> {int(d[i])}"))
        nosrc = ~bad & ~has[s, k]
        for i in np.flatnonzero(nosrc).tolist():
            out.append(Counterexample("causality", t, int(s[i]), idx[i:i + 1],
                                      f"step {t}: rank {int(s[i])} sends chunk {int(k[i])} it does not hold"))
        already = ~bad & got[d, k]
        for i in np.flatnonzero(already).tolist():
            out.append(Counterexample("receive-once", t, int(d[i]), idx[i:i + 1],
                                      f"step {t}: rank {int(d[i])} receives chunk {int(k[i])} again"))
        for key, c, mem in _dup_groups(d.astype(np.int64) * nc + k):
            out.append(Counterexample("receive-once", t, key // nc, idx[mem],
                                      f"step {t}: rank {key // nc} receives chunk {key % nc} from {c} senders"))
        good = ~bad
        if good.any():
            pc = np.bincount(p[good], minlength=net.npairs)
            for q in np.flatnonzero(pc > net.cap).tolist():
                mem = np.flatnonzero(good & (p == q))
                out.append(Counterexample("link", t, q, idx[mem],
                                          f"step {t}: {int(pc[q])} chunks on link {int(net.psrc[q])} -> "
                                          f"{int(net.pdst[q])} (capacity {int(net.cap[q])})"))
            if net.ngroups:
                pg = p[good]
                cnt = np.diff(net.pg_ptr)[pg]
                rep = np.repeat(np.arange(pg.size), cnt)
                starts = net.pg_ptr[pg]
                offs = np.arange(rep.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
                gids = net.pg_idx[starts[rep] + offs] if rep.size else np.zeros(0, np.int64)
                gc = np.bincount(gids, minlength=net.ngroups)
                over = np.flatnonzero((gc > net.gcap) & genf)
                gidx = np.flatnonzero(good)
                for g in over.tolist():
                    mem = gidx[np.unique(rep[gids == g])]
                    out.append(Counterexample("group", t, g, idx[mem],
                                              f"step {t}: {int(gc[g])} chunks through {net.glabel[g]} "
                                              f"(capacity {int(net.gcap[g])})"))
        if task.fanout_one:
            for key, c, mem in _dup_groups(s.astype(np.int64) * nc + k):
                out.append(Counterexample("fanout", t, key // nc, idx[mem],
                                          f"step {t}: rank {key // nc} forwards chunk {key % nc} to {c} peers"))
        if out and (stop_after_first_step or len(out) >= max_examples):
            return out
        ok = good & ~nosrc
        got[d[~bad], k[~bad]] = True
        has[d[ok], k[ok]] = True
    miss = np.argwhere(~has)
    if miss.size:
        msg = (f"{miss.shape[0]} (rank, chunk) pairs missing at the end, e.g. rank {int(miss[0, 0])} "
               f"chunk {int(miss[0, 1])}")
        out.append(Counterexample("postcondition", T, -1, np.zeros(0, np.int64), msg))
    return out


def earliest_step(cexs: list[Counterexample]) -> int:
    return min(c.step for c in cexs)
