"""From a ProgramIR and a Topology to the flat arrays the event loop runs on.

:func:`prepare` does the size-independent work once per (program, cluster): global TB numbering,
connection ids and FIFO positions, the link of every sending primitive (``Topology.link_between``),
the resources a flow occupies (the link, its shared groups, or the rank's reduction unit), the
dependency lists in both directions and the slice anchor chunk of every primitive (the same one the
generated kernels use, :func:`hccc.compiler.ir.extents.chunk_anchors`). :func:`geometry` adds what depends on
the buffer size: elements per chunk, the slice length and the micro-batch count, exactly as
``hccc_prims.h`` computes them.

A resource is identified by an integer: links ``0..L-1``, shared groups ``L..L+NG-1``, the
reduction units of ranks ``L+NG..L+NG+N-1`` (only for ranks whose node declares ``gamma``), then
with a per-block limit the data engine of each thread block ``L+NG+N+g``.

Per-block limit. One GPU block moves only so many bytes a second (the kernels' cost model,
:mod:`hccc.compiler.passes.kernel_cost`: about 21 GB/s on 64 KiB units with 16 warps, the fifth
GPU run's copy-engine table), so a block cannot fill a fast link alone; the kernels spread a
connection over ``nchannels`` blocks (:mod:`hccc.compiler.passes.channels`). Each thread block's
sends therefore also cross a resource of its own of capacity ``nchannels x block_gbps`` (default
:data:`DEFAULT_BLOCK_GBPS`; None or infinity: no limit) at 16 warps per block, scaled as that
table's rates scale at fewer warps (``block_gbps_at``: 8 warps about 0.86 of it, 1 warp 0.31):
a connection runs at min(its fair share of link and groups, nchannels x block_gbps).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.ir.program_ir import Op, ProgramIR
from hccc.compiler.cluster.topology import Topology
from hccc.compiler.passes.channels import BLOCK_GBPS_WARPS, DEFAULT_BLOCK_GBPS, block_gbps_at
from hccc.compiler.passes import kernel_cost
from hccc.compiler.passes.kernel_cost import KernelCosts, unit_class
from hccc.compiler.frontend.slice_policy import SlicePolicy
from hccc.compiler.passes.slicing import CriticalPath, critical_path
from hccc.util.plural import plural

from hccc.runtime.sim_engine import F_RECV, F_REDUCE, F_SEND

_FLAGS = np.array([(F_SEND if Op(i).sends else 0) | (F_RECV if Op(i).receives else 0)
                   | (F_REDUCE if Op(i).reduces else 0) for i in range(len(Op))], dtype=np.int64)


#: ``prepare``'s ``costs`` that reads the simulator's costs (``kernel_cost.SIM_COSTS``) at the call
MODEL_COSTS = "model"

#: Bytes per element the sizes are counted in (float32, like nccl-tests' default).
DEFAULT_ELEMENT_BYTES = 4


class SimulationError(ValueError):
    """The program cannot run on the cluster (missing link, rank count mismatch, deadlock)."""


@dataclass
class SimProgram:
    """Size-independent simulation input (all arrays int64 / float64, ready for the engine)."""

    nranks: int
    nchunks: int
    collective: str
    chunk_bytes: int
    tb_ptr: np.ndarray        # G + 1
    tb_rank: np.ndarray       # G
    tb_local: np.ndarray      # G: TB index within its rank
    p_flags: np.ndarray
    p_sconn: np.ndarray
    p_rconn: np.ndarray
    p_spos: np.ndarray
    p_rpos: np.ndarray
    p_cnt: np.ndarray
    p_chunk: np.ndarray
    p_rank: np.ndarray
    p_link: np.ndarray        # link of sending primitives, -1 otherwise
    p_pipeline: np.ndarray
    dep_ptr: np.ndarray
    dep_on: np.ndarray
    rdep_ptr: np.ndarray
    rdep_tb: np.ndarray
    c_total: np.ndarray       # messages posted on each connection in one micro-batch
    c_stb: np.ndarray
    c_rtb: np.ndarray
    c_alpha: np.ndarray
    c_link: np.ndarray
    c_src: np.ndarray
    c_dst: np.ndarray
    link_res_ptr: np.ndarray
    link_res: np.ndarray
    res_cap: np.ndarray
    rank_cres: np.ndarray     # reduction resource per rank, -1 = free (gamma not modelled)
    link_alpha: np.ndarray    # per link, seconds
    nlinks: int
    ngroups: int
    # what a sending primitive's flow holds: its route (link, groups, and with a per-block limit
    # its TB's block resource), the engine's p_link / link_res_ptr / link_res
    p_route: np.ndarray = None
    route_res_ptr: np.ndarray = None
    route_res: np.ndarray = None
    nchannels: int = 1
    block_gbps: float | None = None
    # per resource: it never decides a rate that max-min over the other resources would not (see
    # :func:`_private_resources`), so the engine takes it as a cap on its flows' rates and leaves
    # it out of the sharing (see sim_engine._share)
    res_private: np.ndarray = None
    # the program's slice policy (``ProgramIR.slice_policy``) and critical path
    # (:func:`hccc.compiler.passes.slicing.critical_path`): what an "auto" slice follows
    policy: SlicePolicy = SlicePolicy()
    path: CriticalPath = CriticalPath.chain(1, 1)
    # the kernels' cost model's unit and hop (:func:`unit_costs`): each primitive's fixed cost a
    # unit and a dependency's hop, seconds (None: none, the alpha-beta model alone)
    p_unit: np.ndarray = None
    hop: float = 0.0

    @property
    def ntbs(self) -> int:
        return int(len(self.tb_ptr) - 1)

    @property
    def nprims(self) -> int:
        return int(len(self.p_flags))


def _csr(keys: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    o = np.lexsort((values, keys))
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=ptr[1:])
    return ptr, values[o].astype(np.int64)


def _fifo_positions(key: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Sum of ``count`` over the earlier primitives of the same connection (canonical order)."""
    o = np.lexsort((np.arange(len(key)), key))
    ks = key[o]
    c = count[o]
    new = np.r_[True, ks[1:] != ks[:-1]] if len(ks) else np.zeros(0, bool)
    csum = np.cumsum(c) - c
    start = np.maximum.accumulate(np.where(new, np.arange(len(ks)), 0)) if len(ks) else ks
    pos = np.empty(len(key), dtype=np.int64)
    pos[o] = csum - csum[start]
    return pos


def prepare(ir: ProgramIR, topo: Topology, block_gbps: float | None = DEFAULT_BLOCK_GBPS,
            costs: KernelCosts | None | str = MODEL_COSTS) -> SimProgram:
    """Size-independent arrays for simulating ``ir`` on ``topo`` (see the module docstring);
    ``block_gbps``: the per-block limit (None or infinity: none); ``costs``: the kernels' unit and
    hop costs the simulator charges (:func:`unit_costs`; :data:`MODEL_COSTS`: ``SIM_COSTS``,
    read at the call; None: none, the alpha-beta model alone).

    Raises :class:`SimulationError` when the rank counts differ or a sending primitive has no link.
    """
    from hccc.compiler.ir.extents import chunk_anchors

    N = int(ir.nranks)
    if topo.nranks != N:
        raise SimulationError(f"the program has {plural(N, 'rank')} but the cluster '{topo.name}' has "
                              f"{plural(topo.nranks, 'GPU')}")
    p = ir.prims
    n = ir.nprims
    flags = _FLAGS[p["op"].astype(np.int64)]
    rank = p["rank"].astype(np.int64)
    tbs = _ThreadBlocks(ir, rank)
    cn = _Connections(ir, flags, rank, tbs.gtb)
    si = cn.si
    c_link, c_alpha = _connection_links(ir, topo, cn)
    p_link = np.full(n, -1, dtype=np.int64)
    p_link[si] = c_link[cn.sconn[si]]
    res_cap, rank_cres, link_res_ptr, link_res = _resources(topo, N)
    # with a per-block limit, each sending TB's flow also crosses its block resource
    nchannels = max(1, int(getattr(ir, "nchannels", 1) or 1))
    limited = block_gbps is not None and np.isfinite(block_gbps) and block_gbps > 0
    if limited:
        bres0 = len(res_cap)
        per_block = block_gbps_at(block_gbps, getattr(ir, "nwarps", BLOCK_GBPS_WARPS))
        res_cap = np.concatenate([res_cap, np.full(tbs.G, nchannels * per_block * 1e9)])
        route_res_ptr, route_res, p_route = _block_routes(tbs.gtb, si, p_link, link_res_ptr, link_res,
                                                          topo.nlinks, bres0, n)
    else:
        route_res_ptr, route_res, p_route = link_res_ptr, link_res, p_link
    # ---- dependencies
    dp = np.asarray(ir.dep_prim, dtype=np.int64)
    do = np.asarray(ir.dep_on, dtype=np.int64)
    dep_ptr, dep_on = _csr(dp, do, n)
    rdep_ptr, rdep_prim = _csr(do, dp, n)
    rdep_tb = tbs.gtb[rdep_prim] if len(rdep_prim) else rdep_prim
    chunk = chunk_anchors(ir).astype(np.int64)      # the slice anchors the kernels use
    p_unit, hop = unit_costs(ir, kernel_cost.SIM_COSTS if isinstance(costs, str) and costs == MODEL_COSTS else costs)
    private = _private_resources(res_cap, tbs.gtb, si, p_route[si], route_res_ptr, route_res,
                                 np.flatnonzero((flags & F_REDUCE) > 0), rank_cres[rank],
                                 link_res_ptr, link_res, res_cap[bres0] if limited else np.inf)
    return SimProgram(
        nranks=N, nchunks=int(ir.nchunks), collective=ir.collective, chunk_bytes=int(ir.chunk_bytes),
        tb_ptr=tbs.tb_ptr, tb_rank=tbs.tb_rank, tb_local=tbs.tb_local, p_flags=flags, p_sconn=cn.sconn,
        p_rconn=cn.rconn, p_spos=cn.spos, p_rpos=cn.rpos, p_cnt=cn.count, p_chunk=chunk, p_rank=rank,
        p_link=p_link, p_pipeline=p["pipeline"].astype(np.int64), dep_ptr=dep_ptr, dep_on=dep_on,
        rdep_ptr=rdep_ptr, rdep_tb=rdep_tb.astype(np.int64), c_total=cn.c_total, c_stb=cn.c_stb,
        c_rtb=cn.c_rtb, c_alpha=c_alpha, c_link=c_link, c_src=cn.c_src, c_dst=cn.c_dst,
        link_res_ptr=link_res_ptr, link_res=link_res, res_cap=res_cap, rank_cres=rank_cres,
        link_alpha=np.asarray(topo.link_alpha, dtype=np.float64), nlinks=topo.nlinks, ngroups=len(topo.groups),
        p_route=p_route, route_res_ptr=route_res_ptr, route_res=route_res, nchannels=nchannels,
        block_gbps=float(block_gbps) if limited else None, res_private=private, policy=ir.slice_policy,
        path=critical_path(ir), p_unit=p_unit, hop=hop)


def unit_costs(ir: ProgramIR, costs: KernelCosts | None) -> tuple[np.ndarray, float]:
    """What the simulator charges a unit of each primitive of ``ir`` beyond its flows, and a
    dependency's hop, at ``costs`` (seconds): a unit's fixed cost by its op at the program's warps
    (:meth:`KernelCosts.fixed_seconds`, Simple: the slice policy's ``c``; a unit's bytes are its
    flows, at the links' and the block's rates), and half a flag round trip
    (:meth:`KernelCosts.hop_seconds`) between a primitive and one on another block of its rank
    that depends on it. A message's hop is its link's latency (``alpha``: the cluster's figure for
    a transfer reaching its peer), not charged twice. ``None``: neither. The event loop holds a
    primitive's progress on its way for one micro-batch at a time, so the hop may not exceed the
    fixed cost of a primitive another depends on (ValueError)."""
    n = int(ir.nprims)
    if costs is None:
        return np.zeros(n, np.float64), 0.0
    warps = max(1, int(getattr(ir, "nwarps", BLOCK_GBPS_WARPS) or BLOCK_GBPS_WARPS))
    ops = ir.prims["op"].astype(np.int64)
    fixed = {o: costs.fixed_seconds(unit_class(o), warps) for o in np.unique(ops).tolist()}
    p_unit = np.array([fixed[o] for o in ops.tolist()], np.float64)
    hop = float(costs.hop_seconds())
    on = np.asarray(ir.dep_on, np.int64)
    if hop > 0.0 and len(on) and float(p_unit[on].min()) < hop:
        raise ValueError(f"a dependency's hop ({hop * 1e6:.3g} us) is longer than the fixed cost of a unit "
                         f"depended on ({float(p_unit[on].min()) * 1e6:.3g} us): the simulator cannot compose it")
    return p_unit, hop


class _ThreadBlocks:
    """Every rank's thread blocks numbered globally (``gtb`` per primitive, ``G`` in all): each
    one's first primitive (``tb_ptr``), rank and local number."""

    def __init__(self, ir: ProgramIR, rank: np.ndarray):
        N = int(ir.nranks)
        ntbs = np.asarray(ir.ntbs, dtype=np.int64)
        tb_base = np.r_[0, np.cumsum(ntbs)].astype(np.int64)
        self.gtb = tb_base[rank] + ir.prims["tb"].astype(np.int64)
        self.G = G = int(tb_base[-1])
        self.tb_ptr = np.searchsorted(self.gtb, np.arange(G + 1)).astype(np.int64)
        self.tb_rank = np.repeat(np.arange(N, dtype=np.int64), ntbs)
        self.tb_local = np.arange(G, dtype=np.int64) - tb_base[self.tb_rank]


class _Connections:
    """The program's connections (one per sender, receiver and channel), numbered: each sending and
    receiving primitive's connection (``sconn``, ``rconn``) and FIFO position (``spos``, ``rpos``),
    each connection's messages, end thread blocks and ranks; both ends checked to match."""

    def __init__(self, ir: ProgramIR, flags: np.ndarray, rank: np.ndarray, gtb: np.ndarray):
        p, n, N = ir.prims, ir.nprims, int(ir.nranks)
        self.count = count = p["count"].astype(np.int64)
        ch = p["channel"].astype(np.int64)
        nch = int(ch.max()) + 1 if n else 1
        sends = (flags & F_SEND) > 0
        recvs = (flags & F_RECV) > 0
        skey = np.where(sends, (rank * N + p["send_peer"].astype(np.int64)) * nch + ch, -1)
        rkey = np.where(recvs, (p["recv_peer"].astype(np.int64) * N + rank) * nch + ch, -1)
        ukeys = np.unique(np.concatenate([skey[sends], rkey[recvs]]))
        C = len(ukeys)
        self.sconn = sconn = np.full(n, -1, dtype=np.int64)
        self.rconn = rconn = np.full(n, -1, dtype=np.int64)
        sconn[sends] = np.searchsorted(ukeys, skey[sends])
        rconn[recvs] = np.searchsorted(ukeys, rkey[recvs])
        self.spos = np.zeros(n, dtype=np.int64)
        self.rpos = np.zeros(n, dtype=np.int64)
        self.si = si = np.flatnonzero(sends)
        ri = np.flatnonzero(recvs)
        # FIFO positions count messages: one slot per primitive and micro-batch (see sim_engine)
        self.spos[si] = _fifo_positions(sconn[si], np.ones(len(si), np.int64))
        self.rpos[ri] = _fifo_positions(rconn[ri], np.ones(len(ri), np.int64))
        chunks_s = np.bincount(sconn[si], weights=count[si], minlength=C).astype(np.int64)
        chunks_r = np.bincount(rconn[ri], weights=count[ri], minlength=C).astype(np.int64)
        if not np.array_equal(chunks_s, chunks_r):
            raise SimulationError("a connection carries different numbers of chunks at its two ends")
        self.c_total = np.bincount(sconn[si], minlength=C).astype(np.int64)
        if not np.array_equal(self.c_total, np.bincount(rconn[ri], minlength=C).astype(np.int64)):
            raise SimulationError("a connection carries different numbers of messages at its two ends")
        self.c_stb = np.full(C, -1, dtype=np.int64)
        self.c_rtb = np.full(C, -1, dtype=np.int64)
        self.c_stb[sconn[si]] = gtb[si]
        self.c_rtb[rconn[ri]] = gtb[ri]
        if C and (self.c_stb.min() < 0 or self.c_rtb.min() < 0):
            raise SimulationError("a connection has a sending end without a receiving end (or vice versa)")
        self.pair = ukeys // nch
        self.c_src = self.pair // N
        self.c_dst = self.pair % N


def _connection_links(ir: ProgramIR, topo: Topology, cn: _Connections) -> tuple[np.ndarray, np.ndarray]:
    """Each connection's link and its latency, one lookup per distinct ordered pair of ranks; a
    pair the cluster has no link for is a SimulationError naming a primitive that sends over it."""
    N = int(ir.nranks)
    C = len(cn.pair)
    si, sconn = cn.si, cn.sconn
    c_link = np.empty(C, dtype=np.int64)
    c_alpha = np.empty(C, dtype=np.float64)
    upairs, inv = np.unique(cn.pair, return_inverse=True)
    pair_link = np.empty(len(upairs), dtype=np.int64)
    pair_alpha = np.empty(len(upairs), dtype=np.float64)
    for j, pr in enumerate(upairs.tolist()):
        u, v = divmod(int(pr), N)
        lk = topo.link_between(u, v)
        if lk is None:
            who = int(si[np.flatnonzero(cn.c_src[sconn[si]] * N + cn.c_dst[sconn[si]] == pr)[0]])
            raise SimulationError(
                f"rank {u} sends to rank {v} (primitive {who}, task {int(ir.prims['task'][who])}) but the "
                f"cluster '{topo.name}' has no link {u} -> {v}")
        pair_link[j] = lk.id
        pair_alpha[j] = lk.alpha
    c_link[:] = pair_link[inv.reshape(-1)]
    c_alpha[:] = pair_alpha[inv.reshape(-1)]
    return c_link, c_alpha


def _resources(topo: Topology, N: int):
    """The bandwidth resources: every link, every shared group, every rank's reduction rate
    (``res_cap``; ``rank_cres`` each rank's, -1 where unlimited), and each link's resources (CSR:
    the link itself, then its shared groups)."""
    L = topo.nlinks
    NG = len(topo.groups)
    res_cap = np.concatenate([
        topo.link_bandwidth * topo.link_lanes,
        np.array([g.capacity_bytes for g in topo.groups], dtype=np.float64),
        np.where(np.isfinite(topo.rank_gamma), topo.rank_gamma, 1.0),
    ]).astype(np.float64)
    rank_cres = np.where(np.isfinite(topo.rank_gamma), L + NG + np.arange(N), -1).astype(np.int64)
    # link -> its shared groups (CSR), from the groups' member lists
    if NG:
        gm = np.concatenate([np.asarray(g.members, dtype=np.int64) for g in topo.groups])
        gg = np.repeat(np.arange(NG, dtype=np.int64), [len(g.members) for g in topo.groups])
    else:
        gm = gg = np.zeros(0, dtype=np.int64)
    lg_ptr, lg = _csr(gm, gg, L)
    link_res_ptr = lg_ptr + np.arange(L + 1, dtype=np.int64)
    link_res = np.empty(L + len(lg), dtype=np.int64)
    link_res[link_res_ptr[:-1]] = np.arange(L)
    if len(lg):
        owner = np.repeat(np.arange(L), np.diff(lg_ptr))
        link_res[np.arange(len(lg)) + owner + 1] = L + lg
    return res_cap, rank_cres, link_res_ptr, link_res


def _block_routes(gtb, si, p_link, link_res_ptr, link_res, L: int, bres0: int, n: int):
    """Routes under a per-block limit: one per sending thread block and link, its link's resources
    then the block's own (resource ``bres0 + block``); returns the routes (CSR) and each
    primitive's route."""
    skeys = gtb[si] * max(L, 1) + p_link[si]
    ukeys_r, rinv = np.unique(skeys, return_inverse=True)
    r_tb, r_link = ukeys_r // max(L, 1), ukeys_r % max(L, 1)
    llen = np.diff(link_res_ptr)[r_link]
    route_res_ptr = np.r_[0, np.cumsum(llen + 1)].astype(np.int64)
    route_res = np.empty(int(route_res_ptr[-1]), np.int64)
    own = np.repeat(np.arange(len(ukeys_r)), llen)
    j = np.arange(len(own)) - np.repeat(np.cumsum(llen) - llen, llen)   # position in the link's list
    route_res[route_res_ptr[:-1][own] + j] = link_res[link_res_ptr[r_link][own] + j]
    route_res[route_res_ptr[1:] - 1] = bres0 + r_tb
    p_route = np.full(n, -1, dtype=np.int64)
    p_route[si] = rinv
    return route_res_ptr, route_res, p_route


def _private_resources(res_cap: np.ndarray, gtb: np.ndarray, sends: np.ndarray, routes: np.ndarray,
                       route_res_ptr: np.ndarray, route_res: np.ndarray, reduces: np.ndarray,
                       cres: np.ndarray, link_res_ptr: np.ndarray, link_res: np.ndarray,
                       block_cap: float) -> np.ndarray:
    """Per resource (of capacities ``res_cap``): it never saturates unless another resource of
    all its flows saturates with or before it, so taking it as a cap on its flows' rates leaves
    max-min's rates as they are. That holds for a resource

    1. held by the flows of at most one thread block (sending primitives ``sends`` over
       ``routes``; reducing primitives ``reduces`` on their rank's resource ``cres``): it
       saturates exactly when its one flow reaches its capacity;
    2. a link with a shared group of at most its capacity (``link_res``: every flow over the
       link crosses the link's groups, so the group carries at least the link's load);
    3. whose holders cannot fill it: a thread block runs one flow at a time, a send at most at
       its block resource's ``block_cap``, so holders x ``block_cap`` within the capacity (with
       no per-block limit, ``block_cap`` is infinite and this never holds)."""
    R = len(res_cap)
    lens = np.diff(route_res_ptr)[routes]
    own = np.repeat(np.arange(len(routes)), lens)
    at = np.repeat(route_res_ptr[:-1][routes], lens) + np.arange(len(own)) - np.repeat(np.cumsum(lens) - lens, lens)
    rc = cres[reduces]
    res = np.concatenate([route_res[at], rc[rc >= 0]]).astype(np.int64)
    tbs = np.concatenate([gtb[sends][own], gtb[reduces][rc >= 0]]).astype(np.int64)
    capped = np.concatenate([np.full(len(own), block_cap), np.full(int((rc >= 0).sum()), np.inf)])
    G = int(gtb.max()) + 1 if len(gtb) else 1
    key, first = np.unique(res * G + tbs, return_index=True)
    users = np.bincount(key // G, minlength=R)
    most = np.bincount(key // G, weights=capped[first], minlength=R)   # inf where a reduction holds it
    private = (users <= 1) | (most <= res_cap)
    L = len(link_res_ptr) - 1
    if L and len(link_res) > L:
        owner = np.repeat(np.arange(L), np.diff(link_res_ptr))
        groups = link_res != owner                      # a link's list: itself, then its groups
        least = np.full(L, np.inf)
        np.minimum.at(least, owner[groups], res_cap[link_res[groups]])
        private[:L] |= least <= res_cap[:L]
    return private


@dataclass(frozen=True)
class FlowClasses:
    """Flows that max-min always gives one rate: the same shared resources and the same cap.
    ``route_cls`` per sending route (``p_route``), ``rank_cls`` per rank's reductions (-1: not
    modelled); a class's shared resources are ``sh[ptr[c]:ptr[c+1]]`` (sorted), its ``cap`` the
    least capacity of its private resources (infinite where it has none); ``width`` the most
    shared resources of a class (at least 1)."""

    route_cls: np.ndarray
    rank_cls: np.ndarray
    ptr: np.ndarray
    sh: np.ndarray
    cap: np.ndarray
    width: int


def flow_classes(route_res_ptr: np.ndarray, route_res: np.ndarray, rank_cres: np.ndarray,
                 res_cap: np.ndarray, private: np.ndarray) -> FlowClasses:
    """The classes of the sending routes (CSR ``route_res_ptr``/``route_res``) and of every
    rank's reductions (its resource ``rank_cres``, -1 where none), by their shared resources
    (not ``private``) and the least capacity of their private ones."""
    nrt = len(route_res_ptr) - 1
    red = np.flatnonzero(rank_cres >= 0)
    lens = np.r_[np.diff(route_res_ptr), np.ones(len(red), np.int64)].astype(np.int64)
    res = np.r_[route_res, rank_cres[red]].astype(np.int64)
    owner = np.repeat(np.arange(len(lens)), lens)
    priv = private[res]
    cap = np.full(len(lens), np.inf)
    np.minimum.at(cap, owner[priv], res_cap[res[priv]])
    nsh = np.bincount(owner[~priv], minlength=len(lens))
    W = max(1, int(nsh.max()) if len(nsh) else 1)
    # a row per route: its shared resources sorted (padded with -1), then its cap's bits
    rows = np.full((len(lens), W + 1), -1, np.int64)
    order = np.lexsort((res[~priv], owner[~priv]))
    so, sr = owner[~priv][order], res[~priv][order]
    pos = np.arange(len(so)) - np.repeat(np.cumsum(nsh) - nsh, nsh)
    rows[so, pos] = sr
    rows[:, W] = cap.view(np.int64)
    uniq, inv = np.unique(rows, axis=0, return_inverse=True)
    inv = inv.reshape(-1).astype(np.int64)
    ucnt = (uniq[:, :W] >= 0).sum(axis=1)
    ptr = np.r_[0, np.cumsum(ucnt)].astype(np.int64)
    sh = uniq[:, :W][uniq[:, :W] >= 0].astype(np.int64)
    rank_cls = np.full(len(rank_cres), -1, np.int64)
    rank_cls[red] = inv[nrt:]
    return FlowClasses(route_cls=inv[:nrt], rank_cls=rank_cls, ptr=ptr, sh=sh,
                       cap=uniq[:, W].copy().view(np.float64), width=W)


@dataclass(frozen=True)
class Geometry:
    """Buffer geometry for one size, as the kernels compute it (``hccc_ctx_init``)."""

    nbytes: int             # the collective's full buffer (nccl-tests' "size")
    count: int              # elements in the full buffer
    element_bytes: int
    slice_elems: int        # elements per micro-batch slice (chunk_bytes / element size)
    nmb: int                # micro-batches
    chunk_len: np.ndarray   # elements per chunk of the full buffer


def geometry(nbytes: int, nchunks: int, chunk_bytes: int,
             element_bytes: int = DEFAULT_ELEMENT_BYTES) -> Geometry:
    """Chunk c covers elements [c*count//nchunks, (c+1)*count//nchunks); slices of
    ``chunk_bytes // element_bytes`` elements; ``nmb = max(1, ceil(ceil(count/nchunks) / slice))``."""
    if nbytes < 0 or element_bytes < 1 or chunk_bytes < 1 or nchunks < 1:
        raise ValueError("sizes must be positive")
    count = int(nbytes) // int(element_bytes)
    bounds = np.arange(nchunks + 1, dtype=np.int64) * count // nchunks
    chunk_len = np.diff(bounds).astype(np.int64)
    maxc = -(-count // nchunks)
    slice_elems = max(1, int(chunk_bytes) // int(element_bytes))
    nmb = max(1, -(-maxc // slice_elems))
    return Geometry(int(nbytes), count, int(element_bytes), slice_elems, nmb, chunk_len)


def _run_elements(geo: Geometry, first: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Elements of chunks ``first .. first+cnt-1`` of the full buffer (indices wrap around)."""
    C = len(geo.chunk_len)
    clen = np.r_[0, np.cumsum(geo.chunk_len)]

    def prefix(x):
        return (x // C) * clen[C] + clen[x % C]
    first = np.asarray(first, np.int64)
    return prefix(first + np.asarray(cnt, np.int64)) - prefix(first)


def send_bytes(prog: SimProgram, geo: Geometry) -> np.ndarray:
    """Bytes each primitive sends over its link in the whole run (0 for non-sending primitives)."""
    cnt = prog.p_cnt
    total = np.zeros(prog.nprims, dtype=np.float64)
    elems = _run_elements(geo, prog.p_chunk, cnt)   # consecutive chunks chunk .. chunk+cnt-1
    m = (prog.p_flags & F_SEND) > 0
    total[m] = elems[m] * geo.element_bytes
    return total


def reduce_bytes(prog: SimProgram, geo: Geometry) -> np.ndarray:
    """Bytes each primitive reduces in the whole run (0 for non-reducing primitives)."""
    elems = _run_elements(geo, prog.p_chunk, prog.p_cnt)
    out = np.zeros(prog.nprims, dtype=np.float64)
    m = (prog.p_flags & F_REDUCE) > 0
    out[m] = elems[m] * geo.element_bytes
    return out


def resource_bytes(prog: SimProgram, geo: Geometry) -> np.ndarray:
    """Bytes that cross every resource in the whole run (links, groups, reduction units)."""
    R = len(prog.res_cap)
    out = np.zeros(R, dtype=np.float64)
    sb = send_bytes(prog, geo)
    m = prog.p_link >= 0
    per_link = np.bincount(prog.p_link[m], weights=sb[m], minlength=prog.nlinks)
    lens = np.diff(prog.link_res_ptr)
    owner = np.repeat(np.arange(prog.nlinks), lens)
    np.add.at(out, prog.link_res, per_link[owner])
    rb = reduce_bytes(prog, geo)
    cres = prog.rank_cres[prog.p_rank]
    mr = (rb > 0) & (cres >= 0)
    np.add.at(out, cres[mr], rb[mr])
    if prog.block_gbps is not None:      # each TB's sends cross its block resource
        bres0 = prog.nlinks + prog.ngroups + prog.nranks
        gtb = np.repeat(np.arange(prog.ntbs), np.diff(prog.tb_ptr))
        np.add.at(out, bres0 + gtb[m], sb[m])
    return out


def lower_bound(prog: SimProgram, geo: Geometry) -> float:
    """A schedule-independent lower bound on the completion time (seconds).

    Every resource carries its bytes at no more than its capacity; on a link the last byte then
    still needs the link's latency to reach the receiver, which must see it before it finishes.
    A thread block runs one thing at a time: every unit's fixed cost (``p_unit``, once a primitive
    and micro-batch), then its flows, so it takes at least its fixed costs plus its sends' bytes at
    its block resource's capacity (where there is a per-block limit)."""
    rb = resource_bytes(prog, geo)
    t = rb / prog.res_cap
    L = prog.nlinks
    t[:L] = np.where(rb[:L] > 0, t[:L] + prog.link_alpha, 0.0)
    if prog.p_unit is not None and prog.nprims:
        gtb = np.repeat(np.arange(prog.ntbs), np.diff(prog.tb_ptr))
        fixed = np.bincount(gtb, weights=prog.p_unit, minlength=prog.ntbs) * geo.nmb
        if prog.block_gbps is not None:
            bres0 = prog.nlinks + prog.ngroups + prog.nranks
            t[bres0:bres0 + prog.ntbs] += fixed
        else:
            t = np.r_[t, fixed]
    return float(t.max()) if len(t) else 0.0
