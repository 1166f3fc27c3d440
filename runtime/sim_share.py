"""The simulator's bandwidth sharing: max-min fair rates for the flow classes of a part, kept as
flows come and go.

The event loop (:mod:`hccc.runtime.sim_engine`, whose module docstring describes the arrays) calls
these functions; they are compiled with it, as its kernels (its ``KERNELS`` names them), and run as
plain Python with it. A *part* is a connected component of the shared resources over all the
program's classes (:func:`_parts`); a shared resource is addressed by its *slot*, its place in the
part's resources (:func:`_slots`). Per part, the classes with members are listed, and per slot the
classes with members on it (:func:`_cls_on`, :func:`_cls_off`).

At an instant whose events changed the counts of flows of some classes (:func:`_note_count`), a
part keeps its rates where the changes leave every full resource as it was and every other below
its capacity (:func:`_needs_share`); otherwise it is filled again (:func:`_share`: progressive
filling, max-min fair), from zero or from the least level the changes reach
(:func:`_refill_level`), the classes frozen below it keeping their rates. A class whose rate
changes has its members brought up to the time (:func:`_set_rate`) and is listed for re-timing.
"""
from __future__ import annotations

import numpy as np

_INF = np.inf
#: a shared resource left with at most this share of its capacity by a filling is full (saturated)
SATURATED = 1e-12
#: a change of flows on a resource the last filling left room on keeps every rate only while the
#: resource stays below its capacity by this share (:func:`_needs_share`): far above the
#: rounding of its use, which the filling sums over a handful of levels
FREE_SLACK = 1e-9


def _note_count(c, cls_ptr, cls_n, chg, chg_n, chg_old, chg_mark, epoch):
    """Class ``c``'s count of flows is about to change (a flow of it starts or stops): where it has
    shared resources, its count before this instant is kept (once an instant, ``epoch``) and the
    class listed for :func:`_needs_share`."""
    if cls_ptr[c] < cls_ptr[c + 1] and chg_mark[c] != epoch:
        chg_mark[c] = epoch
        chg_old[c] = cls_n[c]
        chg[chg_n[0]] = c
        chg_n[0] += 1


def _needs_share(dirty, ndirty, chg, nchg, chg_next, part_head, chg_old, cls_n, cls_rate, cls_ptr, sh_slot, slot_part,
                 slot_use, slot_sat, slot_cap, du, touched, touch_mark, full_mark, epoch, counters):
    """Keep in ``dirty[:ndirty]`` only the parts whose rates the counts changed at this instant
    (``chg[:nchg]``, with their counts before it) may change, and return how many; the others
    keep their rates, and their shared resources' use (``slot_use``) is brought up to date.

    The rates of the last share stay max-min fair where (a) no class gained its first member (it
    has no rate yet), (b) the use of every resource the last share saturated (``slot_sat``; the
    resources that froze classes, so every class's bottleneck or its cap) is unchanged, and (c)
    every other resource the changes touch stays below its capacity by :data:`FREE_SLACK`. Then
    every class still runs at the most its bottleneck allows and no resource is overfull, which
    defines the max-min rates (each class at its cap or the largest on a full resource it uses).
    Most instants of a tree program only move flows between classes of equal rate, or change flows
    on resources with room left: the held-out 64-GPU AllReduce's simulation changed no rate in most
    of its shares (docs/archive/measurements-log.md#the-allreduce-simulations-sharing-counted-29-november-2026).

    The classes whose counts changed are linked per part for :func:`_share` (from
    ``part_head[p]``, on through ``chg_next``, as places in ``chg``)."""
    for d in range(ndirty):
        part_head[dirty[d]] = -1
    nt = 0
    for q in range(nchg):
        c = chg[q]
        old = chg_old[c]
        new = cls_n[c]
        if old == new:
            continue
        a = cls_ptr[c]
        p = slot_part[sh_slot[a]]
        chg_next[q] = part_head[p]
        part_head[p] = q
        if old == 0:
            full_mark[p] = epoch
            continue
        d = (new - old) * cls_rate[c]
        for j in range(a, cls_ptr[c + 1]):
            k = sh_slot[j]
            if touch_mark[k] != epoch:
                touch_mark[k] = epoch
                du[k] = 0.0
                touched[nt] = k
                nt += 1
            du[k] += d
    for i in range(nt):
        k = touched[i]
        p = slot_part[k]
        if full_mark[p] == epoch:
            continue
        if slot_sat[k]:
            if abs(du[k]) > SATURATED * slot_cap[k]:
                full_mark[p] = epoch
        elif du[k] > 0.0 and slot_use[k] + du[k] > slot_cap[k] * (1.0 - FREE_SLACK):
            full_mark[p] = epoch
    for i in range(nt):
        k = touched[i]
        if full_mark[slot_part[k]] != epoch:
            slot_use[k] += du[k]
    w = 0
    for d in range(ndirty):
        p = dirty[d]
        if full_mark[p] == epoch:
            dirty[w] = p
            w += 1
        else:
            counters[4] += 1
    return w


def _cls_on(c, cls_ptr, part_of, cls_sh, sh_slot, slot_ptr, slot_cls, slot_inc, slot_n, inc_pos, part_cls_ptr,
            pact, pact_n, cls_ppos):
    """Class ``c``, which has a member again, joins the list of its part's classes with members
    (``pact`` from ``part_cls_ptr[p]``, ``pact_n[p]`` of them) and each of its shared resources'
    lists (a slot ``s``'s from ``slot_ptr[s]``, ``slot_n[s]`` of them: the class, and the
    incidence ``j`` of ``cls_sh`` it is there by, whose place ``inc_pos[j]`` is)."""
    a = cls_ptr[c]
    b = cls_ptr[c + 1]
    if a == b:
        return
    p = part_of[cls_sh[a]]
    q = pact_n[p]
    pact[part_cls_ptr[p] + q] = c
    cls_ppos[c] = q
    pact_n[p] = q + 1
    for j in range(a, b):
        s = sh_slot[j]
        q = slot_n[s]
        slot_cls[slot_ptr[s] + q] = c
        slot_inc[slot_ptr[s] + q] = j
        inc_pos[j] = q
        slot_n[s] = q + 1


def _cls_off(c, cls_ptr, part_of, cls_sh, sh_slot, slot_ptr, slot_cls, slot_inc, slot_n, inc_pos, part_cls_ptr,
             pact, pact_n, cls_ppos):
    """Class ``c``, left without members, leaves the lists :func:`_cls_on` put it in (the last
    entry of each list takes its place)."""
    a = cls_ptr[c]
    b = cls_ptr[c + 1]
    if a == b:
        return
    p = part_of[cls_sh[a]]
    base = part_cls_ptr[p]
    q = cls_ppos[c]
    last = pact_n[p] - 1
    o = pact[base + last]
    pact[base + q] = o
    cls_ppos[o] = q
    pact_n[p] = last
    for j in range(a, b):
        s = sh_slot[j]
        base = slot_ptr[s]
        q = inc_pos[j]
        last = slot_n[s] - 1
        o = slot_inc[base + last]
        slot_cls[base + q] = slot_cls[base + last]
        slot_inc[base + q] = o
        inc_pos[o] = q
        slot_n[s] = last


def _cls_advance(c, t, cls_rate, cls_vt, mkey, mn, moff):
    """Bring class ``c``'s members up to t: what each carried since ``cls_vt`` (at the class's
    rate) is taken off the bytes left to it (its key in the class's heap, whose order stays)."""
    done = cls_rate[c] * (t - cls_vt[c])
    if done != 0.0:
        for j in range(moff[c], moff[c] + mn[c]):
            mkey[j] -= done
    cls_vt[c] = t


def _set_rate(c, rate, t, cls_rate, cls_vt, mkey, mn, moff, retime, retime_n, in_retime):
    """Class ``c`` frozen at ``rate`` by the filling of t: where that is a new rate, its members are
    brought up to t at the old one and the class is listed for re-timing (:func:`_retime`)."""
    if rate == cls_rate[c]:
        return
    _cls_advance(c, t, cls_rate, cls_vt, mkey, mn, moff)
    cls_rate[c] = rate
    if not in_retime[c]:
        in_retime[c] = True
        retime[retime_n[0]] = c
        retime_n[0] += 1


def _fill_level(k, L, slot_ptr, slot_cls, slot_n, slot_cap, cls_n, cls_rate, chg_old, chg_mark, epoch, sx, sn):
    """The least level below ``L`` at which shared resource (slot) ``k`` fills, or ``L``: the
    classes whose counts changed at this instant rising with their new counts, every other class on
    it at its rate (a class runs at the level until it reaches its rate). ``sx``/``sn``: room for
    the rates and counts of the resource's classes."""
    a = slot_ptr[k]
    b = a + slot_n[k]
    cap = slot_cap[k]
    slope = 0
    m = 0
    for i in range(a, b):
        c = slot_cls[i]
        if chg_mark[c] == epoch and chg_old[c] != cls_n[c]:
            slope += cls_n[c]
        else:
            # the others in order of their rates (a resource carries a few dozen classes at most)
            x = cls_rate[c]
            q = m
            while q > 0 and sx[q - 1] > x:
                sx[q] = sx[q - 1]
                sn[q] = sn[q - 1]
                q -= 1
            sx[q] = x
            sn[q] = cls_n[c]
            m += 1
            slope += cls_n[c]
    base = 0.0
    for q in range(m):
        x = sx[q]
        if x >= L:
            break
        if base + slope * x >= cap:
            break
        base += sn[q] * x
        slope -= sn[q]
    if slope <= 0:
        return L
    lv = (cap - base) / slope
    return lv if lv < L else L


def _refill_level(p, chg, chg_next, part_head, chg_old, chg_mark, epoch, cls_n, cls_rate, cls_cap, cls_ptr, sh_slot,
                  slot_ptr, slot_cls, slot_n, slot_cap, sx, sn):
    """The level from which part ``p``'s filling may differ from its last one after the count
    changes of this instant (:func:`_share`): the least of the changed classes' rates and caps and
    of the levels at which the resources gaining flows fill (:func:`_fill_level`). Below it every
    resource fills as before (the changed classes rise there in both fillings, and no resource they
    touch fills), so every class frozen below it keeps its rate. 0.0: a changed class without a
    rate bounds it."""
    L = _INF
    q = part_head[p]
    while q >= 0:
        c = chg[q]
        q = chg_next[q]
        if cls_cap[c] < L:
            L = cls_cap[c]
        if chg_old[c] > 0 and cls_rate[c] < L:
            L = cls_rate[c]
    q = part_head[p]
    while q >= 0:
        c = chg[q]
        q = chg_next[q]
        if cls_n[c] <= chg_old[c]:
            continue
        for j in range(cls_ptr[c], cls_ptr[c + 1]):
            lv = _fill_level(sh_slot[j], L, slot_ptr, slot_cls, slot_n, slot_cap, cls_n, cls_rate, chg_old, chg_mark,
                             epoch, sx, sn)
            if lv < L:
                L = lv
    return L if L < _INF else 0.0


def _share(t, dirty, ndirty, res_n, cls_ptr, cls_cap, cls_n, cls_rate, cls_vt, mkey, mn, moff, part_res_ptr,
           part_res, part_cls_ptr, slot_cap, sh_slot, slot_ptr, slot_cls, slot_n, pact, pact_n, comp_res, rem, cnt,
           rise, rising, stack, retime, retime_n, in_retime, slot_use, slot_sat, slot_part, fill_res, smark, ord_cls,
           ord_rate, ord_n, cls_opos, chg, chg_next, part_head, chg_old, chg_mark, epoch, sx, sn, counters):
    """Max-min fair rates (progressive filling) on every dirty part (``dirty[:ndirty]``); a class
    whose rate changes has its members brought up to t and is listed for re-timing
    (:func:`_retime`). A *part* is a connected component of the shared resources and the classes
    over them, all the program's classes counted (:func:`_parts`): the components of the classes
    with flows now partition it, and max-min over several components is max-min on each, so a
    part is filled whole, over its resources and classes with flows.

    The filling works on *classes* (:func:`hccc.runtime.sim_model.flow_classes`): flows with
    the same shared resources and the same cap, which max-min gives one rate. A class counts on
    each of its shared resources with its members (``res_n`` counts the flows) and freezes whole.
    Private resources (never deciding a rate max-min over the others would not, ``res_private``)
    are in no class's list: their least capacity is the class's cap (a class's cap freezes it at
    that level).

    It works on the part's own lists, kept as flows come and go (:func:`_cls_on`): the classes
    with members (``pact``) and, per shared resource, the classes with members on it
    (``slot_cls``); a shared resource is addressed by its *slot*, its place in the part's
    resources (``part_res``), where ``slot_cap`` copies its capacity and ``rem``/``cnt`` (the
    capacity left and the flows still rising over it) live. Each level scans the resources still
    carrying rising classes (compacted after each level) for the least fair share ``rem / cnt``;
    the classes on the resources that fill at a level, or whose cap it reaches, freeze at it and
    leave the counts of their resources (a class rises while ``rise[c]`` holds this filling's
    stamp). A level that reaches a cap looks only at the classes still rising when the last such
    level looked (``rising``, compacted as it goes), and a class takes its new rate where it
    freezes (:func:`_set_rate`).

    A part filled before is filled again only from :func:`_refill_level` (``L0``): its classes
    are kept in the order they froze, with their rates (``ord_cls``/``ord_rate`` from
    ``part_cls_ptr[p]``, ``ord_n[p]`` entries; ``cls_opos[c]`` a class's entry, entries of
    classes since emptied or moved are dead), those below ``L0`` keep their rates, and the others
    rise again from ``L0`` over the resources they use, whose capacity left is what the classes
    below ``L0`` leave of it (``slot_use``, each resource's use by the last filling, less the
    rising classes' old use). The rates are max-min's as a filling from zero gives them; their
    last bits may differ, as the levels are summed from ``L0``. A filling from zero (a part's first,
    or ``L0`` 0.0, or every class above ``L0``) starts from the capacities, as before. On the
    held-out 64-GPU AllReduce and ReduceScatter, about a third of the classes a filling from zero
    looked at rated at or above the least rate among the changed classes
    (docs/archive/measurements-log.md#filling-again-from-the-least-level-a-change-reaches-simulator-and-the-samples-side-by-side)."""
    for d in range(ndirty):
        p = dirty[d]
        ncl = pact_n[p]
        ob = part_cls_ptr[p]
        if ncl == 0:
            ord_n[p] = 0
            continue
        counters[5] += 1
        stamp = counters[5]
        # ---- where the filling starts: the level, the classes rising from it, the resources
        L0 = 0.0
        split = 0
        if ord_n[p] > 0:
            L0 = _refill_level(p, chg, chg_next, part_head, chg_old, chg_mark, epoch, cls_n, cls_rate, cls_cap, cls_ptr,
                               sh_slot, slot_ptr, slot_cls, slot_n, slot_cap, sx, sn)
        if L0 > 0.0:
            lo = 0
            hi = ord_n[p]
            while lo < hi:
                mid = (lo + hi) // 2
                if ord_rate[ob + mid] < L0:
                    lo = mid + 1
                else:
                    hi = mid
            split = lo
        nrising = 0
        if split > 0:
            for i in range(ob + split, ob + ord_n[p]):
                c = ord_cls[i]
                if cls_opos[c] == i and cls_n[c] > 0 and rise[c] != stamp:
                    rise[c] = stamp
                    rising[nrising] = c
                    nrising += 1
            q = part_head[p]
            while q >= 0:
                c = chg[q]
                q = chg_next[q]
                if cls_n[c] > 0 and rise[c] != stamp:
                    rise[c] = stamp
                    rising[nrising] = c
                    nrising += 1
                    cls_opos[c] = -1          # (a class with members again: its old entry is dead)
            if nrising == ncl:
                split = 0
        counters[1] += 1
        best = _INF
        arg = -1
        nres = 0
        nfill = 0
        if split == 0:
            # ---- from zero: every class with members rises over every resource of the part
            L0 = 0.0
            nrising = ncl
            cb = part_cls_ptr[p]
            for q in range(cb, cb + ncl):
                c = pact[q]
                rise[c] = stamp
                rising[q - cb] = c
            for k in range(part_res_ptr[p], part_res_ptr[p + 1]):
                n = res_n[part_res[k]]
                slot_sat[k] = False
                fill_res[nfill] = k
                nfill += 1
                if n > 0:
                    comp_res[nres] = k
                    nres += 1
                    rem[k] = slot_cap[k]
                    cnt[k] = n
                    s = slot_cap[k] / n
                    if s < best:
                        best = s
                        arg = k
        else:
            # ---- from L0: the rising classes' resources, with what the classes below L0 leave
            # (the classes changed at this instant that lost every member, listed after the
            # rising ones, leave their old use too)
            nleft = nrising
            q = part_head[p]
            while q >= 0:
                c = chg[q]
                q = chg_next[q]
                if cls_n[c] == 0:
                    rising[nleft] = c
                    nleft += 1
            for q in range(nleft):
                c = rising[q]
                old = chg_old[c] if chg_mark[c] == epoch else cls_n[c]
                used = old * cls_rate[c] if old > 0 else 0.0
                for j in range(cls_ptr[c], cls_ptr[c + 1]):
                    k = sh_slot[j]
                    if smark[k] != stamp:
                        smark[k] = stamp
                        fill_res[nfill] = k
                        nfill += 1
                        rem[k] = slot_cap[k] - slot_use[k]
                        cnt[k] = 0
                        slot_sat[k] = False
                    rem[k] += used
                    if q < nrising:
                        cnt[k] += cls_n[c]
            for f in range(nfill):
                k = fill_res[f]
                if cnt[k] > 0:
                    rem[k] -= cnt[k] * L0
                    comp_res[nres] = k
                    nres += 1
                    s = rem[k] / cnt[k]
                    if s < best:
                        best = s
                        arg = k
            # the dead entries of the kept order go where the rising ones would not fit
            if split + nrising > part_cls_ptr[p + 1] - ob:
                w = 0
                for i in range(ob, ob + split):
                    c = ord_cls[i]
                    if cls_opos[c] == i and cls_n[c] > 0:
                        ord_cls[ob + w] = c
                        ord_rate[ob + w] = ord_rate[i]
                        cls_opos[c] = ob + w
                        w += 1
                split = w
        counters[2] += nrising
        capmin = _INF
        for q in range(nrising):
            c = rising[q]
            if cls_cap[c] < capmin:
                capmin = cls_cap[c]
        level = L0
        left = nrising
        na = nres
        wo = ob + split          # the next entry of the order
        while left > 0:
            # the next level: a shared resource fills (``best`` more) or a cap is reached
            capped = capmin - level <= best
            step = capmin - level if capped else best
            level = capmin if capped else level + best
            nsat = 0
            for k in range(na):
                r = comp_res[k]
                rem[r] -= step * cnt[r]
                if (r == arg and step == best) or rem[r] <= SATURATED * slot_cap[r]:
                    stack[nsat] = r
                    nsat += 1
                    slot_sat[r] = True
            for q in range(nsat):
                r = stack[q]
                for i in range(slot_ptr[r], slot_ptr[r] + slot_n[r]):
                    c = slot_cls[i]
                    if rise[c] == stamp:
                        rise[c] = 0
                        _set_rate(c, level, t, cls_rate, cls_vt, mkey, mn, moff, retime, retime_n, in_retime)
                        ord_cls[wo] = c
                        ord_rate[wo] = level
                        cls_opos[c] = wo
                        wo += 1
                        left -= 1
                        n = cls_n[c]
                        for j in range(cls_ptr[c], cls_ptr[c + 1]):
                            cnt[sh_slot[j]] -= n
            if capped:
                # the classes whose cap this level reached freeze at it; the next cap among the rest
                # (``rising[:nrising]``: the classes not frozen when last looked at, compacted here)
                nxt = _INF
                w = 0
                for q in range(nrising):
                    c = rising[q]
                    if rise[c] != stamp:
                        continue
                    if cls_cap[c] <= level:
                        rise[c] = 0
                        _set_rate(c, cls_cap[c], t, cls_rate, cls_vt, mkey, mn, moff, retime, retime_n, in_retime)
                        ord_cls[wo] = c
                        ord_rate[wo] = cls_cap[c]
                        cls_opos[c] = wo
                        wo += 1
                        left -= 1
                        n = cls_n[c]
                        for j in range(cls_ptr[c], cls_ptr[c + 1]):
                            cnt[sh_slot[j]] -= n
                    else:
                        rising[w] = c
                        w += 1
                        if cls_cap[c] < nxt:
                            nxt = cls_cap[c]
                nrising = w
                capmin = nxt
            # the survivors, and the least fair share among them for the next level
            w = 0
            best = _INF
            arg = -1
            for k in range(na):
                r = comp_res[k]
                if cnt[r] > 0:
                    comp_res[w] = r
                    w += 1
                    s = rem[r] / cnt[r]
                    if s < best:
                        best = s
                        arg = r
            na = w
        ord_n[p] = wo - ob
        # what each resource carries at these rates (:func:`_needs_share` compares changes with it)
        for f in range(nfill):
            k = fill_res[f]
            slot_use[k] = slot_cap[k] - rem[k] if res_n[part_res[k]] > 0 else 0.0


def _root(up, x):
    """The representative of ``x``'s set in the union-find forest ``up`` (paths halved)."""
    while up[x] != x:
        up[x] = up[up[x]]
        x = up[x]
    return x


def _parts(R, NCL, cls_ptr, cls_sh):
    """The parts :func:`_share` fills: the connected components of the shared resources joined
    by every class's list (union-find). Returns ``part_of`` (per resource, -1 where no class
    shares it) and the CSR lists of each part's resources and classes (a class without shared
    resources is in none)."""
    up = np.arange(R)
    used = np.zeros(R, np.bool_)
    for c in range(NCL):
        a = cls_ptr[c]
        for j in range(a, cls_ptr[c + 1]):
            used[cls_sh[j]] = True
            x = _root(up, cls_sh[a])
            y = _root(up, cls_sh[j])
            if x != y:
                up[y] = x
    part_of = np.full(R, -1, np.int64)
    ident = np.full(R, -1, np.int64)
    nparts = 0
    for r in range(R):
        if used[r]:
            x = _root(up, r)
            if ident[x] < 0:
                ident[x] = nparts
                nparts += 1
            part_of[r] = ident[x]
    res_ptr = np.zeros(nparts + 1, np.int64)
    cls_ptr_p = np.zeros(nparts + 1, np.int64)
    for r in range(R):
        if part_of[r] >= 0:
            res_ptr[part_of[r] + 1] += 1
    for c in range(NCL):
        if cls_ptr[c] < cls_ptr[c + 1]:
            cls_ptr_p[part_of[cls_sh[cls_ptr[c]]] + 1] += 1
    for q in range(nparts):
        res_ptr[q + 1] += res_ptr[q]
        cls_ptr_p[q + 1] += cls_ptr_p[q]
    res = np.empty(res_ptr[nparts], np.int64)
    cls = np.empty(cls_ptr_p[nparts], np.int64)
    fill = res_ptr[:nparts].copy()
    for r in range(R):
        if part_of[r] >= 0:
            res[fill[part_of[r]]] = r
            fill[part_of[r]] += 1
    fill = cls_ptr_p[:nparts].copy()
    for c in range(NCL):
        if cls_ptr[c] < cls_ptr[c + 1]:
            q = part_of[cls_sh[cls_ptr[c]]]
            cls[fill[q]] = c
            fill[q] += 1
    return part_of, res_ptr, res, cls_ptr_p, cls


def _slots(NCL, cls_ptr, cls_sh, res_cap, part_of, part_res_ptr, part_res):
    """Where :func:`_share` keeps a part's shared resources: ``sh_slot`` (per entry of
    ``cls_sh``: the slot of the resource, its place in ``part_res``), ``slot_ptr`` (CSR: room in
    a slot's list for every class over it) and ``slot_cap`` (a slot's capacity)."""
    n = part_res.shape[0]
    slot_of = np.full(res_cap.shape[0], -1, np.int64)
    slot_cap = np.empty(n, np.float64)
    for k in range(n):
        slot_of[part_res[k]] = k
        slot_cap[k] = res_cap[part_res[k]]
    sh_slot = np.empty(cls_sh.shape[0], np.int64)
    slot_ptr = np.zeros(n + 1, np.int64)
    for j in range(cls_sh.shape[0]):
        sh_slot[j] = slot_of[cls_sh[j]]
        slot_ptr[sh_slot[j] + 1] += 1
    for k in range(n):
        slot_ptr[k + 1] += slot_ptr[k]
    return sh_slot, slot_ptr, slot_cap
