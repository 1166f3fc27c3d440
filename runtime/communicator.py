"""One rank per process: :class:`Communicator` sets up this process's rank of a compiled algorithm
and runs its collective on the caller's arrays. It is one rank
(:class:`~hccc.runtime.process_rank.ProcessRank`: its kernel, memory, launch and wait) plus its
bootstrap (steps 1 and 4 below) and the collective calls (their arrays:
:mod:`hccc.runtime.call_buffers`; AllToAllv: :class:`~hccc.runtime.alltoallv_call.RankAllToAllv`).

Set-up (``Communicator(algo, rank=, world_size=, ...)``):

1. load the algorithm (a ProgramIR, a compiled OUTDIR or its ``manifest.json``, an ``.rccl`` /
   MSCCL ``.xml`` / ProgramIR ``.json`` file, compiled with ``options``) and check that it is for
   ``world_size`` ranks;
2. build and load *this rank's* kernel only (per dtype and op, cached by content hash);
3. allocate what the rank owns (:class:`~hccc.runtime.rank_memory.RankMemory`, the code the
   single-process runner uses, kernel protocol v2): its control block (tails of the connections
   it receives on, heads of those it sends on, progress counters) and the FIFOs it receives on,
   in memory the platform can export (CPU emulation: POSIX shared memory; CUDA / HIP: IPC
   handles), its flags (abort flag, error record) and a small host segment (POSIX shared memory:
   process id, barrier counter, state, the call being made) for host-side barriers and failure
   detection. The flags: on the CPU emulation one more shared-memory block (abort flag at 0,
   error record at 64) that every peer maps, so a failing rank raises its peers' abort flags
   with plain stores; on CUDA / HIP the abort flag is this process's pinned, mapped host memory
   (:meth:`Platform.host_flags`: the host raises it with a plain store while the kernel spins;
   IPC cannot export it) and the error record device memory, and a peer's failure reaches this
   rank through the host segments: the host watch running during every call sees the peer
   failed or gone and raises this rank's own flag;
4. exchange the handles through the bootstrap (:mod:`hccc.runtime.bootstrap`: torch.distributed's
   process group or a store), map the memory of the peers this rank sends to or receives from
   (a receive connection's ``head`` lives in the sender's control block), write the connection
   tables, and wait until every rank has mapped everything; then the names are dropped (nothing
   stays in ``/dev/shm`` even if a process is killed later).

Table mode: an OUTDIR compiled with ``--codegen table`` runs the generic kernels; this rank's
table (checked against the manifest) is copied to its memory and passed after the kernel
argument, as the single-process runner does.

A collective call (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``reduce``,
``all_to_all``, and a method per further collective of :mod:`hccc.compiler.frontend.collectives`,
named by its spec: the one the algorithm implements) checks the arrays (type, size, this rank's
share of an uneven count), meets its peers at a host barrier where every rank's call is compared
(collective, count, dtype, op: a mismatch is an error on every rank, not a hang), zeroes the
counters it owns, meets them again (nobody sends into a FIFO before its receiver has reset it) and
launches its kernel under the FIFO protocol its size asks for (``proto``: ``"auto"`` runs LL up to the
crossover and Simple above, :func:`hccc.runtime.rank_memory.launch_proto`, the rule ``hccc run --proto``
follows; the protocol each rank chose is compared with the call, and :attr:`Communicator.last_proto`
says what ran) and on the arrays themselves (temporaries only where the algorithm's buffers
cannot alias the way the call asks). While the kernel runs, the host watches its peers: a peer
process that died, or a peer that reported a failure, raises this rank's abort flag; a rank whose
kernel fails raises every peer's. Every rank then gets a :class:`CommunicatorError` naming the
cause within the timeout, and the communicator is unusable (``close()`` releases its memory; a new
communicator works).

Nodes (``node=``, ``$HCCC_NODE``, default the host name): ranks on one node map each other's
memory; ranks on different nodes connect through the network transport (:mod:`hccc.runtime.net`:
mirrors of the remote FIFOs and counters carried by a C++ progress thread over UCX, and mirrors of
the remote host segments, so barriers and failure reports work the same across nodes).
"""
from __future__ import annotations

import ctypes
import os
import socket
from pathlib import Path

from hccc.compiler.frontend.collectives import SPECS, CollectiveSpec
from hccc.compiler.ir.extents import count_unit
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime import shm
from hccc.runtime.bootstrap import Bootstrap, BootstrapError, exchange, make_bootstrap
from hccc.runtime.call_buffers import CallError, call_arrays, device_kind, full_count, route, sync_caller
from hccc.runtime.generated import GeneratedProgram, check_codegen
from hccc.runtime.checked_run import DTYPES, ELEMENT_BYTES, OPS
from hccc.runtime.memory_limits import check_fifo_memory, refused_memory
from hccc.compiler.backend.abi import NSLOTS
from hccc.compiler.passes.slicing import budget_slot_capacity
from hccc.runtime.rank_memory import RankMemory, fifo_budget_bytes
from hccc.runtime.platform import PlatformError
from hccc.runtime.process_rank import METHODS, CommunicatorError, ProcessRank
from hccc.util import dtypes as dtypes_table


def _load(algo, options) -> tuple[ProgramIR, list[str] | None, str | None]:
    """(ProgramIR, per-rank manifest platforms or None, code-generation mode of a compiled OUTDIR
    or None) of ``algo``."""
    if isinstance(algo, ProgramIR):
        return algo, None, None
    from hccc.util.diagnostics import CompileError
    from hccc.compiler.pipeline import load_manifest, load_program, manifest_codegen, manifest_path
    path = Path(algo)
    if not path.exists():
        raise CommunicatorError(f"{path}: no such algorithm, OUTDIR or ProgramIR")
    mpath = manifest_path(path)
    if mpath is not None:
        if not mpath.exists():
            raise CommunicatorError(f"{path}: a directory without manifest.json (not a compiled OUTDIR)")
        try:
            ir, plats = load_manifest(mpath)
            return ir, plats, manifest_codegen(mpath)
        except CompileError as exc:
            raise CommunicatorError(f"{mpath}: {exc}") from None
    return load_program(path, options), None, None


# ------------------------------------------------------------------------------- the communicator
class Communicator(ProcessRank):
    """This process's rank of a compiled collective algorithm; see the module docstring.

    ``algo``: a ProgramIR, a compiled OUTDIR (or its ``manifest.json``), or an algorithm file
    (``.rccl``, MSCCL ``.xml``, ProgramIR ``.json``; compiled with ``options``, a
    :class:`~hccc.compiler.pipeline.CompileOptions`). Bootstrap (one of): ``group`` (a torch
    ProcessGroup; the default group when torch.distributed is initialised and nothing else is
    given), ``store`` (a torch.distributed Store), ``init_method`` (``tcp://HOST:PORT``,
    ``file:///PATH``, ``env://``) or ``bootstrap`` (a :class:`~hccc.runtime.bootstrap.Bootstrap`).
    ``backend``: ``"cpu"`` (the emitted kernel in CPU emulation, memory in POSIX shared memory),
    ``"cuda"`` / ``"hip"``, or a Platform object. ``device``: the GPU (default: the
    ``LOCAL_RANK`` environment variable, else ``rank`` modulo the devices visible). ``timeout_s``:
    how long set-up and every collective wait for peers; ``kernel_timeout_s``: the kernels' own
    spin-wait limit. ``dtype`` / ``op``: the kernel built at set-up (others are built on first use).
    ``codegen``: ``"specialized"`` or ``"table"`` (default: a compiled OUTDIR's own mode, else
    specialised kernels). ``proto``: the FIFO protocol, ``"auto"`` (LL for a call of up to
    :data:`hccc.compiler.backend.abi.LL_AUTO_MAX_BYTES` of full buffer, Simple above), ``"simple"``
    or ``"ll"``; the attribute of that name may be changed between calls (every rank alike).
    :attr:`last_proto` is the protocol the last call ran, :attr:`proto_note` why it is not the one
    asked for (or None): MSCCL imports and slots too small for LL lines run Simple
    (:func:`~hccc.runtime.rank_memory.launch_proto`), and so does a job across nodes (the network
    proxy forwards a slot when its ``tail`` advances; LL messages post none). ``fifo_bytes``: the
    data one connection's FIFO holds (its ``NSLOTS`` slots together, at most the compiled slot's;
    default ``HCCC_FIFO_BYTES``, else :data:`~hccc.compiler.passes.slicing.FIFO_BUDGET_BYTES`, 8 MiB):
    the FIFOs are exported before any call size is known, so calls larger than that pipeline
    through them in more micro-batches; every rank must give the same (:attr:`chunk_bytes` is the
    slot capacity it gives, :attr:`compiled_chunk_bytes` the program's).
    """

    def __init__(self, algo, rank: int | None = None, world_size: int | None = None, *, group=None,
                 store=None, init_method: str | None = None, bootstrap: Bootstrap | None = None,
                 backend="cpu", device: int | None = None, name: str | None = None, options=None,
                 timeout_s: float = 60.0, kernel_timeout_s: float = 30.0, dtype: str = "float32",
                 op: str = "sum", nthreads: int | None = None, cache_dir=None,
                 codegen: str | None = None, node: str | None = None, proto: str = "auto",
                 fifo_bytes: int | None = None):
        super().__init__(proto, timeout_s, kernel_timeout_s)
        self._node, self._boot = node, None
        self._fifo_request = fifo_bytes
        try:
            ir, plats, compiled = _load(algo, options)
            self._setup(ir, plats, compiled if codegen is None else codegen, rank, world_size,
                        dict(group=group, store=store, init_method=init_method, bootstrap=bootstrap,
                             name=name or ir.name), backend, device, dtype, op, nthreads, cache_dir)
            self._exchange(algo, cache_dir)
        except BaseException as exc:
            refused = refused_memory(exc) if isinstance(exc, Exception) else None
            if refused is not None:       # memory the system refused: said so, with the rank
                exc = CommunicatorError(f"rank {getattr(self, 'rank', '?')}: setting up: {refused}")
            if self._boot is not None and isinstance(exc, Exception):
                # the peers end their set-up at once with this reason, not at the timeout
                why = str(exc)
                prefix = f"rank {self.rank}: "
                self._boot.fail(why[len(prefix):] if why.startswith(prefix) else why)
            self._release()
            if refused is not None:
                raise exc from None
            raise

    # ------------------------------------------------------------------ set-up
    def _setup(self, ir, plats, codegen, rank, world_size, boot: dict, backend, device, dtype, op,
               nthreads, cache_dir) -> None:
        """Steps 1-3 of the module docstring: the program, the bootstrap, the platform, this
        rank's kernel and the memory it owns."""
        codegen = codegen or "specialized"
        check_codegen(codegen)
        self.codegen, self.ir, self.collective = codegen, ir, ir.collective
        if dtype not in DTYPES or op not in OPS:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)} and op one of {', '.join(OPS)}")
        try:
            self._boot = make_bootstrap(rank, world_size, timeout_s=self.timeout_s, **boot)
        except BootstrapError as exc:
            raise CommunicatorError(str(exc)) from None
        self.rank, self.world_size = int(self._boot.rank), int(self._boot.world_size)
        self._wake = getattr(self._boot, "wake", None)
        self._in_process = bool(getattr(self._boot, "same_process", False))
        if self.world_size != ir.nranks:
            raise CommunicatorError(f"{ir.name} is an algorithm for {ir.nranks} ranks; this job has "
                                    f"{self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise CommunicatorError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        if not self._in_process:     # (ranks in this process name no segments; their job reaps once)
            shm.reap_stale()
        self.rank_platform = plats or ["hip" if backend == "hip" else "cuda"] * ir.nranks
        pf = self._pf = self._platform(backend, device, cache_dir)
        # this rank's kernel
        self._prog = prog = self._generated(ir, cache_dir, codegen)
        # the FIFOs are exported before any call size is known: sized by the per-connection budget
        # (HCCC_FIFO_BYTES), at most the compiled slot; larger calls pipeline through them
        try:
            self.fifo_bytes = fifo_budget_bytes(self._fifo_request)
        except ValueError as exc:
            raise CommunicatorError(f"rank {self.rank}: {exc}") from None
        self.compiled_chunk_bytes = prog.chunk_bytes
        self.chunk_bytes = budget_slot_capacity(ir, prog.chunk_bytes, self.fifo_bytes, NSLOTS)
        step_chunks = ir.max_step_chunks      # (computed from the primitives: once, not per plan)
        self._plans = list(prog.plans_with_capacity(self.chunk_bytes, step_chunks))
        self.slot_bytes = self._plans[self.rank].slot_bytes
        self._agree(prog.manifest, self.rank_platform, codegen, dtype, op)
        self.grid = prog.blocks(self.rank)
        self.block = prog.threads(self.rank_platform[self.rank], pf, nthreads)
        self._auto_threads = nthreads is None
        #: threads per block chosen below the emitted count so that the kernel's blocks fit, and why
        self.threads_note = None
        self._kernels: dict[tuple[str, str], object] = {}
        self._kernel(dtype, op)
        check_fifo_memory(ir.name, self._plans, [self.rank])
        self._allocate()

    def _generated(self, ir: ProgramIR, cache_dir, codegen: str) -> GeneratedProgram:
        """The generated sources of ``ir`` for the ranks' manifest platforms, read once
        (:class:`~hccc.runtime.generated.GeneratedProgram`): this process's own."""
        return GeneratedProgram(ir, self.rank_platform, cache_dir, codegen)

    def _exchange(self, algo, cache_dir) -> None:
        """Step 4 of the module docstring: exchange the handles, map the peers' memory, write
        the connection tables, and drop the names once every rank has mapped everything."""
        from hccc.runtime import net
        pf, mem = self._pf, self._mem
        try:
            my_node = net.node_name(self._node)
        except ValueError as exc:
            raise CommunicatorError(f"rank {self.rank}: {exc}") from None
        me = {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "node": my_node,
              "platform": pf.name, "device": int(self.device)}
        if self._in_process:
            # ranks that are threads of one process reach each other's memory as it is: its
            # pointers, and the host segment as an object (the bootstrap hands objects over)
            me.update(ptrs=[mem.ctrl, mem.slots, self._owned.flags_ptr or 0], hostseg=self._hosts.own)
        else:
            me.update(ctrl=pf.ipc_export(mem.ctrl).hex(), slots=pf.ipc_export(mem.slots).hex(),
                      flags=(pf.ipc_export(self._owned.flags_ptr).hex()
                             if self._owned.flags_ptr is not None else ""),
                      hostseg=self._hosts.own.handle.hex(), ptrs=None)
        peers = self._exchange_values(me, "handles")
        self.nodes = nodes = [p["node"] for p in peers]
        self._check_nodes(peers, my_node)
        if len(set(nodes)) > 1:
            for why in net.placement_problems(nodes, self.rank_platform, assumed=net.declared_nodes(algo, self.ir)):
                import warnings
                warnings.warn(f"{self.ir.name}: {why}", RuntimeWarning, stacklevel=3)
            try:
                self._net = net.NetLink(
                    self.rank, nodes, self._plans, mem, self._hosts.own.address, self._all_gather,
                    self._owned.local, pf.host_flags, cache_dir=cache_dir,
                    stale_s=max(1.0, min(5.0, self.timeout_s / 3)))
            except net.TransportError as exc:
                raise CommunicatorError(f"rank {self.rank} (node {my_node}): {exc}") from None
        self._hosts.know([p["pid"] for p in peers], nodes)
        self._hosts.net = self._net
        bases = self._map_peers(peers, my_node)
        # one GPU: one process's device index (ranks of other processes on one GPU, whose device
        # indices need not name one GPU, are taken as on other GPUs: system scope)
        self._gpus = [(p["host"], p["pid"], p["platform"], p["device"]) for p in peers]
        mem.connect(self._plans, lambda peer: bases.get(peer, (0, 0)), self._gpus)
        if self._net is not None:
            self._owned.host_flag_ptrs.append(self._net.mwords)
            self._net.wire()              # cross-node connections through the mirrors
        # every rank has mapped every segment: drop the names
        self._all_gather(b"", "mapped")
        for p in self._owned.segments_own:
            pf.ipc_seal(p)
        self._hosts.own.unlink()

    def _refit(self, capacity: int) -> None:
        """FIFOs of slots of ``capacity`` bytes (as ``chunk_bytes``, at most the compiled one),
        for ranks that are threads of this process, whose memory their peers
        reach by address: with no kernel running, this rank's control block, FIFOs, orphan FIFOs
        and connection tables are allocated anew for the plans at that capacity (the old freed,
        the memory limit checked first), every rank's new blocks exchanged, the tables written and
        every rank met before any goes on; the plans, the slot size and the calls' plans follow,
        and the next LL call zeroes the slots. Every rank of the job calls it alike."""
        if not self._owned.private:
            raise CommunicatorError(f"rank {self.rank}: FIFOs grow only where every rank is a thread of "
                                    "this process (their memory taken by address)")
        capacity = min(int(capacity), self.compiled_chunk_bytes)
        plans = list(self._prog.plans_with_capacity(capacity, self.ir.max_step_chunks))
        check_fifo_memory(self.ir.name, plans, [self.rank])
        own, old = self._owned, self._mem
        try:
            for ptr in old.allocations:
                own.free(ptr)
            self._mem = mem = RankMemory(plans[self.rank], self._pf, own.exported, own.local,
                                         lambda n: own.local(n, peer=True))
            if self.codegen == "table":
                mem.load_table(self._prog.tables([self.rank])[self.rank])
            self._refits += 1
            bases = self._exchange_values((mem.ctrl, mem.slots), f"fifos {self._refits}")
            mem.connect(plans, lambda peer: bases[peer], self._gpus)
            self._plans, self.chunk_bytes, self.slot_bytes = plans, capacity, plans[self.rank].slot_bytes
            self._call_plans.clear()
            self.ll_epochs.dirty = True
            self._exchange_values(0, f"fifos {self._refits} connected")
        except BaseException as exc:
            # half-way: the old FIFOs are gone and the new ones are not every rank's. The peers,
            # which may wait for this rank's blocks, end at once with the reason, and no rank
            # runs again (:meth:`_rejoin` refuses)
            why = str(exc)
            why = why[len(f"rank {self.rank}: "):] if why.startswith(f"rank {self.rank}: ") else why
            self._no_fifos = f"reallocating its FIFOs for slots of {capacity} bytes failed: {why}"
            self._boot.fail(self._no_fifos)
            raise self._fail(self._no_fifos, abort_peers=False) from None

    def _check_nodes(self, peers: list[dict], my_node: str) -> None:
        """Ranks that say they share a node run on one host, on one platform kind."""
        local_ranks = [r for r in range(self.world_size) if self.nodes[r] == my_node]
        for r in local_ranks:
            if peers[r]["host"] != peers[self.rank]["host"]:
                raise CommunicatorError(
                    f"ranks {self.rank} and {r} say they are on node {my_node} but run on hosts "
                    f"{peers[self.rank]['host']} and {peers[r]['host']}: give each host its own "
                    "node name (node= or HCCC_NODE)")
        kinds = sorted({peers[r]["platform"] for r in local_ranks})
        if len(kinds) > 1:
            raise CommunicatorError(f"the ranks of node {my_node} use different platforms "
                                    f"({', '.join(kinds)}); ranks that share a node share memory")

    def _map_peers(self, peers: list[dict], my_node: str) -> dict[int, tuple[int, int]]:
        """Map what this rank needs of every peer: the host segment (across nodes: its mirror),
        the control and slot blocks of the peers its connection tables point into (the receivers
        of its sends, the senders of what it receives) and, on the CPU emulation, their flags.
        A peer that is a thread of this process (an in-process bootstrap) gives its pointers
        themselves: nothing of it is mapped but its host segment. Returns peer -> (control block,
        slot block) in this process."""
        targets, bases = self._plans[self.rank].peers(), {}
        here = os.getpid()

        def imported(p: dict, key: str) -> int:
            if p.get("ptrs") is not None and int(p["pid"]) == here:
                return int(p["ptrs"][("ctrl", "slots", "flags").index(key)])
            return self._owned.import_segment(bytes.fromhex(p[key]))

        def host_segment(r: int, p: dict) -> None:
            if self._in_process:
                self._hosts.attach(r, segment=p["hostseg"])
            else:
                self._hosts.attach(r, bytes.fromhex(p["hostseg"]))

        try:
            for r, p in enumerate(peers):
                if r == self.rank:
                    continue
                if self.nodes[r] != my_node:
                    self._hosts.attach(r, mirror=self._net.host_mirror(r))
                    continue
                if r in targets:
                    bases[r] = (imported(p, "ctrl"), imported(p, "slots"))
                if self._owned.shared_flags:
                    self._owned.peer_flags[r] = imported(p, "flags")
                host_segment(r, p)
        except (PlatformError, shm.ShmError) as exc:
            raise CommunicatorError(f"rank {self.rank}: cannot map a peer's memory: {exc}") from None
        return bases

    def _release(self) -> None:
        super()._release()
        if self._boot is not None:
            self._boot.close()

    def _agree(self, man: dict, plats, codegen: str, dtype: str, op: str) -> None:
        """Before anything is mapped: every rank runs the same program with the same memory
        layout and protocol (:mod:`hccc.runtime.agreement`), else every rank raises."""
        from hccc.runtime.agreement import first_difference, program_terms
        mine = program_terms(self.ir, man, plats, codegen, dtype, op, fifo_slot_bytes=self.slot_bytes,
                             digest=self._prog.digest)
        why = first_difference(self._exchange_values(mine, "program"))
        if why:
            raise CommunicatorError(f"rank {self.rank}: {why}")

    def _exchange_values(self, value, tag: str) -> list:
        """Every rank's ``value``, in rank order (:meth:`Bootstrap.exchange`: JSON text between
        processes, the objects themselves between the threads of one)."""
        try:
            return exchange(self._boot, value, tag)
        except BootstrapError as exc:
            raise CommunicatorError(f"rank {self.rank}: {exc}") from None

    def _all_gather(self, data: bytes, tag: str) -> list[bytes]:
        try:
            return self._boot.all_gather(data, tag)
        except BootstrapError as exc:
            raise CommunicatorError(f"rank {self.rank}: {exc}") from None

    # ------------------------------------------------------------------ the collectives
    def _prepare(self, method: str, x, out, inplace: bool, op: str):
        """Check the call; returns (count, dtype, input pointer, output pointer, copy-back)
        (:func:`hccc.runtime.call_buffers.route`)."""
        self._check_usable()
        want = METHODS.get(self.collective)
        if want != method:
            raise CommunicatorError(f"{self.ir.name} implements {self.collective} ({want}), not {method}")
        if op not in OPS:
            raise ValueError(f"unknown op {op!r} (expected one of {', '.join(OPS)})")
        spec = SPECS[self.collective]
        bx, bo = call_arrays(method, x, out, self._pf.name)
        if spec.reduces:
            dtypes_table.check_instance(bx.dtype, op)   # (integer avg: refused with the reason)
        count = full_count(spec, method, bx, bo, count_unit(self.ir), self.world_size)
        es = ELEMENT_BYTES[bx.dtype]
        try:
            return (count, bx.dtype) + route(self.ir, spec, self.rank, method, bx, bo, inplace,
                                             self._layout_row(count), count, es, device_kind(self._pf.name))
        except CallError as exc:
            raise CommunicatorError(str(exc)) from None

    def _call(self, method, x, out, inplace, op):
        count, dtype, in_p, out_p, copy_back = self._prepare(method, x, out, inplace, op)
        if self._pf.name != "cpu":
            sync_caller(x)
        self._run(method, count, dtype, op, in_p, out_p)
        if copy_back is not None:
            tmp, dst, nbytes = copy_back
            ctypes.memmove(dst, tmp.ctypes.data, nbytes)

    def all_reduce(self, x, op: str = "sum", *, out=None):
        """Reduce ``x`` over the ranks into ``out`` (default: ``x``, in place); returns it."""
        self._call("all_reduce", x, out, out is None, op)
        return x if out is None else out

    def all_gather(self, x, out):
        """Every rank's ``x`` (its share: chunk ``rank`` of ``out``) gathered into ``out``."""
        self._call("all_gather", x, out, False, "sum")
        return out

    def reduce_scatter(self, x, out, op: str = "sum"):
        """``x`` reduced over the ranks; this rank's share (chunk ``rank``) into ``out``."""
        self._call("reduce_scatter", x, out, False, op)
        return out

    def broadcast(self, x, root: int | None = None, *, out=None):
        """The root's ``x`` into every rank's ``out`` (default: ``x``, in place)."""
        self._check_root(root, "broadcast")
        self._call("broadcast", x, out, out is None, "sum")
        return x if out is None else out

    def reduce(self, x, root: int | None = None, op: str = "sum", *, out=None):
        """``x`` reduced over the ranks into the root's ``out`` (default: ``x``, in place); the other
        ranks' outputs are unspecified."""
        self._check_root(root, "reduce")
        self._call("reduce", x, out, out is None, op)
        return x if out is None else out

    def all_to_all(self, x, out):
        """Block ``j`` of ``x`` to rank ``j``; block ``i`` of ``out`` from rank ``i``."""
        self._call("all_to_all", x, out, False, "sum")
        return out

    def _check_root(self, root, method) -> None:
        have = getattr(self.ir, "root", None)
        if root is not None and have is not None and int(root) != int(have):
            raise ValueError(f"{method}: {self.ir.name} is compiled for root {have}, not {root}")

    # ------------------------------------------------------------------ AllToAllv
    def all_to_all_v(self, x, out=None, counts=None, *, sdispls=None, rdispls=None,
                     device_counts: bool = False, send_counts=None):
        """AllToAllv (:mod:`hccc.runtime.alltoallv`) on this rank's AllToAll program: ``counts[s][d]``
        elements from rank ``s`` to rank ``d`` (the whole ``nranks x nranks`` matrix, the same on
        every rank; zeros allowed; any matrix on any call), block ``(rank, d)`` read from ``x`` at
        ``sdispls[rank][d]`` and block ``(s, rank)`` written to ``out`` at ``rdispls[rank][s]``
        (displacements: the whole matrices, or None for packed). ``out=None`` runs in place
        (symmetric counts, equal displacements). Checked before anything runs: the counts against
        this rank's buffers (:class:`CommunicatorError` naming the entry; the peers fail the call
        too, since this rank never reaches it), and at the call's host barrier every
        rank's counts and displacements against every peer's (a 64-bit digest): ranks that
        disagree all raise :class:`CommunicatorError`, none launches.

        ``device_counts=True``: ``counts`` is an int64 array of ``nranks * nranks`` elements in
        the memory the kernels run in (CPU emulation: host memory; CUDA: a GPU tensor, e.g. a
        router's output gathered to every rank), read by the kernels only, with no host sync:
        they take the prefix sums and, before anything moves, refuse a negative count, a block
        past its sender's send buffer or its receiver's receive buffer, and in place an
        asymmetric matrix (every rank fails the call, the entry named). The host then cannot
        check or compare the counts: every rank must pass buffers of one size (their lengths
        compared at the call's barrier: the kernels check every rank's blocks against them),
        scratch is sized for blocks up to a whole send buffer, and displacements must be None
        (packed).

        ``send_counts`` (instead of ``counts``): this rank's row only, ``send_counts[d]`` elements
        to rank ``d`` (host memory: a list, numpy array or CPU tensor), as a MoE router gives each
        rank. The ranks exchange their rows through their host segments at a barrier of the call
        (:meth:`~hccc.runtime.alltoallv_call.RankAllToAllv.gather_rows`), every rank assembles the
        same matrix, and the call goes on as with ``counts`` (checked against this rank's buffers,
        digests compared): a rank that passes ``counts`` while the others pass rows fails the call
        on every rank. Displacements packed;
        ranks on one node (across nodes the host segments' mirrors do not carry the rows). With
        ``device_counts=True`` the row is ``nranks`` int64 in device memory and never read on the
        host: a first AllToAllv call of the same program gathers the rows into a matrix on the
        device (:meth:`~hccc.runtime.alltoallv_call.RankAllToAllv.gather_rows_on_device`), which
        the call then reads as device counts."""
        self._check_usable()
        self._vcalls.call(x, out, counts, sdispls=sdispls, rdispls=rdispls, device_counts=device_counts,
                          send_counts=send_counts)
        return x if out is None else out

def _spec_method(spec: CollectiveSpec):
    """A Communicator method for a collective without a hand-written one, shaped by its spec:
    ``out`` may be left out (in place) where input and output are one buffer, ``root`` is there
    for a rooted collective and ``op`` for a reducing one."""
    inplace_ok = spec.alias == "same"

    def method(self, x, out=None, *, root: int | None = None, op: str = "sum"):
        if root is not None and not spec.rooted:
            raise TypeError(f"{spec.method}: {spec.title} has no root")
        if op != "sum" and not spec.reduces:
            raise TypeError(f"{spec.method}: {spec.title} reduces nothing (no op)")
        if out is None and not inplace_ok:
            raise ValueError(f"{spec.method}: needs an output array")
        if spec.rooted:
            self._check_root(root, spec.method)
        self._call(spec.method, x, out, out is None, op)
        return x if out is None else out

    method.__name__ = spec.method
    method.__doc__ = (f"{spec.title} (:mod:`hccc.compiler.frontend.collectives`): input ``x``"
                      + (", output ``out`` (default: ``x``, in place)" if inplace_ok else ", output ``out``")
                      + ("; ``root`` checks the compiled root" if spec.rooted else "")
                      + ("; ``op`` the reduction" if spec.reduces else "") + ".")
    return method


for _spec in SPECS.values():   # every collective has its method
    if not hasattr(Communicator, _spec.method):
        setattr(Communicator, _spec.method, _spec_method(_spec))


__all__ = ["Communicator", "CommunicatorError", "METHODS"]
