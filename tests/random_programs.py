"""Random valid programs, independent of the compiler: per chunk a random reduction tree
(ReduceScatter / AllReduce) and a random broadcast tree (AllGather / AllReduce), with steps chosen so
there are no races (checked with the verifier in test_lower.py); the hypothesis strategy
:func:`algorithms` over them, small generated :data:`EXAMPLES`, a :func:`step_schedule` independent
of HPDS, and :func:`sharing_rs4`, a random ReduceScatter whose thread-block allocation choice
simulates both allocations."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from hccc.compiler.frontend import generators as G
from hccc.compiler.frontend.algorithm import RECV, RRC, Algorithm, Collective, Header
from hccc.compiler.passes.schedule import Schedule


# ------------------------------------------------------------------------------ random programs
def _bcast_rows(rng, n, c, root, t0):
    """Broadcast chunk c from root: every other rank receives once, after its sender holds it."""
    have = {root: t0 - 1}
    rows = []
    for r in rng.permutation([x for x in range(n) if x != root]).tolist():
        holders = sorted(have)
        s = holders[int(rng.integers(len(holders)))]
        t = have[s] + 1 + int(rng.integers(0, 2))
        rows.append((s, r, t, c, RECV))
        have[r] = t
    return rows, max(have.values())


def _sendrecv_rows(rng, n, c, dest, t0):
    """Chunk c from its owner to ``dest`` (SendRecv): a random broadcast tree from the owner, kept
    whole (every other rank keeps a copy in scratch) or cut to its path to ``dest``."""
    rows, _ = _bcast_rows(rng, n, c, c, t0)
    if rng.integers(2):
        return rows
    parent = {d: (s, r) for r in rows for s, d in [r[:2]]}
    path, at = [], dest
    while at != c:
        path.append(parent[at][1])
        at = parent[at][0]
    return path[::-1]


def _reduce_rows(rng, n, c, root, t0):
    """Reduce chunk c onto root over a random tree: a node sends (rrc) after all its children did,
    siblings at distinct steps."""
    order = [root] + rng.permutation([x for x in range(n) if x != root]).tolist()
    parent = {order[i]: order[int(rng.integers(i))] for i in range(1, n)}
    children = {x: [] for x in order}
    for x, p in parent.items():
        children[p].append(x)
    send_t = {}
    ready = {}

    def visit(x):
        for ch in children[x]:
            visit(ch)
        kids = sorted(children[x], key=lambda k: (send_t[k], k))
        last = t0 - 1
        for k in kids:
            send_t[k] = max(send_t[k], last + 1)
            last = send_t[k]
        ready[x] = max([t0] + [send_t[k] + 1 for k in kids])
        if x != root:
            send_t[x] = ready[x] + int(rng.integers(0, 2))

    visit(root)
    rows = [(x, parent[x], send_t[x], c, RRC) for x in parent]
    return rows, ready[root] - 1


def _gather_rows(rng, n, c, root, t0):
    """Chunk c (owned by rank c) walks a random simple path to root: direct, or through up to
    two other ranks (which keep it in scratch), hops at increasing random steps."""
    if c == root:
        return []
    others = [r for r in rng.permutation(n).tolist() if r not in (c, root)]
    path = [c] + others[:int(rng.integers(0, min(2, len(others)) + 1))] + [root]
    rows, t = [], t0
    for a, b in zip(path, path[1:]):
        rows.append((a, b, t, c, RECV))
        t += 1 + int(rng.integers(0, 2))
    return rows


def _scatter_rows(rng, n, c, root, t0):
    """Chunk c (for rank c) walks a random simple path from root: direct, or through up to two
    other ranks (which keep it in scratch), hops at increasing random steps."""
    if c == root:
        return []
    others = [r for r in rng.permutation(n).tolist() if r not in (c, root)]
    path = [root] + others[:int(rng.integers(0, min(2, len(others)) + 1))] + [c]
    rows, t = [], t0
    for a, b in zip(path, path[1:]):
        rows.append((a, b, t, c, RECV))
        t += 1 + int(rng.integers(0, 2))
    return rows


def _alltoall_rows(rng, n):
    """Every block (i -> j) walks a random simple path from i to j (direct, or through up to two
    other ranks, which keep it in scratch), hops at increasing random steps; some blocks also
    leave a copy behind on a rank off the path (transit copies the postcondition ignores)."""
    rows = []
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            c = i * n + j
            others = [r for r in rng.permutation(n).tolist() if r not in (i, j)]
            path = [i] + others[:int(rng.integers(0, min(2, len(others)) + 1))] + [j]
            t = int(rng.integers(0, 3))
            for a, b in zip(path, path[1:]):
                rows.append((a, b, t, c, RECV))
                t += 1 + int(rng.integers(0, 2))
            extra = [r for r in range(n) if r not in path]
            if extra and rng.integers(0, 3) == 0:
                rows.append((path[int(rng.integers(0, len(path) - 1))], extra[0], t, c, RECV))
    return rows


def random_algorithm(coll: Collective, n: int, seed: int, name: str = "rand") -> Algorithm:
    rng = np.random.default_rng(seed)
    rows = []
    if coll == Collective.ALLTOALL:
        return Algorithm.from_rows(Header(nranks=n, collective=coll, name=name), _alltoall_rows(rng, n))
    top = int(rng.integers(n))   # Broadcast / Reduce / Gather / Scatter root, SendRecv shift
    for c in range(n):
        t0 = int(rng.integers(0, 3))
        if coll == Collective.SENDRECV:
            rows += _sendrecv_rows(rng, n, c, (c + top) % n, t0)
        elif coll == Collective.BROADCAST:
            rows += _bcast_rows(rng, n, c, top, t0)[0]
        elif coll == Collective.REDUCE:
            rows += _reduce_rows(rng, n, c, top, t0)[0]
        elif coll == Collective.ALLGATHER:
            rows += _bcast_rows(rng, n, c, c, t0)[0]
        elif coll == Collective.REDUCESCATTER:
            rows += _reduce_rows(rng, n, c, c, t0)[0]
        elif coll == Collective.GATHER:
            rows += _gather_rows(rng, n, c, top, t0)
        elif coll == Collective.SCATTER:
            rows += _scatter_rows(rng, n, c, top, t0)
        else:
            root = int(rng.integers(n))
            r1, t_end = _reduce_rows(rng, n, c, root, t0)
            r2, _ = _bcast_rows(rng, n, c, root, t_end + 1 + int(rng.integers(0, 2)))
            rows += r1 + r2
    h = Header(nranks=n, collective=coll, name=name, root=top if coll.spec.parameter else 0)
    return Algorithm.from_rows(h, rows)


colls = st.sampled_from(list(Collective))


@st.composite
def algorithms(draw, max_ranks=6):
    coll = draw(colls)
    n = draw(st.integers(1, max_ranks))
    seed = draw(st.integers(0, 2 ** 31))
    alg = random_algorithm(coll, n, seed)
    k = draw(st.sampled_from([1, 1, 2, 3]))
    return G.split_chunks(alg, k) if k > 1 else alg


EXAMPLES = [
    lambda: G.ring_allgather(4), lambda: G.ring_reducescatter(5), lambda: G.ring_allreduce(4),
    lambda: G.direct_allgather(3), lambda: G.direct_reducescatter(4), lambda: G.direct_allreduce(3),
    lambda: G.recursive_doubling_allgather(8), lambda: G.hm_allreduce(2, 4),
    lambda: G.hm_allreduce(3, 2), lambda: G.hm_allgather(3, 2), lambda: G.hm_reducescatter(2, 3),
    lambda: G.hm_allreduce(4, 8),
]


def step_schedule(alg: Algorithm) -> Schedule:
    """A stand-in schedule independent of HPDS: one sub-pipeline per step, tasks in step order."""
    steps, inv = np.unique(alg.step, return_inverse=True)
    order = np.argsort(alg.step, kind="stable").astype(np.int64)
    return Schedule(subpipeline=inv.astype(np.int32), order=order, scheduler="step")


def random_program(coll: str, n: int, seed: int, k: int) -> Algorithm:
    """:func:`random_algorithm` of the collective named ``coll``, its chunks split in ``k``."""
    alg = random_algorithm(Collective.parse(coll), n, seed)
    return G.split_chunks(alg, k) if k > 1 else alg


def sharing_rs4(tmp_path):
    """A random 4-rank ReduceScatter whose state-based allocation shares TBs (so the allocation
    choice simulates both allocations), written as ``rs4.rccl``, and a 4-GPU mesh ``mesh.topo`` for
    it; returns both paths as strings."""
    alg = random_program("reducescatter", 4, 80, 1)
    lines = ['def ResCCLAlgo(nRanks=4, OpType="Reducescatter", AlgoName="rs4"):']
    lines += [f"    transfer({s}, {d}, {t}, {c}, {'rrc' if o else 'recv'})"
              for s, d, t, c, o in zip(alg.src.tolist(), alg.dst.tolist(), alg.step.tolist(),
                                       alg.chunk.tolist(), alg.op.tolist())]
    src = tmp_path / "rs4.rccl"
    src.write_text("\n".join(lines) + "\n")
    links = ", ".join(f"(({u},{v}) -> (25,1))" for u in range(4) for v in range(4) if u != v)
    topo = tmp_path / "mesh.topo"
    topo.write_text(f"define nodenum = 1\ndefine node1 = 4\ndefine bandwidth = {{direct => [{links}]}}\n")
    return str(src), str(topo)
