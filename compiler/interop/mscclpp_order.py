"""The order an MSCCL++ plan's thread blocks carry between them, as ProgramIR dependencies.

A NOP row stands where a block passes a semaphore or a barrier (:meth:`SyncOrder.note`); then
(:meth:`SyncOrder.deps`) the ``k``-th acquire of a semaphore depends on the ``k``-th release
(counted from its ``init_value``), every block leaving a barrier on every other block arriving at
the same pass of it, and a packet read on the packet write whose flags it waits for.
"""
from __future__ import annotations

from collections import defaultdict

from hccc.compiler.interop.mscclpp_locate import PlanReader
from hccc.compiler.ir.program_ir import Op


class SyncOrder:
    """Semaphore and barrier passes of every block, as their NOP rows, then the dependencies."""

    def __init__(self, rd: PlanReader, gpus: list):
        self.rd, self.gpus = rd, gpus
        self.sem_rel = defaultdict(list)      # (rank, semaphore) -> [(tb, NOP row, path)] per release
        self.sem_acq = defaultdict(list)      # (rank, semaphore) -> [(tb, NOP row, path)] per acquire
        self.barriers = defaultdict(list)     # (rank, barrier id, k) -> [(tb, arrive, depart, path)]
        self.barrier_uses = defaultdict(int)

    def note(self, add, r, ti, p, op, desc):
        """The NOP rows (made by ``add``) where operation ``op`` passes a semaphore or barrier."""
        name = op.name
        if name == "sem_acquire":
            at = add(r, ti, Op.NOP, p, desc)
            for s in op.semaphore_ids:
                self.sem_acq[(r, s)].append((ti, at, p))
        if name == "sem_release":
            at = add(r, ti, Op.NOP, p, desc)
            for s in op.semaphore_ids:
                self.sem_rel[(r, s)].append((ti, at, p))
        if name == "barrier":
            arrive = add(r, ti, Op.NOP, p, desc)
            depart = add(r, ti, Op.NOP, p, desc)
            # the k-th pass of a block through barrier b meets the k-th of the others
            bkey = (r, op.barrier_id)
            k = self.barrier_uses[(bkey, ti)]
            self.barrier_uses[(bkey, ti)] += 1
            self.barriers[bkey + (k,)].append((ti, arrive, depart, p))

    def deps(self, pk_deps) -> list[tuple[int, int]]:
        """``(row, row it waits for)``: semaphores, the k-th acquire after the k-th release;
        barriers, everyone before everyone; packet reads (``pk_deps``: ``(reader row, packet
        write)``) after the packet writes whose flags they wait for."""
        rd = self.rd
        deps = []
        for key, acqs in self.sem_acq.items():
            rels = self.sem_rel.get(key, [])
            sems = self.gpus[key[0]].get("semaphores", [])
            if key[1] >= len(sems) or not isinstance(sems[key[1]], dict):
                raise rd.err(acqs[0][2], f"semaphore {key[1]} of rank {key[0]} is not declared")
            init = sems[key[1]].get("init_value", 0)
            for side in (acqs, rels):
                if len({x[0] for x in side}) > 1:
                    raise rd.err(side[0][2], f"semaphore {key[1]} of rank {key[0]} is used by several thread "
                                             f"blocks on one side: which release an acquire waits for is not fixed")
            for k, (ti, at, p) in enumerate(acqs):
                kk = k - init
                if kk < 0:
                    continue
                if kk >= len(rels):
                    raise rd.err(p, f"semaphore {key[1]} of rank {key[0]} is acquired more often than released")
                deps.append((at, rels[kk][1]))
        for key, arr in self.barriers.items():
            for ti, _, depart, p in arr:
                for tj, arrive, _, _ in arr:
                    if tj != ti:
                        deps.append((depart, arrive))
        for row, w in pk_deps:
            if w.pk_row is None:
                raise rd.err(w.path, "packets read before anything writes them")
            deps.append((row, w.pk_row))
        return deps


__all__ = ["SyncOrder"]
