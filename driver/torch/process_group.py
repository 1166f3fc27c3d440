"""The ``"hccc"`` torch.distributed process group.

:class:`HcccProcessGroup` is a Python ``torch.distributed.ProcessGroup`` (the kind torch lets a
package register, :func:`register`). Per call it

1. refuses the call when a CUDA graph is being captured (:class:`CaptureError`, before anything
   is queued: hccc's collectives meet their peers at host barriers, which a graph cannot replay);
2. checks the tensors (one device, matching dtypes; a wrong device is a ``ValueError``);
3. picks the route, cached per call signature: an algorithm of the catalog
   (:meth:`hccc.catalog.Catalog.select` for the collective, the group's size, the buffer's bytes,
   dtype, op and root) run by a :class:`~hccc.runtime.Communicator` made on first use (group rank
   ``r`` is the algorithm's rank ``r``), or the delegate backend (gloo for CPU tensors, nccl --
   RCCL on ROCm -- for GPU tensors, or the backend the device map names for that device), with
   the reason logged once per job (rank 0, once per reason); a one-tensor call (all_reduce,
   broadcast, reduce) looks up what its shape decides -- the checks of step 2, the route, the
   call's description -- after the first call of that shape (collective, op, root, dtype, device,
   element count, contiguity), and only the capture check of step 1 runs on every call;
4. runs the call at once in the caller's thread when no earlier call is pending, else queues it on
   the group's worker thread, which runs the calls one at a time in the order
   they were made (the same order on every rank), and returns a :class:`HcccWork` (``wait``,
   ``is_completed``, ``get_future`` for DDP's communication hooks).

The methods: one per row of :data:`hccc.torch_calls.TORCH_CALLS` (torch's method, the collective
spec it runs as, the form in which torch passes the buffers), made by :func:`_method`; the form's
adapter (``_in_place``, ``_single``, ``_lists``, ``_coalesced``, ``_barrier``, the delegate-only
``_delegate_only`` and ``_point``) maps torch's arguments onto the spec's buffers, root and op, and
every AVG runs through :func:`_avg_sum`.

GPU tensors: the call records an event on the caller's current stream; the worker waits for it,
then the Communicator runs its kernel on its own stream and waits for it, so the tensors are
ready once the work completes (this path has not been run on a GPU here).

Agreement: every rank's calls are numbered, described (kind, torch's op, dtype, counts, root) and
compared (:mod:`hccc.torch.ledger`): ranks whose calls differ all get a :class:`CallMismatch` at
once, on any route. When the group is made, every input to the choice of algorithm (catalog,
``HCCC_CLUSTER``, ``HCCC_TOPOLOGY``, device map, version) and every rank's set-up outcome are
compared: a difference or a failure is an error on every rank naming the ranks. Other failures are
the Communicator's (a dead rank: an error on every rank within the timeout), surfacing from
``wait()``; the delegate gets the group's timeout.
"""
from __future__ import annotations

import functools
import logging
import os
import queue
import socket
import sys
import threading
import time
import weakref
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.futures import Future

from hccc.catalog import Catalog, CatalogError
from hccc.compiler.frontend.collectives import OWN, ROOT
from hccc.torch_calls import (BARRIER, COALESCED, DELEGATE_LISTS, IN_PLACE, LISTS, POINT, SINGLE,
                              TORCH_CALLS, TorchCall)
from hccc.torch.ledger import CallMismatch, ShmLedger, StoreLedger, describe, digest

log = logging.getLogger("hccc.torch")

_C = torch._C._distributed_c10d
#: torch's reduction operations by the names the calls are described with (and the runtime's op
#: names where it has the op: :data:`hccc.runtime.launcher.OPS`)
_TORCH_OPS = {"SUM": "sum", "MAX": "max", "MIN": "min", "AVG": "avg", "PRODUCT": "prod",
              "BAND": "band", "BOR": "bor", "BXOR": "bxor", "PREMUL_SUM": "premul_sum"}
#: the same by torch's ReduceOp kind (``ReduceOp.op``), for the look-up every call makes
_OP_NAMES = {getattr(dist.ReduceOp.RedOpType, m): n for m, n in _TORCH_OPS.items()
             if hasattr(dist.ReduceOp.RedOpType, m)}
_DEVICES = ("cpu", "cuda")
#: distinct call signatures whose routes a group remembers; past this the memory starts afresh
#: (a job has a few dozen signatures: its tensors' sizes, dtypes and ops; this bounds a job that
#: makes a new size every call)
ROUTE_CACHE_MAX = 4096
#: an ``all_to_all_single`` with split sizes is routed (catalog size bands) as an even call of this
#: many elements per rank and block, the same on every rank: its ranks move different byte counts,
#: and every rank must pick the same catalog entry before they exchange their splits. 80640 =
#: 2^8 * 3^2 * 5 * 7, so the call splits into equal pieces for any pieces per block up to 10
#: (the catalog's even-share test); about 2.5 MB of float32 at 8 ranks
UNEVEN_ROUTE_ELEMENTS = 80640
#: seconds between looks at a delegate's work (and the peers' calls) once its first millisecond
#: has passed: well below a gloo call's own time at any size worth measuring
_DELEGATE_POLL_S = 0.0005
#: (delegate, reason) pairs this process has logged: a fallback is logged once per job, by the
#: rank 0 of a group (every rank counts it: :func:`stats`)
_LOGGED: set[tuple[str, str]] = set()


def _log_fallback(rank: int, coll: str, delegate: str, why: str) -> None:
    if rank != 0 or (delegate, why) in _LOGGED:
        return
    _LOGGED.add((delegate, why))
    log.warning("hccc: %s falls back to %s: %s", coll, delegate, why)


@functools.cache
def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype's name without the module (``float32``), made once per dtype (every call's
    counters name it)."""
    return str(dtype).replace("torch.", "")


@functools.cache
def kernel_dtype(dtype: torch.dtype) -> str | None:
    """The runtime's name of a torch dtype its kernels implement (:data:`hccc.runtime.launcher.
    DTYPES`: whatever the kernels gain is carried), else None; looked up once per dtype."""
    from hccc.runtime.launcher import DTYPES
    name = dtype_name(dtype)
    return name if name in DTYPES else None


def kernel_op(op: str) -> str | None:
    """The runtime's name of a torch-level op its kernels implement (:data:`hccc.runtime.launcher.
    OPS`), else None (``prod`` may be spelt ``product`` there)."""
    from hccc.runtime.launcher import OPS
    for name in ((op, "product") if op == "prod" else (op,)):
        if name in OPS:
            return name
    return None


class CaptureError(RuntimeError):
    """A collective was issued while a CUDA graph was being captured."""


def capture_active() -> bool:
    """Whether the current CUDA stream is being captured into a graph (False without CUDA, and
    before CUDA is initialised: a capture needs it, and the check costs nothing then)."""
    try:
        return bool(torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


@dataclass
class Options:
    """The backend's options (``init_process_group(..., pg_options=Options(...))``; subgroups
    inherit the default group's). ``catalog``: the algorithm directory (default: the
    ``HCCC_ALGO_DIR`` environment variable; none: the built-in catalog, :mod:`hccc.torch.builtin`).
    ``cluster``: a cluster description (``.topo`` or TACCL ``.json``; default ``HCCC_CLUSTER``)
    whose simulated times break ties between entries. ``topology``: the machine's ``.topo``
    (default ``HCCC_TOPOLOGY``), the tie-break where no cluster is given. ``kernel_timeout_s``: the
    kernels' spin-wait limit (default: the group's timeout, at most 30 s). Every rank must resolve
    them alike (compared when the group is made)."""

    catalog: str | os.PathLike | None = None
    cluster: str | os.PathLike | None = None
    kernel_timeout_s: float | None = None
    topology: str | os.PathLike | None = None
    _resolved: bool = field(default=False, repr=False)
    _sources: dict = field(default_factory=dict, repr=False)

    def resolved(self) -> "Options":
        """The options with the environment's defaults filled in (and where each came from)."""
        if self._resolved:
            return self
        vals, sources = {}, {}
        for key, env, label in (("catalog", "HCCC_ALGO_DIR", "Options(catalog=)"),
                                ("cluster", "HCCC_CLUSTER", "Options(cluster=)"),
                                ("topology", "HCCC_TOPOLOGY", "Options(topology=)")):
            given = getattr(self, key)
            vals[key] = given if given is not None else (os.environ.get(env) or None)
            sources[key] = label if given is not None else env
        return Options(kernel_timeout_s=self.kernel_timeout_s, _resolved=True, _sources=sources, **vals)


#: set to 0 to keep the backend from describing the machine through NVML when no topology is given
DETECT_ENV = "HCCC_DETECT_TOPOLOGY"


def _with_detected_topology(options: Options, device_backends: dict, world: int, detect=None):
    """``options`` with the topology of this machine, detected through NVML, where none was given
    (``HCCC_TOPOLOGY``, ``Options(topology=)``), hccc serves the group's CUDA tensors, CUDA has
    devices, and the machine has as many GPUs as the group has ranks (the group is this machine's
    GPUs: a group spanning hosts falls back anyway). The ``.topo`` is written into hccc's cache
    under its contents' digest, so every rank of the machine names the same file and the group's
    agreement compares its contents like a given topology's. Returns ``(options, note)``: the note
    says why nothing was detected (None when something was, or detection did not apply).
    ``detect``: the detector (default :func:`hccc.compiler.cluster.detect.detect_topology`)."""
    import dataclasses
    import hashlib
    if os.environ.get(DETECT_ENV, "1") == "0" or device_backends.get("cuda", "hccc") != "hccc":
        return options, None
    if detect is None:
        import torch
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            return options, None
        from hccc.compiler.cluster.detect import detect_topology as detect
    from hccc.util.diagnostics import CompileError, render_all
    try:
        text, topo = detect()
    except CompileError as exc:
        return options, f"no topology detected: {render_all(exc).strip()}"
    ngpus = topo.nranks
    if ngpus != world:
        return options, (f"no topology detected: this machine has {ngpus} GPUs, the group {world} "
                         "ranks (set HCCC_TOPOLOGY to the cluster's .topo)")
    from hccc.runtime import cache
    folder = cache.cache_root() / "detected_topology"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(text.encode()).hexdigest()}.topo"
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    sources = dict(options._sources, topology="detected through NVML")
    return dataclasses.replace(options, topology=str(path), _sources=sources), None


def _file_digest(path) -> str:
    """SHA-256 of a description file's contents, read through the input checks every reader uses
    (a regular file within the input size limit; anything else is an error naming the file)."""
    import hashlib
    from hccc.util.diagnostics import read_input_bytes, render_all
    from hccc.util.diagnostics import CompileError
    try:
        return hashlib.sha256(read_input_bytes(path)).hexdigest()
    except CompileError as exc:
        raise RuntimeError(render_all(exc)) from None


# ------------------------------------------------------------------------------------- work
class HcccWork(_C.Work):
    """The result of one call: completes when the call has run (in the caller's thread, before the
    work is returned, or on the group's worker). ``queued``: the call waits for the worker, so
    :meth:`wait` may block (an event to block on); a call run in the caller's thread is finished
    when its work is returned and needs none. The future is made when it is asked for (most calls
    never are: DDP's hooks ask, a plain ``dist.all_reduce`` does not)."""

    #: guards a work's lazily made future against the worker finishing the call meanwhile
    _future_lock = threading.Lock()

    def __init__(self, result, queued: bool = True):
        super().__init__()
        self._finished = False
        self._done = threading.Event() if queued else None
        self._exc: BaseException | None = None
        self._result = result
        self._future: Future | None = None

    def _settle(self, fut: Future) -> None:
        if self._exc is None:
            fut.set_result(self._result)
        else:
            fut.set_exception(self._exc)

    def _finish(self, exc: BaseException | None = None) -> None:
        self._exc = exc
        with HcccWork._future_lock:
            self._finished = True
            fut = self._future
        if self._done is not None:
            self._done.set()
        if fut is not None:
            self._settle(fut)

    def wait(self, timeout=None) -> bool:
        if not self._finished:
            secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
            if secs is not None and secs <= 0:
                secs = None
            if self._done is None or not self._done.wait(secs):
                raise RuntimeError(f"hccc: the collective did not complete within {secs:g} s")
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        return self._finished

    def is_success(self) -> bool:
        return self._finished and self._exc is None

    def exception(self):
        return self._exc

    def get_future(self) -> Future:
        with HcccWork._future_lock:
            fut = self._future
            if fut is not None:
                return fut
            fut = self._future = Future()
            finished = self._finished
        if finished:
            self._settle(fut)
        return fut

    def result(self):
        return self._result


# ------------------------------------------------------------------------------------- catalogs
_CATALOGS: dict[str, Catalog] = {}
_CLUSTERS: dict[str, object] = {}


def _catalog(path) -> Catalog:
    if path is None:
        return Catalog.empty()
    key = str(Path(path).resolve())
    if key not in _CATALOGS:
        try:
            _CATALOGS[key] = Catalog.load(path)
        except CatalogError as exc:
            from hccc.util.diagnostics import render_all
            raise RuntimeError(f"hccc: the algorithm catalog cannot be used:\n{render_all(exc)}") from None
    return _CATALOGS[key]


def _cluster(path):
    if path is None:
        return None
    key = str(Path(path).resolve())
    if key not in _CLUSTERS:
        from hccc.compiler.pipeline import load_cluster
        _CLUSTERS[key] = load_cluster(path)
    return _CLUSTERS[key]


def _op_name(opts) -> str:
    """torch's operation of a call as a stable name (never an object's text: a PREMUL_SUM op is an
    object whose text holds its address)."""
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    name = _OP_NAMES.get(getattr(op, "op", None))    # a ReduceOp's kind: one look-up per call
    if name is not None:
        return name
    for member, name in _TORCH_OPS.items():
        kind = getattr(dist.ReduceOp.RedOpType, member, None)
        if kind is not None and op == kind:
            return name
    return "an unknown reduction"


# ------------------------------------------------------------------------------------- the group
_GROUPS: "weakref.WeakSet[HcccProcessGroup]" = weakref.WeakSet()


class HcccProcessGroup(dist.ProcessGroup):
    """See the module docstring. Made by torch through the registered creator."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, options: Options | None = None,
                 device_backends: dict[str, str] | None = None, global_ranks=None):
        super().__init__(rank, size)
        self._rank, self._size = int(rank), int(size)
        self.timeout_s = max(1.0, timeout.total_seconds())
        self._timeout = timeout
        self._store = dist.PrefixStore("hccc/", store)
        self._outer_store = store
        #: device type -> backend named by the device map ("hccc" where hccc serves it)
        self.device_backends = dict(device_backends or {d: "hccc" for d in _DEVICES})
        self.disabled: str | None = None
        self._broken: str | None = None
        self._ledger = None
        self._calls = 0
        self._digests: dict[str, int] = {}
        self._texts: dict[tuple, str] = {}       # call shape -> its description
        self._closed = True                  # until the worker runs
        # this rank's set-up: whatever fails is told to every peer at the agreement below, so that
        # every rank fails at once with the reason (not after the timeout, waiting for this one)
        problem, inputs, node, ledger = None, {}, None, None
        try:
            self.options = (options or Options()).resolved()
            self.topology_note = None
            if self.options.topology is None:
                self.options, self.topology_note = _with_detected_topology(
                    self.options, self.device_backends, self._size)
            self.kernel_timeout_s = (self.options.kernel_timeout_s if self.options.kernel_timeout_s
                                     else min(30.0, self.timeout_s))
            self.catalog = _catalog(self.options.catalog)
            # the simulator breaks ties between entries on the cluster, else on the topology
            self.cluster = _cluster(self.options.cluster if self.options.cluster is not None
                                    else self.options.topology)
            from hccc.runtime import net
            node = net.node_name()
            inputs = self._choice_inputs()
            ledger = ShmLedger(self._rank, self._size)
        except Exception as exc:
            problem = str(exc).removeprefix("hccc: ") or type(exc).__name__
        try:
            self._agree(problem, inputs, node, ledger)
        except BaseException:
            if ledger is not None:
                ledger.close()
            raise
        self._delegates: dict[str, object] = {}
        self._routes: dict[tuple, tuple] = {}
        #: one-tensor call shape -> (device, route, description): what _in_place derives from it
        self._shapes: dict[tuple, tuple] = {}
        self._comms: dict[tuple[str, str], object] = {}
        self.counters = {"hccc": Counter(), "fallback": Counter(), "delegated": Counter(),
                         "entries": Counter(), "reasons": Counter(), "protos": Counter()}
        #: calls hccc's kernels carried, per collective and dtype
        self.carried: dict[str, Counter] = defaultdict(Counter)
        #: seconds the worker spent on calls, per route kind and collective (where a step's time
        #: goes: benchmarks/torch_backend.py)
        self.seconds: dict[str, Counter] = defaultdict(Counter)
        self._queue: queue.Queue = queue.Queue()
        #: held while a call runs (on the worker or inline in the caller's thread)
        self._exec = threading.Lock()
        #: guards _pending: calls made and not finished (queued or running)
        self._state = threading.Lock()
        self._pending = 0
        self._closed = False
        self._thread = threading.Thread(target=self._worker, name=f"hccc-pg-{rank}", daemon=True)
        self._thread.start()
        # the delegate of every device this process can use (gloo's connect is collective: every
        # rank makes it here, together)
        for dev in _DEVICES:
            if dev == "cpu" or torch.cuda.is_available():
                self._delegate(dev)
        _GROUPS.add(self)

    # ------------------------------------------------------------------ set-up
    def _choice_inputs(self) -> dict[str, list]:
        """Every input to the choice of algorithm, as ``name -> [what is compared, what is
        shown]``: the catalog (its files' fingerprint), the cluster and topology descriptions
        (their contents), the device map and hccc's version. Paths are shown, contents compared
        (two ranks may read the same files from different places)."""
        src = self.options._sources

        def given(key: str) -> str:
            label = src.get(key, "")
            return f" (given as {label})" if label.startswith("Options(") else ""
        cat = self.catalog
        out = {}
        out["the algorithm catalog (HCCC_ALGO_DIR)"] = [
            cat.fingerprint, (f"{len(cat.entries)} entries from {cat.directory} [{cat.fingerprint[:12]}]"
                              f"{given('catalog')}") if cat.directory is not None
            else "(not set: the built-in catalog)"]
        for key, env, value in (("cluster", "HCCC_CLUSTER", self.options.cluster),
                                ("topology", "HCCC_TOPOLOGY", self.options.topology)):
            if value is None:
                out[env] = ["", "(not set)"]
            else:
                d = _file_digest(value)
                out[env] = [d, f"{value} [{d[:12]}]{given(key)}"]
        dmap = ",".join(f"{d}:{b}" for d, b in sorted(self.device_backends.items()))
        out["the device map"] = [dmap, dmap]
        from hccc import __version__
        out["the hccc version"] = [__version__, __version__]
        return out

    def _agree(self, problem: str | None, inputs: dict, node: str | None, ledger) -> None:
        """Every rank's set-up and choice inputs, gathered and compared: a rank whose set-up failed
        or an input on which ranks differ is an error on every rank, naming the ranks. Ranks on
        several hosts run everything on the delegate (a Communicator maps its peers' memory)."""
        import json
        from hccc.runtime.bootstrap import BootstrapError, StoreBootstrap
        me = {"problem": problem, "inputs": inputs, "host": socket.gethostname(), "node": node,
              "ledger": ledger.handle.hex() if ledger is not None else ""}
        try:
            boot = StoreBootstrap(self._store, self._rank, self._size, name="agree",
                                  timeout_s=self.timeout_s)
            peers = [json.loads(b) for b in boot.all_gather(json.dumps(me).encode(), "catalog")]
        except BootstrapError as exc:
            raise RuntimeError(f"hccc: rank {self._rank}: {exc}") from None
        failed = [(r, p["problem"]) for r, p in enumerate(peers) if p["problem"]]
        if failed:
            raise RuntimeError("hccc: the process group's set-up failed on " + "; ".join(
                f"rank {r}: {why}" for r, why in failed))
        lines = []
        for name in peers[0]["inputs"]:
            seen: dict[str, list[int]] = {}
            shown: dict[str, str] = {}
            for r, p in enumerate(peers):
                key, text = p["inputs"].get(name, ["", "(not set)"])
                seen.setdefault(key, []).append(r)
                shown[key] = text
            if len(seen) > 1:
                groups = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: "
                                   f"{shown[k]}" for k, rs in seen.items())
                lines.append(f"{name} ({groups})")
        if lines:
            raise RuntimeError(
                "hccc: the ranks disagree on " + "; and on ".join(lines) + ": every rank must load "
                "the same algorithm catalog and set every input to the choice of algorithm alike, "
                "or ranks pick different algorithms")
        hosts = sorted({p["host"] for p in peers})
        self.nodes = [p["node"] for p in peers]
        if len(hosts) > 1:
            # a group across hosts compares its calls through the store
            self._ledger = StoreLedger(dist.PrefixStore("ledger/", self._store), self._rank, self._size)
            ledger.close()
            if self.catalog.entries or self.options.catalog is None:
                self.disabled = (f"the group spans {len(hosts)} hosts; hccc's communicators map their "
                                 "peers' memory, so every call runs on the delegate")
        else:
            try:
                ledger.attach([bytes.fromhex(p["ledger"]) for p in peers])
                boot.barrier("ledger")
            except Exception as exc:
                raise RuntimeError(f"hccc: rank {self._rank}: cannot map the peers' call records: "
                                   f"{exc}") from None
            ledger.mapped()
            self._ledger = ledger
        if self.options.catalog is None and not self.disabled:
            from hccc.torch.builtin import BuiltinCatalog
            self.catalog = BuiltinCatalog(self._size, self.nodes, topology=self.options.topology,
                                          topology_digest=inputs.get("HCCC_TOPOLOGY", [""])[0])

    def _delegate(self, dev: str):
        if dev not in self._delegates:
            name = self.device_backends.get(dev, "hccc")
            if name == "hccc":
                name = "gloo" if dev == "cpu" else "nccl"
            store = dist.PrefixStore(f"hccc-delegate/{dev}/", self._outer_store)
            if name == "gloo":
                self._delegates[dev] = _C.ProcessGroupGloo(store, self._rank, self._size, self._timeout)
            elif name == "nccl":
                if not dist.is_nccl_available():
                    raise RuntimeError("hccc: GPU tensors need the nccl delegate, which this torch "
                                       "build lacks")
                opts = _C.ProcessGroupNCCL.Options()
                opts._timeout = self._timeout
                self._delegates[dev] = _C.ProcessGroupNCCL(store, self._rank, self._size, opts)
            else:
                raise RuntimeError(f"hccc: cannot delegate {dev} tensors to backend {name!r} "
                                   "(gloo or nccl)")
        return self._delegates[dev]

    # ------------------------------------------------------------------ torch's queries
    def getBackendName(self) -> str:
        return "hccc"

    @property
    def group_name(self) -> str:
        return dist.distributed_c10d._world.pg_names[self]

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        return f"HcccProcessGroup(rank={self._rank}, size={self._size}, entries={len(self.catalog.entries)})"

    # ------------------------------------------------------------------ the worker
    def _worker(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            self._run_job(*job)

    def _run_job(self, fn, work) -> None:
        """Run one call (one at a time, in the order the calls were made)."""
        exc = None
        with self._exec:
            try:
                fn()
            except BaseException as e:
                exc = e
        with self._state:
            self._pending -= 1
        # last: a future's callbacks run here and may make further calls
        work._finish(exc)

    def _enqueue(self, fn, result) -> HcccWork:
        """Run the call: at once in the caller's thread when no earlier call is queued or running
        (the common case: two thread hand-offs less per call, which on a loaded host cost more
        than the call's own work), else after them on the worker thread."""
        if self._closed:
            raise RuntimeError("hccc: the process group has been shut down")
        if self._broken:
            raise RuntimeError(f"hccc: rank {self._rank}: the process group is unusable after an "
                               f"earlier failure: {self._broken}")
        with self._state:
            inline = self._pending == 0 and threading.get_ident() != self._thread.ident
            self._pending += 1
        work = HcccWork(result, queued=not inline)
        if inline:
            self._run_job(fn, work)
        else:
            self._queue.put((fn, work))
        return work

    def shutdown(self) -> None:
        """Stop the worker (after the calls already queued) and close the communicators."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(self.timeout_s)
        for comm in self._comms.values():
            try:
                comm.close()
            except Exception:
                pass
        self._comms.clear()
        if self._ledger is not None:
            self._ledger.close()

    def abort(self) -> None:
        self.shutdown()

    def __del__(self):
        try:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        except Exception:
            pass

    # ------------------------------------------------------------------ routing
    def _device(self, tensors, what: str) -> torch.device:
        devs = {t.device for t in tensors}
        if len(devs) != 1:
            raise ValueError(f"hccc: {what}: the tensors live on different devices "
                             f"({', '.join(sorted(map(str, devs)))}); one call needs one device")
        dev = next(iter(devs))
        if dev.type not in _DEVICES:
            raise ValueError(f"hccc: {what}: tensors on {dev} are not supported (cpu or cuda)")
        return dev

    @staticmethod
    def _check_capture(what: str) -> None:
        if capture_active():
            raise CaptureError(
                f"hccc: {what} was issued while a CUDA graph is being captured; hccc's collectives "
                "meet their peers at host barriers, which a graph replay cannot repeat: issue it "
                "outside torch.cuda.graph (or capture with an nccl process group)")

    def _check(self, what: str, inputs, outputs=()) -> torch.device:
        self._check_capture(what)
        tensors = [*inputs, *outputs]
        dev = self._device(tensors, what)
        dt = {t.dtype for t in tensors}
        if len(dt) > 1:
            raise TypeError(f"hccc: {what}: the tensors have different dtypes "
                            f"({', '.join(sorted(map(str, dt)))})")
        return dev

    def _route(self, coll: str, dev: torch.device, tensors, nbytes: int, op: str,
               root: int | None = None, extra: str = "", strided_ok: bool = False) -> tuple:
        """("hccc", entry, kernel op, sum dtype, prescale) or ("fallback" | "delegated", reason,
        None, None, None); cached per call signature (stable values only). An AVG runs as a SUM in
        the dtype and with the scaling :func:`avg_plan` gives."""
        t = tensors[0]
        key = (coll, dev.type, t.dtype, nbytes, op, root, extra,
               strided_ok or all(x.is_contiguous() for x in tensors))
        got = self._routes.get(key)
        if got is not None:
            return got
        if self.device_backends.get(dev.type, "hccc") != "hccc":
            got = ("delegated", f"the device map gives {dev.type} to "
                   f"{self.device_backends[dev.type]}", None, None, None)
        elif extra:
            got = ("fallback", extra, None, None, None)
        elif self.disabled:
            got = ("fallback", self.disabled, None, None, None)
        elif not self.catalog.entries and not getattr(self.catalog, "lazy", False):
            got = ("fallback", "no algorithm catalog (set HCCC_ALGO_DIR or Options(catalog=))",
                   None, None, None)
        elif not key[-1]:
            got = ("fallback", "a non-contiguous tensor", None, None, None)
        elif nbytes == 0:
            got = ("fallback", "an empty tensor", None, None, None)
        else:
            from hccc.runtime.launcher import DTYPES, OPS
            name = str(t.dtype).replace("torch.", "")
            acc, pre, kop = None, False, kernel_op(op)
            if op == "avg":
                plan = avg_plan(t.dtype, DTYPES)
                kop = kernel_op("sum")
                if plan is None:
                    got = ("fallback", f"op avg of {name} (torch averages no {name} tensors)",
                           None, None, None)
                else:
                    acc, pre = plan
                    nbytes = nbytes // t.element_size() * acc.itemsize
            dtype = kernel_dtype(acc if acc is not None else t.dtype)
            if got is not None:
                pass
            elif dtype is None:
                got = ("fallback", f"dtype {name} has no hccc kernel (hccc: {', '.join(DTYPES)})",
                       None, None, None)
            elif kop is None:
                got = ("fallback", f"op {op} has no hccc kernel (hccc: {', '.join(OPS)})",
                       None, None, None)
            else:
                entry, why = self.catalog.select(coll, self._size, nbytes, dtype, kop, root,
                                                 self.cluster)
                got = (("hccc", entry, kop, acc, pre) if entry is not None
                       else ("fallback", why, None, None, None))
        if len(self._routes) >= ROUTE_CACHE_MAX:
            self._routes.clear()
        self._routes[key] = got
        return got

    def _count(self, coll: str, route: tuple, dev: str, dtype: torch.dtype) -> None:
        kind, what = route[0], route[1]
        self.counters[kind][coll] += 1
        if kind == "hccc":
            self.counters["entries"][what.name] += 1
            self.carried[coll][dtype_name(dtype)] += 1
            return
        self.counters["reasons"][what] += 1
        if kind == "fallback":
            name = self.device_backends.get(dev, "hccc")
            name = name if name != "hccc" else ("gloo" if dev == "cpu" else "nccl")
            _log_fallback(self._rank, coll, name, what)

    def _communicator(self, entry, dev: torch.device, dtype: str, op: str, watch=None):
        """The entry's Communicator, made on its first call (``watch``: polled while its set-up
        waits for the peers, who may be making another call)."""
        key = (entry.name, dev.type)
        comm = self._comms.get(key)
        if comm is None:
            from hccc.runtime.bootstrap import StoreBootstrap
            from hccc.runtime.communicator import Communicator
            boot = StoreBootstrap(self._store, self._rank, self._size, name=f"entry/{entry.name}",
                                  timeout_s=self.timeout_s, watch=watch)
            backend = "cpu" if dev.type == "cpu" else ("hip" if torch.version.hip else "cuda")
            comm = Communicator(entry.path if entry.outdir else entry.ir, bootstrap=boot,
                                backend=backend, device=dev.index, timeout_s=self.timeout_s,
                                kernel_timeout_s=self.kernel_timeout_s, dtype=dtype, op=op)
            boot.watch = None                # set up: the first call's watch has done its part
            self._comms[key] = comm
        return comm

    def _next_call(self, text: str) -> tuple[int, int]:
        """Number and post this rank's next call (the worker's thread: calls in their order)."""
        self._calls += 1
        tag = self._digests.get(text)
        if tag is None:
            if len(self._digests) >= ROUTE_CACHE_MAX:
                self._digests.clear()
            tag = self._digests[text] = digest(text)
        self._ledger.post(self._calls, text, tag)
        return self._calls, tag

    def _mismatch(self, why: str) -> CallMismatch:
        self._broken = why
        return CallMismatch(f"hccc: rank {self._rank}: {why}")

    def _wait_delegate(self, work, seq: int, text: str, tag: int) -> None:
        """Wait for a delegate's work, comparing the peers' calls meanwhile."""
        start = time.monotonic()
        while not work.is_completed():
            why = self._ledger.conflict(seq, text, tag)
            if why:
                raise self._mismatch(why)
            # yield for the first millisecond (most calls complete within it), then sleep
            time.sleep(0 if time.monotonic() - start < 1e-3 else _DELEGATE_POLL_S)
        work.wait()

    def _submit(self, coll: str, dev: torch.device, route: tuple, run_hccc, run_delegate, result,
                text: str | None):
        """Queue the call on its route; ``run_hccc(comm, op)`` / ``run_delegate(backend)``;
        ``text``: the call as every rank must make it (:func:`~hccc.torch.ledger.describe`; None for
        point-to-point calls, which the ranks make differently)."""
        result_dtype = _result_dtype(result)
        devtype = dev.type                  # (a property torch makes anew on every read)
        self._count(coll, route, devtype, result_dtype)
        ready = None
        if devtype == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(dev))
        kind, entry, kop, acc = route[0], route[1], route[2], route[3]
        if kind == "hccc":
            dtype = kernel_dtype(acc if acc is not None else result_dtype)
            made = (entry.name, devtype)    # the communicator's key (:meth:`_communicator`)
            protos, seconds = self.counters["protos"], self.seconds["hccc"]

            def fn():
                t0 = time.perf_counter()
                if ready is not None:
                    ready.synchronize()
                seq, tag = self._next_call(text)

                def watch():
                    return self._ledger.conflict(seq, text, tag)
                try:
                    comm = self._comms.get(made)
                    if comm is None:
                        comm = self._communicator(entry, dev, dtype, kop, watch)
                except Exception as exc:
                    why = watch()
                    if why:
                        raise self._mismatch(why) from None
                    raise exc
                comm.call_tag = tag
                comm.watch = watch
                try:
                    run_hccc(comm, kop)
                except Exception as exc:
                    why = self._ledger.conflict(seq, text, tag)
                    if why:
                        raise self._mismatch(why) from None
                    raise exc
                finally:
                    comm.watch = None
                # no comparison after the call: every rank's call met this one's on the same
                # communicator, which compared their digests (call_tag) before its kernel ran
                protos[comm.last_proto] += 1     # auto: LL for small calls
                seconds[coll] += time.perf_counter() - t0
        else:
            backend = self._delegate(devtype)

            def fn():
                t0 = time.perf_counter()
                if ready is not None:
                    ready.synchronize()
                if text is None:
                    work = run_delegate(backend)
                    if work is not None:
                        work.wait()
                else:
                    seq, tag = self._next_call(text)
                    work = run_delegate(backend)
                    if work is not None:
                        self._wait_delegate(work, seq, text, tag)
                    self._ledger_settle(seq, text, tag)
                self.seconds[kind][coll] += time.perf_counter() - t0
        return self._enqueue(fn, result)

    def _ledger_settle(self, seq: int, text: str, tag: int) -> None:
        try:
            self._ledger.settle(seq, text, tag, self.timeout_s)
        except CallMismatch as exc:
            raise CallMismatch(f"hccc: rank {self._rank}: {exc}") from None

    def _text(self, kind: str, tensors, *, op: str | None = None, counts=None, root=None) -> str:
        """The call's description (:func:`~hccc.torch.ledger.describe`), made once per call shape."""
        t = tensors[0] if tensors else None
        counts = tuple(counts) if counts is not None else tuple(x.numel() for x in tensors)
        dtype, device = (t.dtype, t.device.type) if t is not None else (None, "cpu")
        key = (kind, op, dtype, counts, root, device)
        got = self._texts.get(key)
        if got is None:
            if len(self._texts) >= ROUTE_CACHE_MAX:
                self._texts.clear()
            got = self._texts[key] = describe(kind, op=op, dtype=dtype, counts=counts, root=root,
                                              device=device)
        return got

    @staticmethod
    def _avg_delegate(backend) -> bool:
        """Whether an AVG on this delegate runs as a SUM here (gloo has no AVG; nccl has)."""
        nccl = getattr(_C, "ProcessGroupNCCL", None)
        return nccl is None or not isinstance(backend, nccl)

    # ------------------------------------------------------------------ the collectives
    # Every method torch calls is made from one row of :data:`hccc.torch_calls.TORCH_CALLS`
    # (:func:`_method`): the row's form picks the adapter below, which turns torch's arguments into
    # the row's collective's buffers, root and op; the collective's spec says the rest (whether it
    # reduces, has a root, which buffer is the full one, how the two overlay), :func:`_run_spec`
    # runs it on a Communicator and :func:`_avg_sum` does every AVG.
    def _in_place(self, call: TorchCall, tensors, opts):
        """``(tensors, opts)``: one tensor, the collective's input and output (allreduce,
        broadcast, reduce)."""
        spec = call.spec
        op = _op_name(opts) if spec.reduces else None
        root = int(opts.rootRank) if spec.rooted else None
        t = tensors[0]
        # one tensor (the common call): what its shape decides is looked up, not worked out again
        shape = (call.method, op, root, t.dtype, t.device, t.numel(), t.is_contiguous()) \
            if len(tensors) == 1 else None
        got = self._shapes.get(shape) if shape is not None else None
        if got is None:
            dev = self._check(call.name, tensors)
            extra = "several tensors in one call" if len(tensors) != 1 else ""
            route = self._route(call.collective, dev, tensors, t.numel() * t.element_size(), op or "sum",
                                root=root, extra=extra, strided_ok=call.strided)
            got = (dev, route, self._text(call.kind, tensors, op=op, root=root))
            if shape is not None:
                if len(self._shapes) >= ROUTE_CACHE_MAX:
                    self._shapes.clear()
                self._shapes[shape] = got
        else:
            self._check_capture(call.name)      # the tensors' checks passed for this shape
        dev, route, text = got
        n = self._size
        # a rank the result does not reach keeps its buffer (the algorithm may leave partial sums
        # in it): it runs on a copy
        receives = spec.end != ROOT or self._rank == root

        def run_on(c, comm, kop):
            if op == "avg":
                _avg_sum(c, c, route[3:5], n, inplace=receives, receives=receives,
                         run_sum=lambda y, _res: _run_spec(comm, spec, y, None, root, kop))
            else:
                _run_spec(comm, spec, c if receives else c.clone(), None, root, kop)

        def run(comm, kop):
            if shape is not None and shape[-1]:     # contiguous: the tensor itself
                run_on(t, comm, kop)
                return
            with _contiguous(t) as c:
                run_on(c, comm, kop)

        def delegate(b):
            if op != "avg" or not self._avg_delegate(b):
                return getattr(b, call.delegate_method)(tensors, opts)
            sopts = _sum_options(call, root)
            for x in tensors:
                with _contiguous(x) as c:
                    _avg_sum(c, c, None, n, inplace=receives,
                             receives=receives,
                             run_sum=lambda y, _res: getattr(b, call.delegate_method)([y], sopts).wait())
            return None
        return self._submit(call.collective, dev, route, run, delegate, tensors, text)

    def _single(self, call: TorchCall, output, input, opts, splits=None):
        """``(output, input, opts)``: one flat tensor per buffer, laid out as the spec's (the
        input the rank's part of the output, or the output the rank's part of the input, may
        overlay it: that input is copied first)."""
        spec = call.spec
        if splits is not None and (splits[0] or splits[1]):
            # split sizes given: an AllToAllv on every rank (a rank whose own splits happen to be
            # equal takes the same route as its peers, whose splits may not be)
            return self._all_to_all_v(call, output, input, splits[0], splits[1], opts)
        dev = self._check(call.name, [input], [output])
        op = _op_name(opts) if spec.reduces else None
        n = self._size
        extra = ""
        if spec.alias == "input in output" and output.numel() != input.numel() * n:
            extra = "the output does not hold the group's inputs"
        elif spec.alias == "output in input" and input.numel() != output.numel() * n:
            extra = "the input does not hold the group's outputs"
        elif spec.alias == "same" and input.numel() != output.numel():
            extra = "input and output of different sizes"
        full = output if spec.full_buffer == "output" else input
        route = self._route(call.collective, dev, [full, output if full is input else input],
                            full.numel() * full.element_size(), op or "sum", extra=extra,
                            strided_ok=call.strided)

        def run(comm, kop):
            if op == "avg":
                _avg_sum(input, output, route[3:5], n, inplace=False, receives=True,
                         run_sum=lambda y, res: _run_spec(comm, spec, y, res, None, kop))
            else:
                _run_spec(comm, spec, input.clone() if _overlap(input, output) else input, output,
                          None, kop)
        rest = ([], []) if call.splits else ()

        def delegate(b):
            run_b = getattr(b, call.delegate_method)
            if op != "avg" or not self._avg_delegate(b):
                return run_b(output, input, *rest, opts)
            sopts = _sum_options(call, None)
            _avg_sum(input, output, None, n,
                     inplace=False, receives=True, run_sum=lambda y, res: run_b(res, y, *rest, sopts).wait())
            return None
        # the call is described by the rank's own part (the buffer that is not the full one)
        own = output if spec.output == OWN else input
        return self._submit(call.collective, dev, route, run, delegate, [output],
                            self._text(call.kind, [own], op=op))

    def _lists(self, call: TorchCall, output_tensors, input_tensors, opts):
        """``(output_tensors, input_tensors, opts)``: the spec's full buffer as a list of one tensor
        per rank, the rank's own part one tensor (allgather, reduce_scatter, scatter). For a rooted
        collective only the root passes the list, so the route depends only on what every rank
        passes; a root whose list does not fit says so in its call's text, so that every rank's
        call fails on the comparison instead of waiting for the root."""
        spec = call.spec
        n = self._size
        listed_out = spec.output != OWN            # the list is the output (allgather)
        own_list, lists = (input_tensors, output_tensors) if listed_out else (output_tensors, input_tensors)
        pieces = [t for lst in lists for t in lst]
        mine = own_list[0]
        op = _op_name(opts) if spec.reduces else None
        root = int(opts.rootRank) if spec.rooted else None
        bad = extra = ""
        if spec.rooted:
            if self._rank == root and (len(lists) != 1 or len(pieces) != n
                                       or any(i.numel() != mine.numel() for i in pieces)):
                bad = (f"the root's {call.method}_list holds {len(pieces)} tensors of "
                       f"{'/'.join(str(i.numel()) for i in pieces) or 'no'} elements")
            elif self._rank == root and any(i.dtype != mine.dtype or i.device != mine.device
                                            for i in pieces):
                bad = (f"the root's {call.method}_list holds tensors of another dtype or device "
                       f"than the {'input' if listed_out else 'output'}")
            extra = "several tensors in one call" if len(own_list) != 1 else bad
            # a bad list goes to the delegate, which refuses it on the root while the others
            # fail on the comparison of the calls
            checked = [] if bad else pieces
        else:
            if len(own_list) != 1 or len(lists) != 1:
                extra = "several tensors in one call"
            elif len(pieces) != n or any(i.numel() != mine.numel() for i in pieces):
                extra = f"{'outputs' if listed_out else 'inputs'} of different sizes"
            elif op == "avg":
                extra = f"op avg of a {call.method} of tensor lists"
            checked = pieces
        dev = self._check(call.name, *((own_list, checked) if listed_out
                                                      else (checked, own_list)))
        route = self._route(call.collective, dev, [mine, *pieces], mine.numel() * mine.element_size() * n,
                            op or "sum", root=root, extra=extra, strided_ok=call.strided)

        def run(comm, kop):
            like = dict(dtype=mine.dtype, device=mine.device)
            if listed_out:
                flat = torch.empty(mine.numel() * n, **like)
                _run_spec(comm, spec, mine.contiguous().view(-1), flat, root, kop)
                for o, piece in zip(pieces, flat.chunk(n)):
                    o.copy_(piece.view_as(o))
                return
            # the full buffer: the list in rank order (a rooted collective's others are never read)
            flat = (torch.cat([i.reshape(-1) for i in pieces]) if not spec.rooted or self._rank == root
                    else torch.empty(mine.numel() * n, **like))
            with _contiguous(mine) as c:
                _run_spec(comm, spec, flat, c.view(-1), root, kop)
        # (a rooted collective's list is the root's alone: not counted)
        counts = ([] if spec.rooted else [len(pieces)]) + [x.numel() for x in own_list]
        text = describe(call.kind, op=op, dtype=mine.dtype, counts=counts, root=root,
                        device=mine.device.type, extra=bad)
        return self._submit(call.collective, dev, route, run,
                            lambda b: getattr(b, call.delegate_method)(output_tensors,
                                                                             input_tensors, opts),
                            output_tensors, text)

    def _coalesced(self, call: TorchCall, outputs, inputs, opts):
        """Several tensors in one call: :attr:`TorchCall.repeats` once per tensor (``inputs`` is
        None for an in-place collective)."""
        each = _BY_METHOD[call.repeats]
        if inputs is None:
            one = _options(each)()
            one.reduceOp = opts.reduceOp
            return self._together([getattr(self, each.method)([t], one) for t in outputs], outputs)
        return self._together([getattr(self, each.method)(o, i, opts) for o, i in zip(outputs, inputs)],
                              outputs)

    def _together(self, works, result) -> HcccWork:
        """One work for several queued calls (coalesced calls run as one call per tensor): it
        completes after them (the worker runs calls in order) with the first error, if any."""
        def fn():
            for w in works:
                w.wait()
        return self._enqueue(fn, result)

    def _all_to_all_v(self, call: TorchCall, output, input, output_split_sizes, input_split_sizes, opts):
        """``all_to_all_single`` with uneven split sizes, on the catalog's AllToAll program run as an
        AllToAllv (:meth:`hccc.runtime.Communicator.all_to_all_v`). Each rank knows its own row of
        the counts matrix (its input splits) and column (its output splits): the ranks exchange
        both through the communicator's bootstrap, every rank builds the matrix from the rows and
        checks every rank's column against it, so ranks that disagree all raise (the same verdict
        everywhere) before any data moves. The route is chosen for :data:`UNEVEN_ROUTE_ELEMENTS`, not
        the rank's own bytes, which differ between ranks (the ranks must take one route)."""
        dev = self._check(call.name, [input], [output])
        n = self._size
        rows_in = input.shape[0] if input.dim() else input.numel()
        rows_out = output.shape[0] if output.dim() else output.numel()
        per_in = input.numel() // rows_in if rows_in else 0
        per_out = output.numel() // rows_out if rows_out else 0
        ins = list(input_split_sizes) if input_split_sizes else [rows_in // n] * n
        outs = list(output_split_sizes) if output_split_sizes else [rows_out // n] * n
        if len(ins) != n or len(outs) != n or sum(ins) != rows_in or sum(outs) != rows_out \
                or min(ins + outs) < 0:
            raise ValueError(f"{call.method}: split sizes {ins} / {outs} do not split the input's "
                             f"{rows_in} and the output's {rows_out} rows among {n} ranks")
        extra = "input and output rows of different sizes" if rows_in and rows_out and per_in != per_out else ""
        per = per_in or per_out
        # (torch refuses strided tensors before the backend; were one to arrive, it runs on a
        # contiguous copy: a route that depended on this rank's layout could differ from its peers')
        route = self._route(call.collective, dev, [input, output],
                            UNEVEN_ROUTE_ELEMENTS * n * input.element_size(), "sum", extra=extra,
                            strided_ok=True)
        # the ranks' sizes differ: only the kind and dtype must agree
        text = self._text(f"{call.collective}v", [input], counts=())
        mine = np.array([c * per for c in ins] + [c * per for c in outs], np.int64)

        def run(comm, _op):
            from hccc.runtime.communicator import CommunicatorError
            tag = f"alltoallv/{comm._calls + 1}"
            got = comm._all_gather(mine.tobytes(), tag)
            _forget_split_keys(comm, tag)
            table = np.stack([np.frombuffer(g, np.int64) for g in got])
            counts = table[:, :n]
            for d in range(n):
                if not np.array_equal(table[d, n:], counts[:, d]):
                    s = int(np.flatnonzero(table[d, n:] != counts[:, d])[0])
                    raise CommunicatorError(
                        f"rank {self._rank}: {call.method}: rank {d} expects {int(table[d, n + s])} "
                        f"elements from rank {s}, which sends it {int(counts[s, d])} (every rank's "
                        "output_split_sizes must match the senders' input_split_sizes)")
            x = (input.clone(memory_format=torch.contiguous_format) if _overlap(input, output)
                 else input.contiguous())
            y = output if output.is_contiguous() else torch.empty_like(output, memory_format=torch.contiguous_format)
            comm.all_to_all_v(x, y, counts)
            if y is not output:
                output.copy_(y)

        return self._submit(f"{call.collective}v", dev, route, run,
                            lambda b: getattr(b, call.delegate_method)(output, input, list(output_split_sizes or []),
                                                                list(input_split_sizes or []), opts),
                            [output], text)

    def _barrier(self, call: TorchCall, opts):
        """A barrier: a call kind of its own (never taken for a peer's data collective), run as a
        one-element allreduce through hccc when the catalog has one for it."""
        if capture_active():
            self._check(call.kind, [])
        t = torch.zeros(1)
        route = self._route(call.kind, t.device, [t], 4, "sum")
        if route[0] == "fallback" and not self.disabled and (
                self.catalog.entries or getattr(self.catalog, "lazy", False)):
            r2 = self._route(call.collective, t.device, [t], 4, "sum")
            route = r2 if r2[0] == "hccc" else route
        spec = call.spec
        return self._submit(call.kind, t.device, route,
                            lambda comm, kop: _run_spec(comm, spec, t, None, 0, kop),
                            lambda b: b.barrier(opts), [t], describe(call.kind))

    def _delegated(self, call: TorchCall, tensors, run_delegate, result, text: str | None):
        """A call hccc has no algorithm kind for: the delegate, counted and logged."""
        dev = self._device(tensors, call.kind) if tensors else torch.device("cpu")
        if capture_active():
            self._check(call.kind, [])
        route = ("fallback", f"hccc has no {call.kind} algorithms", None, None, None)
        if self.device_backends.get(dev.type, "hccc") != "hccc":
            route = ("delegated", f"the device map gives {dev.type} to {self.device_backends[dev.type]}",
                     None, None, None)
        return self._submit(call.kind, dev, route, None, run_delegate, result, text)

    def _delegate_only(self, call: TorchCall, output_tensors, input_tensors, opts):
        """``(output_tensors, input_tensors, opts)`` on the delegate. Uneven lists (alltoall of
        tensor lists: a rank's tensors may differ from its peers') are described by how many
        tensors; the others by their sizes (and root)."""
        ins = list(input_tensors)
        root = int(opts.rootRank) if hasattr(opts, "rootRank") else None
        text = self._text(call.kind, ins, root=root,
                          counts=[len(ins)] if call.form == DELEGATE_LISTS else None)
        return self._delegated(call, ins, lambda b: getattr(b, call.method)(output_tensors, input_tensors, opts),
                               output_tensors, text)

    def _point(self, call: TorchCall, tensors, peer, tag):
        """Point-to-point (send, recv) on the delegate; never compared (the ranks make different
        calls)."""
        return self._delegated(call, list(tensors), lambda b: getattr(b, call.method)(tensors, peer, tag),
                               tensors, None)


# ------------------------------------------------------------------------------------- the methods
_BY_METHOD = {c.method: c for c in TORCH_CALLS}


def _options(call: TorchCall):
    """torch's options class of a call."""
    return getattr(_C, call.options)


def _sum_options(call: TorchCall, root: int | None):
    """The call's options for a SUM (an AVG on a delegate without it), with the call's root."""
    sopts = _options(call)()
    sopts.reduceOp = dist.ReduceOp.SUM
    if root is not None:
        sopts.rootRank = root
    return sopts


def _run_spec(comm, spec, x, out, root, kop):
    """Run ``spec``'s collective on a Communicator (its method of the spec's name): input ``x``,
    output ``out`` (None: in place in ``x``), the root where the spec has one, the op where it
    reduces."""
    kw = {}
    if spec.rooted:
        kw["root"] = root
    if spec.reduces:
        kw["op"] = kop
    return getattr(comm, spec.method)(x, out=out, **kw)


def _method(call: TorchCall):
    """The ProcessGroup method of one row of the table: torch's arguments (the options defaulted)
    handed to the adapter of the row's form."""
    def opts_of(opts):
        return opts if opts is not None else _options(call)()

    if call.form == IN_PLACE:
        def method(self, tensors, opts=None):
            return self._in_place(call, tensors, opts_of(opts))
    elif call.form == SINGLE and call.splits:
        def method(self, output, input, output_split_sizes=None, input_split_sizes=None, opts=None):
            return self._single(call, output, input, opts_of(opts),
                                (list(output_split_sizes or []), list(input_split_sizes or [])))
    elif call.form == SINGLE:
        def method(self, output, input, opts=None):
            return self._single(call, output, input, opts_of(opts))
    elif call.form == LISTS:
        def method(self, output_tensors, input_tensors, opts=None):
            return self._lists(call, output_tensors, input_tensors, opts_of(opts))
    elif call.form == COALESCED and _BY_METHOD[call.repeats].form == IN_PLACE:
        def method(self, tensors, opts=None):
            return self._coalesced(call, tensors, None, opts_of(opts))
    elif call.form == COALESCED:
        def method(self, outputs, inputs, opts=None):
            return self._coalesced(call, outputs, inputs, opts_of(opts))
    elif call.form == BARRIER:
        def method(self, opts=None):
            return self._barrier(call, opts_of(opts))
    elif call.form == POINT:
        def method(self, tensors, peer, tag=0):
            return self._point(call, tensors, peer, tag)
    else:
        def method(self, output_tensors, input_tensors, opts=None):
            return self._delegate_only(call, output_tensors, input_tensors, opts_of(opts))
    method.__name__ = method.__qualname__ = call.method
    method.torch_call = call            # the row it was made from
    method.__doc__ = (f"torch's ``{call.name}``: "
                      + (f"the {call.spec.title} collective ({call.form})" if call.spec is not None
                         else f"on the delegate ({call.form})") + ", from :data:`hccc.torch_calls.TORCH_CALLS`.")
    return method


for _call in TORCH_CALLS:
    for _name in (_call.method, *_call.aliases):
        setattr(HcccProcessGroup, _name, _method(_call))


# ------------------------------------------------------------------------------------- averages
def avg_plan(dtype: torch.dtype, sum_dtypes) -> tuple[torch.dtype, bool] | None:
    """How an AVG of ``dtype`` tensors runs as a SUM over the ranks: (the dtype the sum runs in,
    whether each rank scales its input by 1/n first); None for a dtype torch averages not (bool,
    complex). ``sum_dtypes``: the runtime dtype names a sum can run in (None: any).

    A sum in the tensor's own dtype followed by a divide overflows where the average is
    representable (float16 40000 + 40000, float32 3e38 + 3e38), so floating types are summed in
    float32 at least (float16 then divides after the sum: float32 holds any sum of float16 values
    exactly enough and none overflows) and scaled by 1/n first where the sum could still overflow
    (bfloat16, float32, float64: as NCCL's floating-point AVG does). Integers are summed in int64
    where it is available (the sum does not wrap) and divided after, truncating toward zero (C's
    integer division, NCCL's integer AVG)."""
    def have(d):
        return sum_dtypes is None or str(d).replace("torch.", "") in sum_dtypes
    if dtype == torch.bool or dtype.is_complex:
        return None
    if dtype.is_floating_point:
        if dtype == torch.float16:
            return (torch.float32, False) if have(torch.float32) else (dtype, True)
        if dtype == torch.bfloat16:
            return (torch.float32, True) if have(torch.float32) else (dtype, True)
        return dtype, True
    return (torch.int64, False) if have(torch.int64) else (dtype, False)


def _avg_input(x: torch.Tensor, acc: torch.dtype, pre: bool, n: int, *, inplace: bool) -> torch.Tensor:
    """The tensor the SUM of an AVG runs on: ``x`` in ``acc`` (``x`` itself when ``inplace`` and it
    is already of that dtype), scaled by 1/n when ``pre``."""
    if x.dtype == acc and inplace:
        y = x
    else:
        y = x.to(acc, copy=True)
    if pre:
        y.mul_(1.0 / n)
    return y


def _avg_output(y: torch.Tensor, out: torch.Tensor, pre: bool, n: int) -> None:
    """The AVG from the summed ``y`` into ``out`` (divided by n unless scaled before)."""
    if not pre:
        if y.dtype.is_floating_point:
            y.div_(n)
        else:
            y = torch.div(y, n, rounding_mode="trunc")
    if y is not out:
        out.copy_(y.view_as(out))


def _avg_sum(x: torch.Tensor, out: torch.Tensor, plan, n: int, *, inplace: bool, receives: bool,
             run_sum) -> None:
    """An AVG as a SUM (every AVG of the backend, on hccc's kernels or a delegate without AVG):
    ``x``'s values in ``plan`` = (the dtype the sum runs in, whether each rank scales by 1/n
    first: :func:`avg_plan` over the kernels' dtypes; None: over every dtype, for a delegate),
    summed by ``run_sum(y, res)`` into ``res`` (None: in place in ``y``,
    where ``out`` is ``x``: the collective's input and output are one buffer), then averaged into
    ``out`` where this rank ``receives`` the result. ``inplace``: ``x`` itself may be summed in
    (its dtype is the sum's)."""
    acc, pre = plan if plan is not None else (avg_plan(x.dtype, None) or (x.dtype, False))
    y = _avg_input(x, acc, pre, n, inplace=inplace)
    if out is x:
        res = y
        run_sum(y, None)
    else:
        res = out if out.dtype == y.dtype and not _overlap(x, out) \
            else torch.empty(out.numel(), dtype=y.dtype, device=out.device)
        run_sum(y, res)
    if receives:
        _avg_output(res, out, pre, n)


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors share memory."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


class _contiguous:
    """``with _contiguous(t) as c``: ``t`` itself when contiguous, else a contiguous copy that is
    copied back into ``t`` at the end."""

    def __init__(self, t: torch.Tensor):
        self.t = t
        self.c = t if t.is_contiguous() else t.contiguous()

    def __enter__(self) -> torch.Tensor:
        return self.c

    def __exit__(self, *exc) -> None:
        if self.c is not self.t and exc[0] is None:
            self.t.copy_(self.c)


def _forget_split_keys(comm, tag: str) -> None:
    """Delete this rank's key of the communicator's previous split exchange from the store, so a
    long training run leaves one key per rank there, not one per call: every peer has posted
    ``tag`` by now, which it does only after reading every key of the previous exchange."""
    from hccc.runtime.bootstrap import StoreBootstrap
    boot = getattr(comm, "_boot", None)
    prev = getattr(comm, "_split_tag", None)
    comm._split_tag = tag
    if prev is None or not isinstance(boot, StoreBootstrap) or boot.store is None:
        return
    try:
        boot.store.delete_key(f"{boot.prefix}/{prev}/{boot.rank}")
    except Exception:       # a store without deletion keeps the key: only memory
        pass


def _result_dtype(result):
    t = result
    while isinstance(t, (list, tuple)):
        t = t[0] if t else None
    return t.dtype if t is not None else torch.float32


def stats(group=None) -> dict:
    """How this process's calls on ``group`` (default: the default group) went: ``hccc`` and
    ``fallback`` / ``delegated`` (calls per collective), ``carried`` (calls hccc's kernels ran, per
    collective and dtype), ``seconds`` (the worker's time on calls, per route kind and collective),
    ``entries`` (calls per catalog entry),
    ``reasons`` (calls per fallback reason), ``protos`` (hccc calls per FIFO protocol the
    Communicator chose by size: ``ll``, ``simple``)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, HcccProcessGroup):
        raise ValueError(f"not an hccc process group: {pg!r}")
    out = {k: dict(v) for k, v in pg.counters.items()}
    out["carried"] = {coll: dict(per) for coll, per in pg.carried.items()}
    out["seconds"] = {kind: dict(per) for kind, per in pg.seconds.items()}
    return out


# ------------------------------------------------------------------------------------- registration
def _device_map() -> dict[str, str] | None:
    """The device map of the process group torch is making (``"cpu:gloo,cuda:hccc"``), read from
    torch's caller frame; None when it cannot be found (then hccc serves every device)."""
    f = sys._getframe(2)
    while f is not None:
        cfg = f.f_locals.get("backend_config")
        if cfg is not None and hasattr(cfg, "get_device_backend_map"):
            return {str(k): str(v) for k, v in cfg.get_device_backend_map().items()}
        f = f.f_back
    return None


def _create(dist_opts, backend_options):
    options = backend_options if isinstance(backend_options, Options) else None
    if options is None and backend_options is not None:
        raise TypeError(f"hccc: pg_options must be hccc.torch.Options, not {type(backend_options).__name__}")
    if options is None and dist.is_initialized():
        default = dist.distributed_c10d._get_default_group()
        if isinstance(default, HcccProcessGroup):
            options = default.options          # subgroups inherit the default group's catalog
    devmap = _device_map()
    if devmap is not None:
        devmap = {d: b for d, b in devmap.items() if d in _DEVICES}
    return HcccProcessGroup(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                            dist_opts.timeout, options, devmap,
                            list(getattr(dist_opts, "global_ranks_in_group", []) or []))


def register() -> None:
    """Register ``"hccc"`` with torch.distributed (idempotent)."""
    if "HCCC" in dist.Backend._plugins:
        return
    dist.Backend.register_backend("hccc", _create, extended_api=True, devices=list(_DEVICES))


__all__ = ["CaptureError", "HcccProcessGroup", "HcccWork", "Options", "capture_active", "register",
           "stats"]
