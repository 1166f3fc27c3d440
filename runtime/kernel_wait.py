"""The wait for one rank's kernel (:class:`~hccc.runtime.process_rank.ProcessRank`) while the host
watches its peers: a peer that died, closed or failed raises this rank's abort flag and the peers'
mapped ones, a kernel past its limit is aborted, and a kernel that ignores the abort flag is given up
on; a finished call's last network puts are drained before the call counts as done.
"""
from __future__ import annotations

import time

from hccc.runtime.kernel_watch import ABORT_GRACE_S, watched_wait
from hccc.runtime.kernel_errors import IGNORES_ABORT, describe_stuck, watchdog_aborted, watchdog_expired

#: how often the wait for this rank's kernel looks at its peers
WATCH_S = 0.02
#: how long a rank aborted by a peer waits for that peer's reason to arrive (its state crosses
#: nodes through the network proxy)
REASON_WAIT_S = 1.0


def wait_for_kernel(pf, flags, hosts, net, ir, *, call: int, watch, timeout_s: float,
                    kernel_timeout_s: float, abort_peers, method: str, sync=None,
                    limit_s: float | None = None):
    """Wait for the kernel of call number ``call`` on ``pf`` (``flags``: its
    :class:`~hccc.runtime.rank_memory.LaunchFlags`; ``hosts``: the
    :class:`~hccc.runtime.host_segment.HostSegments`; ``net``: the network proxy or None;
    ``watch``: the caller's extra reason to give up, or None; ``abort_peers()`` raises the peers'
    mapped abort flags; ``sync``: the :class:`~hccc.runtime.rank_memory.BackgroundSync` to wait
    through, or None for a thread of this wait's own; ``limit_s``: the host's limit on the
    kernel's run, after which its abort flag is raised, default ``timeout_s + 2 *
    kernel_timeout_s``). Returns None when the call finished, else (why it failed, whether the
    kernel still runs because it ignores the abort flag)."""
    limit = timeout_s + 2 * kernel_timeout_s if limit_s is None else float(limit_s)
    grace = max(ABORT_GRACE_S, kernel_timeout_s)
    w = watched_wait([pf], flags, limit, grace, name="hccc-comm-wait",
                     problem=lambda: hosts.peer_problem(call, watch), on_problem=abort_peers, poll_s=WATCH_S,
                     sync=sync)
    cause = w.cause
    watchdog = w.late and cause is None
    if watchdog:
        cause = watchdog_expired(limit)
    if not w.finished:
        return f"{cause}; {IGNORES_ABORT}", True
    # the waiter has set `done` and is about to end: join it, so that a call that returns or
    # raises leaves no thread of its own behind
    w.waiter.join(grace)
    if w.failure is not None:
        return f"{method}: {w.failure}", False
    rec = flags.record()
    if cause is None and not flags.aborted and not rec.valid:
        # a finished call's puts (the last credits) land before the counters are reset
        if net is not None and not net.drain(timeout_s):
            return (f"{method} #{call}: the network did not complete this rank's last puts within "
                    f"{timeout_s:g} s"), False
        hosts.mark_done(call)
        return None
    what = describe_stuck(ir, rec, pf.ticks_per_us) if rec.valid else None
    if watchdog:           # aborted by the watchdog and stopped: the runner's words, the record in them
        return f"{method} #{call} failed: " + watchdog_aborted(
            limit, what or ("aborted without an error record" if flags.aborted else None)), False
    if cause is None:
        cause = hosts.peer_problem(call, watch)
        # a peer that aborted this kernel records why once its own kernel has stopped (across
        # nodes its state travels through the proxy): give the reason a moment to arrive
        until = time.monotonic() + REASON_WAIT_S
        while cause is None and not what and time.monotonic() < until:
            time.sleep(0.01)
            cause = hosts.peer_problem(call, watch)
        cause = cause or ("aborted by a peer" if not what else None)
    return f"{method} #{call} failed: " + "; ".join(p for p in (cause, what) if p), False


__all__ = ["wait_for_kernel", "WATCH_S"]
