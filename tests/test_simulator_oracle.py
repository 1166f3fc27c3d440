"""The simulator against a slow, obviously correct reference simulator, on random programs and clusters.

The reference below re-derives everything from the ProgramIR and the Topology with plain Python
objects: every TB is an explicit list of units ``(primitive, micro-batch, sub-chunk)`` in its
execution order; FIFO positions are counted, not computed; at every instant all ready TBs are
started until nothing changes, then max-min fair rates are recomputed from scratch over *all*
active flows, and time jumps to the next flow end or slot visibility. No batching, components,
heaps or incremental state, so a bug in the fast engine's bookkeeping shows up as a mismatch.
The per-block limit: every send of a TB also holds a resource named after the TB, of capacity
``nchannels x block_gbps`` (none with ``block_gbps=None``). The kernels' unit and hop costs
(``costs``, a KernelCosts whose rows hold one figure at every warps): a unit pays its op's fixed
cost before its first chunk's flows, once its waits are met; a dependency is met a hop after the
micro-batch it waits for finished (each micro-batch's finish time kept, not only the latest).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.passes.build import build_program
from hccc.compiler.backend.codegen import analyse
from hccc.compiler.ir.program_ir import Op
from hccc.compiler.cluster.topology import TopologyBuilder
from hccc.runtime.sim_model import DEFAULT_BLOCK_GBPS
from hccc.runtime.simulator import NSLOTS, build_for_execution, least_time, simulate
from hccc.testing import valid_programs


# ============================================================================= the reference
class ReferenceSimulator:
    """See the module docstring. ``run()`` returns (time, tb_finish, tb_busy) keyed by (rank, tb)."""

    def __init__(self, ir, topo, nbytes, *, execution="task", element_bytes=4, nslots=NSLOTS,
                 block_gbps=DEFAULT_BLOCK_GBPS, costs=None):
        self.ir, self.topo, self.nslots = ir, topo, nslots
        self.block_bps = None if block_gbps is None else ir.nchannels * block_gbps * 1e9
        P = ir.prims
        n = ir.nprims
        count = int(nbytes) // element_bytes
        bounds = [c * count // ir.nchunks for c in range(ir.nchunks + 1)]
        self.chunk_len = [bounds[c + 1] - bounds[c] for c in range(ir.nchunks)]
        # a slot holds one micro-batch of one primitive: the slices of all its chunks
        comm = [k for k in range(n) if Op(int(P["op"][k])).sends or Op(int(P["op"][k])).receives]
        most = max([int(P["count"][k]) for k in comm], default=1)
        share = ir.chunk_bytes // most
        share = share - share % 16 if share >= 16 else share
        slice_e = max(1, share // element_bytes)
        maxc = -(-count // ir.nchunks)
        self.nmb = max(1, -(-maxc // slice_e))
        self.slice_e, self.esize = slice_e, element_bytes
        anchor = analyse(ir).chunk
        self.prim = []
        for i in range(n):
            op = Op(int(P["op"][i]))
            self.prim.append(dict(op=op, rank=int(P["rank"][i]), tb=int(P["tb"][i]),
                                  sp=int(P["send_peer"][i]), rp=int(P["recv_peer"][i]),
                                  ch=int(P["channel"][i]), cnt=int(P["count"][i]), chunk=int(anchor[i])))
        # a unit's fixed cost by its op (the row's one figure) and a dependency's hop
        self.unit = [0.0] * n
        self.hop = 0.0
        if costs is not None:
            for i, pr in enumerate(self.prim):
                op = pr["op"]
                row = ("RECV_REDUCE_COPY" if op.reduces else "RECV") if op.receives else "SEND" if op.sends else "COPY"
                self.unit[i] = costs.unit_us[row][0] * 1e-6
            self.hop = costs.flag_round_trip_us / 2 * 1e-6
        self.deps = {i: [] for i in range(n)}
        for a, b in zip(ir.dep_prim.tolist(), ir.dep_on.tolist()):
            self.deps[a].append(b)
        # TB programs -> unit lists
        progs: dict[tuple[int, int], list[int]] = {}
        for i in range(n):
            progs.setdefault((self.prim[i]["rank"], self.prim[i]["tb"]), []).append(i)
        self.tbs = sorted(progs)
        self.units = {}
        for key, plist in progs.items():
            if execution == "task":
                u = [(p, m, k) for p in plist for m in range(self.nmb) for k in range(self.prim[p]["cnt"])]
            else:
                u = [(p, m, k) for m in range(self.nmb) for p in plist for k in range(self.prim[p]["cnt"])]
            self.units[key] = u
        # FIFO positions by counting, per connection, each end in its own unit order: one message
        # (slot) per primitive and micro-batch, shared by the units of its chunks
        self.spost, self.rpost = {}, {}
        for key in self.tbs:
            seen_s, seen_r = {}, {}
            for j, (p, m, k) in enumerate(self.units[key]):
                pr = self.prim[p]
                last = k == pr["cnt"] - 1
                if pr["op"].sends:
                    c = (pr["rank"], pr["sp"], pr["ch"])
                    self.spost[(key, j)] = (c, seen_s.get(c, 0))
                    seen_s[c] = seen_s.get(c, 0) + last
                if pr["op"].receives:
                    c = (pr["rp"], pr["rank"], pr["ch"])
                    self.rpost[(key, j)] = (c, seen_r.get(c, 0))
                    seen_r[c] = seen_r.get(c, 0) + last
        self.gamma = topo.rank_gamma

    def slice_bytes(self, chunk, m):
        ln = self.chunk_len[chunk % len(self.chunk_len)]
        off = m * self.slice_e
        return max(0, min(self.slice_e, ln - off)) * self.esize

    def link_resources(self, u, v):
        lk = self.topo.link_between(u, v)
        res = [("link", lk.id)] + [("group", g) for g in self.topo.groups_of_link(lk.id)]
        return lk, res

    def capacity(self, res):
        kind, i = res
        if kind == "link":
            return self.topo.link(i).total_bandwidth
        if kind == "group":
            return self.topo.groups[i].capacity_bytes
        if kind == "block":
            return self.block_bps
        return float(self.gamma[i])

    @staticmethod
    def max_min(flows, capacity):
        """Progressive filling over every flow (list of resource lists)."""
        rate = [0.0] * len(flows)
        frozen = [False] * len(flows)
        rem = {r: capacity(r) for f in flows for r in f}
        level = 0.0
        while not all(frozen):
            users = {r: 0 for r in rem}
            for i, f in enumerate(flows):
                if not frozen[i]:
                    for r in f:
                        users[r] += 1
            share, arg = min((rem[r] / users[r], r) for r in rem if users[r] > 0)
            level += share
            for r in rem:
                rem[r] -= share * users[r]
            full = {r for r in rem if users[r] > 0 and (r == arg or rem[r] <= 1e-12 * capacity(r))}
            for i, f in enumerate(flows):
                if not frozen[i] and any(r in full for r in f):
                    frozen[i] = True
                    rate[i] = level
        return rate

    def run(self):
        NS = self.nslots
        tb = {key: dict(j=0, stage="start", flow=None, busy=0.0, ready=0.0, finish=None, bytes=0.0)
              for key in self.tbs}
        progress = {}                 # prim -> micro-batches done
        head, tail = {}, {}           # connection -> consumed / visible posts
        pending = {}                  # connection -> [(visible time, post)] in post order
        send_start, vis_time = {}, {}  # (connection, post) -> time
        done_at = {}                  # (prim, micro-batch) -> when it finished
        timers = []                   # when a unit's fixed cost ends or a dependency's hop does
        now = 0.0
        while True:
            changed = True
            while changed:
                changed = False
                for c, q in pending.items():
                    while q and q[0][0] <= now:
                        q.pop(0)
                        tail[c] = tail.get(c, 0) + 1
                        changed = True
                for key in self.tbs:
                    s = tb[key]
                    if s["finish"] is not None or s["flow"] is not None:
                        continue
                    p, m, k = self.units[key][s["j"]]
                    pr = self.prim[p]
                    if s["stage"] == "start":
                        if any(progress.get(q, 0) < m + 1 or done_at[(q, m)] + self.hop > now for q in self.deps[p]):
                            continue
                        # the first chunk of a message waits for its data / a free slot
                        if pr["op"].receives and k == 0:
                            c, post = self.rpost[(key, s["j"])]
                            if tail.get(c, 0) <= post:
                                continue
                        if pr["op"].sends and k == 0:
                            c, post = self.spost[(key, s["j"])]
                            if head.get(c, 0) + NS <= post:
                                continue
                        if pr["op"].receives:
                            c, post = self.rpost[(key, s["j"])]
                            b0 = max(s["ready"], send_start[(c, post)])
                            s["busy"] += max(0.0, vis_time[(c, post)] - b0)
                        s["bytes"] = self.slice_bytes(pr["chunk"] + k, m)
                        s["stage"] = "reduce"
                        changed = True
                        if k == 0 and self.unit[p] > 0:
                            s["stage"], s["until"] = "fixed", now + self.unit[p]
                            s["busy"] += self.unit[p]
                            timers.append(s["until"])
                            continue
                    if s["stage"] == "fixed":
                        if s["until"] > now:
                            continue
                        s["stage"] = "reduce"
                    if s["stage"] == "reduce":
                        s["stage"] = "send"
                        if pr["op"].reduces and s["bytes"] > 0 and math.isfinite(self.gamma[pr["rank"]]):
                            s["flow"] = dict(res=[("gamma", pr["rank"])], rem=s["bytes"], t0=now)
                            continue
                    if s["stage"] == "send":
                        s["stage"] = "done"
                        if pr["op"].sends:
                            c, post = self.spost[(key, s["j"])]
                            if k == 0:
                                send_start[(c, post)] = now
                            if s["bytes"] > 0:
                                _, res = self.link_resources(pr["rank"], pr["sp"])
                                if self.block_bps is not None:
                                    res = res + [("block", key)]
                                s["flow"] = dict(res=res, rem=s["bytes"], t0=now)
                                continue
                    # the unit is complete; its message with the primitive's last chunk
                    if pr["op"].sends and k == pr["cnt"] - 1:
                        c, post = self.spost[(key, s["j"])]
                        lk, _ = self.link_resources(pr["rank"], pr["sp"])
                        vis_time[(c, post)] = now + lk.alpha
                        pending.setdefault(c, []).append((now + lk.alpha, post))
                    if pr["op"].receives and k == pr["cnt"] - 1:
                        c, post = self.rpost[(key, s["j"])]
                        head[c] = post + 1
                    if k == pr["cnt"] - 1:
                        progress[p] = m + 1
                        done_at[(p, m)] = now
                        timers.append(now + self.hop)
                    s["j"] += 1
                    s["ready"] = now
                    s["stage"] = "start"
                    if s["j"] == len(self.units[key]):
                        s["finish"] = now
                    changed = True
            if all(tb[key]["finish"] is not None for key in self.tbs):
                break
            active = [key for key in self.tbs if tb[key]["flow"] is not None]
            rates = self.max_min([tb[key]["flow"]["res"] for key in active], self.capacity)
            ends = [now + tb[key]["flow"]["rem"] / r for key, r in zip(active, rates)]
            vis = [q[0][0] for q in pending.values() if q] + [x for x in timers if x > now]
            if not ends and not vis:
                raise RuntimeError("reference: deadlock")
            t_next = min(ends + vis)
            for key, r, e in zip(active, rates, ends):
                f = tb[key]["flow"]
                if e <= t_next:
                    tb[key]["busy"] += t_next - f["t0"]
                    tb[key]["flow"] = None
                else:
                    f["rem"] -= r * (t_next - now)
            now = t_next
        finish = {key: tb[key]["finish"] for key in self.tbs}
        busy = {key: tb[key]["busy"] for key in self.tbs}
        return max(finish.values(), default=0.0), finish, busy


# ============================================================================= random clusters
@st.composite
def clusters(draw, n: int, *, allow_groups: bool = True, allow_gamma: bool = True):
    """A full mesh over ``n`` ranks with random per-link bandwidth, lanes and latency, split into
    1-3 nodes, plus random shared groups and reduction throughputs."""
    nnodes = draw(st.integers(1, min(3, n)))
    cuts = sorted(draw(st.lists(st.integers(1, n - 1), min_size=nnodes - 1, max_size=nnodes - 1,
                                unique=True))) if n > 1 and nnodes > 1 else []
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
    b = TopologyBuilder("random")
    for k, g in enumerate(sizes):
        gamma = draw(st.sampled_from([None, 50, 400])) if allow_gamma else None
        b.add_node(f"node{k + 1}", g, gamma_gbps=gamma)
    ids = []
    for u in range(n):
        for v in range(n):
            if u == v:
                continue
            bw = draw(st.sampled_from([5, 12.5, 25, 50]))
            lanes = draw(st.integers(1, 4))
            alpha = draw(st.sampled_from([0, 0.5, 1.7, 6]))
            ids.append(int(b.add_links([u], [v], b.params("direct", bw, lanes, alpha))[0]))
    if allow_groups and ids:
        for k in range(draw(st.integers(0, 3))):
            members = draw(st.lists(st.sampled_from(ids), min_size=1, max_size=min(6, len(ids)), unique=True))
            b.add_group("switch", "a->b", f"g{k}", members, draw(st.sampled_from([4, 10, 30])), 1, 0)
    return b.build()


@st.composite
def unit_costs(draw):
    """None (the alpha-beta model alone) or the kernels' unit and hop costs with one figure a row
    (any warps), the hop no longer than the cheapest unit (what the event loop composes)."""
    from hccc.compiler.passes.kernel_cost import DESIGN_TARGETS
    if draw(st.booleans()):
        return None
    rows = {k: (draw(st.sampled_from([0.0, 0.3, 1.0, 2.5])),) * 3 for k in ("COPY", "SEND", "RECV", "RECV_REDUCE_COPY")}
    least = min(r[0] for r in rows.values())
    hop = draw(st.sampled_from([0.0, least / 2, least])) if least > 0 else 0.0
    return dataclasses.replace(DESIGN_TARGETS, unit_us=rows, flag_round_trip_us=2 * hop)


def compare(ir, topo, nbytes, execution, nslots=NSLOTS, block_gbps=DEFAULT_BLOCK_GBPS, costs=None):
    fast = simulate(ir, topo, nbytes, execution=execution, nslots=nslots, block_gbps=block_gbps, costs=costs)
    t, finish, busy = ReferenceSimulator(ir, topo, nbytes, execution=execution, nslots=nslots,
                                         block_gbps=block_gbps, costs=costs).run()
    assert fast.time_s == pytest.approx(t, rel=1e-9, abs=1e-15)
    keys = list(zip(fast.tb_rank.tolist(), fast.tb_local.tolist()))
    assert sorted(keys) == sorted(finish)
    for key, f, b in zip(keys, fast.tb_finish.tolist(), fast.tb_busy.tolist()):
        assert f == pytest.approx(finish[key], rel=1e-9, abs=1e-15)
        assert b == pytest.approx(busy[key], rel=1e-7, abs=1e-13)
    assert fast.time_s >= fast.lower_bound_s * (1 - 1e-9)
    return fast


# 40 ms an example: 30 under the README's command, ten times as many under the thorough profile
@settings(max_examples=examples(30), suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_engine_matches_reference_on_random_programs_and_clusters(data):
    alg = data.draw(valid_programs(max_ranks=6, min_ranks=2), label="algorithm")
    n = alg.header.nranks
    topo = data.draw(clusters(n), label="cluster")
    execution = data.draw(st.sampled_from(["task", "algorithm"]), label="execution")
    chunk = data.draw(st.sampled_from([64, 256, 4096]), label="chunk_bytes")
    scheduler = data.draw(st.sampled_from(["hpds", "rr"]))
    tb_alloc = data.draw(st.sampled_from([None, "state", "connection"]))
    ir = build_for_execution(alg, execution, scheduler=scheduler, tb_alloc=tb_alloc, chunk_bytes=chunk)
    nbytes = data.draw(st.integers(0, 24 * chunk * n), label="nbytes")
    nslots = data.draw(st.sampled_from([NSLOTS, 1, 2]), label="nslots")
    ir.nchannels = data.draw(st.sampled_from([1, 2, 3]), label="channels")
    block_gbps = data.draw(st.sampled_from([None, 4.0, DEFAULT_BLOCK_GBPS, 1000.0]), label="block_gbps")
    compare(ir, topo, nbytes, execution, nslots, block_gbps, data.draw(unit_costs(), label="costs"))


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_least_time_bounds_every_simulation_of_the_program(data):
    """``least_time`` (what ``synth`` uses to leave unsimulated a program that cannot beat another):
    no simulation of the program at that size ends sooner, with any channels, per-block limit or
    slice or the kernels' unit costs; it is the bound the simulator reports for the program at its
    own slices without the per-block limit or unit costs."""
    alg = data.draw(valid_programs(max_ranks=6, min_ranks=2), label="algorithm")
    n = alg.header.nranks
    topo = data.draw(clusters(n), label="cluster")
    chunk = data.draw(st.sampled_from([64, 256, 4096]), label="chunk_bytes")
    ir = build_for_execution(alg, "task", chunk_bytes=chunk)
    nbytes = data.draw(st.integers(0, 24 * chunk * n), label="nbytes")
    least = least_time(ir, topo, nbytes)
    plain = simulate(ir, topo, nbytes, block_gbps=None, slice_bytes="auto", costs=None)
    assert least == pytest.approx(plain.lower_bound_s, rel=1e-12, abs=1e-18)
    assert plain.time_s >= least * (1 - 1e-9)
    for _ in range(3):
        ir.nchannels = data.draw(st.sampled_from([1, 2, 3]), label="channels")
        block = data.draw(st.sampled_from([None, 4.0, DEFAULT_BLOCK_GBPS]), label="block_gbps")
        slices = data.draw(st.sampled_from(["auto", None]), label="slice")
        t = simulate(ir, topo, nbytes, block_gbps=block, slice_bytes=slices).time_s
        assert t >= least * (1 - 1e-9)


@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_engine_matches_reference_on_multi_chunk_steps(data):
    """Imported MSCCL programs whose steps move many chunks (one FIFO message each, which both
    peers send before either receives): no deadlock, and the engine agrees with the reference."""
    from hccc.compiler.interop.msccl_xml import import_xml_text
    from msccl_texts import allpairs_allreduce, direct_allgather

    family = data.draw(st.sampled_from([allpairs_allreduce, direct_allgather]), label="family")
    n, per = data.draw(st.integers(2, 3), label="n"), data.draw(st.integers(2, 12), label="per")
    ir = import_xml_text(family(n, per), "algo.xml")
    ir.chunk_bytes = data.draw(st.sampled_from([16, 64, 256]), label="bytes per chunk") * per
    topo = data.draw(clusters(n), label="cluster")
    nbytes = 4 * data.draw(st.integers(0, 20 * ir.nchunks), label="elements")
    # how the importer proved it deadlock-free (these send before they receive: "algorithm", with
    # the runtimes' two Simple messages per connection)
    assert ir.origin.execution == "algorithm"
    compare(ir, topo, nbytes, "algorithm", data.draw(st.sampled_from([NSLOTS, 2]), label="nslots"),
            costs=data.draw(unit_costs(), label="costs"))


def measured_flat():
    """The measured calibration's units at 16 warps (the CUDA kernels' blocks) and its hop, one
    figure a row."""
    from hccc.compiler.passes.kernel_cost import V4_H200
    rows = {k: (V4_H200.fixed_seconds(k, 16) * 1e6,) * 3 for k in V4_H200.unit_us}
    return dataclasses.replace(V4_H200, unit_us=rows, copy_kib=(), copy_gbs={}, flat_gbs=50.0)


@pytest.mark.parametrize("name", ["hm_allreduce_2x4", "hm_allgather_2x4", "ring_allreduce_8"])
@pytest.mark.parametrize("execution", ["task", "algorithm"])
@pytest.mark.parametrize("with_costs", [False, True])
def test_engine_matches_reference_on_examples(name, execution, with_costs):
    from hccc.compiler.pipeline import load_algorithm, load_cluster

    alg = load_algorithm(f"examples/{name}.rccl")
    topo = load_cluster("examples/clusters/a100_topo1.topo")
    ir = build_for_execution(alg, execution, chunk_bytes=1 << 16)
    compare(ir, topo, 8 * 5 * (1 << 16) + 12, execution, costs=measured_flat() if with_costs else None)


@settings(max_examples=30)
@given(data=st.data())
def test_uniform_speedup_scales_time_exactly(data):
    """Bandwidths, gamma and the per-block limit x k with latencies, units' costs and hops / k: every
    event happens k times sooner."""
    alg = data.draw(valid_programs(max_ranks=5, min_ranks=2))
    n = alg.header.nranks
    k = data.draw(st.sampled_from([2, 4, 10]))
    seed = data.draw(st.integers(0, 2 ** 16))

    def make(scale):
        rng = np.random.default_rng(seed)
        b = TopologyBuilder("scaled")
        b.add_node("node1", n, gamma_gbps=100 * scale)
        for u in range(n):
            for v in range(n):
                if u != v:
                    bw = float(rng.choice([5, 25, 50])) * scale
                    b.add_links([u], [v], b.params("direct", bw, int(rng.integers(1, 3)),
                                                   float(rng.choice([0, 1, 4])) / scale))
        return b.build()

    ir = build_program(alg, chunk_bytes=1024)
    size = data.draw(st.integers(1, 40 * 1024))
    costs = data.draw(unit_costs(), label="costs")

    def scaled(div):
        if costs is None:
            return None
        return dataclasses.replace(costs, unit_us={r: tuple(x / div for x in v) for r, v in costs.unit_us.items()},
                                   flag_round_trip_us=costs.flag_round_trip_us / div)
    t1 = simulate(ir, make(1), size, block_gbps=7.0, costs=scaled(1)).time_s
    tk = simulate(ir, make(k), size, block_gbps=7.0 * k, costs=scaled(k)).time_s
    assert tk == pytest.approx(t1 / k, rel=1e-9)


@settings(max_examples=40)
@given(data=st.data())
def test_more_bandwidth_never_slower_without_sharing(data):
    """Without shared groups or shared reduction units no two TBs compete for a resource, so every
    event time is a max-plus function of the durations: faster links can only help."""
    alg = data.draw(valid_programs(max_ranks=6, min_ranks=2))
    n = alg.header.nranks
    topo_base = data.draw(clusters(n, allow_groups=False, allow_gamma=False))
    ir = build_program(alg, chunk_bytes=512)
    # the property needs each link to carry a single connection (channel 0): true by construction
    faster = TopologyBuilder("faster")
    faster.add_node("node1", n)
    boost = data.draw(st.lists(st.sampled_from([1, 1, 2, 5]), min_size=topo_base.nlinks,
                               max_size=topo_base.nlinks))
    for lk, f in zip(topo_base.links(), boost):
        faster.add_links([lk.src], [lk.dst], faster.params("direct", lk.bandwidth_gbps * f, lk.lanes,
                                                           lk.alpha * 1e6))
    size = data.draw(st.integers(1, 30 * 512))
    t0 = simulate(ir, topo_base, size).time_s
    t1 = simulate(ir, faster.build(), size).time_s
    assert t1 <= t0 * (1 + 1e-9)
