"""The simulator's bandwidth sharing (``sim_share._share``) against the definition of max-min
fairness, not against another filling: an allocation is max-min fair exactly when it is feasible
(no resource carries more than its capacity) and every flow has a *bottleneck*, a resource on its
route that is full and on which no flow runs faster than it. Random flows over random shared
resources, the engine's own arrays set up by its ``_flow_start``."""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.passes.build import build_program
from hccc.compiler.pipeline import load_algorithm, load_cluster
from hccc.runtime import sim_engine as eng
from hccc.runtime import sim_share
from hccc.runtime import sim_model
from hccc.runtime.simulator import prepare, simulate

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CLUSTERS = EXAMPLES / "clusters"


class Sharing:
    """The engine's flow and sharing state for flows ``routes`` (resource ids) over resources of
    ``caps``, driven through its own ``_flow_start``, ``_flow_stop`` and ``_share``; ``private``:
    the resources only one flow holds are marked private (caps on that flow)."""

    def __init__(self, caps: list[float], routes: list[list[int]], private: bool = False):
        R, G = len(caps), len(routes)
        self.R, self.t, self.epoch = R, 0.0, 1
        self.res_cap = np.asarray(caps, float)
        users = np.bincount([r for route in routes for r in route], minlength=R)
        res_private = (users <= 1) if private else np.zeros(R, np.bool_)
        self.ptr = np.r_[0, np.cumsum([len(r) for r in routes])].astype(np.int64)
        self.flat = np.asarray([r for route in routes for r in route], np.int64)
        self.cls = cls = sim_model.flow_classes(self.ptr, self.flat, np.zeros(0, np.int64), self.res_cap, res_private)
        NCL = len(cls.cap)
        self.NCL = NCL
        self.fl = (np.full(G, -1, np.int64), np.zeros(G, np.int64), np.zeros(G, np.int64), np.zeros(G, np.bool_))
        self.fl_start = np.zeros(G)
        self.cls_n, self.cls_rate, self.cls_vt = np.zeros(NCL, np.int64), np.zeros(NCL), np.zeros(NCL)
        none = np.diff(cls.ptr) == 0
        self.cls_rate[none] = cls.cap[none]          # as the engine starts them
        self.moff = np.r_[0, np.cumsum(np.bincount(cls.route_cls, minlength=NCL))].astype(np.int64)
        self.mkey, self.mitem = np.empty(G), np.empty(G, np.int64)
        self.mpos, self.mn = np.full(G, -1, np.int64), np.zeros(NCL, np.int64)
        self.retime, self.retime_n, self.in_retime = np.empty(NCL, np.int64), np.zeros(1, np.int64), np.zeros(NCL, np.bool_)
        self.res_n = np.zeros(R, np.int64)
        self.busy_t0, self.busy = np.zeros(R), np.zeros(R)
        self.hkey, self.hitem = np.empty(NCL), np.empty(NCL, np.int64)
        self.hpos, self.hn = np.full(NCL, -1, np.int64), np.zeros(1, np.int64)
        self.parts = part_of, part_res_ptr, part_res, part_cls_ptr, part_cls = sim_share._parts(R, NCL, cls.ptr, cls.sh)
        self.sh_slot, self.slot_ptr, self.slot_cap = sim_share._slots(NCL, cls.ptr, cls.sh, self.res_cap, part_of,
                                                                part_res_ptr, part_res)
        nparts, nslots, nsh = len(part_cls_ptr) - 1, len(part_res), len(cls.sh)
        # the lists of classes with members (the engine's ``_cls_on``/``_cls_off`` keep them)
        self.lists = (part_of, self.sh_slot, self.slot_ptr, np.empty(nsh, np.int64), np.empty(nsh, np.int64),
                      np.zeros(nslots, np.int64), np.zeros(nsh, np.int64), part_cls_ptr,
                      np.empty(len(part_cls), np.int64), np.zeros(nparts, np.int64), np.zeros(NCL, np.int64))
        self.dirty, self.dirty_n = np.empty(nparts, np.int64), np.zeros(1, np.int64)
        self.dirty_mark = np.zeros(nparts, np.int64)
        self.counters = np.zeros(6, np.int64)
        # the classes whose counts changed since the last share, what the last filling left each
        # resource, and the order its classes froze in (the engine's own arrays)
        self.chg = (np.empty(NCL, np.int64), np.zeros(1, np.int64), np.zeros(NCL, np.int64), np.zeros(NCL, np.int64))
        self.slot_use, self.slot_sat = np.zeros(nslots), np.zeros(nslots, np.bool_)
        self.slot_part = np.repeat(np.arange(nparts), np.diff(part_res_ptr)).astype(np.int64)
        self.order = (np.empty(len(part_cls), np.int64), np.empty(len(part_cls)), np.zeros(nparts, np.int64),
                      np.full(NCL, -1, np.int64))
        self.rise = np.zeros(NCL, np.int64)
        self.smark = np.zeros(nslots, np.int64)
        self.running: set[int] = set()

    def start(self, g: int, nbytes: float = 1e6) -> None:
        sim_share._note_count(self.cls.route_cls[g], self.cls.ptr, self.cls_n, *self.chg, self.epoch)
        eng._flow_start(g, self.cls.route_cls[g], self.flat, self.ptr[g], self.ptr[g + 1], False, nbytes, self.t,
                        self.cls.ptr, self.cls.sh, self.cls_n, self.cls_rate, self.cls_vt, *self.lists,
                        self.res_n, self.busy_t0, *self.fl,
                        self.fl_start, self.mkey, self.mitem, self.mpos, self.mn, self.moff, self.retime,
                        self.retime_n, self.in_retime, self.dirty, self.dirty_n, self.dirty_mark, self.epoch)
        self.running.add(g)

    def stop(self, g: int) -> None:
        c = self.fl[0][g]
        # out of its class's heap of running members, as the engine's completion takes it, and
        # the class's next completion after it (none: out of the event heap)
        eng._heap_set(self.mkey, self.mitem, self.mpos, self.mn, c, self.moff[c], g, -np.inf)
        assert eng._heap_pop(self.mkey, self.mitem, self.mpos, self.mn, c, self.moff[c]) == g
        nxt = self.cls_vt[c] + self.mkey[self.moff[c]] / self.cls_rate[c] if self.mn[c] else -np.inf
        eng._heap_set(self.hkey, self.hitem, self.hpos, self.hn, 0, 0, c, nxt)
        if not self.mn[c]:
            assert eng._heap_pop(self.hkey, self.hitem, self.hpos, self.hn, 0, 0) == c
        sim_share._note_count(c, self.cls.ptr, self.cls_n, *self.chg, self.epoch)
        eng._flow_stop(g, self.t, self.flat, self.flat, self.cls.ptr, self.cls.sh, self.cls_n, *self.lists,
                       self.res_n, self.busy_t0, self.busy, *self.fl,
                       self.dirty, self.dirty_n, self.dirty_mark, self.epoch)
        self.running.discard(g)

    def share(self) -> dict[int, float]:
        """The rates of the running flows after the changes since the last share; every class's
        next completion is checked against its rate."""
        part_of, sh_slot, slot_ptr, slot_cls, slot_inc, slot_n, inc_pos, part_cls_ptr, pact, pact_n, _ = self.lists
        nslots, nparts = len(slot_n), len(pact_n)
        chg, chg_n, chg_old, chg_mark = self.chg
        chg_next, part_head = np.empty(self.NCL, np.int64), np.full(nparts, -1, np.int64)
        nfull = sim_share._needs_share(self.dirty, int(self.dirty_n[0]), chg, int(chg_n[0]), chg_next, part_head,
                                 chg_old, self.cls_n, self.cls_rate, self.cls.ptr, sh_slot, self.slot_part,
                                 self.slot_use, self.slot_sat,
                                 self.slot_cap, np.zeros(nslots), np.empty(nslots, np.int64),
                                 np.zeros(nslots, np.int64), np.zeros(nparts, np.int64), self.epoch, self.counters)
        sim_share._share(self.t, self.dirty, nfull, self.res_n, self.cls.ptr, self.cls.cap, self.cls_n,
                   self.cls_rate, self.cls_vt, self.mkey, self.mn, self.moff, self.parts[1], self.parts[2],
                   part_cls_ptr, self.slot_cap, sh_slot, slot_ptr, slot_cls, slot_n, pact, pact_n,
                   np.empty(nslots, np.int64), np.zeros(nslots), np.zeros(nslots, np.int64),
                   self.rise, np.empty(self.NCL, np.int64), np.empty(nslots, np.int64), self.retime,
                   self.retime_n, self.in_retime, self.slot_use, self.slot_sat, self.slot_part,
                   np.empty(nslots, np.int64), self.smark, *self.order, chg, chg_next, part_head, chg_old, chg_mark,
                   self.epoch, np.empty(self.NCL), np.empty(self.NCL, np.int64), self.counters)
        self.dirty_n[0] = 0
        chg_n[0] = 0
        eng._retime(self.t, self.retime, self.retime_n, self.in_retime, self.cls_rate, self.cls_vt, self.mkey,
                    self.mn, self.moff, self.hkey, self.hitem, self.hpos, self.hn)
        # every running class's key in the event heap is its next completion, or earlier where its
        # rate fell (never later: no completion is missed); brought to the first entry, the
        # earliest completion of all is due there (``_settle_top``)
        due = {}
        for c in set(self.cls.route_cls[sorted(self.running)].tolist()):
            first = self.mkey[self.moff[c]]       # the bytes left to the class's first member
            due[c] = self.cls_vt[c] + first / self.cls_rate[c]
            assert self.hkey[self.hpos[c]] <= due[c] * (1 + 1e-12)
        if due:
            eng._settle_top(self.NCL, self.cls_rate, self.cls_vt, self.mkey, self.moff, self.hkey, self.hitem,
                            self.hpos, self.hn)
            assert self.hkey[0] == pytest.approx(min(due.values()), rel=1e-12)
            assert due[int(self.hitem[0])] == pytest.approx(self.hkey[0], rel=1e-12)
        self.epoch += 1
        self.check_lists()
        return {g: float(self.cls_rate[self.cls.route_cls[g]]) for g in self.running}

    def check_lists(self) -> None:
        """The lists the filling visits hold exactly the classes with members: each part's, and
        each shared resource's (by its slot in its part), with the places ``_cls_off`` swaps by."""
        part_of, sh_slot, slot_ptr, slot_cls, slot_inc, slot_n, inc_pos, part_cls_ptr, pact, pact_n, ppos = self.lists
        ptr, sh = self.cls.ptr, self.cls.sh
        part_res_ptr, part_res = self.parts[1], self.parts[2]
        for q in range(len(pact_n)):
            got = pact[part_cls_ptr[q]:part_cls_ptr[q] + pact_n[q]].tolist()
            want = [c for c in range(self.NCL) if self.cls_n[c] > 0 and ptr[c] < ptr[c + 1]
                    and part_of[sh[ptr[c]]] == q]
            assert sorted(got) == want and len(set(got)) == len(got)
            assert all(ppos[c] == i for i, c in enumerate(got))
            for k in range(part_res_ptr[q], part_res_ptr[q + 1]):
                r = part_res[k]
                lo = slot_ptr[k]
                got = slot_cls[lo:lo + slot_n[k]].tolist()
                assert sorted(got) == [c for c in want if r in sh[ptr[c]:ptr[c + 1]].tolist()]
                for i in range(slot_n[k]):
                    j = slot_inc[lo + i]
                    assert sh[j] == r and sh_slot[j] == k and inc_pos[j] == i and ptr[got[i]] <= j < ptr[got[i] + 1]
                assert self.res_n[r] == sum(self.cls_n[c] for c in got)


def share(caps: list[float], routes: list[list[int]], private: bool = False) -> np.ndarray:
    """Rates the engine gives flows ``routes`` started together over resources of ``caps``."""
    sharing = Sharing(caps, routes, private)
    for g in range(len(routes)):
        sharing.start(g)
    rate = sharing.share()
    return np.asarray([rate[g] for g in range(len(routes))])


def assert_max_min_fair(caps: list[float], routes: list[list[int]], rate: dict[int, float]) -> None:
    """Feasible, and every flow of ``rate`` (flow -> rate; the others are not running) has a full
    resource on its route on which no flow runs faster (the definition, module docstring)."""
    assert all(r > 0 for r in rate.values())
    load = np.zeros(len(caps))
    for g, r in rate.items():
        load[routes[g]] += r
    tol = 1e-9
    assert (load <= np.asarray(caps) * (1 + tol)).all(), "a resource carries more than its capacity"
    for g in rate:
        bottleneck = [r for r in routes[g] if load[r] >= caps[r] * (1 - tol)
                      and all(rate[h] <= rate[g] * (1 + tol) for h in rate if r in routes[h])]
        assert bottleneck, f"flow {g} (rate {rate[g]:.4g}) has no bottleneck: it could run faster"


@st.composite
def flows(draw):
    R = draw(st.integers(1, 7))
    # capacities from a few values, so that ties (several resources full at one level) are common
    caps = [float(draw(st.sampled_from([1, 2, 3, 5, 8, 10, 21, 40]))) * 1e9 for _ in range(R)]
    G = draw(st.integers(1, 10))
    routes = [sorted(draw(st.sets(st.integers(0, R - 1), min_size=1, max_size=min(R, 4)))) for _ in range(G)]
    return caps, routes


@settings(max_examples=300, deadline=None)
@given(flows(), st.booleans())
def test_rates_are_max_min_fair(case, private):
    """Also with the resources one flow holds taken as caps on its rate (as the engine takes a
    thread block's own block resource)."""
    caps, routes = case
    rate = share(caps, routes, private)
    assert_max_min_fair(caps, routes, dict(enumerate(rate.tolist())))


@settings(max_examples=300, deadline=None)
@given(flows(), st.booleans(), st.data())
def test_rates_stay_max_min_fair_as_flows_come_and_go(case, private, data):
    """Flows starting and stopping over several shares, several at once: after each share the
    running flows' rates are max-min fair (a share fills again only the parts whose flows
    changed)."""
    caps, routes = case
    st_ = Sharing(caps, routes, private)
    for _ in range(data.draw(st.integers(1, 6))):
        st_.t += data.draw(st.sampled_from([0.0, 1e-6]))    # before any flow could end (1e6 bytes)
        _toggle_and_share(st_, caps, routes, data, 4)


def _toggle_and_share(st_, caps, routes, data, most: int) -> None:
    """Start or stop up to ``most`` drawn flows, then share: max-min fair whenever a flow runs."""
    for g in data.draw(st.lists(st.integers(0, len(routes) - 1), min_size=1, max_size=most, unique=True)):
        (st_.stop if g in st_.running else st_.start)(g)
    if st_.running:
        assert_max_min_fair(caps, routes, st_.share())
    else:
        st_.share()


@st.composite
def capped_flows(draw):
    """Flows over a few shared resources, each also over a resource of its own (a cap once taken as
    private) of many sizes, so that one filling freezes classes at several caps, between and at the
    levels where shared resources fill."""
    R = draw(st.integers(1, 4))
    caps = [float(draw(st.sampled_from([4, 6, 10, 15, 24]))) * 1e9 for _ in range(R)]
    G = draw(st.integers(2, 12))
    routes = []
    for g in range(G):
        shared = sorted(draw(st.sets(st.integers(0, R - 1), min_size=1, max_size=R)))
        caps.append(float(draw(st.sampled_from([0.5, 1, 1.5, 2, 3, 4, 5, 8, 30]))) * 1e9)
        routes.append(shared + [len(caps) - 1])
    return caps, routes


@settings(max_examples=200, deadline=None)
@given(capped_flows(), st.data())
def test_flows_capped_at_many_levels_stay_max_min_fair(case, data):
    """Classes whose caps come between, at and after the levels where shared resources fill, with
    flows coming and going: max-min fair after every share (the filling's classes still rising are
    looked at again at each cap, without those frozen since)."""
    caps, routes = case
    st_ = Sharing(caps, routes, private=True)
    for g in range(len(routes)):
        st_.start(g)
    assert_max_min_fair(caps, routes, st_.share())
    for _ in range(data.draw(st.integers(1, 4))):
        _toggle_and_share(st_, caps, routes, data, 3)


def test_a_filling_again_starts_from_the_least_level_a_change_reaches():
    """Flows a, b on a 2 GB/s resource, c, d on a 10 GB/s one, e on both: 2/3 GB/s for a, b and e
    (the small resource full), 14/3 for c and d. A flow f joining c and d's class rises from where
    their resource fills with it (28/9 GB/s), above the 2/3 of the others: only that class is
    filled again (one class), and the rates are max-min fair; so are they after every flow of
    that class but one stops. The first filling took every class (three)."""
    caps, routes = [2e9, 10e9], [[0], [0], [1], [1], [0, 1], [1]]
    st_ = Sharing(caps, routes)
    for g in range(5):
        st_.start(g)
    rate = st_.share()
    assert st_.counters[2] == 3
    assert np.allclose([rate[g] for g in range(5)], [2e9 / 3, 2e9 / 3, 14e9 / 3, 14e9 / 3, 2e9 / 3])
    st_.start(5)
    rate = st_.share()
    assert st_.counters[2] == 3 + 1                       # only c, d and f's class rose again
    assert_max_min_fair(caps, routes, rate)
    assert np.isclose(rate[5], (10e9 - 2e9 / 3) / 3)
    for g in (2, 3):
        st_.stop(g)
    assert_max_min_fair(caps, routes, st_.share())


def test_a_tie_freezes_every_full_resource_at_its_level():
    """Two resources full at one level, a third flow only on a roomier one: 1, 1 and 2 GB/s."""
    for private in (False, True):
        rate = share([1e9, 1e9, 4e9], [[0, 2], [1, 2], [2]], private)
        assert np.allclose(rate, [1e9, 1e9, 2e9])


def test_private_caps_leave_shared_capacity_to_the_others():
    """Flows capped by resources of their own (1 and 2 GB/s) on a shared 10 GB/s resource with a
    third, uncapped flow: 1, 2 and the 7 GB/s they leave; the same with the caps as resources."""
    for private in (False, True):
        rate = share([10e9, 1e9, 2e9], [[0, 1], [0, 2], [0]], private)
        assert np.allclose(rate, [1e9, 2e9, 7e9])


@pytest.mark.parametrize("algo,cluster", [
    ("ring_allreduce_8", "a100_topo1"),         # reductions on every rank's gamma resource
    ("hm_allreduce_2x4", "a100_topo1"),
    ("hm_allgather_2x8", "a100_topo2"),
    ("direct_alltoall_8", "a100_topo1"),        # many blocks over the same NIC groups
    ("trees:allgather", "v100_4x2_8"),          # links behind shared PCIe switches and NICs
    ("trees:allreduce", "h20_4_8"),
])
def test_private_caps_change_no_simulated_time(algo, cluster):
    """The engine with the private resources taken as caps against the same engine taking every
    resource into the sharing (no resource private): the same completion time and link busy
    times, with and without the per-block limit, at two sizes; and the resources it marks private
    are exactly those recounted here: held by the flows of at most one thread block, links with a
    shared group of no more capacity, and resources whose holders' blocks cannot fill them. (The
    alpha-beta model alone, ``costs=None``: with the kernels' unit and hop costs the tree
    AllReduce on h20_4_8 at 64 MiB ends at the same time to 1e-11 both ways, but its link busy
    times part by up to 2.7 %, from flows started at the same instant that end 9 ns apart: a
    divergence not taken apart yet; the engine agrees with the reference simulator on random
    programs with those costs, tests/test_simulator_oracle.py.)"""
    if algo.startswith("trees:"):
        ir, topo = _tree_program(cluster, algo.split(":")[1])
    else:
        topo = load_cluster(CLUSTERS / f"{cluster}.topo")
        ir = build_program(load_algorithm(EXAMPLES / f"{algo}.rccl"))
    more = False
    for block_gbps in (sim_model.DEFAULT_BLOCK_GBPS, None):
        prog = prepare(ir, topo, block_gbps, None)
        plain = dataclasses.replace(prog, res_private=None)
        for size in (1 << 20, 64 << 20):
            a = simulate(prog, topo, size, slice_bytes="auto")
            b = simulate(plain, topo, size, slice_bytes="auto")
            assert a.time_s == pytest.approx(b.time_s, rel=1e-12)
            assert np.allclose(a.link_busy, b.link_busy, rtol=1e-12, atol=1e-15)
        # an independent count: thread blocks whose flows hold each resource
        holders = [set() for _ in range(len(prog.res_cap))]
        gtb = np.repeat(np.arange(prog.ntbs), np.diff(prog.tb_ptr))
        for p in np.flatnonzero(prog.p_flags & eng.F_SEND):
            rt = prog.p_route[p]
            for r in prog.route_res[prog.route_res_ptr[rt]:prog.route_res_ptr[rt + 1]]:
                holders[r].add(int(gtb[p]))
        for p in np.flatnonzero(prog.p_flags & eng.F_REDUCE):
            r = prog.rank_cres[prog.p_rank[p]]
            if r >= 0:
                holders[r].add(int(gtb[p]))
        sends = [set() for _ in range(len(prog.res_cap))]
        for p in np.flatnonzero(prog.p_flags & eng.F_SEND):
            rt = prog.p_route[p]
            for r in prog.route_res[prog.route_res_ptr[rt]:prog.route_res_ptr[rt + 1]]:
                sends[r].add(int(gtb[p]))
        nchannel_rate = None
        if block_gbps is not None:
            nchannel_rate = ir.nchannels * sim_model.block_gbps_at(block_gbps, ir.nwarps) * 1e9
        expected = []
        for r, h in enumerate(holders):
            only_sends = h == sends[r]
            fill = len(h) * nchannel_rate if nchannel_rate is not None and only_sends else np.inf
            group_caps = [g.capacity_bytes for g in topo.groups if r < prog.nlinks and r in g.members]
            expected.append(len(h) <= 1 or fill <= prog.res_cap[r]
                            or (bool(group_caps) and min(group_caps) <= prog.res_cap[r]))
        assert expected == prog.res_private.tolist()
        more |= sum(expected) > sum(len(h) <= 1 for h in holders)
    if algo.startswith("trees:"):     # many streams per pair: the rules past single holders
        assert more                   # mark resources too


def _tree_program(cluster: str, collective: str):
    """A tree-packing program (a channel per stream, pipelined pieces: the flows a thread block
    starts one after another over the same link), built without simulating."""
    from hccc.compiler.synth import synthesize
    from hccc.compiler.synth.emit import to_algorithm

    topo = load_cluster(CLUSTERS / f"{cluster}.topo")
    res = synthesize(topo, collective, method="trees", time_limit=30)
    return build_program(to_algorithm(res, topo)), topo


@pytest.mark.parametrize("case", [
    ("ring_allreduce_8", "a100_topo1"),
    ("ring_allreduce_8:fuse", "a100_topo1"),    # receive-reduce-send: a reduction, then a send
    ("hm_allgather_2x8", "a100_topo2"),
    ("direct_alltoall_8", "a100_topo1"),
    ("trees:allgather", "h20_4_8"),
    ("trees:reducescatter", "v100_4x2_8"),
    ("trees:allreduce", "a100_topo3"),
])
def test_flow_take_over_changes_no_simulated_time(case):
    """A thread block's next flow over the same resources at the instant its flow ended keeps
    that flow's rate without a re-share (the set of flows is the same, so max-min is): against
    the engine that stops every flow and starts the next, the same completion time and link busy
    times, in both execution modes, and no more re-sharing (a flow stopped and one started in its
    class at one instant leave the class's count as it was, so neither engine fills again for
    them: ``_needs_share``)."""
    from hccc.runtime.simulator import _engine_args, geometry

    algo, cluster = case
    if algo.startswith("trees:"):
        ir, topo = _tree_program(cluster, algo.split(":")[1])
    else:
        topo = load_cluster(CLUSTERS / f"{cluster}.topo")
        name, _, fuse = algo.partition(":")
        ir = build_program(load_algorithm(EXAMPLES / f"{name}.rccl"), fuse=fuse == "fuse")
    prog = prepare(ir, topo)
    # also with reductions slower than the links, so a reduction's rate is never a send's
    cap = prog.res_cap.copy()
    cres = prog.rank_cres[prog.rank_cres >= 0]
    cap[cres] = 0.37 * cap[:prog.nlinks].min()
    slow = dataclasses.replace(prog, res_cap=cap)
    for prog, execution in itertools.product((prog, slow), ("task", "algorithm")):
        for size in (1 << 20, 64 << 20):
            geo = geometry(size, prog.nchunks, min(prog.chunk_bytes, 1 << 16), 4)
            a = eng.run(*_engine_args(prog, geo, execution, 0, 8, take_over=True))
            b = eng.run(*_engine_args(prog, geo, execution, 0, 8, take_over=False))
            assert a[0] == b[0] == eng.STATUS_OK
            assert a[1] == pytest.approx(b[1], rel=1e-12)                 # completion time
            assert np.allclose(a[5], b[5], rtol=1e-12, atol=1e-15)        # resource busy times
            assert a[10][0] == b[10][0]                                   # the same events
            assert a[10][1] <= b[10][1] and a[10][2] <= b[10][2]          # fillings, classes filled


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 11), st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.25, 7.0])),
                max_size=60))
def test_event_heap_pops_in_time_then_item_order(ops):
    """The engine's indexed heaps against dictionaries of pending items: an insert or a key
    change (``_heap_set``), or a pop, which must return the item of least (time, item), ties by
    item. Two heaps share the arrays, as the classes' heaps of members do: items 0-5 in heap 0
    stored from slot 0, items 6-11 in heap 1 stored from slot 6."""
    n = 12
    hkey, hitem = np.empty(n), np.empty(n, np.int64)
    hpos, hn = np.full(n, -1, np.int64), np.zeros(2, np.int64)
    pending: list[dict[int, float]] = [{}, {}]

    def pop(h):
        want = min(pending[h], key=lambda i: (pending[h][i], i))
        assert eng._heap_pop(hkey, hitem, hpos, hn, h, 6 * h) == want
        del pending[h][want]

    for is_pop, item, key in ops:
        h = item // 6
        if is_pop and pending[h]:
            pop(h)
        else:
            eng._heap_set(hkey, hitem, hpos, hn, h, 6 * h, item, key)
            pending[h][item] = key
        for j in (0, 1):
            assert hn[j] == len(pending[j])
            assert all(hitem[6 * j + hpos[i]] == i and hkey[6 * j + hpos[i]] == k for i, k in pending[j].items())
    for h in (0, 1):
        while pending[h]:
            pop(h)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 12).flatmap(lambda R: st.tuples(
    st.just(R), st.lists(st.sets(st.integers(0, R - 1), max_size=4), max_size=10))))
def test_parts_are_the_connected_components_of_the_classes(case):
    """The parts the filling works on against networkx's connected components of the graph of
    shared resources and the classes over them (a class with no shared resource is in no part)."""
    import networkx as nx

    R, lists = case
    ptr = np.r_[0, np.cumsum([len(x) for x in lists])].astype(np.int64)
    sh = np.asarray([r for x in lists for r in sorted(x)], np.int64)
    part_of, res_ptr, res, cls_ptr, cls = sim_share._parts(R, len(lists), ptr, sh)
    g = nx.Graph()
    for c, x in enumerate(lists):
        g.add_nodes_from(("r", r) for r in x)
        g.add_edges_from((("c", c), ("r", r)) for r in x)
    want = {frozenset(comp) for comp in nx.connected_components(g)}
    got = set()
    for q in range(len(res_ptr) - 1):
        got.add(frozenset([("r", int(r)) for r in res[res_ptr[q]:res_ptr[q + 1]]]
                          + [("c", int(c)) for c in cls[cls_ptr[q]:cls_ptr[q + 1]]]))
        assert all(part_of[r] == q for r in res[res_ptr[q]:res_ptr[q + 1]])
    assert got == want
    assert all(part_of[r] == -1 for r in range(R) if not any(r in x for x in lists))
