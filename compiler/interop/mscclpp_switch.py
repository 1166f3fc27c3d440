"""Switch (NVLS) channels of an MSCCL++ plan, rewritten into the memory-channel operations the
importer proves.

A switch channel (``channel_type: switch`` in a GPU's ``channels``) binds one buffer of every rank of
a group (``buffer_type``: ``i``, ``o`` or ``s``; ``rank_groups[g].ranks``) to one multicast address:
the executor's loader makes one switch channel of every rank group a channel lists, in order, and
connects each collectively over its ranks (``connectNvlsCollective``: a rank outside its group is an
error, and the members handshake in the order they declare their groups). A thread block lists the
switch channels it uses (``channels``, type ``switch``), and an operation names one through a buffer
reference ``{"switch_channel_id": k, "index": c, "size": n}`` (the block's ``k``-th switch channel,
chunks ``[c, c+n)`` of its buffer on every member). The operations (the executor's kernel):

* ``glres`` (multimem load-reduce-store): for every element, the sum of the element on every member
  of the source channel's group, stored to the element on every member of the destination's;
* ``gstore`` (multimem store): a local region of the rank, stored on every member of the group;
* ``gstorepkt``: LL packets of the rank's own scratch (each read once its flag is this call's), put
  with this call's flag into the packet region of every member's scratch.

Read as point-to-point operations on the members' copies (which is what the multicast does, one
element at a time), they are operations hccc already imports:

* ``glres`` = ``rres`` (read-reduce-send): the rank's own copy and each other member's copy are read
  and reduced into the rank's own copy of the destination, which is then put to every other
  member's copy; a group of the rank alone is a ``copy`` (when the regions differ);
* ``gstore`` = ``put`` of the source to every other member's copy, and a ``copy`` into the rank's own
  copy (none when that is the source itself, as in an in-place AllGather);
* ``gstorepkt`` = ``rppkt`` (put the packets of the rank's own scratch) to every other member; the
  rank's own packets are already in place (a store into another place of its own scratch is not
  modelled, and refused).

Remote buffers the rewrite needs are added to the rank's table; the reads and puts then synchronise
as the plan says with its signals, waits, semaphores and packet flags, and are proven like any
other (a read of a member's copy must follow a wait towards that member, a put be followed by a
signal to it). ``glres``/``gstore`` through a channel over the scratch of a plan with
``use_double_scratch_buffer`` are refused: the kernel's multimem address carries no scratch half
(``gstorepkt``'s does), so the plan's own scratch accesses, which alternate halves, and the
multimem ones part on every other call. Every refusal is located at the field at fault.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from hccc.compiler.interop.mscclpp_ops import PlanOp, local, remote

#: the operations that work over a switch channel (``execution_plan.cc``: MULTI_LOAD_REDUCE_STORE,
#: MULTI_STORE, MULTI_STORE_PKT)
SWITCH_OPS = frozenset({"glres", "gstore", "gstorepkt"})
_LETTERS = ("i", "o", "s")


@dataclass(frozen=True)
class SwitchGroup:
    """One switch channel of a rank, as the loader makes it: the ranks of its group (as declared)
    and the buffer it binds on each (``i``, ``o``, ``s``), with where the plan declares it."""
    ranks: tuple[int, ...]
    letter: str
    path: tuple


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class SwitchChannels:
    """The switch channels of every rank of a plan, checked; :meth:`expand` rewrites an operation.

    ``gpus`` is the plan's list of GPUs, ``chunks(rank, letter)`` the chunks of that rank's buffer,
    ``err(path, message)`` the importer's located error, ``double_scratch`` the plan's
    ``use_double_scratch_buffer``."""

    def __init__(self, gpus: list, chunks: Callable[[int, str], int], err: Callable[[tuple, str], Exception],
                 double_scratch: bool = False):
        self.err = err
        self.double = double_scratch
        self.chunks = chunks
        self.R = len(gpus)
        self.groups: list[list[SwitchGroup]] = [self._read(r, g) for r, g in enumerate(gpus)]
        self._check_partners()
        #: rank -> {(peer, letter): index in the rank's remote buffers} of the buffers added so far
        self._added: dict[int, dict[tuple, int]] = {}

    # -- channels
    def _read(self, r: int, gpu) -> list[SwitchGroup]:
        err = self.err
        out = []
        chans = gpu.get("channels", []) if isinstance(gpu, dict) else []
        for k, ch in enumerate(chans if isinstance(chans, list) else []):
            if not isinstance(ch, dict) or ch.get("channel_type") != "switch":
                continue
            p = ("gpus", r, "channels", k)
            letter = ch.get("buffer_type")
            if letter not in _LETTERS:
                raise err(p + (("buffer_type",) if "buffer_type" in ch else ()),
                          "a switch (NVLS) channel needs a 'buffer_type' (i, o or s): the buffer it binds")
            groups = ch.get("rank_groups")
            if not isinstance(groups, list) or not groups:
                raise err(p, "a switch (NVLS) channel needs 'rank_groups', a non-empty list of groups")
            for gi, grp in enumerate(groups):
                gp = p + ("rank_groups", gi)
                ranks = grp.get("ranks") if isinstance(grp, dict) else None
                if not isinstance(ranks, list) or not ranks:
                    raise err(gp, "a switch channel's rank group needs 'ranks', a non-empty list")
                for j, x in enumerate(ranks):
                    if not _int(x) or not 0 <= x < self.R:
                        raise err(gp + ("ranks", j), f"bad rank {x!r} in a switch channel's group: the plan "
                                                     f"has ranks 0..{self.R - 1}")
                if len(set(ranks)) != len(ranks):
                    raise err(gp + ("ranks",), f"a switch channel's group names a rank twice: {ranks}")
                if r not in ranks:
                    raise err(gp + ("ranks",), f"rank {r}'s switch (NVLS) channel is over ranks {ranks}, a group "
                                               f"rank {r} is not in: the executor binds only a member's buffer")
                # the loader reads the group's 'size' (and keeps it unused): it must be an integer
                if not _int(grp.get("size")) or grp["size"] < 0:
                    raise err(gp + (("size",) if "size" in grp else ()),
                              "a switch channel's rank group needs 'size', a non-negative integer")
                out.append(SwitchGroup(tuple(ranks), letter, gp + ("ranks",)))
        return out

    def _check_partners(self):
        """Every member of a group declares it too: the switch channels rank A shares with rank B,
        in A's order, are the ones B shares with A in B's order (same ranks, same buffer), since
        the members connect each group together, one after the other."""
        shared: dict[tuple[int, int], list[SwitchGroup]] = {}
        for a in range(self.R):
            for grp in self.groups[a]:
                for b in grp.ranks:
                    if b != a:
                        shared.setdefault((a, b), []).append(grp)
        for (a, b), mine in sorted(shared.items()):
            theirs = shared.get((b, a), [])
            for m, grp in enumerate(mine):
                other = theirs[m] if m < len(theirs) else None
                if other is None or sorted(other.ranks) != sorted(grp.ranks) or other.letter != grp.letter:
                    said = ("declares no such channel" if other is None else
                            f"declares its switch channel over ranks {list(other.ranks)} (buffer "
                            f"'{other.letter}') there")
                    raise self.err(grp.path, f"rank {a}'s switch (NVLS) channel over ranks {list(grp.ranks)} "
                                             f"(buffer '{grp.letter}') has no partner on rank {b}: it is the "
                                             f"{_nth(m)} rank {a} shares with rank {b}, and rank {b} {said}")

    def members(self) -> list[tuple[int, ...]]:
        """The groups of every rank (each group's ranks share a node: the switch maps their memory)."""
        return [g.ranks for gs in self.groups for g in gs]

    # -- operations
    def expand(self, r: int, op: dict, p: tuple, tb_switch: list, rbufs: list) -> list[tuple[PlanOp, dict]]:
        """The memory-channel operations switch operation ``op`` (at ``p``, of rank ``r``, in a
        thread block whose switch channels are ``tb_switch``, rank-level ids) stands for, each with
        the remote-buffer table its buffer ids index (``{"memory": [index in rbufs]}``). Remote
        buffers the rewrite needs are appended to ``rbufs`` (the rank's ``(rank, letter)`` list)."""
        err, name = self.err, op["name"]
        ctype = op.get("channel_type", "switch")
        if ctype != "switch":
            raise err(p + ("channel_type",), f"'{name}' works over a switch channel, not a {ctype!r} one")
        tbg = None
        if "tbg_info" in op:
            g = op["tbg_info"]
            tbg = (g["tb_id"], g["tbg_size"])      # checked with every other tbg_info
        sref, dref, dpath, sg, dg = self._operands(r, op, p, tb_switch)
        return self._rewrite(r, name, sref, dref, dpath, sg, dg, tbg, rbufs)

    def _operands(self, r: int, op: dict, p: tuple, tb_switch: list):
        """The one source and one destination reference of switch operation ``op``, checked, with
        the destination's path and the switch groups they name (``None`` for a local source)."""
        err, name = self.err, op["name"]
        srcs = self._refs(op, "src_buff", p)
        dsts = self._refs(op, "dst_buff", p)
        for side, refs in (("src_buff", srcs), ("dst_buff", dsts)):
            if len(refs) != 1:
                raise err(p + ((side,) if side in op else ()),
                          f"'{name}' needs exactly one '{side}' reference (the executor reads only the first), "
                          f"it has {len(refs)}")
        (sref, spath), (dref, dpath) = srcs[0], dsts[0]
        if name == "glres":
            sg = self._group(r, sref, spath, tb_switch, name)
        else:
            sg = None
            if "switch_channel_id" in sref or "buffer_id" in sref or sref.get("type") not in _LETTERS:
                raise err(spath, f"'{name}' stores a region of the rank's own buffers: its source needs a "
                                 f"'type' (i, o or s)")
            if name == "gstorepkt" and sref["type"] != "s":
                raise err(spath + ("type",), "'gstorepkt' puts LL packets of the rank's scratch: its source "
                                             "must be the scratch ('s')")
            self._in_range(r, sref["type"], sref, spath)
        dg = self._group(r, dref, dpath, tb_switch, name)
        if self.double and name != "gstorepkt":
            for g, at in ((sg, spath), (dg, dpath)):
                if g is not None and g.letter == "s":
                    # the kernel's multimem address carries no scratch half (gstorepkt's does)
                    raise err(at + ("switch_channel_id",), f"'{name}' through a switch channel over the scratch "
                                                           f"of a plan with use_double_scratch_buffer: the "
                                                           f"executor's multimem access always reaches the first "
                                                           f"half, while the plan's own scratch accesses alternate "
                                                           f"halves call by call")
        if name == "gstorepkt" and dg.letter != "s":
            raise err(dpath + ("switch_channel_id",), f"'gstorepkt' writes packets into the scratch of every "
                                                      f"member: its switch channel binds buffer '{dg.letter}'")
        if sref["size"] != dref["size"]:
            raise err(dpath + ("size",), f"'{name}' moves {sref['size']} chunks from its source and "
                                         f"{dref['size']} into its destination: the sizes must agree")
        return sref, dref, dpath, sg, dg

    def _rewrite(self, r: int, name: str, sref: dict, dref: dict, dpath: tuple, sg, dg, tbg,
                 rbufs: list) -> list[tuple[PlanOp, dict]]:
        """The memory-channel operations a checked switch operation stands for, with the
        remote-buffer table they index (remote buffers added to ``rbufs`` as needed)."""
        err = self.err
        n, si, di = sref["size"], sref["index"], dref["index"]
        table: list[int] = []

        def rb(peer, letter, index):
            key = (peer, letter)
            added = self._added.setdefault(r, {})
            if key not in added:
                added[key] = len(rbufs)
                rbufs.append(key)
            if added[key] not in table:
                table.append(added[key])
            return remote(table.index(added[key]), index, n)

        dst_peers = [m for m in dg.ranks if m != r]
        if name == "glres":
            src_peers = [m for m in sg.ranks if m != r]
            own_src, own_dst = local(sg.letter, si, n), local(dg.letter, di, n)
            if not src_peers:
                ops = self._store(own_src, own_dst, [rb(m, dg.letter, di) for m in dst_peers], tbg)
            else:
                srcs_ = (own_src,) + tuple(rb(m, sg.letter, si) for m in src_peers)
                dsts_ = (own_dst,) + tuple(rb(m, dg.letter, di) for m in dst_peers)
                ops = [PlanOp("rres", srcs_, dsts_, "memory", tbg=tbg)]
        elif name == "gstore":
            own_src = local(sref["type"], si, n)
            ops = self._store(own_src, local(dg.letter, di, n), [rb(m, dg.letter, di) for m in dst_peers], tbg)
        else:
            if si != di:
                raise err(dpath + ("index",), f"'gstorepkt' stores the packets of scratch chunks [{si}, {si + n}) "
                                              f"at chunk {di} of every member, its own rank {r} included: a "
                                              f"packet copy within one rank's scratch is not modelled")
            ops = []
            if dst_peers:
                ops.append(PlanOp("rppkt", (local("s", si, n),), tuple(rb(m, "s", di) for m in dst_peers),
                                  "memory", tbg=tbg))
        return [(replace(o, switch=name), {"memory": list(table)}) for o in ops]

    @staticmethod
    def _store(src, own_dst, peer_dsts, tbg) -> list[PlanOp]:
        """``src`` put to every peer's copy and copied into the rank's own (unless it is there)."""
        ops = []
        if peer_dsts:
            ops.append(PlanOp("put", (src,), tuple(peer_dsts), "memory", tbg=tbg))
        if (src.type, src.index) != (own_dst.type, own_dst.index):
            ops.append(PlanOp("copy", (src,), (own_dst,), tbg=tbg))
        return ops

    def _refs(self, op, side, p) -> list[tuple[dict, tuple]]:
        refs = op.get(side, [])
        if not isinstance(refs, list):
            raise self.err(p + (side,), f"'{side}' must be a list")
        out = []
        for j, ref in enumerate(refs):
            where = p + (side, j)
            if not isinstance(ref, dict) or not _int(ref.get("index")) or not _int(ref.get("size")):
                raise self.err(where, "a buffer reference needs integer 'index' and 'size'")
            if ref["index"] < 0 or ref["size"] < 1:
                raise self.err(where, "a buffer reference's index must be non-negative and its size at least 1")
            out.append((ref, where))
        return out

    def _group(self, r, ref, path, tb_switch, name) -> SwitchGroup:
        """The switch channel a reference names, its region checked on every member."""
        err = self.err
        k = ref.get("switch_channel_id")
        if k is None:
            raise err(path, f"'{name}' reaches every member's buffer through a switch channel: the reference "
                            f"needs a 'switch_channel_id'")
        if not _int(k) or not 0 <= k < len(tb_switch):
            raise err(path + ("switch_channel_id",), f"switch channel {k!r} of a thread block that lists "
                                                     f"{len(tb_switch)} switch channel"
                                                     + ("" if len(tb_switch) == 1 else "s"))
        c = tb_switch[k]
        if not _int(c) or not 0 <= c < len(self.groups[r]):
            raise err(path + ("switch_channel_id",), f"the thread block's switch channel {k} is rank {r}'s "
                                                     f"switch channel {c!r}; rank {r} declares "
                                                     f"{len(self.groups[r])}")
        grp = self.groups[r][c]
        for m in grp.ranks:
            self._in_range(m, grp.letter, ref, path, through=True)
        return grp

    def _in_range(self, owner, letter, ref, path, through=False):
        have = self.chunks(owner, letter)
        lo, hi = ref["index"], ref["index"] + ref["size"]
        if hi > have:
            raise self.err(path + ("index",), f"chunks [{lo}, {hi}) of rank {owner}'s {letter} buffer"
                                 + (" (a member of the switch channel's group)" if through else "")
                                 + f": it has {have}")


def _nth(m: int) -> str:
    return {0: "first", 1: "second", 2: "third"}.get(m, f"{m + 1}th")


__all__ = ["SWITCH_OPS", "SwitchChannels", "SwitchGroup"]
