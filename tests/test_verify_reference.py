"""The verifier against an independent, sequential, set-based reference model (hypothesis).

The reference replays transfers one step at a time with Python frozensets and dicts (no numpy,
no bitsets) and lists errors in the order documented in hccc.compiler.passes.verify. Each random program
puts transfer i on its own source line (10 + i), so the diagnostics' locations identify the
offending transfers and the comparison covers which transfer each error is about.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import examples
from hccc.compiler.frontend.algorithm import RECV, RRC, Algorithm, Collective, Header, TransferSite
from hccc.util.diagnostics import Location, SourceFile
from hccc.compiler.passes.verify import VerifyError, verify
from hccc.testing import mutations, valid_programs

SRC = SourceFile("rand.rccl", "")
STATIC_ORDER = ["src-out-of-range", "dst-out-of-range", "chunk-out-of-range", "negative-step", "bad-op",
                "self-transfer"]


def reference(coll: Collective, n: int, rows: list[tuple[int, int, int, int, int]], root: int = 0, k: int = 1):
    """Sequential model: returns the sorted list of (phase, step, kind order, transfer, kind).

    ``k`` chunks per rank (chunk ``c`` belongs to rank ``c // k``), ``root`` for Broadcast/Reduce/Gather/Scatter,
    the shift for SendRecv (chunk ``c`` ends at rank ``(c // k + root) % n``);
    Alltoall: ``n*n*k`` chunks, chunk ``c`` goes from rank ``c // (n*k)`` to rank ``(c // k) % n``."""
    errors = []
    live = []
    nc = n * n * k if coll is Collective.ALLTOALL else n * k
    for i, (s, d, t, c, o) in enumerate(rows):
        problems = [not 0 <= s < n, not 0 <= d < n, not 0 <= c < nc, t < 0, o not in (RECV, RRC), s == d]
        if any(problems):
            errors.append((0, 0, 0, i, STATIC_ORDER[problems.index(True)]))
        else:
            live.append(i)
    copy_only = coll in (Collective.ALLGATHER, Collective.BROADCAST, Collective.ALLTOALL, Collective.GATHER,
                         Collective.SCATTER, Collective.SENDRECV)
    if coll is Collective.ALLTOALL:
        state = {(r, c): (frozenset([r]) if r == c // (n * k) else frozenset())
                 for r in range(n) for c in range(nc)}
    elif coll in (Collective.ALLGATHER, Collective.GATHER, Collective.SENDRECV):
        state = {(r, c): (frozenset([r]) if r == c // k else frozenset()) for r in range(n) for c in range(nc)}
    elif coll in (Collective.BROADCAST, Collective.SCATTER):
        state = {(r, c): (frozenset([r]) if r == root else frozenset()) for r in range(n) for c in range(nc)}
    else:
        state = {(r, c): frozenset([r]) for r in range(n) for c in range(nc)}
    by_step = defaultdict(list)
    for i in live:
        by_step[rows[i][2]].append(i)
    for t in sorted(by_step):
        trs = by_step[t]
        writers, readers = defaultdict(list), defaultdict(list)
        for i in trs:
            s, d, _, c, _ = rows[i]
            writers[(d, c)].append(i)
            readers[(s, c)].append(i)
        raced = set()
        for key, ws in writers.items():
            if len(ws) > 1:
                errors.append((1, t, 0, ws[1], "write-write-race"))
                raced.add(key)
            elif key in readers:
                errors.append((1, t, 1, ws[0], "read-write-race"))
                raced.add(key)
        updates = {}
        for i in trs:
            s, d, _, c, o = rows[i]
            if (d, c) in raced or (s, c) in raced:
                continue
            have, mine = state[(s, c)], state[(d, c)]
            if not have:
                errors.append((1, t, 2, i, "undefined-source"))
            elif o == RRC and not mine:
                errors.append((1, t, 3, i, "undefined-target"))
            elif o == RRC and copy_only:
                errors.append((1, t, 4, i, "allgather-reduction"))
            elif o == RRC and have & mine:
                errors.append((1, t, 5, i, "double-count"))
            else:
                updates[(d, c)] = have if o == RECV else have | mine
        state.update(updates)
    if not errors:
        everyone = frozenset(range(n))
        for r in range(n):
            for c in range(nc):
                if coll is Collective.ALLTOALL:
                    ok = (c // k) % n != r or state[(r, c)] == frozenset([c // (n * k)])
                elif coll is Collective.ALLGATHER:
                    ok = state[(r, c)] == frozenset([c // k])
                elif coll is Collective.SENDRECV:
                    ok = (c // k + root) % n != r or state[(r, c)] == frozenset([c // k])
                elif coll is Collective.BROADCAST:
                    ok = state[(r, c)] == frozenset([root])
                elif coll is Collective.REDUCESCATTER:
                    ok = c // k != r or state[(r, c)] == everyone
                elif coll is Collective.REDUCE:
                    ok = r != root or state[(r, c)] == everyone
                elif coll is Collective.GATHER:
                    ok = r != root or state[(r, c)] == frozenset([c // k])
                elif coll is Collective.SCATTER:
                    ok = c // k != r or state[(r, c)] == frozenset([root])
                else:
                    ok = state[(r, c)] == everyone
                if not ok:
                    errors.append((2, 0, 0, r * nc + c, "postcondition"))
    return sorted(errors)


def one_site_per_row(header: Header, rows) -> Algorithm:
    arr = np.asarray(rows, dtype=np.int64).reshape(-1, 5)
    k = len(arr)
    sites = [TransferSite(Location(SRC, 10 + i, 1), ()) for i in range(k)]
    return Algorithm(header, arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy(), arr[:, 3].copy(),
                     arr[:, 4].astype(np.uint8), np.arange(k, dtype=np.int64), sites,
                     [np.zeros((1, 0), dtype=np.int64) for _ in range(k)])


def compare(alg_rows, coll: Collective, n: int, max_errors: int = 20, root: int = 0, k: int = 1) -> None:
    header = Header(n, coll, "rand", location=Location(SRC, 1, 1), root=root, chunks_per_rank=k)
    alg = one_site_per_row(header, alg_rows)
    ref = reference(coll, n, [tuple(r) for r in alg_rows], root, k)
    try:
        verify(alg, max_errors=max_errors)
    except VerifyError as err:
        assert ref, "verifier rejects a program the reference accepts"
        assert err.first_kind == ref[0][4]
        assert err.total == len(ref)
        kinds = [k for k in err.kinds if k != "postcondition-summary"]
        assert kinds == [e[4] for e in ref[:len(kinds)]]
        # transfer errors are located at the transfer the reference names
        counted = [d for d, k in zip(err.diagnostics, err.kinds) if k != "postcondition-summary"]
        for diag, kind, e in zip(counted, kinds, ref):
            if kind.startswith("postcondition"):
                nc = n * n * k if coll is Collective.ALLTOALL else n * k
                r, c = divmod(e[3], nc)
                assert diag.message.startswith(f"rank {r} does not hold chunk {c} ")
                moves = [(row[2], i) for i, row in enumerate(alg_rows) if row[3] == c]
                if coll is Collective.ALLTOALL and moves:
                    # located at the block's last transfer
                    assert diag.location.line == 10 + max(moves)[1]
                else:
                    assert diag.location.line == 1
            else:
                assert diag.location.line == 10 + e[3]
        listed = len(kinds)
        assert err.more == (0 if ref[0][4] == "postcondition" else len(ref) - listed)
        return
    assert not ref, f"verifier accepts a program the reference rejects: {ref[:3]}"


@st.composite
def random_programs(draw):
    """Arbitrary small programs: mostly in range, sometimes not; few steps so races happen."""
    n = draw(st.integers(1, 5))
    coll = draw(st.sampled_from(list(Collective)))
    k = draw(st.sampled_from([1, 1, 2, 3]))
    root = draw(st.integers(0, n - 1)) if coll.spec.parameter else 0   # a root, SendRecv's shift
    oob = draw(st.booleans())
    lo, hi = (-1, n) if oob else (0, n - 1)
    nc = n * n * k if coll is Collective.ALLTOALL else n * k
    row = st.tuples(st.integers(lo, hi), st.integers(lo, hi), st.integers(-1 if oob else 0, 4),
                    st.integers(lo, nc if oob else nc - 1),
                    st.sampled_from([RECV, RRC, RECV, RRC] + ([3] if oob else [])))
    rows = draw(st.lists(row, max_size=14))
    return coll, n, rows, root, k


# the thorough profile runs ten times as many
@settings(max_examples=examples(250), deadline=None)
@given(random_programs())
def test_matches_reference_on_random_programs(prog):
    coll, n, rows, root, k = prog
    compare(rows, coll, n, root=root, k=k)


@settings(max_examples=60, deadline=None)
@given(random_programs(), st.integers(1, 4))
def test_matches_reference_with_small_max_errors(prog, max_errors):
    coll, n, rows, root, k = prog
    compare(rows, coll, n, max_errors, root, k)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_programs(max_ranks=6))
def test_matches_reference_on_valid_programs(alg):
    h = alg.header
    assert reference(h.collective, h.nranks, list(alg.rows()), h.root, h.chunks_per_rank) == []
    compare(list(alg.rows()), h.collective, h.nranks, root=h.root, k=h.chunks_per_rank)


@settings(max_examples=examples(130), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_matches_reference_on_mutants(data):
    alg = data.draw(valid_programs(max_ranks=6, min_ranks=2))
    _, mutant = data.draw(mutations(alg))
    h = alg.header
    compare(list(mutant.rows()), h.collective, h.nranks, root=h.root, k=h.chunks_per_rank)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutant_then_noise_matches_reference(data):
    """Mutants with an extra random transfer: later errors, cascades, postconditions."""
    alg = data.draw(valid_programs(max_ranks=5, min_ranks=2))
    n = alg.header.nranks
    rows = list(alg.rows())
    k = data.draw(st.integers(0, 3))
    for _ in range(k):
        pos = data.draw(st.integers(0, len(rows)))
        rows.insert(pos, (data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, n - 1)),
                          data.draw(st.integers(0, max(r[2] for r in rows) + 1)),
                          data.draw(st.integers(0, alg.header.nchunks - 1)),
                          data.draw(st.sampled_from([RECV, RRC]))))
    h = alg.header
    compare(rows, h.collective, n, root=h.root, k=h.chunks_per_rank)
