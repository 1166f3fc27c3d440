"""The simulator's event loop: columnar arrays in, completion times and busy times out.

The functions are plain Python that numba compiles for large simulations
(:mod:`hccc.util.jit`: from :data:`MIN_COMPILED_WORK` events and classes re-shared, when numba, the
extra ``sim``, is installed); :func:`run` picks the variant. Everything here works on
flat numpy arrays prepared by :mod:`hccc.runtime.sim_model`; the model itself (what a thread block
does, how bandwidth is shared) is documented in :mod:`hccc.runtime.simulator`.

Data layout (G thread blocks, P primitives, C connections, R resources, NCL flow classes):

* a TB ``g`` owns primitives ``tb_ptr[g] .. tb_ptr[g+1]-1`` and runs them in that order;
* primitive flags ``1`` send, ``2`` receive, ``4`` reduce; connection ids, FIFO positions
  (``spos``/``rpos``: messages posted earlier on the connection by the TB; a primitive posts one
  message, one slot, per micro-batch, holding the slices of all its chunks, as the kernels do),
  ``cnt`` chunks, the anchor
  chunk that sizes its slices, the rank (for its reduction resource) and the link it sends over;
* cross-TB dependencies as CSR ``dep_ptr``/``dep_on``; ``rdep_ptr``/``rdep_tb`` lists, for every
  primitive, the TBs whose primitives wait for it (so they can be woken);
* a *flow* is the bandwidth phase of a slot write (over its route: the link, its shared groups
  and, with the per-block limit, its TB's block resource) or of a reduction (over the rank's
  reduction resource). A TB runs at most one flow at a time, so flows are indexed by TB;
* flows over routes with the same shared resources and the same cap form a *class*
  (:func:`hccc.runtime.sim_model.flow_classes`: ``route_cls``, ``rank_cls``; its shared resources
  ``cls_sh[cls_ptr[c]:cls_ptr[c+1]]``, its cap ``cls_cap[c]``), which max-min gives one rate. A
  class counts its member flows (``cls_n``); every resource counts its flows (``res_n``, for its
  busy time and a shared one for the sharing), and the classes with members are listed, swapped
  out when they empty, per part and per shared resource (:func:`_cls_on`), for the sharing to
  visit only those.

Events live in one indexed binary heap over items ``0..NCL-1`` (the next completion of a member
of class ``c``) and ``NCL..NCL+C-1`` (the next pending slot of connection ``c`` becoming visible
to its receiver). Each class keeps its running members in a heap of its own (slots
``moff[c]..moff[c+1]-1`` of one array) keyed by the bytes left to each at the class's time
``cls_vt``: every member runs at the class's rate, so the order of their completions is fixed
while they run, and a change of rate re-times one event-heap item, not every member (the keys
are brought up to the time of the change in one pass, without reordering); where the change moves
the class's completion later, its earlier key stays until it comes first, and is then moved on to
the completion (:func:`_settle_top`), so a class whose rate falls and rises again between two of
its completions costs the heap nothing for the fall. All events of one
instant are processed before bandwidth shares are recomputed, once per part (a connected
component of the shared resources over all the program's classes) touched: progressive filling
over classes, max-min fair, over the part's lists of classes with members
(:mod:`hccc.runtime.sim_share`: a part keeps its rates where the changes leave every full
resource as it was and every other below its capacity, and is otherwise filled again from the
least level the changes reach). A unit of work is an event or a class re-shared (one that rose
in a filling).
"""
from __future__ import annotations

import ctypes
import time

import numpy as np

from hccc.util import clock
from hccc.util.jit import Kernels
from hccc.runtime.sim_share import (FREE_SLACK, SATURATED, _cls_advance, _cls_off, _cls_on, _fill_level,  # noqa: F401
                                     _needs_share, _note_count, _parts, _refill_level, _root, _set_rate, _share,
                                     _slots)

#: events plus re-shared flow classes from which a process's simulations run compiled: plain Python takes
#: about a second for this many, numba's first compile of the engine about ten
MIN_COMPILED_WORK = 40_000

F_SEND = 1
F_RECV = 2
F_REDUCE = 4

# TB states
S_READY = 0      # trying to start its current unit (may be blocked)
S_BUSY = 1       # a flow of the current unit is running
S_PHASE = 2      # a phase of the current unit finished; continue with the next phase
S_DONE = 3
S_FIXED = 4      # paying the current unit's fixed cost (a timer runs)

# What a blocked TB waits for (diagnostics)
W_NONE = 0
W_DEP = 1
W_DATA = 2
W_SLOT = 3

# Columns of the event loop's table of primitives (``pr``: a row per primitive)
PR_FLAGS = 0
PR_DEP0 = 1         # its dependencies dep_on[PR_DEP0:PR_DEP1]
PR_DEP1 = 2
PR_RCONN = 3
PR_RPOS = 4
PR_SCONN = 5
PR_SPOS = 6
PR_CHUNK = 7
PR_CNT = 8
PR_LINK = 9
PR_RANK = 10
PR_RDEP0 = 11       # the TBs that wait for it, rdep_tb[PR_RDEP0:PR_RDEP1]
PR_RDEP1 = 12
PR_WIDTH = 16       # int32 columns: one cache line

# Interval kinds recorded for the timeline
K_SEND = 0
K_REDUCE = 1
K_RECV = 2
K_UNIT = 3      # a unit's fixed cost (the kernels' cost model's, before its flows)

STATUS_OK = 0
STATUS_DEADLOCK = 1
STATUS_BUDGET = 2     # the run spent its work budget (a plain run: rerun compiled) or passed its deadline
STATUS_STOPPED = 3    # another thread turned the run's stop switch

_INF = np.inf
#: instants between two looks at the clock of a run with a deadline (a look costs ~20 ns compiled)
#: and at its stop switch
CLOCK_EVERY = 256


def _monotonic_clock():
    """libc's ``clock_gettime`` as a ctypes function, for plain Python (the compiled loop calls the
    C function by its symbol: :func:`_compiled_clock`); None where the platform has none (a run's
    deadline is then not checked)."""
    try:
        fn = ctypes.CDLL(None).clock_gettime
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    return fn


def _compiled_clock():
    from numba.core import types
    return types.ExternalFunction("clock_gettime", types.int32(types.int32, types.intp))


_CLOCK_GETTIME = _monotonic_clock()
_CLOCK_ID = int(getattr(time, "CLOCK_MONOTONIC", 1))
HAVE_CLOCK = _CLOCK_GETTIME is not None

if HAVE_CLOCK:
    def _clock_now(ts):
        """Seconds of the monotonic clock (``ts``: two int64, the timespec it is read into)."""
        _CLOCK_GETTIME(_CLOCK_ID, ts.ctypes.data)
        return ts[0] + ts[1] * 1e-9
else:
    def _clock_now(ts):
        return 0.0


def clock_now() -> float:
    """The clock a run's ``deadline`` is in (:func:`run_engine`)."""
    return float(_clock_now(np.zeros(2, np.int64)))


# ---------------------------------------------------------------------------- indexed heap
def _heap_before(ka, ia, kb, ib):
    """(key, item) ``a`` comes before ``b``: the earlier time, ties by the item."""
    if ka < kb:
        return True
    if ka > kb:
        return False
    return ia < ib


def _heap_put(hkey, hitem, hpos, base, i, k, it):
    """Write entry (key ``k``, item ``it``) at slot ``i`` of the heap stored from ``base``."""
    hkey[base + i] = k
    hitem[base + i] = it
    hpos[it] = i


def _heap_up(hkey, hitem, hpos, base, i):
    """Sift the entry at ``i`` up: its parents move down into the hole it leaves until its
    place is found, where it is written once."""
    k = hkey[base + i]
    it = hitem[base + i]
    while i > 0:
        parent = (i - 1) // 2
        if not _heap_before(k, it, hkey[base + parent], hitem[base + parent]):
            break
        _heap_put(hkey, hitem, hpos, base, i, hkey[base + parent], hitem[base + parent])
        i = parent
    _heap_put(hkey, hitem, hpos, base, i, k, it)


def _heap_down(hkey, hitem, hpos, base, i, n):
    """Sift the entry at ``i`` down, its lesser child moving up into the hole each level."""
    k = hkey[base + i]
    it = hitem[base + i]
    while True:
        best = 2 * i + 1
        if best >= n:
            break
        right = best + 1
        if right < n and _heap_before(hkey[base + right], hitem[base + right], hkey[base + best],
                                      hitem[base + best]):
            best = right
        if not _heap_before(hkey[base + best], hitem[base + best], k, it):
            break
        _heap_put(hkey, hitem, hpos, base, i, hkey[base + best], hitem[base + best])
        i = best
    _heap_put(hkey, hitem, hpos, base, i, k, it)


def _heap_set(hkey, hitem, hpos, hn, h, base, item, key):
    """Insert ``item`` with ``key`` into heap ``h`` (stored from ``base``, ``hn[h]`` entries;
    ``hpos[item]``: its slot there, -1 when in no heap), or change its key."""
    i = hpos[item]
    if i < 0:
        i = hn[h]
        hn[h] += 1
        _heap_put(hkey, hitem, hpos, base, i, key, item)
        _heap_up(hkey, hitem, hpos, base, i)
    else:
        old = hkey[base + i]
        hkey[base + i] = key
        if key < old:
            _heap_up(hkey, hitem, hpos, base, i)
        else:
            _heap_down(hkey, hitem, hpos, base, i, hn[h])


def _heap_pop(hkey, hitem, hpos, hn, h, base):
    """Take the least entry out of heap ``h`` and return its item."""
    item = hitem[base]
    last = hn[h] - 1
    hn[h] = last
    hpos[item] = -1
    if last > 0:
        top = np.int64(0)      # not a literal 0: numba would compile the heap again for it
        _heap_put(hkey, hitem, hpos, base, top, hkey[base + last], hitem[base + last])
        _heap_down(hkey, hitem, hpos, base, top, last)
    return item


# ---------------------------------------------------------------------------- flows
def _mark_dirty(p, dirty, dirty_n, dirty_mark, dirty_epoch):
    """List part ``p`` for the next share, once per instant (``dirty_epoch``)."""
    if dirty_mark[p] != dirty_epoch:
        dirty_mark[p] = dirty_epoch
        dirty[dirty_n[0]] = p
        dirty_n[0] += 1


def _member_join(g, c, nbytes, t, cls_rate, cls_vt, mkey, mitem, mpos, mn, moff, retime, retime_n, in_retime):
    """Flow ``g`` of ``nbytes`` joins its class ``c``'s heap of running members at t; the class is
    listed for re-timing (its first member may be new)."""
    _cls_advance(c, t, cls_rate, cls_vt, mkey, mn, moff)
    _heap_set(mkey, mitem, mpos, mn, c, moff[c], g, nbytes)
    if not in_retime[c]:
        in_retime[c] = True
        retime[retime_n[0]] = c
        retime_n[0] += 1


def _flow_start(g, c, res_ids, lo, hi, red, nbytes, t, cls_ptr, cls_sh, cls_n, cls_rate, cls_vt, part_of, sh_slot,
                slot_ptr, slot_cls, slot_inc, slot_n, inc_pos, part_cls_ptr, pact, pact_n, cls_ppos, res_n,
                res_busy_t0, fl_cls, fl_lo, fl_hi, fl_red, fl_start, mkey, mitem, mpos, mn, moff, retime, retime_n,
                in_retime, dirty, dirty_n, dirty_mark, dirty_epoch):
    """Start TB g's flow of ``nbytes`` over resources ``res_ids[lo:hi]`` (``red``: a reduction's,
    on ``rank_cres``) at time t; ``c`` is its class. Every resource counts the flow (busy time,
    and ``res_n`` is how many flows a shared resource's filling divides); the class gains a
    member (in its heap by the bytes left to each at ``cls_vt``; it ends once the class, at
    ``cls_rate``, has carried them), and joins its part's and its shared resources' lists when
    it was empty (:func:`_cls_on`); its part is listed for the share."""
    fl_cls[g] = c
    fl_lo[g] = lo
    fl_hi[g] = hi
    fl_red[g] = red
    fl_start[g] = t
    for k in range(lo, hi):
        r = res_ids[k]
        res_n[r] += 1
        if res_n[r] == 1:
            res_busy_t0[r] = t
    cls_n[c] += 1
    _member_join(g, c, nbytes, t, cls_rate, cls_vt, mkey, mitem, mpos, mn, moff, retime, retime_n, in_retime)
    a = cls_ptr[c]
    if a < cls_ptr[c + 1]:
        if cls_n[c] == 1:
            _cls_on(c, cls_ptr, part_of, cls_sh, sh_slot, slot_ptr, slot_cls, slot_inc, slot_n, inc_pos,
                    part_cls_ptr, pact, pact_n, cls_ppos)
        _mark_dirty(part_of[cls_sh[a]], dirty, dirty_n, dirty_mark, dirty_epoch)


def _flow_stop(g, t, route_res, rank_cres, cls_ptr, cls_sh, cls_n, part_of, sh_slot, slot_ptr, slot_cls, slot_inc,
               slot_n, inc_pos, part_cls_ptr, pact, pact_n, cls_ppos, res_n, res_busy_t0, res_busy, fl_cls, fl_lo,
               fl_hi, fl_red, dirty, dirty_n, dirty_mark, dirty_epoch):
    """TB g's ended flow leaves its resources and its class (and the class its lists when it
    has no member left: :func:`_cls_off`); its part is listed for the share."""
    for k in range(fl_lo[g], fl_hi[g]):
        r = rank_cres[k] if fl_red[g] else route_res[k]
        res_n[r] -= 1
        if res_n[r] == 0:
            res_busy[r] += t - res_busy_t0[r]
    c = fl_cls[g]
    cls_n[c] -= 1
    a = cls_ptr[c]
    if a < cls_ptr[c + 1]:
        if cls_n[c] == 0:
            _cls_off(c, cls_ptr, part_of, cls_sh, sh_slot, slot_ptr, slot_cls, slot_inc, slot_n, inc_pos,
                     part_cls_ptr, pact, pact_n, cls_ppos)
        _mark_dirty(part_of[cls_sh[a]], dirty, dirty_n, dirty_mark, dirty_epoch)
    fl_cls[g] = -1


def _completion(c, cls_rate, cls_vt, mkey, moff):
    """When class ``c``'s first member ends, at the class's rate: its event-heap key (the one
    formula :func:`_retime`, :func:`_settle_top` and the event loop share, so a key moved on is
    the key it would have been given)."""
    return cls_vt[c] + mkey[moff[c]] / cls_rate[c]


def _retime(t, retime, retime_n, in_retime, cls_rate, cls_vt, mkey, mn, moff, hkey, hitem, hpos, hn):
    """After the share of t: the next completion of every class listed (a member joined, or its
    rate changed), in the event heap: when its first member has carried what was left to it."""
    ev = np.int64(0)       # the event heap (heap 0, at 0), not a literal 0 (see _heap_pop)
    for q in range(retime_n[0]):
        c = retime[q]
        in_retime[c] = False
        if mn[c] > 0:
            te = _completion(c, cls_rate, cls_vt, mkey, moff)
            if te < t:
                te = t
            if hpos[c] >= 0 and hkey[hpos[c]] <= te:
                continue        # an earlier key stands, moved on when it comes up (_settle_top)
            _heap_set(hkey, hitem, hpos, hn, ev, ev, c, te)
    retime_n[0] = 0


def _settle_top(NCL, cls_rate, cls_vt, mkey, moff, hkey, hitem, hpos, hn):
    """Move the event heap's first entries on to their classes' completions where :func:`_retime`
    left them early, until the first is due."""
    ev = np.int64(0)
    while hn[0] > 0 and hitem[0] < NCL:
        c = hitem[0]
        te = _completion(c, cls_rate, cls_vt, mkey, moff)
        if te <= hkey[0]:
            return
        _heap_set(hkey, hitem, hpos, hn, ev, ev, c, te)


# ---------------------------------------------------------------------------- the event loop
def run_engine(mode, nslots, nmb, slice_elems, esize, rec_lim,
               tb_ptr, p_flags, p_sconn, p_rconn, p_spos, p_rpos, p_cnt, p_chunk, p_rank, p_link,
               dep_ptr, dep_on, rdep_ptr, rdep_tb,
               c_total, c_stb, c_rtb, c_alpha,
               link_res_ptr, link_res, res_cap, rank_cres, chunk_len,
               route_cls, rank_cls, cls_ptr, cls_sh, cls_cap, p_unit, hop, take_over, budget, deadline, stop):
    """Simulate; see the module docstring for the arrays. ``p_unit``: each primitive's fixed cost
    a unit (seconds, paid once per micro-batch before its flows); ``hop``: what a dependency's
    progress takes to reach the block that waits for it (seconds, at most every ``p_unit`` of a
    primitive depended on: a primitive then has at most one micro-batch whose progress is on its way). ``mode`` 0 = task-level (each primitive
    for every micro-batch before the next), 1 = algorithm-level (every micro-batch runs the TB's
    whole primitive list). Busy intervals of TBs ``0 .. rec_lim-1`` are recorded for the timeline.
    ``budget`` >= 0 stops the run with :data:`STATUS_BUDGET` once events plus flow classes re-shared
    exceed it (-1: no limit), and so does ``deadline`` > 0 once :func:`clock_now` passes it (looked at
    every :data:`CLOCK_EVERY` instants); ``stop``: one int64 that another thread may set, which ends
    the run with :data:`STATUS_STOPPED` (looked at as often as the clock). ``take_over``: a TB's next flow over the resources of the flow it
    just ended, at the same instant, keeps that flow's rate without a re-share (False: every
    flow stops and starts, the reference the tests hold it to). Returns a tuple, unpacked by :func:`hccc.runtime.simulator.simulate`."""
    G = tb_ptr.shape[0] - 1
    P = p_flags.shape[0]
    C = c_total.shape[0]
    R = res_cap.shape[0]
    NS = nslots
    # ---- TB state
    tb_pos = np.empty(G, np.int64)
    for g in range(G):
        tb_pos[g] = tb_ptr[g]
    tb_m = np.zeros(G, np.int64)
    tb_i = np.zeros(G, np.int64)
    tb_state = np.zeros(G, np.int64)
    tb_phase = np.zeros(G, np.int64)
    tb_wait = np.zeros(G, np.int64)
    tb_depok = np.zeros(G, np.bool_)
    tb_ready_t = np.zeros(G, np.float64)
    tb_busy = np.zeros(G, np.float64)
    tb_finish = np.zeros(G, np.float64)
    tb_bytes = np.zeros(G, np.float64)
    tb_spost = np.zeros(G, np.int64)
    tb_rpost = np.zeros(G, np.int64)
    tb_paid = np.zeros(G, np.bool_)      # the current unit's fixed cost is paid
    progress = np.zeros(P, np.int64)
    prog_t = np.zeros(P, np.float64)     # when a primitive's last micro-batch finished
    # ---- connections
    c_head = np.zeros(C, np.int64)      # slots consumed by the receiver
    c_posted = np.zeros(C, np.int64)    # slots the sender has finished writing
    c_tail = np.zeros(C, np.int64)      # slots visible to the receiver
    c_vist = np.zeros(C * NS, np.float64)    # visibility time of post k at k % NS
    c_sstart = np.zeros(C * NS, np.float64)  # start of the sender's write of post k
    # ---- flows, classes and resources
    NCL = cls_cap.shape[0]
    fl_cls = np.full(G, -1, np.int64)
    fl_lo = np.zeros(G, np.int64)
    fl_hi = np.zeros(G, np.int64)
    fl_red = np.zeros(G, np.bool_)
    fl_start = np.zeros(G, np.float64)
    cls_n = np.zeros(NCL, np.int64)
    # a class's rate (one without shared resources runs at its cap), and the time its members'
    # bytes left (their keys in its heap) were brought up to
    cls_rate = np.zeros(NCL, np.float64)
    cls_vt = np.zeros(NCL, np.float64)
    for c in range(NCL):
        if cls_ptr[c] == cls_ptr[c + 1]:
            cls_rate[c] = cls_cap[c]
    # each class's running members in a heap by the bytes left to them: class c's from moff[c],
    # room for every TB with a flow in the class
    moff = np.zeros(NCL + 1, np.int64)
    last_tb = np.full(NCL, -1, np.int64)
    for g in range(G):
        for p in range(tb_ptr[g], tb_ptr[g + 1]):
            for ph in range(2):
                c = -1
                if ph == 0 and (p_flags[p] & F_REDUCE) and rank_cres[p_rank[p]] >= 0:
                    c = rank_cls[p_rank[p]]
                elif ph == 1 and (p_flags[p] & F_SEND):
                    c = route_cls[p_link[p]]
                if c >= 0 and last_tb[c] != g:
                    last_tb[c] = g
                    moff[c + 1] += 1
    for c in range(NCL):
        moff[c + 1] += moff[c]
    mkey = np.empty(moff[NCL], np.float64)
    mitem = np.empty(moff[NCL], np.int64)
    mpos = np.full(G, -1, np.int64)
    mn = np.zeros(NCL, np.int64)
    retime = np.empty(NCL, np.int64)    # classes to re-time after the share of t
    retime_n = np.zeros(1, np.int64)
    in_retime = np.zeros(NCL, np.bool_)
    res_n = np.zeros(R, np.int64)
    res_busy_t0 = np.zeros(R, np.float64)
    res_busy = np.zeros(R, np.float64)
    clock = np.zeros(2, np.int64)       # the timespec the deadline's clock is read into
    # ---- the parts the sharing fills, and their lists of classes with members (:func:`_cls_on`)
    part_of, part_res_ptr, part_res, part_cls_ptr, part_cls = _parts(R, NCL, cls_ptr, cls_sh)
    sh_slot, slot_ptr, slot_cap = _slots(NCL, cls_ptr, cls_sh, res_cap, part_of, part_res_ptr, part_res)
    NPART = part_cls_ptr.shape[0] - 1
    NSLOT = part_res.shape[0]
    slot_cls = np.empty(cls_sh.shape[0], np.int64)
    slot_inc = np.empty(cls_sh.shape[0], np.int64)
    slot_n = np.zeros(NSLOT, np.int64)
    inc_pos = np.zeros(cls_sh.shape[0], np.int64)
    pact = np.empty(part_cls.shape[0], np.int64)
    pact_n = np.zeros(NPART, np.int64)
    cls_ppos = np.zeros(NCL, np.int64)
    dirty = np.empty(NPART, np.int64)
    dirty_n = np.zeros(1, np.int64)
    dirty_mark = np.zeros(NPART, np.int64)
    comp_res = np.empty(NSLOT, np.int64)
    rem = np.zeros(NSLOT, np.float64)
    cnt = np.zeros(NSLOT, np.int64)
    rise = np.zeros(NCL, np.int64)
    rising = np.empty(NCL, np.int64)
    stack = np.empty(NSLOT, np.int64)
    # what the last filling of its part left each shared resource (its use, whether it is full),
    # the order its classes froze in, and the classes whose counts changed since
    # (:func:`_needs_share`, :func:`_share`)
    slot_use = np.zeros(NSLOT, np.float64)
    slot_sat = np.zeros(NSLOT, np.bool_)
    slot_part = np.empty(NSLOT, np.int64)
    for q in range(NPART):
        for k in range(part_res_ptr[q], part_res_ptr[q + 1]):
            slot_part[k] = q
    fill_res = np.empty(NSLOT, np.int64)
    smark = np.zeros(NSLOT, np.int64)
    ord_cls = np.empty(part_cls.shape[0], np.int64)
    ord_rate = np.empty(part_cls.shape[0], np.float64)
    ord_n = np.zeros(NPART, np.int64)
    cls_opos = np.full(NCL, -1, np.int64)
    sx = np.empty(NCL, np.float64)
    sn = np.empty(NCL, np.int64)
    du = np.zeros(NSLOT, np.float64)
    touched = np.empty(NSLOT, np.int64)
    touch_mark = np.zeros(NSLOT, np.int64)
    full_mark = np.zeros(NPART, np.int64)
    chg = np.empty(NCL, np.int64)
    chg_n = np.zeros(1, np.int64)
    chg_old = np.zeros(NCL, np.int64)
    chg_mark = np.zeros(NCL, np.int64)
    chg_next = np.empty(NCL, np.int64)
    part_head = np.full(NPART, -1, np.int64)
    # a flow that ended at t stays on its resources until the worklist of t is done: the TB's next
    # flow over the same resources (``fl_key``: the link, or -1 - rank for a reduction) takes it
    # over at the same rate without a re-share (the set of flows, hence max-min, is unchanged)
    fl_key = np.zeros(G, np.int64)
    fl_pend = np.zeros(G, np.bool_)
    pend = np.empty(G, np.int64)
    # ---- heap over NCL class items (a member's completion) and C visibility items
    NI = NCL + C + G                    # and G timers: a unit's fixed cost, a dependency's hop
    hkey = np.empty(NI, np.float64)
    hitem = np.empty(NI, np.int64)
    hpos = np.full(NI, -1, np.int64)
    hn = np.zeros(1, np.int64)
    # ---- worklist of TBs to (re)try
    wl = np.empty(G, np.int64)
    in_wl = np.zeros(G, np.bool_)
    # ---- recording
    if rec_lim > G:
        rec_lim = G
    units = 0
    for p in range(tb_ptr[rec_lim]):
        units += p_cnt[p] * nmb
    nrec_cap = 3 * units + nmb * tb_ptr[rec_lim] + 1     # and a fixed cost per primitive and micro-batch
    rec_tb = np.zeros(nrec_cap, np.int64)
    rec_prim = np.zeros(nrec_cap, np.int64)
    rec_mb = np.zeros(nrec_cap, np.int64)
    rec_kind = np.zeros(nrec_cap, np.int64)
    rec_t0 = np.zeros(nrec_cap, np.float64)
    rec_t1 = np.zeros(nrec_cap, np.float64)
    # ---- each primitive's fields side by side (a row of ``pr``, columns ``PR_*``): a TB's step
    # reads most of them, from one cache line (int32 columns, rows aligned) instead of a line of
    # each array; the load of that line is the loop's costliest
    # (docs/measurements.md#the-simulators-speed)
    raw = np.zeros((P + 1) * PR_WIDTH, np.int32)
    lead = (64 - raw.ctypes.data % 64) % 64 // 4       # rows start on a cache line
    pr = raw[lead:lead + P * PR_WIDTH].reshape((P, PR_WIDTH))
    for p in range(P):
        pr[p, PR_FLAGS] = p_flags[p]
        pr[p, PR_DEP0] = dep_ptr[p]
        pr[p, PR_DEP1] = dep_ptr[p + 1]
        pr[p, PR_SCONN] = p_sconn[p]
        pr[p, PR_RCONN] = p_rconn[p]
        pr[p, PR_SPOS] = p_spos[p]
        pr[p, PR_RPOS] = p_rpos[p]
        pr[p, PR_CNT] = p_cnt[p]
        pr[p, PR_CHUNK] = p_chunk[p]
        pr[p, PR_RANK] = p_rank[p]
        pr[p, PR_LINK] = p_link[p]
        pr[p, PR_RDEP0] = rdep_ptr[p]
        pr[p, PR_RDEP1] = rdep_ptr[p + 1]
    # counters: [events, share components, share flows, batches, parts whose share was skipped,
    # fillings (their stamp)]
    counters = np.zeros(6, np.int64)

    status, t, nrec = _event_loop(mode, nslots, nmb, slice_elems, esize, rec_lim, take_over, budget, deadline,
                                  stop, counters, clock,
                                  (tb_ptr, tb_pos, tb_m, tb_i, tb_state, tb_phase, tb_wait, tb_depok, tb_ready_t,
                                   tb_busy, tb_finish, tb_bytes, tb_spost, tb_rpost, progress, wl, in_wl, tb_paid,
                                   prog_t),
                                  (pr, dep_on, rdep_tb, chunk_len, p_unit, hop),
                                  (c_total, c_stb, c_rtb, c_alpha, c_head, c_posted, c_tail, c_vist, c_sstart),
                                  (rank_cres, rank_cls, route_cls, link_res_ptr, link_res),
                                  (fl_cls, fl_lo, fl_hi, fl_red, fl_start, fl_key, fl_pend, pend, res_n, res_busy_t0,
                                   res_busy),
                                  (cls_ptr, cls_sh, cls_cap, cls_n, cls_rate, cls_vt, mkey, mitem, mpos, mn, moff,
                                   retime, retime_n, in_retime),
                                  (part_of, part_res_ptr, part_res, part_cls_ptr, sh_slot, slot_ptr, slot_cap,
                                   slot_cls, slot_inc, slot_n, inc_pos, pact, pact_n, cls_ppos, dirty, dirty_n,
                                   dirty_mark, comp_res, rem, cnt, rise, rising, stack, slot_use, slot_sat, slot_part,
                                   fill_res, smark, ord_cls, ord_rate, ord_n, cls_opos, sx, sn, du, touched,
                                   touch_mark, full_mark, chg, chg_n, chg_old, chg_mark, chg_next, part_head),
                                  (hkey, hitem, hpos, hn),
                                  (rec_tb, rec_prim, rec_mb, rec_kind, rec_t0, rec_t1))
    t_end = 0.0
    for g in range(G):
        if tb_state[g] == S_DONE and tb_finish[g] > t_end:
            t_end = tb_finish[g]
    for r in range(R):
        if res_n[r] > 0:
            res_busy[r] += t - res_busy_t0[r]
    return (status, t_end, t, tb_finish, tb_busy, res_busy, tb_state, tb_wait, tb_pos, tb_m,
            counters, rec_tb[:nrec], rec_prim[:nrec], rec_mb[:nrec], rec_kind[:nrec], rec_t0[:nrec],
            rec_t1[:nrec])


def _event_loop(mode, nslots, nmb, slice_elems, esize, rec_lim, take_over, budget, deadline, stop, counters, clock_ts,
                tbs, prims, conns, routes, flows, classes, shares, events, recs):
    """:func:`run_engine`'s event loop over the arrays it made, grouped in tuples by what they hold:
    ``tbs``, the thread blocks: their primitives, where each is, its state and times; the worklist;
    ``prims``, the primitives (``pr``'s rows), their dependencies and the chunks' lengths; ``conns``,
    the connections and their FIFOs; ``routes``, the resources and classes of links and reductions;
    ``flows``, the running flows and the resources they hold; ``classes``, the flow classes, their rates
    and members; ``shares``, the sharing's parts, lists and workspace (:mod:`hccc.runtime.sim_share`);
    ``events``, the event heap; ``recs``, the recorded busy intervals; ``stop``, ``counters`` and
    ``clock_ts`` as in :func:`run_engine`. It allocates nothing, so it is compiled without reference
    counting, as :data:`HELPERS` are: the helpers it calls per event take some forty arrays each, and a
    loop that counts references counts every one up and down around every call (measured on a 64-GPU
    AllReduce simulation:
    docs/archive/measurements-log.md#the-event-loop-without-reference-counts-smaller-slices-guessed-beside-the-longest-sample-29-november-2026-later).
    Returns ``(status, the time it stopped at, intervals recorded)``."""
    (tb_ptr, tb_pos, tb_m, tb_i, tb_state, tb_phase, tb_wait, tb_depok, tb_ready_t, tb_busy, tb_finish, tb_bytes,
     tb_spost, tb_rpost, progress, wl, in_wl, tb_paid, prog_t) = tbs
    (pr, dep_on, rdep_tb, chunk_len, p_unit, hop) = prims
    (c_total, c_stb, c_rtb, c_alpha, c_head, c_posted, c_tail, c_vist, c_sstart) = conns
    (rank_cres, rank_cls, route_cls, link_res_ptr, link_res) = routes
    (fl_cls, fl_lo, fl_hi, fl_red, fl_start, fl_key, fl_pend, pend, res_n, res_busy_t0, res_busy) = flows
    (cls_ptr, cls_sh, cls_cap, cls_n, cls_rate, cls_vt, mkey, mitem, mpos, mn, moff, retime, retime_n,
     in_retime) = classes
    (part_of, part_res_ptr, part_res, part_cls_ptr, sh_slot, slot_ptr, slot_cap, slot_cls, slot_inc, slot_n, inc_pos,
     pact, pact_n, cls_ppos, dirty, dirty_n, dirty_mark, comp_res, rem, cnt, rise, rising, stack, slot_use, slot_sat,
     slot_part, fill_res, smark, ord_cls, ord_rate, ord_n, cls_opos, sx, sn, du, touched, touch_mark, full_mark, chg,
     chg_n, chg_old, chg_mark, chg_next, part_head) = shares
    (hkey, hitem, hpos, hn) = events
    (rec_tb, rec_prim, rec_mb, rec_kind, rec_t0, rec_t1) = recs
    ev = np.int64(0)       # the event heap (heap 0, at 0), not a literal 0 (see _heap_pop)
    G = tb_ptr.shape[0] - 1
    NCL = cls_cap.shape[0]
    NT = NCL + c_total.shape[0]         # the first timer item of the event heap (TB g's: NT + g)
    NS = nslots
    # an int64, not a literal 1: numba would compile every kernel it is passed to once for the
    # literal (the first instant) and again for int64 (the later ones)
    dirty_epoch = np.int64(1)
    wn = 0
    pn = 0
    nrec = 0
    ndone = 0
    for g in range(G):
        if tb_ptr[g + 1] == tb_ptr[g]:
            tb_state[g] = S_DONE
            ndone += 1
        else:
            wl[wn] = g
            wn += 1
            in_wl[g] = True

    t = 0.0
    status = STATUS_OK
    while True:
        # ============================================ process the worklist at time t
        while wn > 0:
            wn -= 1
            g = wl[wn]
            in_wl[g] = False
            while True:
                st = tb_state[g]
                if st == S_BUSY or st == S_DONE or st == S_FIXED:
                    break
                p = tb_pos[g]
                m = tb_m[g]
                i = tb_i[g]
                fl = pr[p, PR_FLAGS]
                if st == S_READY:
                    if not tb_depok[g]:
                        ok = True
                        wake = 0.0      # the latest dependency's progress still on its way here
                        for d in range(pr[p, PR_DEP0], pr[p, PR_DEP1]):
                            q = dep_on[d]
                            if progress[q] < m + 1:
                                ok = False
                                break
                            if progress[q] == m + 1 and prog_t[q] + hop > t and prog_t[q] + hop > wake:
                                wake = prog_t[q] + hop
                        if not ok:
                            tb_wait[g] = W_DEP
                            break
                        if wake > 0.0:
                            tb_wait[g] = W_DEP
                            _heap_set(hkey, hitem, hpos, hn, ev, ev, NT + g, wake)
                            break
                        tb_depok[g] = True
                    rc = -1
                    sc = -1
                    # one slot (message) per primitive and micro-batch: its first chunk waits
                    if fl & F_RECV:
                        rc = pr[p, PR_RCONN]
                        if i == 0:
                            if mode == 0:
                                rpost = pr[p, PR_RPOS] * nmb + m
                            else:
                                rpost = m * c_total[rc] + pr[p, PR_RPOS]
                            if c_tail[rc] <= rpost:
                                tb_wait[g] = W_DATA
                                break
                            tb_rpost[g] = rpost
                    if fl & F_SEND:
                        sc = pr[p, PR_SCONN]
                        if i == 0:
                            if mode == 0:
                                spost = pr[p, PR_SPOS] * nmb + m
                            else:
                                spost = m * c_total[sc] + pr[p, PR_SPOS]
                            if c_head[sc] + NS <= spost:
                                tb_wait[g] = W_SLOT
                                break
                            tb_spost[g] = spost
                    tb_wait[g] = W_NONE
                    if i == 0 and not tb_paid[g] and p_unit[p] > 0.0:
                        # the unit's fixed cost, before its flows (its inputs are here, its slot free)
                        tb_paid[g] = True
                        tb_busy[g] += p_unit[p]
                        if g < rec_lim:
                            rec_tb[nrec] = g
                            rec_prim[nrec] = p
                            rec_mb[nrec] = m
                            rec_kind[nrec] = K_UNIT
                            rec_t0[nrec] = t
                            rec_t1[nrec] = t + p_unit[p]
                            nrec += 1
                        tb_state[g] = S_FIXED
                        _heap_set(hkey, hitem, hpos, hn, ev, ev, NT + g, t + p_unit[p])
                        break
                    # geometry of this slice
                    ch = (pr[p, PR_CHUNK] + i) % chunk_len.shape[0]   # anchors wrap around
                    ln = chunk_len[ch]
                    off = m * slice_elems
                    ne = 0
                    if ln > off:
                        ne = ln - off
                        if ne > slice_elems:
                            ne = slice_elems
                    tb_bytes[g] = ne * esize
                    if rc >= 0:
                        # the receiver counts as busy while its slot is being written to it
                        k = tb_rpost[g] % NS
                        vis = c_vist[rc * NS + k]
                        b0 = c_sstart[rc * NS + k]
                        if tb_ready_t[g] > b0:
                            b0 = tb_ready_t[g]
                        if vis > b0:
                            tb_busy[g] += vis - b0
                            if g < rec_lim:
                                rec_tb[nrec] = g
                                rec_prim[nrec] = p
                                rec_mb[nrec] = m
                                rec_kind[nrec] = K_RECV
                                rec_t0[nrec] = b0
                                rec_t1[nrec] = vis
                                nrec += 1
                    tb_phase[g] = 0
                    tb_state[g] = S_PHASE
                    st = S_PHASE
                # ---- st == S_PHASE: start the next phase of the unit, or complete it
                nb = tb_bytes[g]
                ph = tb_phase[g]
                # the flow of the phase: a reduction (on the rank's resource, where modelled), then
                # the send (over its route); ``key`` names its resources for a take-over
                nph = 0
                key = c = lo = hi = 0
                if ph < 1 and (fl & F_REDUCE) and nb > 0.0 and rank_cres[pr[p, PR_RANK]] >= 0:
                    nph = 1
                    key = -1 - pr[p, PR_RANK]
                    c = rank_cls[pr[p, PR_RANK]]
                    lo = pr[p, PR_RANK]
                    hi = lo + 1
                elif ph < 2 and (fl & F_SEND):
                    sc = pr[p, PR_SCONN]
                    if i == 0:
                        c_sstart[sc * NS + tb_spost[g] % NS] = t
                    if nb > 0.0:
                        nph = 2
                        key = pr[p, PR_LINK]
                        c = route_cls[key]
                        lo = link_res_ptr[key]
                        hi = link_res_ptr[key + 1]
                if nph > 0:
                    tb_phase[g] = nph
                    tb_state[g] = S_BUSY
                    if fl_pend[g]:
                        fl_pend[g] = False
                        if fl_key[g] == key:
                            # the same class at the same rate
                            fl_start[g] = t
                            _member_join(g, fl_cls[g], nb, t, cls_rate, cls_vt, mkey, mitem, mpos, mn, moff,
                                         retime, retime_n, in_retime)
                            break
                        _note_count(fl_cls[g], cls_ptr, cls_n, chg, chg_n, chg_old, chg_mark, dirty_epoch)
                        _flow_stop(g, t, link_res, rank_cres, cls_ptr, cls_sh, cls_n, part_of, sh_slot, slot_ptr,
                                   slot_cls, slot_inc, slot_n, inc_pos, part_cls_ptr, pact, pact_n, cls_ppos, res_n,
                                   res_busy_t0, res_busy, fl_cls, fl_lo, fl_hi, fl_red, dirty, dirty_n, dirty_mark,
                                   dirty_epoch)
                    fl_key[g] = key
                    red = nph == 1
                    ids = rank_cres if red else link_res
                    _note_count(c, cls_ptr, cls_n, chg, chg_n, chg_old, chg_mark, dirty_epoch)
                    _flow_start(g, c, ids, lo, hi, red, nb, t, cls_ptr, cls_sh, cls_n, cls_rate, cls_vt, part_of,
                                sh_slot, slot_ptr, slot_cls, slot_inc, slot_n, inc_pos, part_cls_ptr, pact, pact_n,
                                cls_ppos, res_n, res_busy_t0, fl_cls, fl_lo, fl_hi, fl_red, fl_start, mkey, mitem,
                                mpos, mn, moff, retime, retime_n, in_retime, dirty, dirty_n, dirty_mark, dirty_epoch)
                    break
                # ---- the unit is complete; the message with the primitive's last chunk
                last = i + 1 == pr[p, PR_CNT]
                if (fl & F_SEND) and last:
                    sc = pr[p, PR_SCONN]
                    k = tb_spost[g]
                    vt = t + c_alpha[sc]
                    c_vist[sc * NS + k % NS] = vt
                    c_posted[sc] = k + 1
                    if c_tail[sc] == k:
                        _heap_set(hkey, hitem, hpos, hn, ev, ev, NCL + sc, vt)
                if (fl & F_RECV) and last:
                    rc = pr[p, PR_RCONN]
                    c_head[rc] = tb_rpost[g] + 1
                    o = c_stb[rc]
                    if not in_wl[o] and tb_state[o] == S_READY:
                        in_wl[o] = True
                        wl[wn] = o
                        wn += 1
                i += 1
                finished = False
                if i == pr[p, PR_CNT]:
                    i = 0
                    progress[p] = m + 1
                    prog_t[p] = t
                    tb_paid[g] = False
                    for d in range(pr[p, PR_RDEP0], pr[p, PR_RDEP1]):
                        o = rdep_tb[d]
                        if not in_wl[o] and tb_state[o] == S_READY:
                            in_wl[o] = True
                            wl[wn] = o
                            wn += 1
                    tb_depok[g] = False
                    if mode == 0:
                        m += 1
                        if m == nmb:
                            m = 0
                            p += 1
                            if p == tb_ptr[g + 1]:
                                finished = True
                    else:
                        p += 1
                        if p == tb_ptr[g + 1]:
                            p = tb_ptr[g]
                            m += 1
                            if m == nmb:
                                finished = True
                tb_pos[g] = p
                tb_m[g] = m
                tb_i[g] = i
                tb_ready_t[g] = t
                if finished:
                    tb_state[g] = S_DONE
                    tb_finish[g] = t
                    ndone += 1
                    break
                tb_state[g] = S_READY
        # ============================================ flows that ended at t and were not taken over
        for q in range(pn):
            g = pend[q]
            if fl_pend[g]:
                fl_pend[g] = False
                _note_count(fl_cls[g], cls_ptr, cls_n, chg, chg_n, chg_old, chg_mark, dirty_epoch)
                _flow_stop(g, t, link_res, rank_cres, cls_ptr, cls_sh, cls_n, part_of, sh_slot, slot_ptr, slot_cls,
                           slot_inc, slot_n, inc_pos, part_cls_ptr, pact, pact_n, cls_ppos, res_n, res_busy_t0,
                           res_busy, fl_cls, fl_lo, fl_hi, fl_red, dirty, dirty_n, dirty_mark, dirty_epoch)
        pn = 0
        # ============================================ bandwidth shares for what changed at t
        if dirty_n[0] > 0:
            nfull = _needs_share(dirty, dirty_n[0], chg, chg_n[0], chg_next, part_head, chg_old, cls_n, cls_rate,
                                 cls_ptr, sh_slot, slot_part, slot_use, slot_sat, slot_cap, du, touched, touch_mark,
                                 full_mark, dirty_epoch, counters)
            if nfull > 0:
                _share(t, dirty, nfull, res_n, cls_ptr, cls_cap, cls_n, cls_rate, cls_vt, mkey, mn, moff,
                       part_res_ptr, part_res, part_cls_ptr, slot_cap, sh_slot, slot_ptr, slot_cls, slot_n, pact,
                       pact_n, comp_res, rem, cnt, rise, rising, stack, retime, retime_n, in_retime, slot_use,
                       slot_sat, slot_part, fill_res, smark, ord_cls, ord_rate, ord_n, cls_opos, chg, chg_next,
                       part_head, chg_old, chg_mark, dirty_epoch, sx, sn, counters)
            dirty_n[0] = 0
            chg_n[0] = 0
            dirty_epoch += 1
        _retime(t, retime, retime_n, in_retime, cls_rate, cls_vt, mkey, mn, moff, hkey, hitem, hpos, hn)
        if ndone == G:
            break
        if hn[0] == 0:
            status = STATUS_DEADLOCK
            break
        if budget >= 0 and counters[0] + counters[2] > budget:
            status = STATUS_BUDGET
            break
        if counters[3] % CLOCK_EVERY == 0:
            if stop[0] != 0:
                status = STATUS_STOPPED
                break
            if deadline > 0.0 and _clock_now(clock_ts) > deadline:
                status = STATUS_BUDGET
                break
        # ============================================ every event of the next instant
        _settle_top(NCL, cls_rate, cls_vt, mkey, moff, hkey, hitem, hpos, hn)
        t = hkey[0]
        counters[3] += 1
        while hn[0] > 0 and hkey[0] == t:
            item = _heap_pop(hkey, hitem, hpos, hn, ev, ev)
            counters[0] += 1
            if item < NCL:
                # the class's first member ends; the class's next completion follows
                c = item
                g = _heap_pop(mkey, mitem, mpos, mn, c, moff[c])
                if mn[c] > 0:
                    te = _completion(c, cls_rate, cls_vt, mkey, moff)
                    if te < t:
                        te = t
                    _heap_set(hkey, hitem, hpos, hn, ev, ev, c, te)
                if take_over:
                    fl_pend[g] = True       # stopped after the worklist unless taken over
                    pend[pn] = g
                    pn += 1
                else:
                    _note_count(fl_cls[g], cls_ptr, cls_n, chg, chg_n, chg_old, chg_mark, dirty_epoch)
                    _flow_stop(g, t, link_res, rank_cres, cls_ptr, cls_sh, cls_n, part_of, sh_slot, slot_ptr,
                               slot_cls, slot_inc, slot_n, inc_pos, part_cls_ptr, pact, pact_n, cls_ppos, res_n,
                               res_busy_t0, res_busy, fl_cls, fl_lo, fl_hi, fl_red, dirty, dirty_n, dirty_mark,
                               dirty_epoch)
                tb_busy[g] += t - fl_start[g]
                if g < rec_lim:
                    rec_tb[nrec] = g
                    rec_prim[nrec] = tb_pos[g]
                    rec_mb[nrec] = tb_m[g]
                    rec_kind[nrec] = K_REDUCE if tb_phase[g] == 1 else K_SEND
                    rec_t0[nrec] = fl_start[g]
                    rec_t1[nrec] = t
                    nrec += 1
                tb_state[g] = S_PHASE
                if not in_wl[g]:
                    in_wl[g] = True
                    wl[wn] = g
                    wn += 1
            elif item >= NT:
                # a TB's timer: its unit's fixed cost is paid, or a dependency's progress reached it
                g = item - NT
                if tb_state[g] == S_FIXED:
                    tb_state[g] = S_READY
                if not in_wl[g] and tb_state[g] == S_READY:
                    in_wl[g] = True
                    wl[wn] = g
                    wn += 1
            else:
                c = item - NCL
                c_tail[c] += 1
                if c_tail[c] < c_posted[c]:
                    _heap_set(hkey, hitem, hpos, hn, ev, ev, item, c_vist[c * NS + c_tail[c] % NS])
                o = c_rtb[c]
                if not in_wl[o] and tb_state[o] == S_READY:
                    in_wl[o] = True
                    wl[wn] = o
                    wn += 1
            _settle_top(NCL, cls_rate, cls_vt, mkey, moff, hkey, hitem, hpos, hn)
    return status, t, nrec

#: the event loop's helpers: they allocate nothing and return no array, so they borrow the loop's
#: arrays (compiled without reference counting, see :class:`hccc.util.jit.Kernels`)
HELPERS = ("_event_loop", "_heap_before", "_heap_put", "_heap_up", "_heap_down", "_heap_set", "_heap_pop", "_mark_dirty",
           "_note_count", "_needs_share", "_fill_level", "_refill_level",
           "_cls_on", "_cls_off", "_root", "_cls_advance", "_member_join", "_flow_start", "_flow_stop", "_set_rate",
           "_share", "_completion", "_retime", "_settle_top")
KERNELS = Kernels(globals(), [*HELPERS, "_parts", "_slots", "_clock_now", "run_engine"], min_work=MIN_COMPILED_WORK, borrowed=HELPERS,
                  compiled_globals={"_CLOCK_GETTIME": _compiled_clock} if HAVE_CLOCK else None)


#: the stop switch of a run nobody stops (:func:`run_engine`'s ``stop``)
NO_STOP = np.zeros(1, np.int64)


def run(*args):
    """:func:`run_within` without a budget or a deadline."""
    return run_within(None, None, *args)


def _clock_deadline(deadline: float | None) -> float:
    """A work-clock deadline (:func:`hccc.util.clock.now`) on :func:`clock_now`'s clock (0.0: none)."""
    if deadline is None or not HAVE_CLOCK:
        return 0.0
    return max(1e-9, clock_now() + (float(deadline) - clock.now()))


def run_within(budget, deadline, *args, stop=None):
    """:func:`run_engine` (every argument but ``budget``, ``deadline`` and ``stop``) stopped with
    :data:`STATUS_BUDGET` once ``budget`` events plus re-shared classes are spent or once the
    work-clock time (:func:`hccc.util.clock.now`) ``deadline`` passes (None: no limit). Plain Python while this
    process's simulations stay within :data:`MIN_COMPILED_WORK` events plus re-shared classes,
    compiled from there on: a plain run that reaches that limit is stopped and run again compiled,
    with the whole budget (a run whose least work, an event per sending primitive and micro-batch,
    already reaches that limit runs compiled at once); numba's first compile of the engine in a
    process is not counted against the deadline (the work clock stands still while numba
    compiles), nor is loading it from numba's cache (that moves the deadline on by its time).
    ``stop``: the run's stop switch (:func:`run_engine`; None: none)."""
    b = -1 if budget is None else max(0, int(budget))
    stop = NO_STOP if stop is None else stop
    plain = KERNELS.plain_budget()
    nmb, p_flags = args[2], args[7]
    least = int(np.count_nonzero(p_flags & F_SEND)) * int(nmb)   # an event per send and micro-batch
    if plain is not None and plain > 0 and least >= plain:
        plain = 0                   # the plain run could not finish: compiled from the start
    if plain is None or plain > 0:
        lim = b if plain is None else plain if b < 0 else min(b, plain)
        out = run_engine(*args, lim, _clock_deadline(deadline), stop)
        counters = out[10]
        KERNELS.spend(int(counters[0] + counters[2]))
        if out[0] != STATUS_BUDGET or plain is None or lim == b or \
                (deadline is not None and clock.now() >= deadline):
            return out                  # finished, or the caller's budget or time is spent
    # numba's compile (or load) and the compiled call run with Ctrl-C held back: an interrupt
    # raised inside numba's compiler leaves half-made native objects that crash when collected;
    # the compiled loop cannot be interrupted anyway, and the interrupt is raised when it returns
    from hccc.runtime.interrupts import deferred_interrupts
    with deferred_interrupts():
        fn = KERNELS.compiled()["run_engine"]
        if deadline is not None and not fn.signatures:
            import numba
            c0 = clock.now()
            fn.compile(tuple(numba.typeof(a) for a in (*args, b, 0.0, stop)))
            deadline += clock.now() - c0        # loading the cache (a compile moves no work clock)
        return fn(*args, b, _clock_deadline(deadline), stop)
