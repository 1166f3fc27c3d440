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
import threading
import time
from pathlib import Path

import numpy as np

from hccc.compiler.backend.abi import PROTOS, resolve_proto
from hccc.compiler.frontend.collectives import OWN, SPECS, CollectiveSpec
from hccc.compiler.ir.extents import count_unit
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime import shm
from hccc.runtime.bootstrap import Bootstrap, BootstrapError, make_bootstrap
from hccc.runtime.kernel_abi import ErrorRecord
from hccc.runtime.ll_epoch import LLEpochs
from hccc.runtime.launcher import (CODEGENS, DTYPES, ELEMENT_BYTES, OPS, check_fifo_memory,
                                   describe_stuck, generated_sources, program_layout, rank_blocks)
from hccc.runtime.rank_memory import LaunchCall, RankMemory, RankPlan, launch_proto
from hccc.runtime.platform import Instance, Platform, PlatformError, get_platform
from hccc.util import dtypes as dtypes_table

#: the collective each method runs (ProgramIR collective names)
METHODS = {name: spec.method for name, spec in SPECS.items()}
_COLL_CODE = {c: i + 1 for i, c in enumerate(sorted(METHODS))}
_FLAGS_BYTES = 64 + ctypes.sizeof(ErrorRecord)
# host segment: uint64 words
_H_MAGIC, _H_PID, _H_SEQ, _H_STATE, _H_CALL, _H_COLL, _H_COUNT, _H_TYPE, _H_DONE, _H_TAG, _H_VDIGEST = range(11)
# (word 15: the network proxy's heartbeat in multi-node jobs, hccc.runtime.net.BEAT_OFFSET)
_MAGIC = 0x48434343434F4D31           # "HCCCCOM1"
_RUNNING, _FAILED, _CLOSED = 0, 1, 2
_POLL_S = 0.0005
#: calls of distinct shapes whose plan (protocol, slice, layout) a communicator keeps: a training
#: job makes a handful of shapes (DDP's buckets, FSDP's shards), each planned once; planning a
#: call (the slice model) took about 0.3 ms of a 4 KiB AllReduce's 8 ms on the CPU emulation
_PLAN_CACHE_MAX = 256
#: ``hccc_args::proto`` per protocol name
_PROTO_CODE = {name.lower(): code for name, code in PROTOS}
_REASON_AT, _REASON_MAX = 128, 1024       # a failed rank's reason, in its host segment
#: a rank's AllToAllv counts row (``all_to_all_v(send_counts=)``), in its host segment after the
#: reason: the number of the call it belongs to, then ``nranks`` int64 counts
_ROW_AT = _REASON_AT + _REASON_MAX


def _host_segment_bytes(nranks: int) -> int:
    """A rank's host segment: the words, the failure reason and a counts row (at least a page)."""
    return max(4096, _ROW_AT + 8 * (1 + int(nranks)))


def _call_type(dtype: str, op: str, proto: str, epoch: int = 0, zero: bool = False) -> int:
    """The host segment's word for a call's element type, op, FIFO protocol and LL flag epoch
    (with whether the call zeroes the slots first: :class:`~hccc.runtime.ll_epoch.LLEpochs`)."""
    return (DTYPES.index(dtype) * 16 + OPS.index(op) + 256 * _PROTO_CODE[proto] +
            (int(zero) << 16) + (int(epoch) << 17))


def _describe_type(word: int) -> str:
    """``float32 (sum, ll) in LL epoch 3`` from a :func:`_call_type` word."""
    epoch, word = divmod(word, 1 << 17)
    zero, word = divmod(word, 1 << 16)
    pr, rest = divmod(word, 256)
    pd, po = divmod(rest, 16)
    protos = {v: k for k, v in _PROTO_CODE.items()}
    return (f"{DTYPES[pd] if pd < len(DTYPES) else '?'} ({OPS[po] if po < len(OPS) else '?'}, "
            f"{protos.get(pr, '?')})" + (f" in LL epoch {epoch}{' (zeroing)' if zero else ''}" if pr else ""))


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


# ------------------------------------------------------------------------------- arrays
#: numpy's element types (and their __cuda_array_interface__ typestr) of every dtype of the one
#: table, hccc.util.dtypes (bfloat16: ml_dtypes' or torch's, matched by name)
_NP_NAMES = {np.dtype(d.numpy): d.name for d in dtypes_table.DTYPES if d.name != "bfloat16"}
_TYPESTR = {np.dtype(d.numpy).newbyteorder("<").str: d.name for d in dtypes_table.DTYPES if d.name != "bfloat16"}


class _Buf:
    """A caller's array as (address, elements, dtype name, device kind)."""

    def __init__(self, ptr: int, n: int, dtype: str, device: str, keep=None):
        self.ptr, self.n, self.dtype, self.device, self.keep = ptr, n, dtype, device, keep


def torch_strided(a):
    """torch's dense layout (torch is imported by whoever passed the tensor ``a``)."""
    import torch
    return torch.strided


def _as_buf(a, what: str) -> _Buf:
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        name = str(a.dtype).replace("torch.", "")
        if name not in DTYPES:
            raise TypeError(f"{what}: torch dtype {a.dtype} is not one of {', '.join(DTYPES)}")
        if a.layout != torch_strided(a):
            raise TypeError(f"{what}: a {str(a.layout).replace('torch.', '')} tensor; the collectives "
                            "take dense (strided) tensors: pass .to_dense()")
        if a.is_neg() or a.is_conj():      # lazy views: memory holds other values than the tensor
            raise ValueError(f"{what}: a lazily {'negated' if a.is_neg() else 'conjugated'} view, whose "
                             "memory does not hold its values: pass .resolve_neg() / .resolve_conj()")
        if not a.is_contiguous():
            raise ValueError(f"{what}: the tensor must be contiguous")
        return _Buf(int(a.data_ptr()), int(a.numel()), name, "cuda" if a.is_cuda else a.device.type, a)
    if isinstance(a, np.ndarray):
        name = _NP_NAMES.get(a.dtype) or ("bfloat16" if a.dtype.name == "bfloat16" else None)
        if name is None:
            raise TypeError(f"{what}: numpy dtype {a.dtype} is not one of {', '.join(DTYPES)}")
        if not (a.flags.c_contiguous and a.flags.writeable):
            raise ValueError(f"{what}: the array must be C-contiguous and writable")
        return _Buf(int(a.ctypes.data), int(a.size), name, "cpu", a)
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is not None:
        name = _TYPESTR.get(cai["typestr"])
        if name is None:
            raise TypeError(f"{what}: element type {cai['typestr']} is not one of {', '.join(DTYPES)}")
        n = int(np.prod(cai["shape"])) if cai["shape"] else 1
        strides = cai.get("strides")
        if strides is not None and tuple(strides) != tuple(
                int(np.prod(cai["shape"][i + 1:])) * np.dtype(cai["typestr"]).itemsize
                for i in range(len(cai["shape"]))):
            raise ValueError(f"{what}: the array must be C-contiguous")
        return _Buf(int(cai["data"][0]), n, name, "cuda", a)
    if hasattr(a, "__dlpack__"):
        return _as_buf(np.from_dlpack(a), what)
    raise TypeError(f"{what}: expected a numpy array, a torch tensor or a CUDA array "
                    f"(__cuda_array_interface__), not {type(a).__name__}")


def _sync_caller(a) -> None:
    """Wait for the work the caller queued on its current stream (the kernel runs on the
    communicator's own stream, after a host barrier)."""
    mod = type(a).__module__.split(".")[0]
    if mod == "torch":
        import torch
        torch.cuda.current_stream(a.device).synchronize()
    elif mod == "cupy":
        import cupy
        cupy.cuda.get_current_stream().synchronize()


class _VCall:
    """An AllToAllv call's device pointers (counts, displacements or 0, block-piece table), the
    scratch slot's elements and the digest every rank compares (0: device counts, not known)."""

    def __init__(self, counts: int, displs: int, vmap: int, slot: int, digest: int):
        self.counts, self.displs, self.vmap, self.slot, self.digest = counts, displs, vmap, slot, digest


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
        #: the micro-batch slice (bytes) of the last call (:func:`~hccc.runtime.rank_memory.launch_slice_bytes`;
        #: None before the first call)
        self.last_slice_bytes: int | None = None
        self._closed = False
        self._net = None
        self._node = node
        self._broken: str | None = None
        self._segments_own: list[int] = []
        self._imported: list[int] = []
        self._host_own: shm.Segment | None = None
        self._host_peer: dict[int, shm.Segment] = {}
        self._pf: Platform | None = None
        self._owned_pf = False
        self._boot: Bootstrap | None = None
        self._mem: RankMemory | None = None
        self._allocs: list[int] = []
        self._scratch: tuple[int, int] | None = None
        self._host_flag_ptrs: list[int] = []
        self._table: int | None = None
        self._peer_flags: dict[int, int] = {}
        self._abort: int | None = None
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
            self._setup(algo, rank, world_size, group, store, init_method, bootstrap, backend,
                        device, name, options, dtype, op, nthreads, cache_dir, codegen)
        except BaseException as exc:
            if self._boot is not None and isinstance(exc, Exception):
                # the peers end their set-up at once with this reason, not at the timeout
                why = str(exc)
                prefix = f"rank {self.rank}: "
                self._boot.fail(why[len(prefix):] if why.startswith(prefix) else why)
            self._release()
            raise

    # ------------------------------------------------------------------ set-up
    def _setup(self, algo, rank, world_size, group, store, init_method, bootstrap, backend, device,
               name, options, dtype, op, nthreads, cache_dir, codegen) -> None:
        ir, plats, compiled_codegen = _load(algo, options)
        if codegen is None:
            codegen = compiled_codegen or "specialized"
        if codegen not in CODEGENS:
            raise ValueError(f"unknown codegen {codegen!r} (expected one of {', '.join(CODEGENS)})")
        self.codegen = codegen
        self.ir = ir
        self.collective = ir.collective
        if dtype not in DTYPES or op not in OPS:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)} and op one of {', '.join(OPS)}")
        try:
            self._boot = make_bootstrap(rank, world_size, group=group, store=store,
                                        init_method=init_method, bootstrap=bootstrap,
                                        name=name or ir.name, timeout_s=self.timeout_s)
        except BootstrapError as exc:
            raise CommunicatorError(str(exc)) from None
        self.rank, self.world_size = int(self._boot.rank), int(self._boot.world_size)
        if self.world_size != ir.nranks:
            raise CommunicatorError(f"{ir.name} is an algorithm for {ir.nranks} ranks; this job has "
                                    f"{self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise CommunicatorError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        shm.reap_stale()
        if plats is None:
            plats = ["hip" if backend == "hip" else "cuda"] * ir.nranks
        self.rank_platform = plats
        mine = plats[self.rank]
        # platform
        if isinstance(backend, Platform):
            pf = backend
        elif backend == "cpu":
            from hccc.runtime.cpu import CpuPlatform
            pf = CpuPlatform(source_platform=mine, cache_dir=cache_dir)
            self._owned_pf = True
        else:
            pf = get_platform(str(backend))
            self._owned_pf = True
        self._pf = pf
        if not pf.runs_sources(mine):
            raise CommunicatorError(f"rank {self.rank} is a {mine.upper()} rank; the {pf.name} "
                                    "platform cannot run it")
        if device is None:
            lr = os.environ.get("LOCAL_RANK", "")
            device = int(lr) if lr.isdigit() else self.rank
        self.device = int(device) % max(1, pf.device_count())
        pf.set_device(self.device)
        # this rank's kernel
        self._gendir = generated_sources(ir, plats, cache_dir, codegen)
        self._man = man = json.loads((self._gendir / "manifest.json").read_text())
        self._agree(man, plats, codegen, dtype, op)
        entry = man["ranks"][self.rank]
        self.grid = rank_blocks(man, entry)
        emitted = int(man["nthreads"].get(mine, 1))
        self.block = int(nthreads) if nthreads is not None else max(1, pf.block_threads(emitted))
        self._auto_threads = nthreads is None
        #: threads per block chosen below the emitted count so that the kernel's blocks fit, and why
        self.threads_note = None
        self._kernels: dict[tuple[str, str], object] = {}
        self._kernel(dtype, op)
        self.chunk_bytes = int(man["chunk_bytes"])
        self.slot_bytes = int(man.get("slot_bytes", self.chunk_bytes))
        # memory this rank owns: peers write its FIFOs and counters (and, on the CPU emulation,
        # raise its abort flag)
        plans = [RankPlan.from_manifest(man, r) for r in range(self.world_size)]
        self._plans = plans

        def exported(n: int) -> int:
            p = pf.ipc_malloc(n)
            self._segments_own.append(p)
            return p

        def local(n: int) -> int:
            p = pf.malloc(n)
            self._allocs.append(p)
            return p

        def local_peer(n: int) -> int:
            p = pf.malloc_peer(n)
            self._allocs.append(p)
            return p

        # control block and receive FIFOs exported; orphan FIFOs (written by this rank's kernel
        # only) and connection tables local
        check_fifo_memory(ir.name, plans, [self.rank])
        self._mem = mem = RankMemory(plans[self.rank], pf, exported, local, local_peer)
        self._shared_flags = pf.name == "cpu"
        if self._shared_flags:
            # abort flag and error record in shared memory every peer maps
            self._flags = exported(_FLAGS_BYTES)
            self._abort = self._flags
            self._error = self._flags + 64
        else:
            # abort flag: pinned, mapped host memory of this process (raised with a plain store,
            # which no queued copy holds back); error record: device memory
            self._abort = pf.host_flags(64)
            self._host_flag_ptrs.append(self._abort)
            self._error = local(ctypes.sizeof(ErrorRecord))
            self._flags = None
        if codegen == "table":
            self._table = mem.load_table(self._read_table(man))
        self._host_own = shm.create(_host_segment_bytes(self.ir.nranks))
        hw = self._host_words(self._host_own)
        hw[_H_PID] = os.getpid()
        hw[_H_MAGIC] = _MAGIC
        self._stream = pf.stream()
        # exchange handles
        from hccc.runtime import net
        try:
            my_node = net.node_name(self._node)
        except ValueError as exc:
            raise CommunicatorError(f"rank {self.rank}: {exc}") from None
        me = {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "node": my_node,
              "platform": pf.name, "ctrl": pf.ipc_export(mem.ctrl).hex(),
              "slots": pf.ipc_export(mem.slots).hex(),
              "flags": pf.ipc_export(self._flags).hex() if self._flags is not None else "",
              "hostseg": self._host_own.handle.hex()}
        peers = [json.loads(b) for b in self._all_gather(json.dumps(me).encode(), "handles")]
        self.nodes = nodes = [p["node"] for p in peers]
        local_ranks = [r for r in range(self.world_size) if nodes[r] == my_node]
        for r in range(self.world_size):
            if nodes[r] == my_node and peers[r]["host"] != peers[self.rank]["host"]:
                raise CommunicatorError(
                    f"ranks {self.rank} and {r} say they are on node {my_node} but run on hosts "
                    f"{peers[self.rank]['host']} and {peers[r]['host']}: give each host its own "
                    "node name (node= or HCCC_NODE)")
        kinds = sorted({peers[r]["platform"] for r in local_ranks})
        if len(kinds) > 1:
            raise CommunicatorError(f"the ranks of node {my_node} use different platforms "
                                    f"({', '.join(kinds)}); ranks that share a node share memory")
        if len(set(nodes)) > 1:
            for why in net.placement_problems(nodes, plats, assumed=net.declared_nodes(algo, ir)):
                import warnings
                warnings.warn(f"{ir.name}: {why}", RuntimeWarning, stacklevel=3)
            try:
                self._net = net.NetLink(
                    self.rank, nodes, plans, mem, self._host_own.address, self._all_gather,
                    local, pf.host_flags, cache_dir=cache_dir,
                    stale_s=max(1.0, min(5.0, self.timeout_s / 3)))
            except net.TransportError as exc:
                raise CommunicatorError(f"rank {self.rank} (node {my_node}): {exc}") from None
        self._pids = [int(p["pid"]) for p in peers]
        # peers whose blocks the connection tables point into: the receivers of this rank's sends
        # (slots, tail) and the senders of what it receives (head)
        targets = plans[self.rank].peers()
        bases: dict[int, tuple[int, int]] = {}
        try:
            for r, p in enumerate(peers):
                if r == self.rank:
                    continue
                if nodes[r] != my_node:
                    self._host_peer[r] = self._net.host_mirror(r)
                    continue
                if r in targets:
                    c = pf.ipc_import(bytes.fromhex(p["ctrl"]))
                    self._imported.append(c)
                    s = pf.ipc_import(bytes.fromhex(p["slots"]))
                    self._imported.append(s)
                    bases[r] = (c, s)
                if self._shared_flags:
                    f = pf.ipc_import(bytes.fromhex(p["flags"]))
                    self._imported.append(f)
                    self._peer_flags[r] = f
                self._host_peer[r] = shm.attach(bytes.fromhex(p["hostseg"]))
        except (PlatformError, shm.ShmError) as exc:
            raise CommunicatorError(f"rank {self.rank}: cannot map a peer's memory: {exc}") from None

        mem.connect(plans, lambda peer: bases.get(peer, (0, 0)))
        if self._net is not None:
            self._host_flag_ptrs.append(self._net.mwords)
            self._net.wire()              # cross-node connections through the mirrors
        # every rank has mapped every segment: drop the names
        self._all_gather(b"", "mapped")
        for p in self._segments_own:
            pf.ipc_seal(p)
        self._host_own.unlink()
        self._calls = 0
        #: (count, element bytes, protocol asked) -> (LaunchCall, this rank's layout row)
        self._call_plans: dict = {}
        self._seq = 0
        #: LL flag epochs of this rank's FIFOs: every rank derives the same from the same calls
        #: (compared per call), so the slots are zeroed only at the first LL call, after Simple
        #: calls and when the epochs wrap (:mod:`hccc.runtime.ll_epoch`)
        self.ll_epochs = LLEpochs()

    def _agree(self, man: dict, plats, codegen: str, dtype: str, op: str) -> None:
        """Before anything is mapped: every rank runs the same program with the same memory
        layout and protocol (:mod:`hccc.runtime.agreement`), else every rank raises."""
        from hccc.runtime.agreement import first_difference, program_terms
        mine = program_terms(self.ir, man, plats, codegen, dtype, op)
        gathered = self._all_gather(json.dumps(mine, sort_keys=True).encode(), "program")
        why = first_difference([json.loads(b) for b in gathered])
        if why:
            raise CommunicatorError(f"rank {self.rank}: {why}")

    @staticmethod
    def _host_words(seg: shm.Segment) -> np.ndarray:
        return np.frombuffer(seg._map, dtype=np.uint64, count=16)

    def _all_gather(self, data: bytes, tag: str) -> list[bytes]:
        try:
            return self._boot.all_gather(data, tag)
        except BootstrapError as exc:
            raise CommunicatorError(f"rank {self.rank}: {exc}") from None

    def _kernel(self, dtype: str, op: str):
        key = (dtype, op)
        if key not in self._kernels:
            pf, man = self._pf, self._man
            lib = pf.build(self._gendir, man, Instance(dtype, op), ranks=[self.rank])
            mod = pf.load(lib)
            pattern = man.get("kernel_symbol", "{kernel}_{dtype}_{op}")
            sym = (pattern.replace("{kernel}", man["ranks"][self.rank]["kernel"])
                   .replace("{dtype}", dtype).replace("{op}", op))
            fn = mod.function(sym)
            if self._auto_threads and self.grid > 0:   # fewer threads per block until the grid fits
                from hccc.runtime.launcher import fit_block_threads
                flavour = self._man["ranks"][self.rank]["platform"]
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

    def _read_table(self, man: dict) -> bytes:
        """This rank's table (table mode), checked against the manifest."""
        from hccc.compiler.backend.table_format import TableFormatError
        from hccc.compiler.backend.table_program import load_tables, read_table
        try:
            path, data = read_table(self._gendir, man)
            tables = load_tables(data, man, [self.rank], path.name)
        except (OSError, TableFormatError) as exc:
            raise CommunicatorError(f"rank {self.rank}: cannot use the tables of {self.ir.name}: "
                                    f"{exc}") from None
        return bytes(tables[self.rank][1])

    # ------------------------------------------------------------------ failure detection
    def _peer_problem(self, call: int | None = None) -> str | None:
        """Why a peer cannot take part any more (died, closed, failed), or None. During call
        ``call`` a peer whose kernel completed that call may close, exit or fail later: it owes
        nothing more to this call. Dead peers are named before peers that report a failure (the
        cause before its echoes)."""
        failed = None
        if self.watch is not None and (why := self.watch()):
            return why
        for r, seg in self._host_peer.items():
            w = self._host_words(seg)
            if call is not None and int(w[_H_DONE]) >= call:
                continue
            state = int(w[_H_STATE])
            if state == _FAILED:
                failed = failed or f"rank {r} failed ({self._reason(seg)})"
            elif state == _CLOSED:
                return f"rank {r} closed its communicator"
            elif self._net is not None and (lost := self._net.peer_problem(r, w)):
                return lost         # across nodes: connection lost, heartbeat stopped
            elif (self._net is None or r not in self._net.remote) and not shm.process_alive(self._pids[r]):
                where = f" on node {self.nodes[r]}" if self._net is not None else ""
                return f"rank {r} (process {self._pids[r]}{where}) exited"
        return failed

    @staticmethod
    def _reason(seg: shm.Segment) -> str:
        raw = bytes(seg._map[_REASON_AT:_REASON_AT + _REASON_MAX])
        return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace") or "no reason given"

    def _fail(self, why: str, *, abort_peers: bool = True) -> CommunicatorError:
        """Mark this communicator broken, tell the peers (state and reason; abort flags when they
        may be waiting for this rank's kernel), return the error."""
        self._broken = why
        if self._host_own is not None:
            text = why.encode("utf-8")[:_REASON_MAX - 1] + b"\0"
            self._host_own._map[_REASON_AT:_REASON_AT + len(text)] = text
            self._host_words(self._host_own)[_H_STATE] = _FAILED
        if abort_peers:
            self._abort_peers()
        return CommunicatorError(f"rank {self.rank}: {why}")

    def _abort_peers(self) -> None:
        """Raise the peers' abort flags where they are mapped here (CPU emulation: shared
        memory). On CUDA / HIP they are not: every peer's host watch sees this rank's failed state
        in its host segment and raises its own flag."""
        for f in self._peer_flags.values():
            ctypes.c_uint32.from_address(f).value = 1

    def _raise_abort(self) -> None:
        """Raise this rank's abort flag: a plain store into host memory."""
        if self._abort is not None:
            ctypes.c_uint32.from_address(self._abort).value = 1

    def _barrier(self, what: str) -> None:
        """Host barrier through the host segments (same host), watching the peers."""
        self._seq += 1
        target = self._seq
        self._host_words(self._host_own)[_H_SEQ] = target
        start = time.monotonic()
        deadline = start + self.timeout_s
        waiting = [r for r in self._host_peer]
        last_check = start
        while waiting:
            waiting = [r for r in waiting if int(self._host_words(self._host_peer[r])[_H_SEQ]) < target]
            if not waiting:
                break
            now = time.monotonic()
            if now - last_check > 0.02:
                last_check = now
                bad = self._peer_problem()
                if bad:
                    raise self._fail(f"{bad} ({what})", abort_peers=False)
            if now > deadline:
                raise self._fail(f"rank{'s' if len(waiting) > 1 else ''} "
                                 f"{', '.join(map(str, waiting))} did not reach {what} within "
                                 f"{self.timeout_s:g} s", abort_peers=False)
            # yield for the first millisecond (peers usually arrive within it), then sleep
            time.sleep(0 if now - start < 1e-3 else _POLL_S)

    # ------------------------------------------------------------------ one collective
    def _check_usable(self) -> None:
        if self._closed:
            raise CommunicatorError("the communicator is closed")
        if self._broken:
            raise CommunicatorError(f"rank {self.rank}: the communicator is unusable after an earlier "
                                    f"failure: {self._broken}")

    def _run(self, method: str, count: int, dtype: str, op: str, in_p: int, out_p: int, v=None) -> None:
        """One launch of ``count`` elements (the full buffer); ``v``: an AllToAllv call's
        :class:`_VCall` (``count`` is then its equal-size stand-in, which sizes slice and protocol)."""
        pf, ir = self._pf, self.ir
        fn = self._kernel(dtype, op)
        es = ELEMENT_BYTES[dtype]
        call, lay = self._plan(count, es)
        self.last_proto, self.proto_note, self.last_slice_bytes = call.proto, call.note, call.slice_bytes
        proto, slice_b = call.proto, call.slice_bytes
        epoch, zero = call.launch(self.ll_epochs)
        self._calls += 1
        hw = self._host_words(self._host_own)
        hw[_H_CALL], hw[_H_COLL], hw[_H_COUNT] = self._calls, _COLL_CODE[ir.collective], count
        hw[_H_TYPE] = _call_type(dtype, op, proto, epoch, zero)
        hw[_H_TAG] = int(self.call_tag) & ((1 << 64) - 1)
        hw[_H_VDIGEST] = v.digest if v is not None else 0
        self._barrier(f"{method} #{self._calls}")       # every rank finished its previous call
        for r, seg in self._host_peer.items():
            w = self._host_words(seg)
            if int(w[_H_VDIGEST]) != int(hw[_H_VDIGEST]):
                # every rank compares with every peer: a rank whose counts differ is seen by all
                raise self._fail(abort_peers=False, why=
                    f"{method} #{self._calls}: rank {r}'s AllToAllv counts (and displacements) differ from "
                    f"this rank's (digest {int(w[_H_VDIGEST]):#018x}, this rank {int(hw[_H_VDIGEST]):#018x}); "
                    "every rank must pass the same counts matrix")
            if int(w[_H_TAG]) != int(hw[_H_TAG]) and int(w[_H_COUNT]) == count \
                    and int(w[_H_TYPE]) == int(hw[_H_TYPE]):
                raise self._fail(abort_peers=False, why=
                    f"{method} #{self._calls}: rank {r}'s call differs from this rank's in what its "
                    f"caller asked for (call tag {int(w[_H_TAG]):#x}, this rank {int(hw[_H_TAG]):#x}); "
                    "every rank must make the same call")
            if int(w[_H_COUNT]) != count or int(w[_H_TYPE]) != int(hw[_H_TYPE]):
                raise self._fail(abort_peers=False, why=
                    f"{method} #{self._calls}: rank {r} passes {int(w[_H_COUNT])} elements of "
                    f"{_describe_type(int(w[_H_TYPE]))}, this rank {count} elements of "
                    f"{_describe_type(int(hw[_H_TYPE]))}; every rank must make the same call")
        self._mem.reset(slots=zero)     # LL: zeroes only when no epoch keeps old lines apart
        if self._net is not None and not self._net.reset(self.timeout_s):
            raise self._fail("the network proxy did not reset its mirrors", abort_peers=False)
        ctypes.c_uint32.from_address(self._abort).value = 0
        pf.memset(self._error, 0, ctypes.sizeof(ErrorRecord))
        scr = self._scratch_ptr((ir.scratch_chunks * v.slot if v is not None else lay[2]) * es)
        try:           # every rank makes this call (compared above): every rank refuses it
            call.check(ir)
        except ValueError as exc:
            raise CommunicatorError(f"rank {self.rank}: {method} #{self._calls}: {exc}") from None
        timeout = self.kernel_timeout_s
        args = self._mem.args(call, input=in_p, output=out_p, scratch=scr, abort_flag=self._abort,
                              error=self._error, timeout_s=timeout, epoch=epoch)
        if v is not None:
            args.vcounts, args.vdispls, args.vmap = v.counts, v.displs, v.vmap
            args.vslot = v.slot if ir.scratch_chunks else 0
        self._barrier(f"{method} #{self._calls} (counters reset)")  # nobody sends into a stale FIFO
        if self._net is not None:
            self._net.shape(self.slot_bytes, ir.max_step_chunks, slice_b)
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
            if len(self._call_plans) >= _PLAN_CACHE_MAX:
                self._call_plans.clear()
            call = LaunchCall.plan(self.ir, count, es, self.chunk_bytes, proto=self._proto,
                                   ll_refused=self._ll_refused())
            got = self._call_plans[key] = (call, self._layout_row(count))
        return got

    def _layout_row(self, count: int):
        """This rank's (input, output, scratch elements, input offset, output offset) at ``count``."""
        key = ("layout", count)
        got = self._call_plans.get(key)
        if got is None:
            if len(self._call_plans) >= _PLAN_CACHE_MAX:
                self._call_plans.clear()
            got = self._call_plans[key] = program_layout(self.ir, count)[self.rank]
        return got

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
        pf = self._pf
        done = threading.Event()
        failure: list[BaseException] = []

        def waiter():
            try:
                pf.synchronize()
            except BaseException as exc:
                failure.append(exc)
            finally:
                done.set()

        waiting = threading.Thread(target=waiter, name="hccc-comm-wait", daemon=True)
        waiting.start()
        limit = self.timeout_s + 2 * self.kernel_timeout_s
        deadline = time.monotonic() + limit
        cause = None
        while not done.wait(0.02):
            bad = self._peer_problem(self._calls)
            if bad and cause is None:
                cause = bad
                self._raise_abort()                 # abort this rank's kernel
                self._abort_peers()
            if time.monotonic() > deadline:
                if cause is None:
                    cause = f"kernel still running after {limit:g} s"
                    self._raise_abort()
                if time.monotonic() > deadline + max(5.0, self.kernel_timeout_s):
                    self._broken = f"{cause}; the kernel ignores the abort flag"
                    raise CommunicatorError(f"rank {self.rank}: {method}: {self._broken}")
        # the waiter has set `done` and is about to end: join it, so that a call that returns or
        # raises leaves no thread of its own behind (a loaded machine may not have run its last
        # lines yet)
        waiting.join(max(5.0, self.kernel_timeout_s))
        if failure:
            raise self._fail(f"{method}: {failure[0]}")
        raw = np.zeros(ctypes.sizeof(ErrorRecord), dtype=np.uint8)
        pf.memcpy_dtoh(raw, self._error)
        aborted = ctypes.c_uint32.from_address(self._abort).value != 0
        rec = ErrorRecord.from_buffer_copy(raw.tobytes())
        if cause is None and not aborted and not rec.valid:
            # a finished call's puts (the last credits) land before the counters are reset
            if self._net is not None and not self._net.drain(self.timeout_s):
                raise self._fail(f"{method} #{self._calls}: the network did not complete this "
                                 f"rank's last puts within {self.timeout_s:g} s")
            self._host_words(self._host_own)[_H_DONE] = self._calls
            return
        what = describe_stuck(self.ir, rec, pf.ticks_per_us) if rec.valid else None
        if cause is None:
            cause = self._peer_problem(self._calls)
            # a peer that aborted this kernel records why once its own kernel has stopped (across
            # nodes its state travels through the proxy): give the reason a moment to arrive
            until = time.monotonic() + 1.0
            while cause is None and not what and time.monotonic() < until:
                time.sleep(0.01)
                cause = self._peer_problem(self._calls)
            cause = cause or ("aborted by a peer" if not what else None)
        parts = [p for p in (cause, what) if p]
        raise self._fail(f"{method} #{self._calls} failed: " + "; ".join(parts))

    # ------------------------------------------------------------------ the collectives
    def _prepare(self, method: str, x, out, inplace: bool, op: str):
        """Check the call; returns (count, dtype, input pointer, output pointer, copy-back)."""
        self._check_usable()
        want = METHODS.get(self.collective)
        if want != method:
            raise CommunicatorError(f"{self.ir.name} implements {self.collective} ({want}), not {method}")
        if op not in OPS:
            raise ValueError(f"unknown op {op!r} (expected one of {', '.join(OPS)})")
        bx = _as_buf(x, f"{method}: input")
        if SPECS[self.collective].reduces:
            dtypes_table.check_instance(bx.dtype, op)   # (integer avg: refused with the reason)
        bo = _as_buf(out, f"{method}: output") if out is not None else None
        if bo is not None and bo.dtype != bx.dtype:
            raise TypeError(f"{method}: input is {bx.dtype} but output is {bo.dtype}")
        kind = "cpu" if self._pf.name == "cpu" else "cuda"
        for b, what in ((bx, "input"), (bo, "output")):
            if b is not None and b.device != kind:
                raise ValueError(f"{method}: the {what} lives on {b.device}; the {self._pf.name} "
                                 f"backend needs {'host' if kind == 'cpu' else 'GPU'} arrays")
        es = ELEMENT_BYTES[bx.dtype]
        # the full buffer's element count, nccl-tests' S
        spec = SPECS[self.collective]
        if spec.full_buffer == "output":
            count = bo.n if bo is not None else -1
        else:
            count = bx.n
        if count < 0:
            raise ValueError(f"{method}: needs an output array")
        unit = count_unit(self.ir)              # AllToAll: equal blocks (1 for the others)
        if count % unit:
            raise ValueError(f"{method}: {count} elements do not split into {unit} equal blocks "
                             f"({self.world_size} ranks x {unit // self.world_size} pieces)")
        n_in, n_out, _scr, in_off, out_off = self._layout_row(count)
        copy_back = None
        if bool(inplace) not in self.ir.placements and not inplace and not self._at_place(bx, bo, in_off, out_off, es):
            raise CommunicatorError(f"{self.ir.name} is proven in place only (its {self._source_text()} "
                                    f"declares it); call {method} in place")
        # an in-place call of a program proven out of place only (an MSCCL XML with inplace="0") runs
        # out of place into a temporary output and copies it back
        alias = True in self.ir.placements
        if inplace:
            if alias and in_off >= 0 and bx.n == n_out:
                return count, bx.dtype, bx.ptr + in_off * es, bx.ptr, None
            if alias and out_off >= 0 and bx.n == n_in:
                return count, bx.dtype, bx.ptr, bx.ptr + out_off * es, None
            # the algorithm's buffers cannot alias this way: a temporary output, copied back
            tmp = np.empty(max(n_out, 1) * es // 4 + 1, dtype=np.uint32) if kind == "cpu" else None
            if tmp is None:
                raise CommunicatorError(f"{method} in place is not supported by {self.ir.name}'s "
                                        "buffers on a GPU; pass out=")
            copy_back = (tmp, bx.ptr, min(n_out, bx.n) * es)
            return count, bx.dtype, bx.ptr, int(tmp.ctypes.data), copy_back
        if bx.n != n_in:
            share = "its share of" if spec.input == OWN else "the"
            raise ValueError(f"{method}: rank {self.rank}'s input holds {bx.n} elements; {share} "
                             f"{count}-element {method} needs {n_in}")
        if bo.n != n_out:
            raise ValueError(f"{method}: rank {self.rank}'s output holds {bo.n} elements; a "
                             f"{count}-element {method} gives it {n_out}")
        if bo.ptr < bx.ptr + bx.n * es and bx.ptr < bo.ptr + bo.n * es and bx.n and bo.n:
            # the collective's in-place layout (an all_gather input at its place in the output, a
            # reduce_scatter output at its place in the input) runs in place, as the program allows
            at_place = self._at_place(bx, bo, in_off, out_off, es)
            if at_place and True in self.ir.placements:
                return count, bx.dtype, bx.ptr, bo.ptr, None
            raise ValueError(f"{method}: input and output overlap" + (
                f"; {self.ir.name} is proven out of place only" if at_place else
                " other than in the collective's in-place layout (this rank's block of the larger buffer)"))
        return count, bx.dtype, bx.ptr, bo.ptr, None

    @staticmethod
    def _at_place(bx, bo, in_off: int, out_off: int, es: int) -> bool:
        """Whether the input and output are the collective's in-place layout (an all_gather input
        at its place in the output, a reduce_scatter output at its place in the input)."""
        if bo is None:
            return False
        return bool((in_off >= 0 and bx.ptr == bo.ptr + in_off * es)
                    or (out_off >= 0 and bo.ptr == bx.ptr + out_off * es))

    def _source_text(self) -> str:
        """What declared the program's placements, for messages."""
        src = (self.ir.stats or {}).get("source")
        return {"mscclpp-plan": "MSCCL++ plan ('inplace': true)"}.get(
            src, 'MSCCL XML (outofplace="0")' if src == "msccl-xml" else "source")

    def _call(self, method, x, out, inplace, op):
        count, dtype, in_p, out_p, copy_back = self._prepare(method, x, out, inplace, op)
        if self._pf.name != "cpu":
            _sync_caller(x)
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
        (:meth:`_gather_rows`), every rank assembles the same matrix, and the call goes on as with
        ``counts`` (checked against this rank's buffers, digests compared): a rank that passes
        ``counts`` while the others pass rows fails the call on every rank. Displacements packed;
        ranks on one node (across nodes the host segments' mirrors do not carry the rows). With
        ``device_counts=True`` the row is ``nranks`` int64 in device memory and never read on the
        host: a first AllToAllv call of the same program gathers the rows into a matrix on the
        device (:meth:`_gather_rows_on_device`), which the call then reads as device counts."""
        from hccc.runtime import alltoallv as av
        self._check_usable()
        method = "all_to_all_v"
        if send_counts is not None:
            if counts is not None:
                raise ValueError(f"{method}: pass counts (the whole matrix) or send_counts (this rank's "
                                 "row), not both")
            if sdispls is not None or rdispls is not None:
                raise ValueError(f"{method}: send_counts takes packed displacements only")
            if not device_counts and (hasattr(send_counts, "__cuda_array_interface__")
                                      or getattr(send_counts, "is_cuda", False)):
                raise ValueError(f"{method}: send_counts lives on the GPU: pass device_counts=True (the rows "
                                 "are gathered on the device), or a host row")
            if not SPECS[self.collective].per_pair_counts:
                raise CommunicatorError(f"{self.ir.name} implements {self.collective}, not an AllToAll: "
                                        "all_to_all_v needs an AllToAll program")
            if not device_counts:
                counts = self._gather_rows(send_counts, method)
        if not SPECS[self.collective].per_pair_counts:
            raise CommunicatorError(f"{self.ir.name} implements {self.collective}, not an AllToAll: "
                                    "all_to_all_v needs an AllToAll program")
        inplace = out is None
        if inplace and not True in self.ir.placements:
            raise CommunicatorError(f"{self.ir.name} is proven out of place only; pass out=")
        bx = _as_buf(x, f"{method}: input")
        bo = bx if inplace else _as_buf(out, f"{method}: output")
        if bo.dtype != bx.dtype:
            raise TypeError(f"{method}: input is {bx.dtype} but output is {bo.dtype}")
        kind = "cpu" if self._pf.name == "cpu" else "cuda"
        for b, what in ((bx, "input"), (bo, "output")):
            if b.device != kind:
                raise ValueError(f"{method}: the {what} lives on {b.device}; the {self._pf.name} "
                                 f"backend needs {'host' if kind == 'cpu' else 'GPU'} arrays")
        es = ELEMENT_BYTES[bx.dtype]
        if not inplace and bo.ptr < bx.ptr + bx.n * es and bx.ptr < bo.ptr + bo.n * es and bx.n and bo.n:
            raise ValueError(f"{method}: input and output overlap; pass out=None for an in-place call")
        N = self.world_size
        vm, tables = self._vtables(inplace)
        K = vm.k
        if device_counts:
            if sdispls is not None or rdispls is not None:
                raise ValueError(f"{method}: device counts take packed displacements only")
            if send_counts is not None:
                cnt_p = self._gather_rows_on_device(send_counts, method, kind)
            else:
                bc = _as_buf(counts, f"{method}: counts")
                if bc.dtype != "int64" or bc.n != N * N or bc.device != kind:
                    raise ValueError(f"{method}: device counts must be {N * N} int64 elements on "
                                     f"{'the host' if kind == 'cpu' else 'the GPU'}, not {bc.n} {bc.dtype} on {bc.device}")
                cnt_p = bc.ptr
            dsp_p = 0
            slot = -(-max(bx.n, bo.n) // K)           # no piece exceeds a whole buffer
            digest = 0
        else:
            try:
                c = av.as_counts(counts, N)
                sd, rd = av.check_call(c, [bx.n if r == self.rank else None for r in range(N)],
                                       [bo.n if r == self.rank else None for r in range(N)],
                                       sdispls, rdispls, inplace)
            except av.CountsError as exc:
                # the peers are told (this rank's state), so they fail at the call's barrier at once
                # instead of waiting for a rank that will not come
                raise self._fail(f"{method} #{self._calls + 1}: {exc}", abort_peers=False) from None
            slot = av.scratch_slot(c, K)
            given = sdispls is not None or rdispls is not None
            blob = c.tobytes() + (av.device_displs(sd, rd).tobytes() if given else b"")
            digest = int.from_bytes(__import__("hashlib").sha256(blob).digest()[:8], "little") | 1
            cnt_p = self._vstage("counts", c.ravel())
            dsp_p = self._vstage("displs", av.device_displs(sd, rd)) if given else 0
        map_p = self._vstage(("map", inplace), tables[self.rank], keep=True)
        vcall = _VCall(cnt_p, dsp_p, map_p, max(slot, 0), digest)
        eq = max(slot, 1) * K * N
        if self._pf.name != "cpu":
            _sync_caller(x)
        self._run(method, eq, bx.dtype, "sum", bx.ptr, bo.ptr, v=vcall)
        return x if inplace else out

    def _gather_rows(self, row, method: str) -> np.ndarray:
        """The counts matrix of an ``all_to_all_v(send_counts=row)`` call: this rank writes its
        row, stamped with the call's number, into its host segment (:data:`_ROW_AT`), and after a
        barrier reads every peer's (each rank finished reading before any rank can pass the next
        call's first barrier and overwrite its row). A peer whose row is not stamped with this
        call made another call: every rank fails. A row this rank cannot use fails the call here
        (the peers see the failure at the barrier)."""
        from hccc.runtime import alltoallv as av
        N, call = self.world_size, self._calls + 1
        if self._net is not None and self._net.remote:
            raise CommunicatorError(f"rank {self.rank}: {method}: send_counts needs every rank on one node "
                                    "(the rows travel in the host segments, whose mirrors across nodes "
                                    "do not carry them); pass the whole counts matrix")
        try:
            mine = av.as_counts(row, N, "send_counts", row=True)
        except av.CountsError as exc:
            raise self._fail(f"{method} #{call}: {exc}", abort_peers=False) from None
        words = np.frombuffer(self._host_own._map, dtype=np.int64, count=1 + N, offset=_ROW_AT)
        words[1:] = mine
        words[0] = call                      # the stamp last: a peer that sees it sees the row
        self._barrier(f"{method} #{call} (counts rows)")
        c = np.empty((N, N), np.int64)
        c[self.rank] = mine
        for r, seg in self._host_peer.items():
            w = np.frombuffer(seg._map, dtype=np.int64, count=1 + N, offset=_ROW_AT)
            if int(w[0]) != call:
                raise self._fail(abort_peers=False, why=
                    f"{method} #{call}: rank {r} did not pass its counts row for this call (every rank "
                    "must pass send_counts=, or every rank the whole matrix)")
            c[r] = w[1:]
        return c

    def _gather_rows_on_device(self, row, method: str, kind: str) -> int:
        """The counts matrix of an ``all_to_all_v(send_counts=row, device_counts=True)`` call, in
        device memory, assembled with no host read of any row: one AllToAllv call of the program
        itself (int64 kernels) in which every rank sends its whole row to every rank, each block
        ``(s, d)`` the ``nranks`` counts of ``row`` (every send displacement 0: all blocks read the
        one row), received packed, so rank ``d``'s output is row ``s`` at ``s * nranks``: the
        matrix, the same on every rank by construction. Its counts and displacements are constants
        every rank knows (uploaded once)."""
        from hccc.runtime import alltoallv as av
        N = self.world_size
        br = _as_buf(row, f"{method}: send_counts")
        if br.dtype != "int64" or br.n != N or br.device != kind:
            raise ValueError(f"{method}: device send_counts must be {N} int64 elements on "
                             f"{'the host' if kind == 'cpu' else 'the GPU'}, not {br.n} {br.dtype} on {br.device}")
        full = np.full((N, N), N, np.int64)
        sd = np.zeros((N, N), np.int64)
        _, rd = av.packed_displs(full)
        av.check_call(full, [N] * N, [N * N] * N, sd, rd)
        dv = av.device_displs(sd, rd)
        digest = int.from_bytes(__import__("hashlib").sha256(full.tobytes() + dv.tobytes()).digest()[:8],
                                "little") | 1
        vm, tables = self._vtables(False)
        vcall = _VCall(self._vstage("rows counts", full.ravel(), keep=True),
                       self._vstage("rows displs", dv, keep=True),
                       self._vstage(("map", False), tables[self.rank], keep=True),
                       av.scratch_slot(full, vm.k), digest)
        mat_p = self._vstage("rows matrix", np.zeros(N * N, np.int64), keep=True)
        if self._pf.name != "cpu":
            _sync_caller(row)
        self._run(f"{method} (gathering the counts rows)", max(vcall.slot, 1) * vm.k * N, "int64", "sum",
                  br.ptr, mat_p, v=vcall)
        return mat_p

    def _vtables(self, inplace: bool):
        """The program's AllToAllv block-piece tables (:mod:`hccc.compiler.ir.vblocks`), once."""
        from hccc.compiler.backend.codegen import _is_canonical, _sorted_copy
        from hccc.compiler.ir.vblocks import VBlockError, rank_tables, vblock_map
        cache_ = self.__dict__.setdefault("_vcache", {})
        if inplace not in cache_:
            ir = self.ir if _is_canonical(self.ir) else _sorted_copy(self.ir)
            try:
                vm = vblock_map(ir, inplace)
            except VBlockError as exc:
                raise CommunicatorError(f"{self.ir.name} cannot run as an AllToAllv: {exc}") from None
            cache_[inplace] = (vm, rank_tables(ir, vm))
        return cache_[inplace]

    def _vstage(self, key, data: np.ndarray, keep: bool = False) -> int:
        """``data`` in this rank's device memory, in a buffer kept for ``key`` (grown as needed;
        with ``keep`` uploaded once)."""
        bufs = self.__dict__.setdefault("_vbufs", {})
        data = np.ascontiguousarray(data)
        have = bufs.get(key)
        if have is not None and keep:
            return have[0]
        if have is None or have[1] < data.nbytes:
            if have is not None:
                self._allocs.remove(have[0])
                self._pf.free(have[0])
            ptr = self._pf.malloc(max(data.nbytes, 16))
            self._allocs.append(ptr)
            bufs[key] = have = (ptr, max(data.nbytes, 16))
        if data.nbytes:
            self._pf.memcpy_htod(have[0], data)
        return have[0]

    def _check_root(self, root, method) -> None:
        have = getattr(self.ir, "root", None)
        if root is not None and have is not None and int(root) != int(have):
            raise ValueError(f"{method}: {self.ir.name} is compiled for root {have}, not {root}")

    # ------------------------------------------------------------------ teardown
    def _release(self) -> None:
        pf = self._pf
        if self._net is not None:         # the proxy stops before the memory it reads goes
            self._net.drain(0.5 if self._broken else 2.0)   # the last state reaches the peers
            self._net.close()
            self._net = None
        for seg in self._host_peer.values():
            seg.close()
        self._host_peer.clear()
        if self._host_own is not None:
            self._host_own.close()
            self._host_own = None
        if pf is not None and not (self._broken and "ignores the abort flag" in self._broken):
            for p in self._imported:
                try:
                    pf.ipc_close(p)
                except Exception:
                    pass
            for p in (self._segments_own + self._allocs + self._host_flag_ptrs
                      + ([self._scratch[0]] if self._scratch else [])):
                try:
                    pf.free(p)
                except Exception:
                    pass
            if self._owned_pf:
                pf.close()
        elif pf is not None:
            for p in self._segments_own:      # names only: the mappings stay with the kernel
                try:
                    pf.ipc_seal(p)
                except Exception:
                    pass
        self._imported, self._segments_own, self._allocs, self._scratch = [], [], [], None
        self._host_flag_ptrs = []
        if self._boot is not None:
            self._boot.close()

    def close(self) -> None:
        """Release this rank's memory and mappings (peers see the communicator closed)."""
        if self._closed:
            return
        self._closed = True
        if self._host_own is not None and not self._broken:
            self._host_words(self._host_own)[_H_STATE] = _CLOSED
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
