"""How a program's units compose into its time on a GPU: the composition half of the kernels' cost
model (:mod:`hccc.compiler.passes.kernel_cost` holds the costs and says the model whole).

A unit of an op costs its fixed part plus its loads (:func:`unit_seconds`: the reads per byte
moved :mod:`hccc.runtime.kernel_traffic` counts); a program's units form a graph
(:func:`unit_graph`: a block's order, dependencies and messages one hop each, slot back-pressure
one hop back, ``abi.NSLOTS`` slots a connection), and a call takes the launch plus the longest
path through it, or the HBM bound if longer (:func:`program_time`). A receive group the kernels
being modelled run as N-source units (:mod:`hccc.compiler.ir.reduce_groups`; :func:`group_units`:
the GPU kernels under LL, not the table mode's generic kernels) is one unit a micro-batch
(:func:`merge_groups`), elsewhere its rows one by one, as those kernels run them: a RECV_REDUCE_COPY unit's fixed cost (one round of waits, one post) and
the loads of its ``k`` received regions and its source, every message into it one hop. Under LL,
a fused LL chain (:func:`ll_chains`: consecutive fused primitives of a block on one pair of
connections, at most ``NSLOTS`` units, which the data threads run line by line, handed over once)
costs its lines' loads at every unit, and its hand-over one unit's fixed cost after the block's
previous unit (or the launch), which it waits for no data to take: its units wait for no barrier,
fence or sync lane, so a line's path through a rank is a hop and the line's move (a structural
reading of the engine, not a measurement, where the kernels decode the program into a primitive
table, :func:`chain_units`: the chain's links are its entries, marked by codegen,
``hccc_pd::chain``). The CPU emulation's, the CUDA and the HIP kernels all run chains
(:data:`hccc.compiler.ir.ll_chains.CHAIN_PLATFORMS`), so the model's chains are every build's. It lives in the runtime
layer because it counts the kernels' traffic as the emitted kernels move it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hccc.compiler.backend.abi import NSLOTS
from hccc.compiler.ir.ll_chains import CHAIN_PIECES, CHAIN_PRIMS
from hccc.compiler.ir.program_ir import Op
from hccc.compiler.passes.kernel_cost import LL_DATA_FRACTION, KernelCosts, unit_class
from hccc.runtime.kernel_traffic import DIRECT_COST, HBM_COST, prim_bytes, traffic

__all__ = ["MAX_UNITS", "CHAIN_PRIMS", "CHAIN_PIECES", "GROUP_UNIT_PROTOS", "unit_seconds", "ProgramTime",
           "unit_graph", "ll_chains", "chain_units", "group_units", "merge_groups", "program_time", "call_time", "ll_ahead_up_to", "LL_CROSSOVER_SIZES"]

#: The most units (primitives x micro-batches) :func:`program_time` composes: its graph's memory and
#: time grow with them (about 100 bytes and a microsecond a unit); a call past it is refused.
MAX_UNITS = 20_000_000


def unit_seconds(costs: KernelCosts, op: int, moved: float, warps: float, proto: str = "simple", *,
                 direct: bool = False, sources: int = 1) -> float:
    """One unit, at ``costs``, of ``op`` (an :class:`Op` code) moving ``moved`` payload bytes on a block of
    ``warps`` warps under ``proto``: its fixed cost plus its loads' time (reads per byte
    moved as ``kernel_traffic`` counts them; ``direct``: a receive proven direct-safe, whose
    data the sender wrote; an LL line carries :data:`LL_DATA_FRACTION` of data). ``sources``: the
    receives an N-source unit reduces (a receive group of that many rows; each received region
    past the first is one more read per byte)."""
    from hccc.runtime.kernel_traffic import DIRECT_COST, HBM_COST
    reads = (DIRECT_COST if direct else HBM_COST)[Op(int(op))][0] + max(0, int(sources) - 1)
    loads = moved * reads / (LL_DATA_FRACTION if proto == "ll" else 1.0)
    return costs.fixed_seconds(unit_class(op), warps, proto) + costs.bytes_seconds(loads, warps)


@dataclass(frozen=True)
class ProgramTime:
    """One call's predicted time (seconds) and its parts: ``launch``, ``path`` (the longest chain
    of units and hops), ``hbm`` (the HBM bound), ``units`` on the longest path, ``hops`` on it,
    ``waits`` (back-pressure edges on it), ``blocks``, ``warps``, ``micro_batches``, ``slice``."""

    total: float
    launch: float
    path: float
    hbm: float
    units: int
    hops: int
    waits: int
    blocks: int
    warps: int
    micro_batches: int
    slice: int


def unit_graph(program, m: int, nslots: int | None = NSLOTS):
    """The units of ``program`` at ``m`` micro-batches a primitive as a graph: node ``p * m + i`` is
    micro-batch ``i`` of primitive ``p``; returns ``(nodes, src, dst, kind, m)`` with ``kind`` 0 for a
    block's order (no hop), 1 for a dependency or a message (a hop) and 2 for slot back-pressure
    (a hop back from the receiver to the sender, ``nslots`` messages later on the connection;
    ``None``: no back-pressure)."""
    from hccc.compiler.passes.slicing import primitive_graph
    n, src, dst, is_tb = primitive_graph(program)
    m = int(m)
    i = np.arange(m, dtype=np.int64)
    edges = []
    # within a primitive: micro-batch i before i + 1
    p = np.arange(n, dtype=np.int64)
    if m > 1:
        a = (p[:, None] * m + i[None, :-1]).ravel()
        edges.append((a, a + 1, np.zeros(len(a), np.int64)))
    # a block's order: the next primitive's first micro-batch after this one's last
    ts, td = src[is_tb], dst[is_tb]
    edges.append((ts * m + m - 1, td * m, np.zeros(len(ts), np.int64)))
    # dependencies and messages: micro-batch i after micro-batch i
    os_, od = src[~is_tb], dst[~is_tb]
    a = (os_[:, None] * m + i[None, :]).ravel()
    b = (od[:, None] * m + i[None, :]).ravel()
    edges.append((a, b, np.ones(len(a), np.int64)))
    if nslots:
        from hccc.compiler.passes.slicing import matched_messages
        for snd, rcv in matched_messages(program):      # one connection's messages, in order
            snd = (snd[:, None] * m + i[None, :]).ravel()
            rcv = (rcv[:, None] * m + i[None, :]).ravel()
            k = len(snd)
            if k > nslots:
                edges.append((rcv[:k - nslots], snd[nslots:], np.full(k - nslots, 2, np.int64)))
    es = np.concatenate([e[0] for e in edges])
    ed = np.concatenate([e[1] for e in edges])
    ek = np.concatenate([e[2] for e in edges])
    return n * m, es, ed, ek, m


def ll_chains(program, m: int) -> list[range]:
    """The fused LL chains the engine forms at ``m`` micro-batches a primitive, as row ranges: the
    rows codegen marks (:func:`hccc.compiler.ir.ll_chains.chain_rows`: fused primitives of
    :data:`CHAIN_PIECES` chunk, awaiting no dependency and awaited by none, in runs
    on one block's receive and send connections) cut into chains of ``min(CHAIN_PRIMS, NSLOTS //
    m)`` rows, none past ``NSLOTS`` micro-batches (:func:`~hccc.compiler.ir.ll_chains.chain_pieces`,
    ``hccc_chain_enter``). The launch-wide conditions are :func:`chain_units`'; under AVG of a
    floating type the engine forms none (the model has no operator and does not see it)."""
    from hccc.compiler.ir.ll_chains import chain_pieces, chain_rows
    return chain_pieces(chain_rows(program), m, NSLOTS)


def chain_units(program, proto: str, table: bool = False) -> bool:
    """Whether the kernels that run ``program`` under ``proto`` form fused LL chains: under LL, in
    kernels with a decoded primitive table (:func:`hccc.compiler.backend.prim_table.ptable_prims`:
    the chain's links are its entries; not the table mode's generic kernels, ``table``, nor a
    program that takes the per-primitive load), not an AllToAll program's (its engine has no chain
    code, ``hccc_chains_of``: its templates are rounds of the counts)."""
    from hccc.compiler.backend.prim_table import ptable_prims
    from hccc.compiler.frontend.collectives import spec_of
    return (proto == "ll" and not spec_of(program.collective).per_pair_counts
            and ptable_prims(program, no_table=table) > 0)


#: the protocols under which the GPU kernels run a receive group as N-source units: LL only (the
#: engine's HCCC_GROUP_SIMPLE is 0 in a GPU build, where a Simple group's rows run one by one; the
#: CPU emulation, which the model does not time, forms them under both)
GROUP_UNIT_PROTOS = ("ll",)


def group_units(proto: str, table: bool = False) -> bool:
    """Whether the GPU kernels that run a program under ``proto`` (the launch's protocol, ``simple``
    or ``ll``: the caller's, which it resolved as the launch does) run its receive groups as N-source
    units: under :data:`GROUP_UNIT_PROTOS`, and not in the table mode's generic kernels (``table``:
    the program runs from its table; their engine is built with HCCC_GROUP_UNITS 0, hccc_table.h),
    where every row is a unit of its own."""
    return proto in GROUP_UNIT_PROTOS and not table


def merge_groups(program, m: int, src, dst, kind, groups):
    """The unit graph with each receive group's rows run as one unit a micro-batch: micro-batch
    ``i`` of every row of a group becomes micro-batch ``i`` of its first row (the messages into the
    rows, their slots' back-pressure and the dependencies on its last row then meet one node), and
    the block order between the group's rows is gone. Returns ``(src, dst, kind)``; the other rows'
    nodes are left without edges."""
    if not groups:
        return src, dst, kind
    n = int(program.nprims)
    head = np.arange(n, dtype=np.int64)
    for s, k in groups:
        head[s:s + k] = s
    pa, pb = src // m, dst // m
    keep = ~((head[pa] == head[pb]) & (pa != pb))      # the order between a group's rows
    src, dst, kind = src[keep], dst[keep], kind[keep]
    return head[src // m] * m + src % m, head[dst // m] * m + dst % m, kind


def program_time(program, nbytes: int, costs: KernelCosts, *, slice_bytes: int, warps: int, proto: str = "simple",
                 element_bytes: int = 4, nslots: int | None = None, direct: bool = True,
                 one_gpu: bool = True, table: bool = False) -> ProgramTime:
    """The predicted time of one call of ``program`` (a ProgramIR, with its ``nchannels``) on a
    full buffer of ``nbytes``, in slices of ``slice_bytes``, on blocks of ``warps`` warps
    (module docstring). ``direct``: the receives :mod:`hccc.compiler.ir.direct` proves safe take
    their data from the sender (``--direct auto``, single-process launches; Simple only);
    ``nslots``: FIFO slots a connection (default the costs'; 0: no back-pressure). The HBM bound
    counts ``kernel_traffic``'s bytes (LL's slots twice over). ``one_gpu``: every rank on one GPU,
    as the recorded runs placed them (the launch is every rank's blocks, the HBM bound every
    rank's bytes); False: one rank per GPU, as a job of processes runs (the torch backend, a
    Communicator): the launch is the most blocks one rank has, the HBM bound one rank's share.
    ``table``: the program runs in the table mode's generic kernels (``proto`` and ``table`` say
    which kernels are modelled: a receive group is one N-source unit where :func:`group_units`
    says those kernels form them, else its rows one by one)."""
    from hccc.compiler.passes.slicing import micro_batches

    k = max(1, int(getattr(program, "nchannels", 1) or 1))
    m = micro_batches(int(nbytes), int(program.nchunks), int(slice_bytes), int(element_bytes))
    if int(program.nprims) * m > MAX_UNITS:
        raise ValueError(f"{program.name}: {int(program.nprims)} primitives x {m} micro-batches = "
                         f"{int(program.nprims) * m:,} units, more than the model composes ({MAX_UNITS:,}): "
                         f"use larger slices")
    slots = (NSLOTS if costs.nslots is None else costs.nslots) if nslots is None else nslots
    moved = prim_bytes(program, int(nbytes), int(element_bytes)).astype(np.float64) / m / k
    ops = program.prims["op"].astype(np.int64)
    use_direct = direct and proto == "simple"
    if use_direct:
        from hccc.compiler.ir.direct import direct_safe
        is_direct = np.asarray(direct_safe(program), dtype=bool)
    else:
        is_direct = np.zeros(len(ops), dtype=bool)
    pairs = set(zip(program.prims["rank"].tolist(), program.prims["tb"].tolist()))
    blocks = len(pairs) * k
    tr = traffic(program, int(nbytes), int(element_bytes), direct=use_direct)
    hbm_bytes = tr.hbm + (2 * tr.link if proto == "ll" else 0)
    t_hbm = float(hbm_bytes) / costs.hbm_bytes_per_s
    launched = blocks
    if not one_gpu:
        per_rank = np.bincount(np.array([r for r, _ in pairs], dtype=np.int64)) if pairs else np.zeros(1, np.int64)
        launched = int(per_rank.max()) * k
        t_hbm /= max(1, int(program.nranks))
    from hccc.compiler.ir.reduce_groups import reduce_groups
    groups = (reduce_groups(program, np.where(is_direct, 2, 0) if is_direct.any() else None)
              if group_units(proto, table) else [])
    sources = np.ones(len(ops), np.int64)
    for s, g in groups:
        sources[s] = g
        sources[s + 1:s + g] = 0          # (run inside the first row's units)
    cost = np.array([unit_seconds(costs, int(o), float(b), warps, proto, direct=bool(d), sources=int(c)) if c else 0.0
                     for o, b, d, c in zip(ops.tolist(), moved.tolist(), is_direct.tolist(), sources.tolist())])
    nodes, src, dst, kind, m = unit_graph(program, m, slots or None)
    src, dst, kind = merge_groups(program, m, src, dst, kind, groups)
    node_cost = np.repeat(cost, m)
    ready = extra = None
    if proto == "ll":
        # a chain's units: their lines; its hand-over: one unit's fixed cost after the block's
        # previous unit, or from the launch
        fixed = np.array([costs.fixed_seconds(unit_class(int(o)), warps, proto) for o in ops.tolist()])
        ready = np.zeros(nodes)
        extra = np.zeros(len(src))
        for ch in (ll_chains(program, m) if chain_units(program, proto, table) else []):
            rows = np.arange(ch.start, ch.stop, dtype=np.int64)
            at = (rows[:, None] * m + np.arange(m, dtype=np.int64)[None, :]).ravel()
            node_cost[at] -= fixed[at // m]
            head = ch.start * m
            ready[head] = fixed[ch.start]
            extra[(dst == head) & (kind == 0) & (src // m != ch.start)] = fixed[ch.start]
    finish, hops, units, waits = _longest(nodes, src, dst, kind, node_cost, costs.hop_seconds(), ready, extra)
    launch = costs.launch_seconds(launched)
    return ProgramTime(total=launch + max(finish, t_hbm), launch=launch, path=finish, hbm=t_hbm, units=units,
                       hops=hops, waits=waits, blocks=blocks, warps=int(warps), micro_batches=m,
                       slice=int(slice_bytes))


def _longest(nodes: int, src, dst, kind, cost, hop: float, ready=None, extra=None):
    """The longest path's finish time through the unit graph (Kahn's levels), and on it the hops,
    the units and the back-pressure edges; ``ready``: a node's earliest start (None: 0), ``extra``:
    an edge's latency beyond its hop (None: none). A cycle (a program that cannot run with these
    slots) raises ValueError."""
    if nodes == 0:
        return 0.0, 0, 0, 0
    lat = np.where(kind > 0, hop, 0.0) + (0.0 if extra is None else extra)
    o = np.argsort(src, kind="stable")
    e_dst, e_lat, e_kind = dst[o], lat[o], kind[o]
    ptr = np.zeros(nodes + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=nodes), out=ptr[1:])
    indeg = np.bincount(dst, minlength=nodes).astype(np.int64)
    start = np.zeros(nodes) if ready is None else np.array(ready, dtype=np.float64)
    # on the path into each node: (hops, units, waits) of its latest predecessor
    hops = np.zeros(nodes, np.int64)
    nunits = np.ones(nodes, np.int64)
    waits = np.zeros(nodes, np.int64)
    frontier = np.flatnonzero(indeg == 0)
    finish = np.zeros(nodes)
    seen = 0
    while len(frontier):
        seen += len(frontier)
        finish[frontier] = start[frontier] + cost[frontier]
        lo, cnt = ptr[frontier], ptr[frontier + 1] - ptr[frontier]
        tot = int(cnt.sum())
        if not tot:
            break
        e = np.repeat(lo, cnt) + (np.arange(tot, dtype=np.int64) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        u = np.repeat(frontier, cnt)
        v = e_dst[e]
        t = finish[u] + e_lat[e]
        # the latest predecessor of each target wins (ties: any)
        order = np.lexsort((t, v))
        v_o, t_o, u_o, e_o = v[order], t[order], u[order], e[order]
        last = np.r_[v_o[1:] != v_o[:-1], True]
        vv, tt, uu, ee = v_o[last], t_o[last], u_o[last], e_o[last]
        better = tt > start[vv]
        vb, ub, eb = vv[better], uu[better], ee[better]
        start[vb] = tt[better]
        hops[vb] = hops[ub] + (e_kind[eb] > 0)
        nunits[vb] = nunits[ub] + 1
        waits[vb] = waits[ub] + (e_kind[eb] == 2)
        uq, c = np.unique(v, return_counts=True)
        indeg[uq] -= c
        frontier = uq[indeg[uq] == 0]
    if seen != nodes:
        raise ValueError("the program's units form a cycle with these slots: it cannot run")
    end = int(np.argmax(finish))
    return float(finish[end]), int(hops[end]), int(nunits[end]), int(waits[end])


def call_time(program, nbytes: int, costs: KernelCosts, proto: str, *, table: bool = False) -> ProgramTime:
    """One call of ``program`` as a job of processes runs it (a Communicator, the torch backend):
    one rank per GPU, the launchers' slice under ``proto`` (the launch's protocol, resolved)
    (:func:`hccc.runtime.rank_memory.launch_slice_bytes`), the program's warps, no direct mode, in
    its specialised kernels (``table``: the table mode's generic kernels)."""
    from hccc.runtime.rank_memory import launch_slice_bytes
    sl = launch_slice_bytes(program, int(nbytes), 4, program.chunk_bytes, proto)
    return program_time(program, int(nbytes), costs, slice_bytes=sl, warps=program.nwarps, proto=proto,
                        direct=False, one_gpu=False, table=table)


#: the sizes (full buffer, bytes) :func:`ll_ahead_up_to` weighs: powers of two from 4 KiB to 64 MiB
LL_CROSSOVER_SIZES = tuple(1 << e for e in range(12, 27))


def ll_ahead_up_to(programs, costs: KernelCosts, sizes=LL_CROSSOVER_SIZES) -> int:
    """The largest of ``sizes`` up to which (at it and every smaller one) every one of ``programs``
    runs faster under LL than under Simple by the model (:func:`call_time`); 0 when LL is behind at
    the smallest. ``--proto auto``'s switch (``abi.LL_AUTO_MAX_BYTES``) is this for the ring
    AllReduce and AllGather of 8 ranks at the measured costs (tests/test_kernel_cost.py)."""
    best = 0
    for n in sorted(int(x) for x in sizes):
        if not all(call_time(p, n, costs, "ll").total < call_time(p, n, costs, "simple").total for p in programs):
            break
        best = n
    return best
