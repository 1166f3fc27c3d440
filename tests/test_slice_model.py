"""The slice policy's model (compiler/passes/slicing.py): ``auto_slice_bytes`` is the smallest slice
of least modelled time, as an oracle that tries every slice finds it (tests/slice_oracle.py: the
model written out again in exact arithmetic); its result keeps the kernels' invariants; it moves
the way the proofs below say when a constant, a bound or the fill moves (and is not monotone in the
channels, which the 16-byte granules break); ``critical_path`` is the longest path of the graph of
units (one node per primitive and micro-batch) at its samples, and an upper bound between them.

The monotone properties, proved in exact arithmetic (the policy compares its candidates exactly):

* ``T(s) B = CP(m(s)) (c B + part(s))``: the slice depends on ``c`` and ``B`` only through ``c B``.
  For slices ``s2 < s1`` (so ``CP(m(s2)) >= CP(m(s1))``), ``T(s2) - T(s1)`` grows with ``c B``
  by ``CP(m(s2)) - CP(m(s1)) >= 0`` per unit of it: where ``s1`` (the smallest best at ``cB``)
  beats every smaller slice, it still does at any larger ``c B``; so a larger ``c B`` never gives a
  smaller slice.
* The search's bounds ``[lo, hi]``: if both move up, the smallest best slice never moves down (the
  old one stays best among what remains below it); if both move down, never up. A larger share or
  ``MinSliceBytes`` moves both up; a larger ``nMicroBatches`` moves ``hi`` down.
* LL: ``B`` halves (``c B`` halves) and the share halves: never a larger slice than Simple's.
* A fill longer by ``d`` units at every ``m`` adds ``d (c + part(s)/B)`` to ``T(s)``, more for a
  larger slice: never a larger slice.
* Channels: ``part = 16 ceil(s / 16 / K)``; without the ceiling only ``c K B`` would matter (more
  channels, never a smaller slice), but the ceiling is not monotone in ``K`` and neither is the
  slice (:func:`test_more_channels_can_give_a_smaller_slice`).
"""
from __future__ import annotations

from fractions import Fraction
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slice_oracle as oracle
from hccc.compiler.backend import abi
from hccc.compiler.frontend.slice_policy import SlicePolicy
from hccc.compiler.passes import slicing
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.slicing import (CriticalPath, auto_slice_bytes, critical_path, micro_batches, model_seconds,
                                          slice_range)
from hccc.testing import valid_programs

KiB, MiB = 1 << 10, 1 << 20


# ----------------------------------------------------------------------------- strategies
@st.composite
def paths(draw) -> CriticalPath:
    """A chain ``a m + D - 1``, or the upper envelope of a few lines ``A m + B`` sampled as
    :func:`critical_path` samples a program's (powers of two past every breakpoint)."""
    if draw(st.booleans()):
        return CriticalPath.chain(draw(st.integers(1, 16)), draw(st.integers(1, 5000)))
    lines = draw(st.lists(st.tuples(st.integers(1, 12), st.integers(0, 300)), min_size=1, max_size=4))
    top = 1
    while top <= max(b for _, b in lines):
        top *= 2
    ms = [1 << i for i in range(top.bit_length() + 1)]
    return CriticalPath(tuple(ms), tuple(max(a * m + b for a, b in lines) for m in ms), max(a for a, _ in lines))


costs = st.one_of(st.none(), st.tuples(st.floats(1e-8, 1e-5), st.floats(1e9, 1e12)))
policies = st.builds(SlicePolicy, st.sampled_from([1, 1, 2, 7, 64]), st.sampled_from([16, 16, 48, 1024, 4096]))


def _costs(proto: str, given_costs):
    return given_costs or (slicing.unit_seconds(proto), slicing.block_bytes_per_second(proto))


# ----------------------------------------------------------------------------- the oracle
@st.composite
def oracle_calls(draw, max_share: int = 4 * KiB, max_channels: int = 8) -> dict:
    """A call whose search is not trivial: chunks of one to a few hundred shares (and now and
    then a tiny one), costs from c B = 1 byte to 100 KB, mostly hccc's default bounds."""
    es = draw(st.sampled_from([1, 2, 4, 8]))
    share = draw(st.integers(128, max_share))
    nchunks = draw(st.integers(1, 16))
    if draw(st.integers(0, 7)):                      # chunks of 1 to 300 shares
        per_chunk = draw(st.integers(1, 300)) * (share // es) + draw(st.integers(0, share // es - 1))
    else:                                            # now and then a tiny or empty one
        per_chunk = draw(st.integers(0, 64))
    nbytes = es * max(0, nchunks * per_chunk - draw(st.integers(0, nchunks - 1)))
    cost = draw(st.one_of(st.none(), st.tuples(st.floats(1e-9, 1e-6), st.floats(1e9, 1e11))))
    policy = draw(st.one_of(st.just(SlicePolicy()), policies))
    return dict(nbytes=nbytes, nchunks=nchunks, share=share, es=es, k=draw(st.integers(1, max_channels)),
                path=draw(paths()), proto=draw(st.sampled_from(slicing.PROTOS)), policy=policy, cost=cost)


def _check_against_oracle(nbytes, nchunks, share, es, k, path, proto, policy, cost):
    got = auto_slice_bytes(nbytes, nchunks, share, es, path=path, nchannels=k, proto=proto, policy=policy,
                           costs=cost)
    c, b = _costs(proto, cost)
    want, t_best = oracle.best_slice(nbytes, nchunks, share, es, path, k, c, b, policy.micro_batches,
                                     policy.min_slice)
    assert oracle.seconds(got, nbytes, nchunks, es, path, k, c, b) == t_best
    assert got == want                                   # the smallest of the best
    t = model_seconds(got, nbytes, nchunks, es, path=path, nchannels=k, proto=proto, costs=cost)
    assert t == pytest.approx(float(t_best), rel=1e-12)


@given(call=oracle_calls())
@settings(max_examples=60, deadline=None)
def test_the_policy_is_the_oracles_best(call):
    _check_against_oracle(**call)


@pytest.mark.slow
@given(call=oracle_calls(max_share=64 * KiB, max_channels=32))
@settings(max_examples=300, deadline=None)
def test_the_policy_is_the_oracles_best_over_larger_shares(call):
    _check_against_oracle(**call)


# ----------------------------------------------------------------------------- invariants
@given(nbytes=st.integers(0, 1 << 36), nchunks=st.integers(1, 4096), share=st.integers(16, 1 << 24),
       es=st.sampled_from([1, 2, 4, 8, 16]), k=st.integers(1, 64), path=paths(), proto=st.sampled_from(slicing.PROTOS),
       policy=policies)
@settings(max_examples=150, deadline=None)
def test_the_slice_is_aligned_bounded_and_deterministic(nbytes, nchunks, share, es, k, path, proto, policy):
    s = auto_slice_bytes(nbytes, nchunks, share, es, path=path, nchannels=k, proto=proto, policy=policy)
    lo, hi = slice_range(nbytes, nchunks, share, es, policy)
    assert (lo, hi) == oracle.bounds(nbytes, nchunks, share, es, policy.micro_batches, policy.min_slice)
    assert s % 16 == 0 and 16 <= lo <= s <= hi <= share
    assert s == auto_slice_bytes(nbytes, nchunks, share, es, path=path, nchannels=k, proto=proto, policy=policy)


# ----------------------------------------------------------------------------- monotone properties
calls = oracle_calls(max_share=MiB, max_channels=16).map(
    lambda d: {k: v for k, v in d.items() if k not in ("proto", "cost")})


def _slice(call, **kw):
    args = dict(call, **kw)
    return auto_slice_bytes(args["nbytes"], args["nchunks"], args["share"], args["es"], path=args["path"],
                            nchannels=args["k"], policy=args["policy"], proto=args.get("proto", "simple"),
                            costs=args.get("costs"))


@given(call=calls, c=st.floats(1e-8, 1e-5), b=st.floats(1e9, 1e12), shift=st.integers(-8, 8),
       more_c=st.floats(1.0, 100.0), more_b=st.floats(1.0, 100.0))
@settings(max_examples=80, deadline=None)
def test_only_c_times_b_matters_and_more_of_it_never_gives_a_smaller_slice(call, c, b, shift, more_c, more_b):
    s = _slice(call, costs=(c, b))
    scale = 2.0 ** shift                       # exact in floating point: c B unchanged
    assert _slice(call, costs=(c * scale, b / scale)) == s
    assert _slice(call, costs=(c * more_c, b)) >= s
    assert _slice(call, costs=(c, b * more_b)) >= s


@given(call=calls, more_share=st.integers(0, 1 << 20), floor=st.integers(1, 4096), micro=st.integers(1, 4096))
@settings(max_examples=80, deadline=None)
def test_the_bounds_move_the_slice_their_way(call, more_share, floor, micro):
    s = _slice(call)
    pol = call["policy"]
    assert _slice(call, share=call["share"] + more_share) >= s
    higher_floor = SlicePolicy(pol.micro_batches, max(pol.min_slice, 16 * floor))
    assert _slice(call, policy=higher_floor) >= s
    more_micro = SlicePolicy(max(pol.micro_batches, micro), pol.min_slice)
    assert _slice(call, policy=more_micro) <= s


@given(call=calls)
@settings(max_examples=60, deadline=None)
def test_ll_never_takes_a_larger_slice_than_simple(call):
    ll_share = abi.ll_share_bytes(call["share"])
    if ll_share < 16:
        return
    assert _slice(call, share=ll_share, proto="ll") <= _slice(call)


@given(call=calls, more=st.integers(1, 10_000))
@settings(max_examples=60, deadline=None)
def test_a_longer_fill_never_gives_a_larger_slice(call, more):
    p = call["path"]
    longer = CriticalPath(p.samples, tuple(u + more for u in p.units), p.slope)
    assert _slice(call, path=longer) <= _slice(call)


@pytest.mark.usefixtures("design_target_costs")
def test_more_channels_can_give_a_smaller_slice():
    """The granules break monotony in the channels (found by a search): 1,063 one-byte elements in
    one chunk, 576-byte shares, a fill of 12,566 units: 12 channels take 368-byte slices (three
    micro-batches, 32-byte parts), 16 channels 224-byte ones (five, 16-byte parts: at 16 channels a
    368-byte slice's 23 granules give 32-byte parts again)."""
    path = CriticalPath.chain(2, 12567)
    assert auto_slice_bytes(1063, 1, 576, 1, path=path, nchannels=12) == 368
    assert auto_slice_bytes(1063, 1, 576, 1, path=path, nchannels=16) == 224


# ----------------------------------------------------------------------------- examples
@pytest.mark.usefixtures("design_target_costs")
def test_examples():
    # no fill: the fewest micro-batches, the smallest slice giving them
    assert auto_slice_bytes(64 * MiB, 8, MiB, path=CriticalPath.chain(8, 1)) == MiB
    assert auto_slice_bytes(6 * MiB, 8, MiB, path=CriticalPath.chain(8, 1)) == 768 * KiB
    # a chain of 101 primitives over 8 MiB: m = sqrt(100 chunk / (K c B)) with c B = 50 KB (LL:
    # 0.2 us at 50 GB/s of data, 10 KB)
    chain = CriticalPath.chain(1, 101)
    for k, proto, want in ((1, "simple", 129.5), (4, "simple", 64.8), (1, "ll", 289.6)):
        s = auto_slice_bytes(8 * MiB, 1, 8 * MiB, path=chain, nchannels=k, proto=proto)
        assert abs(micro_batches(8 * MiB, 1, s) - want) <= 1.0, (k, proto, s)
    # the program's bounds: at least 64 micro-batches (slices <= 16 KiB), unless below the floor
    assert auto_slice_bytes(MiB, 1, MiB, path=CriticalPath.chain(8, 1), policy=SlicePolicy(64, 16)) == 16 * KiB
    assert auto_slice_bytes(MiB, 1, MiB, path=CriticalPath.chain(8, 1), policy=SlicePolicy(64, 32 * KiB)) == 32 * KiB
    assert auto_slice_bytes(MiB, 1, MiB, path=chain, policy=SlicePolicy(1, 512 * KiB)) == 512 * KiB
    assert auto_slice_bytes(0, 8, path=chain) == 16
    assert auto_slice_bytes(100, 3, element_bytes=2, path=CriticalPath.chain(1, 1)) == 48     # 17 elements: one slice
    for bad in (dict(nchunks=0), dict(share=8), dict(element_bytes=3), dict(proto="ll128"), dict(costs=(0.0, 1e9)),
                dict(costs=(1e-6, -1.0)), dict(nbytes=-1)):
        args = dict(nbytes=MiB, nchunks=4, share=MiB, element_bytes=4, path=chain) | bad
        with pytest.raises(ValueError):
            auto_slice_bytes(args.pop("nbytes"), args.pop("nchunks"), args.pop("share"), args.pop("element_bytes"),
                             **args)
    with pytest.raises(ValueError):
        CriticalPath((1, 2), (3, 3), 2)                  # units below slope x samples
    with pytest.raises(ValueError):
        CriticalPath((2,), (4,), 1)                      # samples start at 1


def test_one_constant_per_cost(monkeypatch):
    """The synthesis budget and the slice policy read the same per-unit cost (no copy of it to
    drift apart); an LL unit costs what a COPY unit does; LL's block moves its share of the
    Simple block's bytes as data."""
    assert slicing.unit_seconds("simple") == slicing.UNIT_SECONDS
    assert slicing.unit_seconds("ll") == slicing.LL_UNIT_SECONDS == slicing.COPY_UNIT_SECONDS
    assert slicing.block_bytes_per_second("ll") == slicing.BLOCK_BYTES_PER_SECOND * slicing.LL_DATA_FRACTION
    assert not hasattr(slicing, "THIN_SLOT_SECONDS")
    ir = _example("ring_allgather_8")
    seconds = 1e-3
    budget = {p for p in slicing.thin_policies()
              if slicing.busiest_slots(ir, p, 64 * MiB, ir.chunk_bytes) * slicing.UNIT_SECONDS
              <= slicing.THIN_SLOT_SHARE * seconds}
    assert set(slicing.thin_policy(ir, 64 * MiB, seconds, ir.chunk_bytes)) == budget
    monkeypatch.setattr(slicing, "UNIT_SECONDS", slicing.UNIT_SECONDS * 1e6)     # the one number moves both
    assert slicing.thin_policy(ir, 64 * MiB, seconds, ir.chunk_bytes) == []


# ----------------------------------------------------------------------------- the critical path
def _unit_graph_longest(ir, m: int) -> int:
    """The most units one path of the graph of (primitive, micro-batch) nodes crosses: a primitive's
    micro-batches in order, a thread block's next primitive after this one's last micro-batch,
    micro-batch i of a dependency or of a matched send before micro-batch i."""
    from collections import defaultdict, deque

    from hccc.compiler.ir.connections import match_connections
    p = ir.prims
    n = ir.nprims
    succ = defaultdict(list)
    order = sorted(range(n), key=lambda i: (int(p["rank"][i]), int(p["tb"][i]), int(p["seq"][i])))
    for x, y in zip(order, order[1:]):
        if (p["rank"][x], p["tb"][x]) == (p["rank"][y], p["tb"][y]):
            succ[(x, m - 1)].append((y, 0))
    pairs = list(zip(ir.dep_on.tolist(), ir.dep_prim.tolist())) + list(zip(*[a.tolist() for a in match_connections(ir)]))
    for u, v in pairs:
        for i in range(m):
            succ[(u, i)].append((v, i))
    for u in range(n):
        for i in range(m - 1):
            succ[(u, i)].append((u, i + 1))
    nodes = [(u, i) for u in range(n) for i in range(m)]
    indeg = dict.fromkeys(nodes, 0)
    for outs in succ.values():
        for w in outs:
            indeg[w] += 1
    best = dict.fromkeys(nodes, 1)
    todo = deque(v for v in nodes if indeg[v] == 0)
    while todo:
        v = todo.popleft()
        for w in succ.get(v, ()):
            best[w] = max(best[w], best[v] + 1)
            indeg[w] -= 1
            if indeg[w] == 0:
                todo.append(w)
    assert all(d == 0 for d in indeg.values()), "the unit graph has a cycle"
    return max(best.values())


@given(alg=valid_programs(["allgather", "allreduce", "broadcast", "reducescatter", "alltoall"], max_ranks=5),
       fuse=st.booleans(), narrow=st.sampled_from([0, 2, slicing.NARROW_LEVEL]))
@settings(max_examples=25, deadline=None)
def test_the_critical_path_is_the_unit_graphs_longest_path(alg, fuse, narrow):
    """``narrow``: the levels of fewer edges done per edge, the others in numpy (0: all in numpy)."""
    ir = build_program(alg, chunk_bytes=256, fuse=fuse)
    with mock.patch.object(slicing, "NARROW_LEVEL", narrow):
        cp = critical_path(ir)
    assert cp.samples[0] == 1 and cp.samples[-1] >= 2 * cp.longest_chain
    last = cp.samples[-1]
    for m in (1, 2, 3, 4, 5, 6, last, last + 3):
        truth = _unit_graph_longest(ir, m)
        if m in cp.samples or m > last:
            assert cp.exact(m) == truth, m                  # exact at the samples and past them
        else:
            assert cp.exact(m) >= truth, m                  # an upper bound between them
        assert truth >= cp.slope * m                        # a path runs ``slope`` primitives whole


def _example(name: str):
    from pathlib import Path

    from hccc.compiler.pipeline import load_program
    return load_program(str(Path(__file__).resolve().parent.parent / "examples" / f"{name}.rccl"))


def test_the_critical_path_of_the_examples():
    """Ring AllGather 8: 15 primitives chained at one micro-batch, but from two on its busiest
    thread blocks' own runs (8 primitives) plus one hop: CP(m) = 8 m + 1. HM AllReduce 4x8: 8
    primitives on its busiest blocks, a chain of 26 at one micro-batch (52 before its thread
    blocks ran by step first: compiler/passes/phase_order.py), whose fill falls as the
    micro-batches grow; from two on a block's run of 10 units a micro-batch (8 in the schedule's
    key order). The result is remembered for the program's arrays, channels aside."""
    from hccc.compiler.passes.channels import with_channels

    ring = _example("ring_allgather_8")
    cp = critical_path(ring)
    assert (cp.longest_chain, cp.slope) == (15, 8)
    assert [cp.exact(m) for m in (2, 3, 4, 100)] == [17, 25, 33, 801]
    assert cp.fill(1) == 7 and cp.fill(64) == 1
    hm = _example("hm_allreduce_4x8")
    cp = critical_path(hm)
    assert (cp.longest_chain, cp.slope) == (26, 10)
    assert slicing.busiest_tb_prims(hm) == 8
    fills = [cp.fill(m) for m in (1, 2, 4, 8, 16, 64, 1024)]
    assert fills == sorted(fills, reverse=True) and fills[0] == 16 and fills[-1] == 11
    assert critical_path(hm) is cp and critical_path(with_channels(hm, 4)) is cp
