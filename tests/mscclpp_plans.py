"""MSCCL++ execution plans written by hand in the styles of MSCCL++'s DSL (remote reads, direct
puts, packets, pipelines, semaphores, thread-block groups), the builders of their JSON objects, and
:func:`corpus`: those plans and small exported ones as text, for the tests of the importer, the
synchronisation checks and the interpreter."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from hccc.compiler.interop.mscclpp_export import export_plan, node_map, plan_text
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.verify import verify
from hccc.compiler.pipeline import load_algorithm

EX = Path(__file__).resolve().parent.parent / "examples"


def refused(plan):
    """The first diagnostic of importing ``plan`` (which must be refused, located): its message and
    the line of the plan's text it points at."""
    import pytest
    from hccc.compiler.interop.mscclpp_import import import_plan_text
    from hccc.util.diagnostics import CompileError
    text = json.dumps(plan, indent=2)
    with pytest.raises(CompileError) as exc:
        import_plan_text(text, "p.json")
    d = exc.value.diagnostics[0]
    assert d.location is not None, d.message
    return d.message, text.splitlines()[d.location.line - 1]


def gpu_entry(r, ic, oc, sc, channels, rbufs, tbs, sems=0):
    return {"id": r, "input_chunks": ic, "output_chunks": oc, "scratch_chunks": sc,
            "channels": channels, "remote_buffers": rbufs, "threadblocks": tbs,
            "semaphores": [{"init_value": 0}] * sems}


def plan_obj(coll, gpus, proto="Simple", inplace=False, name="hand"):
    return {"name": name, "collective": coll, "protocol": proto, "inplace": inplace, "reuse_resources": False,
            "num_threads_per_block": 1024, "use_double_scratch_buffer": proto == "LL", "buffer_alignment": 16,
            "min_message_size": 0, "max_message_size": 1 << 40, "gpus": gpus}


def mem_channels(ids):
    return {"channel_type": "memory", "channel_ids": ids}


def mem_buffer_refs(ids):
    return [{"access_channel_type": "memory", "remote_buffer_ids": ids}]


def buf(t, i, n=1):
    return {"type": t, "index": i, "size": n}


def remote_buf(b, i, n=1):
    return {"buffer_id": b, "index": i, "size": n}


def sync_op(name, ids):
    return {"name": name, "channel_ids": ids, "channel_type": "memory"}


NOP = {"name": "nop"}


def plan_read_reduce_allreduce():
    """2 ranks: each reads its peer's input of the chunk it owns (rre), then puts the sum into the
    peer's output."""
    gpus = []
    for r in range(2):
        p = 1 - r
        ops = [sync_op("signal", [0]), sync_op("wait", [0]), NOP,
               {"name": "rre", "src_buff": [buf("i", r), remote_buf(0, r)], "dst_buff": [buf("o", r)], "channel_type": "memory"},
               NOP, {"name": "put", "src_buff": [buf("o", r)], "dst_buff": [remote_buf(1, r)], "channel_type": "memory",
                     "channel_ids": [0]},
               NOP, sync_op("signal", [0]), sync_op("wait", [0])]
        gpus.append(gpu_entry(r, 2, 2, 0, [{"channel_type": "memory", "connected_to": [p]}],
                         [{"rank": p, "type": "i", "access_channel_types": ["memory"]},
                          {"rank": p, "type": "o", "access_channel_types": ["memory"]}],
                         [{"id": 0, "ops": ops, "channels": [mem_channels([0])], "remote_buffer_refs": mem_buffer_refs([0, 1])}]))
    return plan_obj("allreduce", gpus)


def plan_direct_allgather(n=3):
    """n ranks: one block puts the input into every peer's output and signals them, a second copies
    the input into place; a barrier joins them."""
    gpus = []
    for r in range(n):
        peers = [p for p in range(n) if p != r]
        puts = [{"name": "put", "src_buff": [buf("i", 0)], "dst_buff": [remote_buf(k, r)], "channel_type": "memory",
                 "channel_ids": [k]} for k in range(len(peers))]
        ks = list(range(len(peers)))
        tb0 = {"id": 0, "ops": puts + [NOP, sync_op("signal", ks), sync_op("wait", ks),
                                       {"name": "barrier", "barrier_id": 0, "num_threadblocks": 2}],
               "channels": [mem_channels(ks)], "remote_buffer_refs": mem_buffer_refs(ks)}
        tb1 = {"id": 1, "ops": [{"name": "copy", "src_buff": [buf("i", 0)], "dst_buff": [buf("o", r)]}, NOP,
                                {"name": "barrier", "barrier_id": 0, "num_threadblocks": 2}]}
        gpus.append(gpu_entry(r, 1, n, 0, [{"channel_type": "memory", "connected_to": peers}],
                         [{"rank": p, "type": "o", "access_channel_types": ["memory"]} for p in peers], [tb0, tb1]))
    return plan_obj("allgather", gpus)


def plan_packet_allgather():
    """2 ranks, LL: packets into the peer's scratch, unpacked into place."""
    gpus = []
    for r in range(2):
        p = 1 - r
        ops = [{"name": "ppkt", "src_buff": [buf("i", 0)], "dst_buff": [remote_buf(0, r)], "channel_type": "memory",
                "channel_ids": [0]}, NOP,
               {"name": "copy", "src_buff": [buf("i", 0)], "dst_buff": [buf("o", r)]}, NOP,
               {"name": "upkt", "src_buff": [buf("s", p)], "dst_buff": [buf("o", p)]}]
        gpus.append(gpu_entry(r, 1, 2, 2, [{"channel_type": "memory", "connected_to": [p]}],
                         [{"rank": p, "type": "s", "access_channel_types": ["memory"]}],
                         [{"id": 0, "ops": ops, "channels": [mem_channels([0])], "remote_buffer_refs": mem_buffer_refs([0])}]))
    return plan_obj("allgather", gpus, proto="LL")


def plan_pipelined_allreduce():
    """2 ranks: a pipeline streams the chunk the peer owns into its scratch slice by slice, the
    owner reduces each slice as it lands; then the sums are put into place."""
    gpus = []
    for r in range(2):
        p = 1 - r
        body = [{"name": "put", "src_buff": [buf("i", p)], "dst_buff": [remote_buf(0, 0)], "channel_type": "memory",
                 "channel_ids": [0]}, NOP, sync_op("signal", [0]), sync_op("wait", [0]), NOP,
                {"name": "re", "src_buff": [buf("i", r), buf("s", 0)], "dst_buff": [buf("o", r)]}, NOP]
        ops = [{"name": "pipeline", "iter_context": {"unit_size": 32, "num_chunks": 1}, "ops": body},
               {"name": "put", "src_buff": [buf("o", r)], "dst_buff": [remote_buf(1, r)], "channel_type": "memory",
                "channel_ids": [0]}, NOP, sync_op("signal", [0]), sync_op("wait", [0])]
        gpus.append(gpu_entry(r, 2, 2, 1, [{"channel_type": "memory", "connected_to": [p]}],
                         [{"rank": p, "type": "s", "access_channel_types": ["memory"]},
                          {"rank": p, "type": "o", "access_channel_types": ["memory"]}],
                         [{"id": 0, "ops": ops, "channels": [mem_channels([0])], "remote_buffer_refs": mem_buffer_refs([0, 1])}]))
    return plan_obj("allreduce", gpus)


def plan_semaphore_reducescatter(ready=True):
    """2 ranks: block 0 receives the peer's part into scratch, block 1 reduces once a device
    semaphore says block 0 has it. Block 0 first tells the peer its scratch is free (a call starts
    once the rank's previous call, its reduction included, has finished) and waits for the peer's
    word before its put; without that (``ready=False``) a rank's next call may put into the
    peer's scratch while the peer still reduces this call's data."""
    gpus = []
    for r in range(2):
        p = 1 - r
        first = [sync_op("signal", [0]), sync_op("wait", [0]), NOP] if ready else []
        tb0 = {"id": 0, "ops": first + [{"name": "put", "src_buff": [buf("i", p)], "dst_buff": [remote_buf(0, 0)],
                                         "channel_type": "memory", "channel_ids": [0]}, NOP, sync_op("signal", [0]),
                                        sync_op("wait", [0]), {"name": "sem_release", "semaphore_ids": [0]}],
               "channels": [mem_channels([0])], "remote_buffer_refs": mem_buffer_refs([0])}
        tb1 = {"id": 1, "ops": [{"name": "sem_acquire", "semaphore_ids": [0]}, NOP,
                                {"name": "re", "src_buff": [buf("i", r), buf("s", 0)], "dst_buff": [buf("o", 0)]}]}
        gpus.append(gpu_entry(r, 2, 1, 1, [{"channel_type": "memory", "connected_to": [p]}],
                         [{"rank": p, "type": "s", "access_channel_types": ["memory"]}], [tb0, tb1], sems=1))
    return plan_obj("reducescatter", gpus)


def plan_forwarded_packets_allgather():
    """2 ranks, LL: the input copied into the rank's own scratch as packets (cpkt), those packets
    forwarded to the peer (rppkt), both regions unpacked into place (one read by two operations)."""
    gpus = []
    for r in range(2):
        p = 1 - r
        ops = [{"name": "cpkt", "src_buff": [buf("i", 0)], "dst_buff": [buf("s", r)]}, NOP,
               {"name": "rppkt", "src_buff": [buf("s", r)], "dst_buff": [remote_buf(0, r)], "channel_type": "memory",
                "channel_ids": [0]}, NOP,
               {"name": "upkt", "src_buff": [buf("s", r)], "dst_buff": [buf("o", r)]}, NOP,
               {"name": "upkt", "src_buff": [buf("s", p)], "dst_buff": [buf("o", p)]}]
        gpus.append(gpu_entry(r, 1, 2, 2, [{"channel_type": "memory", "connected_to": [p]}],
                         [{"rank": p, "type": "s", "access_channel_types": ["memory"]}],
                         [{"id": 0, "ops": ops, "channels": [mem_channels([0])], "remote_buffer_refs": mem_buffer_refs([0])}]))
    return plan_obj("allgather", gpus, proto="LL")


HAND = [plan_forwarded_packets_allgather, plan_read_reduce_allreduce, plan_direct_allgather, plan_packet_allgather, plan_pipelined_allreduce,
        plan_semaphore_reducescatter]


def grouped_copy_allgather(size=3):
    """The direct AllGather, its local copy moved by a group of ``size`` thread blocks (one part each)."""
    plan = plan_direct_allgather()
    for r, g in enumerate(plan["gpus"]):
        tbs = g["threadblocks"]
        tbs[0]["ops"][-1]["num_threadblocks"] = 1 + size
        copy_op = tbs[1]["ops"][0]
        del tbs[1:]
        for i in range(size):
            op = dict(copy_op, tbg_info={"tb_id": i, "tbg_size": size})
            tbs.append({"id": 1 + i, "ops": [op, NOP, {"name": "barrier", "barrier_id": 0,
                                                          "num_threadblocks": 1 + size}]})
    return plan


def grouped_puts_allgather():
    """2 ranks: the put of the rank's chunk into its peer is moved by a group of two thread blocks;
    only block 0 signals, after a barrier of the group (as the DSL writes single-node groups)."""
    gpus = []
    for r in range(2):
        p = 1 - r

        def put(i):
            return {"name": "put", "src_buff": [buf("i", 0)], "dst_buff": [remote_buf(0, r)], "channel_type": "memory",
                    "tbg_info": {"tb_id": i, "tbg_size": 2}}

        def bar(b, n):
            return {"name": "barrier", "barrier_id": b, "num_threadblocks": n}

        tb0 = {"id": 0, "ops": [put(0), NOP, bar(1, 2), sync_op("signal", [0]), sync_op("wait", [0]), bar(0, 3)],
               "channels": [mem_channels([0])], "remote_buffer_refs": mem_buffer_refs([0])}
        tb1 = {"id": 1, "ops": [{"name": "copy", "src_buff": [buf("i", 0)], "dst_buff": [buf("o", r)]}, NOP, bar(0, 3)]}
        tb2 = {"id": 2, "ops": [put(1), NOP, bar(1, 2), bar(0, 3)], "remote_buffer_refs": mem_buffer_refs([0])}
        gpus.append(gpu_entry(r, 1, 2, 0, [{"channel_type": "memory", "connected_to": [p]}],
                         [{"rank": p, "type": "o", "access_channel_types": ["memory"]}], [tb0, tb1, tb2]))
    return plan_obj("allgather", gpus)


def grouped_reduce_allreduce(size=2, cuts=None, channel="memory"):
    """A 2-rank in-place AllReduce whose data operations are moved by a thread-block group of
    ``size`` blocks, block ``b`` synchronising with the peer's block ``b`` alone over channel ``b``
    of ``size`` channels to the peer (per-block signals; the case of MSCCL++'s executor test plan
    ``reduce_tbg``). Rank ``r`` owns chunks ``[size * r, size * (r + 1))`` of ``2 * size``.

    ``channel`` "memory": each rank copies the peer's chunks of its input into its scratch (the
    group: block ``b`` copies the peer's ``b``-th chunk), signals and waits, then reads the peer's
    scratch, reduces and writes the sum into both inputs (``rres``), signals and waits. "port":
    each rank puts the peer's chunks of its input into the peer's scratch (``put`` on the block's
    port channel), signals and waits, reduces its chunks locally (``re``) and puts the sums into
    the peer's input, signals and waits. "packets" (LL): each rank puts the peer's chunks as
    packets into the peer's scratch (``ppkt``), then reduces the packets into its own chunks and
    puts the sums as packets into the peer's scratch (``repkt``... as ``respkt``), and unpacks the
    peer's sums (``upkt``): no signals, the packets' flags order every element.

    ``cuts``: the reduction as one operation per run of chunks of these lengths (summing to
    ``size``) instead of one over the rank's chunks (MSCCL++'s ``reduce_tbg`` reduces chunk 0 and
    chunk 1 apart: ``(1, 1)``); the executor then gives block ``b`` part ``b`` of each run, bytes
    another block of the peer wrote, so with signals it races."""
    n = size
    ll = channel == "packets"
    gpus = []
    for r in range(2):
        p = 1 - r
        mine, theirs = n * r, n * p

        def grp(op, b):
            return dict(op, tbg_info={"tb_id": b, "tbg_size": n})

        def per_chunk(make):
            """The reduction over the rank's chunks, or one per run of ``cuts``."""
            starts = [sum((cuts or (n,))[:j]) for j in range(len(cuts or (n,)))]
            return [make(mine + a, k) for a, k in zip(starts, cuts or (n,))]

        tbs = []
        for b in range(n):
            if channel == "memory":
                sig = [sync_op("signal", [0]), NOP, sync_op("wait", [0]), NOP]
                ops = [grp({"name": "copy", "src_buff": [buf("i", theirs, n)], "dst_buff": [buf("s", theirs, n)]}, b),
                       NOP, *sig]
                for idx, k in per_chunk(lambda i, k: (i, k)):
                    ops += [grp({"name": "rres", "src_buff": [buf("i", idx, k), remote_buf(0, idx, k)],
                                 "dst_buff": [buf("i", idx, k), remote_buf(1, idx, k)], "channel_type": "memory",
                                 "reduce_op": "sum"}, b), NOP]
                ops += sig
                rbufs = [{"rank": p, "type": "s", "access_channel_types": ["memory"]},
                         {"rank": p, "type": "i", "access_channel_types": ["memory"]}]
                tb = {"id": b, "ops": ops, "channels": [mem_channels([b])], "remote_buffer_refs": mem_buffer_refs([0, 1])}
            elif channel == "port":
                sig = [{"name": "signal", "channel_ids": [0], "channel_type": "port"},
                       {"name": "wait", "channel_ids": [0], "channel_type": "port"}, NOP]
                ops = [grp({"name": "put", "src_buff": [buf("i", theirs, n)], "dst_buff": [remote_buf(0, theirs, n)],
                            "channel_ids": [0], "channel_type": "port"}, b), *sig]
                for idx, k in per_chunk(lambda i, k: (i, k)):
                    ops += [grp({"name": "re", "src_buff": [buf("i", idx, k), buf("s", idx, k)],
                                 "dst_buff": [buf("i", idx, k)], "reduce_op": "sum"}, b), NOP,
                            grp({"name": "put", "src_buff": [buf("i", idx, k)], "dst_buff": [remote_buf(1, idx, k)],
                                 "channel_ids": [0], "channel_type": "port"}, b)]
                ops += sig
                rbufs = [{"rank": p, "type": "s", "access_channel_types": ["port"]},
                         {"rank": p, "type": "i", "access_channel_types": ["port"]}]
                tb = {"id": b, "ops": ops, "channels": [{"channel_type": "port", "channel_ids": [b]}],
                      "remote_buffer_refs": [{"access_channel_type": "port", "remote_buffer_ids": [0, 1]}]}
            else:
                # scratch: the peer's chunks as packets at [0, n), the peer's sums at [n, 2n)
                ops = [grp({"name": "ppkt", "src_buff": [buf("i", theirs, n)], "dst_buff": [remote_buf(0, 0, n)],
                            "channel_type": "memory"}, b)]
                for idx, k in per_chunk(lambda i, k: (i, k)):
                    ops += [grp({"name": "respkt", "src_buff": [buf("i", idx, k), buf("s", idx - mine, k)],
                                 "dst_buff": [buf("i", idx, k), remote_buf(0, n + idx - mine, k)],
                                 "channel_type": "memory", "reduce_op": "sum"}, b)]
                ops += [grp({"name": "upkt", "src_buff": [buf("s", n, n)], "dst_buff": [buf("i", theirs, n)]}, b)]
                rbufs = [{"rank": p, "type": "s", "access_channel_types": ["memory"]}]
                tb = {"id": b, "ops": ops, "remote_buffer_refs": mem_buffer_refs([0])}
            tbs.append(tb)
        chans = [] if ll else [{"channel_type": channel, "connected_to": [p] * n}]
        gpus.append(gpu_entry(r, 2 * n, 2 * n, 2 * n, chans, rbufs, tbs))
    return plan_obj("allreduce", gpus, proto="LL" if ll else "Simple", inplace=True,
                    name=f"grouped_reduce_{channel}_{size}" + "".join(f"_{k}" for k in cuts or ()))


def grouped_quarters_allreduce():
    """:func:`grouped_reduce_allreduce`'s memory variant with the copy of the peer's two chunks cut
    by a group of 4 (a half chunk per block) and each chunk reduced by a group of 2 (blocks 0-1
    chunk 0, 2-3 chunk 1): block ``b`` reads the half the peer's block ``b`` copied, at sizes whose
    chunks are an even number of alignment units; at odd ones the executor's parts of the two
    ranges end on different units."""
    gpus = []
    for r in range(2):
        p = 1 - r
        sig = [sync_op("signal", [0]), NOP, sync_op("wait", [0]), NOP]
        tbs = []
        for b in range(4):
            c = 2 * r + b // 2
            ops = [{"name": "copy", "src_buff": [buf("i", 2 * p, 2)], "dst_buff": [buf("s", 2 * p, 2)],
                    "tbg_info": {"tb_id": b, "tbg_size": 4}}, NOP, *sig,
                   {"name": "rres", "src_buff": [buf("i", c), remote_buf(0, c)], "dst_buff": [buf("i", c), remote_buf(1, c)],
                    "channel_type": "memory", "reduce_op": "sum", "tbg_info": {"tb_id": b % 2, "tbg_size": 2}}, NOP, *sig]
            tbs.append({"id": b, "ops": ops, "channels": [mem_channels([b])], "remote_buffer_refs": mem_buffer_refs([0, 1])})
        gpus.append(gpu_entry(r, 4, 4, 4, [{"channel_type": "memory", "connected_to": [p] * 4}],
                              [{"rank": p, "type": "s", "access_channel_types": ["memory"]},
                               {"rank": p, "type": "i", "access_channel_types": ["memory"]}], tbs))
    return plan_obj("allreduce", gpus, inplace=True, name="grouped_quarters")


@lru_cache(maxsize=None)
def corpus() -> tuple[str, ...]:
    """Real plans as text: the hand-written ones (the DSL's styles, switch channels included) and
    small exported ones (a SendRecv among them)."""
    out = [json.dumps(make()) for make in HAND + [grouped_copy_allgather, grouped_puts_allgather]]
    from mscclpp_switch_plans import (plan_switch_allgather, plan_switch_allreduce, plan_switch_butterfly_allreduce,
                                      plan_switch_packet_allgather)
    out += [json.dumps(p) for p in (plan_switch_allreduce(3, 1, False), plan_switch_allgather(2, 2, False, (1,)),
                                    plan_switch_packet_allgather(3, 1, False), plan_switch_butterfly_allreduce(1))]
    for name, kw in (("ring_allreduce_8", {}), ("hm_allgather_2x4", {}), ("ring_allgather_8", dict(protocol="LL")),
                     ("ring_reducescatter_8", dict(instances=2)), ("ring_sendrecv_8", {})):
        a = load_algorithm(EX / f"{name}.rccl")
        verify(a)
        ir = build_program(a)
        nodes = None if kw.get("protocol") == "LL" else node_map(ir.nranks, a.header.gpu_per_node)
        out.append(plan_text(export_plan(ir, nodes=nodes, **kw)))
    return tuple(out)
