"""MSCCL++ plans over switch (NVLS) channels, written in the styles of MSCCL++'s DSL (its
``allreduce_nvls_zero_copy``, ``allgather_nvls_zero_copy`` and ``allgather_nvls_zero_copy_pkt``
test programs), with the sizes, rank counts, thread blocks and placement as parameters, for the
tests of the importer's switch rewrite and of the interpreter's switch semantics."""
from __future__ import annotations

import copy

from mscclpp_plans import NOP, buf, gpu_entry, plan_obj


def switch_channel(letter, ranks):
    return {"channel_type": "switch", "buffer_type": letter, "rank_groups": [{"size": len(ranks), "ranks": list(ranks)}]}


def switch_ref(k, i, n=1):
    return {"switch_channel_id": k, "index": i, "size": n}


def rlx(name, ids):
    return {"name": name, "channel_ids": ids, "channel_type": "memory"}


def _pieces(lo, hi, cuts):
    """[lo, hi) cut at the ``cuts`` inside it: (index, size) pieces."""
    bounds = [lo] + sorted(c for c in set(cuts) if lo < c < hi) + [hi]
    return [(a, b - a) for a, b in zip(bounds, bounds[1:])]


def _barrier(peers_ids):
    """The DSL's all-peer barrier of one thread block (relaxed signals, then waits)."""
    return [NOP, rlx("rlxsignal", peers_ids), NOP, rlx("rlxwait", peers_ids), NOP]


def _mesh_blocks(R, r, work, nblocks):
    """``nblocks`` thread blocks of rank r, block b on memory channels b*(R-1) .. towards every
    peer (one channel per peer per block, the DSL's instances), each running the barrier, its
    share of ``work`` (a list of operations, dealt round-robin), a nop, the barrier again."""
    tbs = []
    for b in range(nblocks):
        ids = list(range(b * (R - 1), (b + 1) * (R - 1)))
        mine = [op for j, op in enumerate(work) if j % nblocks == b]
        body = []
        for op in mine:
            body += [op, NOP]
        ops = _barrier(list(range(R - 1))) + body + _barrier(list(range(R - 1)))
        tbs.append({"id": b, "ops": ops, "channels": [{"channel_type": "memory", "channel_ids": ids},
                                                      {"channel_type": "switch", "channel_ids": [0, 1]}],
                    "remote_buffer_refs": []})
    return tbs


def _mesh_channels(R, r, nblocks):
    peers = [p for p in range(R) if p != r]
    return {"channel_type": "memory", "connected_to": peers * nblocks}


def plan_switch_allreduce(R=2, k=1, inplace=True, cuts=(), nblocks=1):
    """AllReduce on R ranks, k chunks a rank: rank r reduces chunks [r*k, (r+1)*k) (cut at
    ``cuts``) over the switch (``glres``: the sum of every rank's copy, stored on every rank),
    between two all-peer barriers. In place: one switch channel over the input; out of place: the
    source channel over the input, the destination channel over the output."""
    C = R * k
    gpus = []
    for r in range(R):
        work = [{"name": "glres", "src_buff": [switch_ref(0, i, n)], "dst_buff": [switch_ref(1, i, n)],
                 "channel_type": "switch", "reduce_op": "sum"} for i, n in _pieces(r * k, (r + 1) * k, cuts)]
        chans = [_mesh_channels(R, r, nblocks), switch_channel("i", range(R)),
                 switch_channel("i" if inplace else "o", range(R))]
        gpus.append(gpu_entry(r, C, C, 0, chans, [], _mesh_blocks(R, r, work, nblocks)))
    return plan_obj("allreduce", gpus, inplace=inplace, name="switch_allreduce")


def plan_switch_allgather(R=2, k=1, inplace=True, cuts=(), nblocks=1):
    """AllGather on R ranks, k chunks a rank: rank r stores its chunks (cut at ``cuts``) into
    output chunks [r*k, (r+1)*k) of every rank through a switch channel over the output
    (``gstore``), between two all-peer barriers. In place the source is the rank's part of its own
    output; out of place its input."""
    gpus = []
    for r in range(R):
        work = []
        for i, n in _pieces(0, k, cuts):
            src = buf("o", r * k + i, n) if inplace else buf("i", i, n)
            work.append({"name": "gstore", "src_buff": [src], "dst_buff": [switch_ref(1, r * k + i, n)],
                         "channel_type": "switch"})
        chans = [_mesh_channels(R, r, nblocks), switch_channel("o", range(R)), switch_channel("o", range(R))]
        gpus.append(gpu_entry(r, k, R * k, 0, chans, [], _mesh_blocks(R, r, work, nblocks)))
    return plan_obj("allgather", gpus, inplace=inplace, name="switch_allgather")


def plan_switch_packet_allgather(R=2, k=1, inplace=True, cuts=()):
    """The LL AllGather of MSCCL++'s ``allgather_nvls_zero_copy_pkt``: rank r packs its chunks into
    scratch chunks [r*k, (r+1)*k) (``cpkt``), stores those packets into the same place of every
    rank's scratch through a switch channel over the scratch (``gstorepkt``), and every rank
    unpacks slot j on thread block j; no signals, the packets' flags synchronise."""
    gpus = []
    for r in range(R):
        own = []
        for i, n in _pieces(0, k, cuts):
            src = buf("o", r * k + i, n) if inplace else buf("i", i, n)
            own += [{"name": "cpkt", "src_buff": [src], "dst_buff": [buf("s", r * k + i, n)]},
                    {"name": "gstorepkt", "src_buff": [buf("s", r * k + i, n)],
                     "dst_buff": [switch_ref(0, r * k + i, n)], "channel_type": "switch"}]
        tbs = []
        for j in range(R):
            ops = (own if j == 0 else []) + [{"name": "upkt", "src_buff": [buf("s", j * k, k)],
                                              "dst_buff": [buf("o", j * k, k)]}]
            tb = {"id": j, "ops": ops, "channels": [], "remote_buffer_refs": []}
            if j == 0:
                tb["channels"] = [{"channel_type": "switch", "channel_ids": [0]}]
            tbs.append(tb)
        gpus.append(gpu_entry(r, k, R * k, R * k, [switch_channel("s", range(R))], [], tbs))
    return plan_obj("allgather", gpus, proto="LL", inplace=inplace, name="switch_packet_allgather")


def plan_switch_butterfly_allreduce(k=2):
    """AllReduce on 4 ranks over switch channels of pairs: first within {0, 1} and {2, 3} (each
    rank reducing half of the chunks over its pair), then within {0, 2} and {1, 3}: every rank
    in two groups of two, the second stage reading what the first stored. In place."""
    R, C = 4, 4 * k
    half = C // 2
    gpus = []
    for r in range(R):
        a, b = r ^ 1, r ^ 2                       # pair peer, cross peer
        lo1 = 0 if r < a else half                # this rank's half of the first stage
        lo2 = 0 if r < b else half
        ops = [rlx("rlxsignal", [0]), rlx("rlxwait", [0]), NOP,
               {"name": "glres", "src_buff": [switch_ref(0, lo1, half)], "dst_buff": [switch_ref(0, lo1, half)],
                "channel_type": "switch"}, NOP,
               rlx("rlxsignal", [0]), rlx("rlxwait", [0]), rlx("rlxsignal", [1]), rlx("rlxwait", [1]), NOP,
               {"name": "glres", "src_buff": [switch_ref(1, lo2, half)], "dst_buff": [switch_ref(1, lo2, half)],
                "channel_type": "switch"}, NOP,
               rlx("rlxsignal", [1]), rlx("rlxwait", [1])]
        tb = {"id": 0, "ops": ops, "channels": [{"channel_type": "memory", "channel_ids": [0, 1]},
                                                {"channel_type": "switch", "channel_ids": [0, 1]}],
              "remote_buffer_refs": []}
        chans = [{"channel_type": "memory", "connected_to": [a, b]},
                 switch_channel("i", sorted((r, a))), switch_channel("i", sorted((r, b)))]
        gpus.append(gpu_entry(r, C, C, 0, chans, [], [tb]))
    return plan_obj("allreduce", gpus, inplace=True, name="switch_butterfly_allreduce")


def grouped(plan):
    """A one-block Simple switch plan with its switch operations moved by a thread-block group of
    two: the block twice, on channels of its own, block b moving part b of each operation's range
    (``tbg_info``), each with its own barriers around."""
    for g in plan["gpus"]:
        tb0 = g["threadblocks"][0]
        tb1 = copy.deepcopy(tb0)
        mem = g["channels"][0]["connected_to"]
        tb1["channels"][0]["channel_ids"] = [len(mem) + c for c in tb0["channels"][0]["channel_ids"]]
        g["channels"][0]["connected_to"] = mem * 2
        for b, tb in enumerate((tb0, tb1)):
            for o in tb["ops"]:
                if o["name"] in ("glres", "gstore"):
                    o["tbg_info"] = {"tb_id": b, "tbg_size": 2}
        g["threadblocks"] = [tb0, dict(tb1, id=1)]
    return plan


SWITCH_HAND = [plan_switch_allreduce, plan_switch_allgather, plan_switch_packet_allgather,
               plan_switch_butterfly_allreduce]
