"""Up-front checks of the MSCCL runtimes' limits on an Algorithm, before anything is built.

The exporter (:mod:`hccc.compiler.interop.msccl_export`) checks every limit exactly on the thread
blocks it builds, but building them for a program that cannot fit wastes the time and memory of a
whole second lowering (minutes and gigabytes at a thousand GPUs). :func:`check_algorithm_fits`
refuses such programs from the transfer table alone, with numpy, in well under a second even for
millions of transfers. Every quantity it compares is a lower bound on what the step-ordered export
(:func:`hccc.compiler.interop.msccl_export.export_algorithm`) produces, so it never refuses a
program the exporter would accept:

* every transfer is one step in the MSCCL thread block that owns its sending end and one in the
  thread block owning its receiving end; a connection (sender, receiver and the transfers'
  channel: transfers on different channels never share one) of ``c`` transfers is cut into at
  least ``ceil(c / max_steps)`` connections, each on a channel and a thread block of its own at
  both ends (:func:`hccc.compiler.interop.msccl_tbs.split_connections`), per instance, so a pair's
  connections need as many distinct channels (a tree program's streams on one pair, numbered by
  channel, grow with the nodes: 63 on a pair of 32 nodes x 8 H20s, past the runtime's 32);
* a rank's XML elements are ``1 + ngpus + thread blocks + steps``; without fusion every send and
  every receive is a step of its own and every connection end (cut as above) a thread block of its own; with
  fusion a step may both receive and send and a thread block may hold one end of each kind, so the
  larger of the two counts bounds them; ``instances`` multiplies both;
* a thread block has one channel and a channel takes ``max_tbs_per_channel`` sending (and as many
  receiving) thread blocks per rank, so ``max_channels`` channels take that many times as many;
* the ``<algo>`` element has one child per GPU, and a GPU one per thread block.
"""
from __future__ import annotations

import numpy as np

from hccc.compiler.frontend.algorithm import Algorithm
from hccc.util.diagnostics import CompileError, Diagnostic
from hccc.compiler.interop.msccl_format import XmlLimits


def _worst(counts: np.ndarray) -> tuple[int, int]:
    """(index, value) of the largest entry."""
    i = int(np.argmax(counts))
    return i, int(counts[i])


def check_algorithm_fits(alg: Algorithm, lim: XmlLimits, *, instances: int = 1, fuse: bool = False) -> None:
    """Raise :class:`CompileError` naming the first runtime limit ``alg``'s MSCCL export must exceed
    (and the option that relaxes it); return quietly when none is certain to be exceeded."""
    n = int(alg.header.nranks)
    k = int(instances)
    src = np.asarray(alg.src, dtype=np.int64)
    dst = np.asarray(alg.dst, dtype=np.int64)
    msgs: list[str] = []
    if len(src):
        ch = np.asarray(alg.channels, dtype=np.int64)
        conns, per_conn = np.unique((src * n + dst) * (int(ch.max()) + 1) + ch, return_counts=True)
        # connections of a pair, each cut into runs of at most max_steps (per instance)
        keys, at = np.unique(conns // (int(ch.max()) + 1), return_inverse=True)
        runs = np.bincount(at, weights=-(-per_conn // lim.max_steps)).astype(np.int64)
        pair = np.bincount(at, weights=per_conn).astype(np.int64)
        nch = np.bincount(at).astype(np.int64)
        j, c = _worst(runs * k)
        if c > lim.max_channels:
            over = int((runs * k > lim.max_channels).sum())
            a, b = divmod(int(keys[j]), n)
            on = (f" on {int(nch[j])} channels (a connection each)" if nch[j] > 1 else "")
            msgs.append(f"rank {a} sends {int(pair[j])} chunks to rank {b}{on}, one step each; at most {lim.max_steps} "
                        f"steps per thread block cut that into {c} connections (with {k} instance(s)), "
                        f"each on a channel of its own, but the target runtime has {lim.max_channels} channels "
                        "(--xml-max-channels)"
                        + (f" ({over - 1} more connection(s) are too long)" if over > 1 else "")
                        + "; the older msccl executor allows 256 steps (--xml-max-steps 256 or --xml-legacy)")
        sends = np.bincount(src, minlength=n)
        recvs = np.bincount(dst, minlength=n)
        send_peers = np.bincount(keys // n, weights=runs, minlength=n).astype(np.int64)
        recv_peers = np.bincount(keys % n, weights=runs, minlength=n).astype(np.int64)
        if fuse:
            steps = np.maximum(sends, recvs)
            tbs = np.maximum(send_peers, recv_peers)
        else:
            steps = sends + recvs
            tbs = send_peers + recv_peers
        nodes = 1 + n + k * (tbs + steps)
        r, c = _worst(nodes)
        if c > lim.max_xml_nodes:
            msgs.append(f"rank {r} needs at least {c} XML elements (algo + {n} gpus + {k * int(tbs[r])} thread "
                        f"blocks + {k * int(steps[r])} steps), but the runtime's XML loader holds at most "
                        f"{lim.max_xml_nodes} (--xml-max-elements)")
        r, c = _worst(k * tbs)
        if c > lim.max_tbs:
            msgs.append(f"rank {r} needs at least {c} thread blocks, more than the runtime's {lim.max_tbs}")
        peers = np.maximum(send_peers, recv_peers) * k
        r, c = _worst(peers)
        room = lim.max_tbs_per_channel * lim.max_channels
        if c > room:
            msgs.append(f"rank {r} has {c // k} connections to its peers ({c} thread blocks with {k} instance(s)) in one "
                        f"direction, but {lim.max_channels} channels of {lim.max_tbs_per_channel} thread blocks "
                        f"hold {room} (--xml-max-tbs-per-channel, --xml-max-channels)")
    if n > lim.max_children:
        msgs.append(f"the program has {n} GPUs, but the runtime's XML loader takes at most "
                    f"{lim.max_children} child elements of <algo>")
    if msgs:
        raise CompileError([Diagnostic("the algorithm does not fit the MSCCL runtime: " + m, None) for m in msgs])


__all__ = ["check_algorithm_fits"]
