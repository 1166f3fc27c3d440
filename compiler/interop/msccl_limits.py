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
from hccc.compiler.interop.connections import connections
from hccc.compiler.interop.msccl_format import XmlLimits


def _worst(counts: np.ndarray) -> tuple[int, int]:
    """(index, value) of the largest entry."""
    i = int(np.argmax(counts))
    return i, int(counts[i])


def check_algorithm_fits(alg: Algorithm, lim: XmlLimits, *, instances: int = 1, fuse: bool = False) -> None:
    """Raise :class:`CompileError` naming the first runtime limit ``alg``'s MSCCL export must exceed
    (and the option that relaxes it); return quietly when none is certain to be exceeded."""
    check_transfers_fit(alg.src, alg.dst, int(alg.header.nranks), lim, channel=alg.channels,
                        instances=instances, fuse=fuse)


def connection_refusal(src, dst, channel, nranks: int, lim: XmlLimits) -> str | None:
    """Why the MSCCL runtime would refuse the program of the transfers ``src[i] -> dst[i]`` on channel
    ``channel[i]`` (None: one channel) for its thread blocks' ids, or None: the export gives every
    connection end (a pair on a channel, cut every ``max_steps`` transfers) a thread block of its
    own, and where a rank forwards what it receives (a tree program's ranks do), its sending thread
    blocks wait on its receiving ones, whose ids a dependency may name only up to ``max_dep_tb``;
    so a rank of more than ``max_dep_tb + 1`` thread blocks is refused here. An estimate, not a
    bound (a rank whose last thread blocks nothing waits on is accepted by the exporter):
    ``hccc synth --for msccl`` weighs its candidates so, and the exporter decides."""
    n = int(nranks)
    pair, c = connections(src, dst, channel, n)
    if not pair.size:
        return None
    runs = -(-c // lim.max_steps)
    tbs = np.bincount(pair // n, weights=runs, minlength=n) + np.bincount(pair % n, weights=runs, minlength=n)
    r, most = _worst(tbs.astype(np.int64))
    if most <= lim.max_dep_tb + 1:
        return None
    return (f"rank {r} would have {most} thread blocks (one per connection end), and its sending thread blocks "
            f"wait on its receiving ones, whose ids a dependency names only up to {lim.max_dep_tb}")


def check_transfers_fit(src, dst, nranks: int, lim: XmlLimits, *, channel=None, instances: int = 1,
                        fuse: bool = False) -> None:
    """:func:`check_algorithm_fits` of a program given by its transfers alone (``src[i] -> dst[i]``
    on channel ``channel[i]``, None: one channel, on ``nranks`` ranks): what it reads of an
    Algorithm, so that a program can be checked before it is one (``hccc synth --for msccl``
    checks its candidates so)."""
    n = int(nranks)
    k = int(instances)
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    msgs: list[str] = []
    if len(src):
        conn_pair, per_conn = connections(src, dst, channel, n)
        # connections of a pair, each cut into runs of at most max_steps (per instance)
        keys, at = np.unique(conn_pair, return_inverse=True)
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


__all__ = ["check_algorithm_fits", "check_transfers_fit", "connection_refusal"]
