"""One rank per process: :class:`Communicator` sets up this process's rank of a compiled algorithm
and runs its collective on the caller's arrays.

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
import json
import os
import socket
import time
from pathlib import Path

from hccc.compiler.backend.abi import resolve_proto
from hccc.compiler.frontend.collectives import SPECS, CollectiveSpec
from hccc.compiler.ir.extents import count_unit
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime import shm
from hccc.runtime.alltoallv_call import RankAllToAllv, Staging
from hccc.runtime.bootstrap import Bootstrap, BootstrapError, make_bootstrap
# (_as_buf, _Buf and torch_strided re-exported under their earlier names)
from hccc.runtime.call_buffers import (Buf as _Buf, CallError, as_buf as _as_buf, call_arrays,  # noqa: F401
                                       device_kind, full_count, route, sync_caller, torch_strided)
from hccc.runtime.generated import GeneratedProgram, check_codegen
from hccc.runtime.host_segment import HostSegments, call_type
from hccc.runtime.kernel_abi import ErrorRecord
from hccc.runtime.ll_epoch import LLEpochs
from hccc.runtime.launcher import (DTYPES, ELEMENT_BYTES, OPS, check_fifo_memory, describe_stuck,
                                   fit_block_threads, program_layout)
from hccc.runtime.rank_memory import (LaunchCall, LaunchFlags, RankMemory, launch_proto,
                                      synchronize_in_background)
from hccc.runtime.platform import Instance, Platform, PlatformError, get_platform
from hccc.util import dtypes as dtypes_table

#: the collective each method runs (ProgramIR collective names)
METHODS = {name: spec.method for name, spec in SPECS.items()}
_COLL_CODE = {c: i + 1 for i, c in enumerate(sorted(METHODS))}
#: the CPU emulation's shared flags block: the abort flag at 0, the error record at 64
_FLAGS_BYTES = 64 + ctypes.sizeof(ErrorRecord)
#: how often the wait for this rank's kernel looks at its peers
_WATCH_S = 0.02
#: calls of distinct shapes whose plan (protocol, slice, layout) a communicator keeps: a training
#: job makes a handful of shapes (DDP's buckets, FSDP's shards), each planned once; planning a
#: call (the slice model) took about 0.3 ms of a 4 KiB AllReduce's 8 ms on the CPU emulation
_PLAN_CACHE_MAX = 256


class CommunicatorError(RuntimeError):
    """A collective or the set-up failed (message for the user); the communicator is unusable."""


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
class Communicator:
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
    proxy forwards a slot when its ``tail`` advances; LL messages post none).
    """

    def __init__(self, algo, rank: int | None = None, world_size: int | None = None, *, group=None,
                 store=None, init_method: str | None = None, bootstrap: Bootstrap | None = None,
                 backend="cpu", device: int | None = None, name: str | None = None, options=None,
                 timeout_s: float = 60.0, kernel_timeout_s: float = 30.0, dtype: str = "float32",
                 op: str = "sum", nthreads: int | None = None, cache_dir=None,
                 codegen: str | None = None, node: str | None = None, proto: str = "auto"):
        self.proto = proto                # ValueError for anything but auto / simple / ll
        #: the FIFO protocol the last call ran ("simple" or "ll"; None before the first call)
        self.last_proto: str | None = None
        #: why the last call's protocol is not the one ``proto`` asked for, or None
        self.proto_note: str | None = None
        #: the micro-batch slice (bytes) of the last call (None before the first call)
        self.last_slice_bytes: int | None = None
        self._closed, self._broken, self._node = False, None, node
        self._net = self._pf = self._boot = self._mem = self._hosts = self._scratch = self._abort = None
        self._owned_pf = False
        # what release() gives back: exported and imported segments, allocations, host flags
        self._segments_own, self._imported, self._allocs, self._host_flag_ptrs = [], [], [], []
        self._peer_flags: dict[int, int] = {}
        self.timeout_s = float(timeout_s)
        self.kernel_timeout_s = float(kernel_timeout_s)
        #: a word the caller sets before a call that every rank's call must match (0: none): what
        #: the caller was asked for beyond this call's collective, count, dtype and op (the torch
        #: backend's description of the call: AVG and SUM run the same kernel)
        self.call_tag = 0
        #: a callable the waits poll (host barriers, the kernel's run): a reason to give up (a peer
        #: that is making another call elsewhere), or None
        self.watch = None
        try:
            ir, plats, compiled = _load(algo, options)
            self._setup(ir, plats, compiled if codegen is None else codegen, rank, world_size,
                        dict(group=group, store=store, init_method=init_method, bootstrap=bootstrap,
                             name=name or ir.name), backend, device, dtype, op, nthreads, cache_dir)
            self._exchange(algo, cache_dir)
        except BaseException as exc:
            if self._boot is not None and isinstance(exc, Exception):
                # the peers end their set-up at once with this reason, not at the timeout
                why = str(exc)
                prefix = f"rank {self.rank}: "
                self._boot.fail(why[len(prefix):] if why.startswith(prefix) else why)
            self._release()
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
        if self.world_size != ir.nranks:
            raise CommunicatorError(f"{ir.name} is an algorithm for {ir.nranks} ranks; this job has "
                                    f"{self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise CommunicatorError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        shm.reap_stale()
        self.rank_platform = plats or ["hip" if backend == "hip" else "cuda"] * ir.nranks
        pf = self._pf = self._platform(backend, device, cache_dir)
        # this rank's kernel
        self._prog = prog = GeneratedProgram(ir, self.rank_platform, cache_dir, codegen)
        self._agree(prog.manifest, self.rank_platform, codegen, dtype, op)
        self.grid = prog.blocks(self.rank)
        self.block = prog.threads(self.rank_platform[self.rank], pf, nthreads)
        self._auto_threads = nthreads is None
        #: threads per block chosen below the emitted count so that the kernel's blocks fit, and why
        self.threads_note = None
        self._kernels: dict[tuple[str, str], object] = {}
        self._kernel(dtype, op)
        self.chunk_bytes, self.slot_bytes, self._plans = prog.chunk_bytes, prog.slot_bytes, prog.plans
        check_fifo_memory(ir.name, self._plans, [self.rank])
        self._allocate()

    def _platform(self, backend, device, cache_dir) -> Platform:
        """The Platform object of this rank, its device chosen."""
        mine = self.rank_platform[self.rank]
        if isinstance(backend, Platform):
            pf = backend
        elif backend == "cpu":
            from hccc.runtime.cpu import CpuPlatform
            pf = CpuPlatform(source_platform=mine, cache_dir=cache_dir)
        else:
            pf = get_platform(str(backend))
        self._owned_pf = pf is not backend
        if not pf.runs_sources(mine):
            raise CommunicatorError(f"rank {self.rank} is a {mine.upper()} rank; the {pf.name} "
                                    "platform cannot run it")
        if device is None:
            lr = os.environ.get("LOCAL_RANK", "")
            device = int(lr) if lr.isdigit() else self.rank
        self.device = int(device) % max(1, pf.device_count())
        pf.set_device(self.device)
        return pf

    def _exported(self, n: int) -> int:
        p = self._pf.ipc_malloc(n)
        self._segments_own.append(p)
        return p

    def _local(self, n: int, peer: bool = False) -> int:
        p = self._pf.malloc_peer(n) if peer else self._pf.malloc(n)
        self._allocs.append(p)
        return p

    def _allocate(self) -> None:
        """What this rank owns (:class:`RankMemory`: the control block and receive FIFOs exported
        to the peers, orphan FIFOs and connection tables local; its table in table mode), its
        flags, its host segment and its stream."""
        pf = self._pf
        self._mem = mem = RankMemory(self._plans[self.rank], pf, self._exported, self._local,
                                     lambda n: self._local(n, peer=True))
        self._shared_flags = pf.name == "cpu"
        if self._shared_flags:
            # abort flag and error record in shared memory every peer maps
            self._flags = self._exported(_FLAGS_BYTES)
            self._abort, self._error = self._flags, self._flags + 64
        else:
            # abort flag: pinned, mapped host memory of this process; error record: device memory
            self._abort = pf.host_flags(64)
            self._host_flag_ptrs.append(self._abort)
            self._error = self._local(ctypes.sizeof(ErrorRecord))
            self._flags = None
        self.flags = LaunchFlags(pf, self._abort, self._error)
        if self.codegen == "table":
            try:
                mem.load_table(self._prog.tables([self.rank])[self.rank])
            except PlatformError as exc:
                raise CommunicatorError(f"rank {self.rank}: {exc}") from None
        self._hosts = HostSegments(self.rank, self.world_size, self.timeout_s)
        self._stream = pf.stream()
        self._vcalls = RankAllToAllv(
            self.ir, self.rank, self.world_size, pf, Staging(pf, self._allocs), self._hosts, run=self._run,
            fail=lambda why: self._fail(why, abort_peers=False), barrier=self._barrier,
            next_call=lambda: self._calls + 1, remote=lambda: bool(self._net is not None and self._net.remote),
            error=CommunicatorError)
        self._calls = self._seq = 0
        #: (count, element bytes, protocol asked) -> (LaunchCall, this rank's layout row)
        self._call_plans: dict = {}
        #: LL flag epochs of this rank's FIFOs: every rank derives the same from the same calls
        #: (compared per call), so the slots are zeroed only at the first LL call, after Simple
        #: calls and when the epochs wrap (:mod:`hccc.runtime.ll_epoch`)
        self.ll_epochs = LLEpochs()

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
              "platform": pf.name, "ctrl": pf.ipc_export(mem.ctrl).hex(),
              "slots": pf.ipc_export(mem.slots).hex(),
              "flags": pf.ipc_export(self._flags).hex() if self._flags is not None else "",
              "hostseg": self._hosts.own.handle.hex()}
        peers = [json.loads(b) for b in self._all_gather(json.dumps(me).encode(), "handles")]
        self.nodes = nodes = [p["node"] for p in peers]
        self._check_nodes(peers, my_node)
        if len(set(nodes)) > 1:
            for why in net.placement_problems(nodes, self.rank_platform, assumed=net.declared_nodes(algo, self.ir)):
                import warnings
                warnings.warn(f"{self.ir.name}: {why}", RuntimeWarning, stacklevel=3)
            try:
                self._net = net.NetLink(
                    self.rank, nodes, self._plans, mem, self._hosts.own.address, self._all_gather,
                    self._local, pf.host_flags, cache_dir=cache_dir,
                    stale_s=max(1.0, min(5.0, self.timeout_s / 3)))
            except net.TransportError as exc:
                raise CommunicatorError(f"rank {self.rank} (node {my_node}): {exc}") from None
        self._hosts.know([p["pid"] for p in peers], nodes)
        self._hosts.net = self._net
        bases = self._map_peers(peers, my_node)
        mem.connect(self._plans, lambda peer: bases.get(peer, (0, 0)))
        if self._net is not None:
            self._host_flag_ptrs.append(self._net.mwords)
            self._net.wire()              # cross-node connections through the mirrors
        # every rank has mapped every segment: drop the names
        self._all_gather(b"", "mapped")
        for p in self._segments_own:
            pf.ipc_seal(p)
        self._hosts.own.unlink()

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
        Returns peer -> (control block, slot block) in this process."""
        pf, targets, bases = self._pf, self._plans[self.rank].peers(), {}

        def imported(handle: str) -> int:
            p = pf.ipc_import(bytes.fromhex(handle))
            self._imported.append(p)
            return p

        try:
            for r, p in enumerate(peers):
                if r == self.rank:
                    continue
                if self.nodes[r] != my_node:
                    self._hosts.attach(r, mirror=self._net.host_mirror(r))
                    continue
                if r in targets:
                    bases[r] = (imported(p["ctrl"]), imported(p["slots"]))
                if self._shared_flags:
                    self._peer_flags[r] = imported(p["flags"])
                self._hosts.attach(r, bytes.fromhex(p["hostseg"]))
        except (PlatformError, shm.ShmError) as exc:
            raise CommunicatorError(f"rank {self.rank}: cannot map a peer's memory: {exc}") from None
        return bases

    def _agree(self, man: dict, plats, codegen: str, dtype: str, op: str) -> None:
        """Before anything is mapped: every rank runs the same program with the same memory
        layout and protocol (:mod:`hccc.runtime.agreement`), else every rank raises."""
        from hccc.runtime.agreement import first_difference, program_terms
        mine = program_terms(self.ir, man, plats, codegen, dtype, op)
        gathered = self._all_gather(json.dumps(mine, sort_keys=True).encode(), "program")
        why = first_difference([json.loads(b) for b in gathered])
        if why:
            raise CommunicatorError(f"rank {self.rank}: {why}")

    def _all_gather(self, data: bytes, tag: str) -> list[bytes]:
        try:
            return self._boot.all_gather(data, tag)
        except BootstrapError as exc:
            raise CommunicatorError(f"rank {self.rank}: {exc}") from None

    def _kernel(self, dtype: str, op: str):
        key = (dtype, op)
        if key not in self._kernels:
            pf, prog = self._pf, self._prog
            lib = pf.build(prog.gendir, prog.manifest, Instance(dtype, op), ranks=[self.rank])
            fn = pf.load(lib).function(prog.kernel_symbol(self.rank, dtype, op))
            if self._auto_threads and self.grid > 0:   # fewer threads per block until the grid fits
                flavour = self.rank_platform[self.rank]
                self.block, note = fit_block_threads(
                    self.block, flavour, lambda b: self.grid <= pf.max_resident_blocks(fn, b),
                    least=pf.least_block_threads(flavour))
                self.threads_note = note or self.threads_note
            if self.grid > 0 and self.grid > pf.max_resident_blocks(fn, self.block):
                raise CommunicatorError(
                    f"rank {self.rank}'s kernel needs {self.grid} thread blocks of {self.block} "
                    f"threads resident at once; at most {pf.max_resident_blocks(fn, self.block)} fit")
            self._kernels[key] = fn
        return self._kernels[key]

    # ------------------------------------------------------------------ failure detection
    def _fail(self, why: str, *, abort_peers: bool = True) -> CommunicatorError:
        """Mark this communicator broken, tell the peers (state and reason; abort flags when they
        may be waiting for this rank's kernel), return the error."""
        self._broken = why
        if self._hosts is not None:
            self._hosts.report_failure(why)
        if abort_peers:
            self._abort_peers()
        return CommunicatorError(f"rank {self.rank}: {why}")

    def _abort_peers(self) -> None:
        """Raise the peers' abort flags where they are mapped here (CPU emulation: shared
        memory). On CUDA / HIP they are not: every peer's host watch sees this rank's failed state
        in its host segment and raises its own flag."""
        for f in self._peer_flags.values():
            ctypes.c_uint32.from_address(f).value = 1

    def _barrier(self, what: str) -> None:
        """Host barrier through the host segments, watching the peers (:meth:`HostSegments.barrier`)."""
        why = self._hosts.barrier(what, self.watch)
        if why:
            raise self._fail(why, abort_peers=False)

    def _check_usable(self) -> None:
        if self._closed:
            raise CommunicatorError("the communicator is closed")
        if self._broken:
            raise CommunicatorError(f"rank {self.rank}: the communicator is unusable after an earlier "
                                    f"failure: {self._broken}")

    # ------------------------------------------------------------------ one collective
    def _run(self, method: str, count: int, dtype: str, op: str, in_p: int, out_p: int, v=None) -> None:
        """One launch of ``count`` elements (the full buffer), the one per-call recipe
        (:mod:`hccc.runtime.rank_memory`); ``v``: an AllToAllv call's
        :class:`~hccc.runtime.alltoallv_call.VCall` (``count`` is then its equal-size stand-in,
        which sizes slice and protocol)."""
        pf, ir = self._pf, self.ir
        fn = self._kernel(dtype, op)
        es = ELEMENT_BYTES[dtype]
        call, lay = self._plan(count, es)
        self.last_proto, self.proto_note, self.last_slice_bytes = call.proto, call.note, call.slice_bytes
        epoch, zero = call.launch(self.ll_epochs)
        self._calls += 1
        what = f"{method} #{self._calls}"
        self._hosts.post_call(self._calls, _COLL_CODE[ir.collective], count,
                              call_type(dtype, op, call.proto, epoch, zero), self.call_tag,
                              v.digest if v is not None else 0)
        self._barrier(what)       # every rank finished its previous call
        why = self._hosts.call_mismatch(what)
        if why:
            raise self._fail(why, abort_peers=False)
        self._mem.reset(slots=zero)     # LL: zeroes only when no epoch keeps old lines apart
        if self._net is not None and not self._net.reset(self.timeout_s):
            raise self._fail("the network proxy did not reset its mirrors", abort_peers=False)
        self.flags.clear()
        scr = self._scratch_ptr((ir.scratch_chunks * v.slot if v is not None else lay[2]) * es)
        try:           # every rank makes this call (compared above): every rank refuses it
            call.check(ir)
        except ValueError as exc:
            raise CommunicatorError(f"rank {self.rank}: {what}: {exc}") from None
        args = self._mem.args(call, input=in_p, output=out_p, scratch=scr, abort_flag=self._abort,
                              error=self._error, timeout_s=self.kernel_timeout_s, epoch=epoch)
        if v is not None:
            v.apply(args, ir.scratch_chunks > 0)
        self._barrier(f"{what} (counters reset)")  # nobody sends into a stale FIFO
        if self._net is not None:
            self._net.shape(self.slot_bytes, ir.max_step_chunks, call.slice_bytes)
        if self.grid > 0:
            pf.launch(fn, self.grid, self.block, self._mem.argument(args), self._stream)
        self._wait(method)

    def _plan(self, count: int, es: int):
        """The call's protocol, slice and message bound (the one recipe:
        :meth:`hccc.runtime.rank_memory.LaunchCall.plan`) and this rank's layout row, planned once
        per call shape: every input to them is the shape, the protocol asked for and what the
        communicator fixed when it was made."""
        key = (count, es, self._proto)
        got = self._call_plans.get(key)
        if got is None:
            call = LaunchCall.plan(self.ir, count, es, self.chunk_bytes, proto=self._proto,
                                   ll_refused=self._ll_refused())
            got = self._remember(key, (call, self._layout_row(count)))
        return got

    def _layout_row(self, count: int):
        """This rank's (input, output, scratch elements, input offset, output offset) at ``count``."""
        got = self._call_plans.get(("layout", count))
        return got if got is not None else self._remember(("layout", count),
                                                          program_layout(self.ir, count)[self.rank])

    def _remember(self, key, value):
        if len(self._call_plans) >= _PLAN_CACHE_MAX:
            self._call_plans.clear()
        self._call_plans[key] = value
        return value

    @property
    def proto(self) -> str:
        """The FIFO protocol asked for: ``"auto"``, ``"simple"`` or ``"ll"`` (see the class)."""
        return self._proto

    @proto.setter
    def proto(self, value: str) -> None:
        resolve_proto(value, 0)           # ValueError for anything else
        self._proto = value

    def _choose_proto(self, nbytes: int) -> str:
        """The FIFO protocol of a call of ``nbytes`` (full buffer) under :attr:`proto`; sets
        :attr:`last_proto` and :attr:`proto_note`. Every rank computes it from the same call and
        the same job, and the call check compares it."""
        proto, note = launch_proto(self.ir, self.proto, nbytes, self.chunk_bytes, self._ll_refused())
        self.last_proto, self.proto_note = proto, note
        return proto

    def _ll_refused(self) -> str | None:
        """Why this job cannot run LL at all, or None."""
        if self._net is None:
            return None
        return ("a job across nodes runs Simple: the network proxy forwards a FIFO slot when its tail "
                "advances, and LL messages post no tail")

    def _scratch_ptr(self, nbytes: int) -> int:
        if self._scratch is None or self._scratch[1] < nbytes:
            if self._scratch is not None:
                self._pf.free(self._scratch[0])
            self._scratch = (self._pf.malloc(max(nbytes, 16)), max(nbytes, 16))
        return self._scratch[0]

    def _wait(self, method: str) -> None:
        """Wait for this rank's kernel, watching the peers; raise on any failure."""
        done, failure, waiting = synchronize_in_background([self._pf], "hccc-comm-wait")
        limit = self.timeout_s + 2 * self.kernel_timeout_s
        deadline = time.monotonic() + limit
        cause = None
        while not done.wait(_WATCH_S):
            bad = self._hosts.peer_problem(self._calls, self.watch)
            if bad and cause is None:
                cause = bad
                self.flags.raise_abort()            # abort this rank's kernel
                self._abort_peers()
            if time.monotonic() > deadline:
                if cause is None:
                    cause = f"kernel still running after {limit:g} s"
                    self.flags.raise_abort()
                if time.monotonic() > deadline + max(5.0, self.kernel_timeout_s):
                    self._broken = f"{cause}; the kernel ignores the abort flag"
                    raise CommunicatorError(f"rank {self.rank}: {method}: {self._broken}")
        # the waiter has set `done` and is about to end: join it, so that a call that returns or
        # raises leaves no thread of its own behind
        waiting.join(max(5.0, self.kernel_timeout_s))
        if failure:
            raise self._fail(f"{method}: {failure[0]}")
        rec = self.flags.record()
        if cause is None and not self.flags.aborted and not rec.valid:
            # a finished call's puts (the last credits) land before the counters are reset
            if self._net is not None and not self._net.drain(self.timeout_s):
                raise self._fail(f"{method} #{self._calls}: the network did not complete this "
                                 f"rank's last puts within {self.timeout_s:g} s")
            self._hosts.mark_done(self._calls)
            return
        what = describe_stuck(self.ir, rec, self._pf.ticks_per_us) if rec.valid else None
        if cause is None:
            cause = self._hosts.peer_problem(self._calls, self.watch)
            # a peer that aborted this kernel records why once its own kernel has stopped (across
            # nodes its state travels through the proxy): give the reason a moment to arrive
            until = time.monotonic() + 1.0
            while cause is None and not what and time.monotonic() < until:
                time.sleep(0.01)
                cause = self._hosts.peer_problem(self._calls, self.watch)
            cause = cause or ("aborted by a peer" if not what else None)
        raise self._fail(f"{method} #{self._calls} failed: " + "; ".join(p for p in (cause, what) if p))

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
        they take the prefix sums and refuse a negative count themselves (every rank fails the
        call). The host then cannot check or compare the counts: every rank must pass buffers
        of one size (compared), scratch is sized for blocks up to a whole send buffer, and
        displacements must be None (packed).

        ``send_counts`` (instead of ``counts``): this rank's row only, ``send_counts[d]`` elements
        to rank ``d`` (host memory: a list, numpy array or CPU tensor), as a MoE router gives each
        rank. The ranks exchange their rows through their host segments at a barrier of the call
        (:meth:`RankAllToAllv.gather_rows <hccc.runtime.alltoallv_call.RankAllToAllv.gather_rows>`), every rank assembles the same matrix, and the call goes on as with
        ``counts`` (checked against this rank's buffers, digests compared): a rank that passes
        ``counts`` while the others pass rows fails the call on every rank. Displacements packed;
        ranks on one node (across nodes the host segments' mirrors do not carry the rows). With
        ``device_counts=True`` the row is ``nranks`` int64 in device memory and never read on the
        host: a first AllToAllv call of the same program gathers the rows into a matrix on the
        device (:meth:`~hccc.runtime.alltoallv_call.RankAllToAllv.gather_rows_on_device`), which
        the call then reads as device counts."""
        self._check_usable()
        self._vcalls.call(x, out, counts, sdispls=sdispls, rdispls=rdispls, device_counts=device_counts,
                          send_counts=send_counts)
        return x if out is None else out

    # ------------------------------------------------------------------ teardown
    def _release(self) -> None:
        pf = self._pf
        if self._net is not None:         # the proxy stops before the memory it reads goes
            self._net.drain(0.5 if self._broken else 2.0)   # the last state reaches the peers
            self._net.close()
            self._net = None
        if self._hosts is not None:
            self._hosts.close()
            self._hosts = None
        if pf is not None and not (self._broken and "ignores the abort flag" in self._broken):
            _quietly(pf.ipc_close, self._imported)
            _quietly(pf.free, self._segments_own + self._allocs + self._host_flag_ptrs
                     + ([self._scratch[0]] if self._scratch else []))
            if self._owned_pf:
                pf.close()
        elif pf is not None:
            _quietly(pf.ipc_seal, self._segments_own)    # names only: the mappings stay with the kernel
        self._imported, self._segments_own, self._allocs, self._scratch = [], [], [], None
        self._host_flag_ptrs = []
        if self._boot is not None:
            self._boot.close()

    def close(self) -> None:
        """Release this rank's memory and mappings (peers see the communicator closed)."""
        if self._closed:
            return
        self._closed = True
        if self._hosts is not None and not self._broken:
            self._hosts.mark_closed()
        self._release()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _quietly(release, items) -> None:
    """``release(item)`` for each item, whatever fails (teardown gives back all it can)."""
    for p in items:
        try:
            release(p)
        except Exception:
            pass


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
