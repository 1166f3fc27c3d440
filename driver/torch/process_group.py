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
   the reason logged once per job (rank 0, once per reason);
4. runs the call at once in the caller's thread when no earlier call is pending, else queues it on
   the group's worker thread, which runs the calls one at a time in the order
   they were made (the same order on every rank), and returns a :class:`HcccWork` (``wait``,
   ``is_completed``, ``get_future`` for DDP's communication hooks).

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
from hccc.torch.ledger import CallMismatch, ShmLedger, StoreLedger, describe, digest

log = logging.getLogger("hccc.torch")

_C = torch._C._distributed_c10d
#: torch's reduction operations by the names the calls are described with (and the runtime's op
#: names where it has the op: :data:`hccc.runtime.launcher.OPS`)
_TORCH_OPS = {"SUM": "sum", "MAX": "max", "MIN": "min", "AVG": "avg", "PRODUCT": "prod",
              "BAND": "band", "BOR": "bor", "BXOR": "bxor", "PREMUL_SUM": "premul_sum"}
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


def kernel_dtype(dtype: torch.dtype) -> str | None:
    """The runtime's name of a torch dtype its kernels implement (:data:`hccc.runtime.launcher.
    DTYPES`: whatever the kernels gain is carried), else None."""
    from hccc.runtime.launcher import DTYPES
    name = str(dtype).replace("torch.", "")
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
            inline = self._pending == 0 and threading.current_thread() is not self._thread
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

    def _check(self, what: str, inputs, outputs=()) -> torch.device:
        if capture_active():
            raise CaptureError(
                f"hccc: {what} was issued while a CUDA graph is being captured; hccc's collectives "
                "meet their peers at host barriers, which a graph replay cannot repeat: issue it "
                "outside torch.cuda.graph (or capture with an nccl process group)")
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
            self.carried[coll][str(dtype).replace("torch.", "")] += 1
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
        self._count(coll, route, dev.type, result_dtype)
        ready = None
        if dev.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(dev))
        kind, entry, kop, acc = route[0], route[1], route[2], route[3]
        if kind == "hccc":
            dtype = kernel_dtype(acc if acc is not None else result_dtype)

            def fn():
                t0 = time.perf_counter()
                if ready is not None:
                    ready.synchronize()
                seq, tag = self._next_call(text)

                def watch():
                    return self._ledger.conflict(seq, text, tag)
                try:
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
                self.counters["protos"][comm.last_proto] += 1     # auto: LL for small calls
                self.seconds["hccc"][coll] += time.perf_counter() - t0
        else:
            backend = self._delegate(dev.type)

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
    def _avg_delegate(backend, _unused=None) -> bool:
        """Whether an AVG on this delegate runs as a SUM here (gloo has no AVG; nccl has)."""
        nccl = getattr(_C, "ProcessGroupNCCL", None)
        return nccl is None or not isinstance(backend, nccl)

    # ------------------------------------------------------------------ the collectives
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        dev = self._check("allreduce", tensors)
        op = _op_name(opts)
        extra = "several tensors in one call" if len(tensors) != 1 else ""
        t = tensors[0]
        route = self._route("allreduce", dev, tensors, t.numel() * t.element_size(), op, extra=extra,
                            strided_ok=True)
        n = self._size

        def run(comm, kop):
            with _contiguous(t) as c:
                if op != "avg":
                    comm.all_reduce(c, op=kop)
                    return
                acc, pre = route[3], route[4]
                y = _avg_input(c, acc, pre, n, inplace=True)
                comm.all_reduce(y, op=kop)
                _avg_output(y, c, pre, n)

        def delegate(b):
            if op != "avg" or not self._avg_delegate(b, None):
                return b.allreduce(tensors, opts)
            for x in tensors:
                _avg_on_sum(x, lambda y: _sum_work(b.allreduce, [y]), n)
            return None
        return self._submit("allreduce", dev, route, run, delegate, tensors,
                            self._text("allreduce", tensors, op=op))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        one = dist.AllreduceOptions()
        one.reduceOp = opts.reduceOp
        return self._together([self.allreduce([t], one) for t in tensors], tensors)

    def _together(self, works, result) -> HcccWork:
        """One work for several queued calls (coalesced calls run as one call per tensor): it
        completes after them (the worker runs calls in order) with the first error, if any."""
        def fn():
            for w in works:
                w.wait()
        return self._enqueue(fn, result)

    def all_gather_single(self, output, input, opts=None):
        opts = opts if opts is not None else _C.AllgatherOptions()
        dev = self._check("all_gather_into_tensor", [input], [output])
        extra = ("the output does not hold the group's inputs"
                 if output.numel() != input.numel() * self._size else "")
        route = self._route("allgather", dev, [output, input], output.numel() * output.element_size(),
                            "sum", extra=extra)
        # in place (FSDP: the input is this rank's slice of the output): the input is copied first
        return self._submit("allgather", dev, route,
                            lambda comm, _op: comm.all_gather(input.clone() if _overlap(input, output)
                                                              else input, output),
                            lambda b: b._allgather_base(output, input, opts), [output],
                            self._text("allgather", [input]))

    _allgather_base = all_gather_single

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _C.AllgatherOptions()
        outs = [t for lst in output_tensors for t in lst]
        dev = self._check("allgather", input_tensors, outs)
        inp = input_tensors[0]
        extra = ""
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            extra = "several tensors in one call"
        elif len(outs) != self._size or any(o.numel() != inp.numel() for o in outs):
            extra = "outputs of different sizes"
        route = self._route("allgather", dev, [inp, *outs], inp.numel() * inp.element_size() * self._size,
                            "sum", extra=extra)

        def run(comm, _op):
            flat = torch.empty(inp.numel() * self._size, dtype=inp.dtype, device=inp.device)
            comm.all_gather(inp.contiguous().view(-1), flat)
            for o, piece in zip(outs, flat.chunk(self._size)):
                o.copy_(piece.view_as(o))
        return self._submit("allgather", dev, route, run,
                            lambda b: b.allgather(output_tensors, input_tensors, opts), output_tensors,
                            self._text("allgather (tensor list)", list(input_tensors),
                                       counts=[len(outs), *(x.numel() for x in input_tensors)]))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else _C.AllgatherOptions()
        return self._together([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)],
                              outputs)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        dev = self._check("reduce_scatter_tensor", [input], [output])
        op = _op_name(opts)
        extra = ("the input does not hold the group's outputs"
                 if input.numel() != output.numel() * self._size else "")
        route = self._route("reducescatter", dev, [input, output], input.numel() * input.element_size(),
                            op, extra=extra)
        n = self._size

        def run(comm, kop):
            if op != "avg":
                comm.reduce_scatter(input.clone() if _overlap(input, output) else input, output, op=kop)
                return
            acc, pre = route[3], route[4]
            y = _avg_input(input, acc, pre, n, inplace=False)
            res = output if output.dtype == y.dtype and not _overlap(input, output) \
                else torch.empty(output.numel(), dtype=y.dtype, device=output.device)
            comm.reduce_scatter(y, res, op=kop)
            _avg_output(res, output, pre, n)

        def delegate(b):
            if op != "avg" or not self._avg_delegate(b, None):
                return b._reduce_scatter_base(output, input, opts)
            sopts = dist.ReduceScatterOptions()
            sopts.reduceOp = dist.ReduceOp.SUM
            acc, pre = avg_plan(input.dtype, None) or (input.dtype, False)
            y = _avg_input(input, acc, pre, n, inplace=False)
            res = torch.empty(output.numel(), dtype=y.dtype, device=output.device)
            b._reduce_scatter_base(res, y, sopts).wait()
            _avg_output(res, output, pre, n)
            return None
        return self._submit("reducescatter", dev, route, run, delegate, [output],
                            self._text("reducescatter", [output], op=op))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        ins = [t for lst in input_tensors for t in lst]
        dev = self._check("reduce_scatter", ins, output_tensors)
        op = _op_name(opts)
        out = output_tensors[0]
        extra = ""
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            extra = "several tensors in one call"
        elif len(ins) != self._size or any(i.numel() != out.numel() for i in ins):
            extra = "inputs of different sizes"
        elif op == "avg":
            extra = "op avg of a reduce_scatter of tensor lists"
        route = self._route("reducescatter", dev, [out, *ins], out.numel() * out.element_size() * self._size,
                            op, extra=extra)

        def run(comm, kop):
            flat = torch.cat([i.reshape(-1) for i in ins])
            res = torch.empty(out.numel(), dtype=out.dtype, device=out.device)
            comm.reduce_scatter(flat, res, op=kop)
            out.copy_(res.view_as(out))
        return self._submit("reducescatter", dev, route, run,
                            lambda b: b.reduce_scatter(output_tensors, input_tensors, opts), output_tensors,
                            self._text("reducescatter (tensor list)", list(output_tensors), op=op,
                                       counts=[len(ins), *(x.numel() for x in output_tensors)]))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._together([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)],
                              outputs)

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        dev = self._check("broadcast", tensors)
        t = tensors[0]
        root = int(opts.rootRank)
        extra = "several tensors in one call" if len(tensors) != 1 else ""
        route = self._route("broadcast", dev, tensors, t.numel() * t.element_size(), "sum",
                            root=root, extra=extra, strided_ok=True)

        def run(comm, _op):
            with _contiguous(t) as c:
                comm.broadcast(c, root)
        return self._submit("broadcast", dev, route, run, lambda b: b.broadcast(tensors, opts), tensors,
                            self._text("broadcast", tensors, root=root))

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        dev = self._check("reduce", tensors)
        t = tensors[0]
        op = _op_name(opts)
        root = int(opts.rootRank)
        extra = "several tensors in one call" if len(tensors) != 1 else ""
        route = self._route("reduce", dev, tensors, t.numel() * t.element_size(), op, root=root,
                            extra=extra, strided_ok=True)
        n = self._size

        def run(comm, kop):
            if op == "avg":
                acc, pre = route[3], route[4]
                y = _avg_input(t.contiguous(), acc, pre, n, inplace=False)
                comm.reduce(y, root, op=kop)
                if self._rank == root:
                    _avg_output(y, t, pre, n)
                return
            if self._rank != root:
                # the algorithm may leave partial sums in a non-root rank's buffer; torch keeps it
                comm.reduce(t.contiguous().clone(), root, op=kop)
                return
            with _contiguous(t) as c:
                comm.reduce(c, root, op=kop)

        def delegate(b):
            if op != "avg" or not self._avg_delegate(b, None):
                return b.reduce(tensors, opts)
            sopts = dist.ReduceOptions()
            sopts.reduceOp, sopts.rootRank = dist.ReduceOp.SUM, root
            acc, pre = avg_plan(t.dtype, None) or (t.dtype, False)
            y = _avg_input(t.contiguous(), acc, pre, n, inplace=False)
            b.reduce([y], sopts).wait()
            if self._rank == root:
                _avg_output(y, t, pre, n)
            return None
        return self._submit("reduce", dev, route, run, delegate, tensors,
                            self._text("reduce", tensors, op=op, root=root))

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        dev = self._check("all_to_all_single", [input], [output])
        splits = list(output_split_sizes or []) + list(input_split_sizes or [])
        extra = ""
        if splits:
            # split sizes given: an AllToAllv on every rank (a rank whose own splits happen to be
            # equal takes the same route as its peers, whose splits may not be)
            return self._all_to_all_v(output, input, output_split_sizes, input_split_sizes, opts, dev)
        elif input.numel() != output.numel():
            extra = "input and output of different sizes"
        route = self._route("alltoall", dev, [input, output], input.numel() * input.element_size(),
                            "sum", extra=extra)
        # with splits the ranks' sizes may differ: only the kind and dtype must agree
        text = self._text("alltoall", [input], counts=() if splits else None)
        return self._submit("alltoall", dev, route,
                            lambda comm, _op: comm.all_to_all(input.clone() if _overlap(input, output)
                                                              else input, output),
                            lambda b: b.alltoall_base(output, input, list(output_split_sizes or []),
                                                      list(input_split_sizes or []), opts), [output],
                            text)

    alltoall_base = all_to_all_single

    def _all_to_all_v(self, output, input, output_split_sizes, input_split_sizes, opts, dev):
        """``all_to_all_single`` with uneven split sizes, on the catalog's AllToAll program run as an
        AllToAllv (:meth:`hccc.runtime.Communicator.all_to_all_v`). Each rank knows its own row of
        the counts matrix (its input splits) and column (its output splits): the ranks exchange
        both through the communicator's bootstrap, every rank builds the matrix from the rows and
        checks every rank's column against it, so ranks that disagree all raise (the same verdict
        everywhere) before any data moves. The route is chosen for :data:`UNEVEN_ROUTE_ELEMENTS`, not
        the rank's own bytes, which differ between ranks (the ranks must take one route)."""
        n = self._size
        rows_in = input.shape[0] if input.dim() else input.numel()
        rows_out = output.shape[0] if output.dim() else output.numel()
        per_in = input.numel() // rows_in if rows_in else 0
        per_out = output.numel() // rows_out if rows_out else 0
        ins = list(input_split_sizes) if input_split_sizes else [rows_in // n] * n
        outs = list(output_split_sizes) if output_split_sizes else [rows_out // n] * n
        if len(ins) != n or len(outs) != n or sum(ins) != rows_in or sum(outs) != rows_out \
                or min(ins + outs) < 0:
            raise ValueError(f"all_to_all_single: split sizes {ins} / {outs} do not split the input's "
                             f"{rows_in} and the output's {rows_out} rows among {n} ranks")
        extra = "input and output rows of different sizes" if rows_in and rows_out and per_in != per_out else ""
        per = per_in or per_out
        # (torch refuses strided tensors before the backend; were one to arrive, it runs on a
        # contiguous copy: a route that depended on this rank's layout could differ from its peers')
        route = self._route("alltoall", dev, [input, output], UNEVEN_ROUTE_ELEMENTS * n * input.element_size(),
                            "sum", extra=extra, strided_ok=True)
        text = self._text("alltoallv", [input], counts=())
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
                        f"rank {self._rank}: all_to_all_single: rank {d} expects {int(table[d, n + s])} "
                        f"elements from rank {s}, which sends it {int(counts[s, d])} (every rank's "
                        "output_split_sizes must match the senders' input_split_sizes)")
            x = (input.clone(memory_format=torch.contiguous_format) if _overlap(input, output)
                 else input.contiguous())
            y = output if output.is_contiguous() else torch.empty_like(output, memory_format=torch.contiguous_format)
            comm.all_to_all_v(x, y, counts)
            if y is not output:
                output.copy_(y)

        return self._submit("alltoallv", dev, route, run,
                            lambda b: b.alltoall_base(output, input, list(output_split_sizes or []),
                                                      list(input_split_sizes or []), opts), [output],
                            text)

    def barrier(self, opts=None):
        """A barrier: a call kind of its own (never taken for a peer's data collective), run as a
        one-element allreduce through hccc when the catalog has one for it."""
        opts = opts if opts is not None else dist.BarrierOptions()
        if capture_active():
            self._check("barrier", [])
        t = torch.zeros(1)
        route = self._route("barrier", t.device, [t], 4, "sum")
        if route[0] == "fallback" and not self.disabled and (
                self.catalog.entries or getattr(self.catalog, "lazy", False)):
            r2 = self._route("allreduce", t.device, [t], 4, "sum")
            route = r2 if r2[0] == "hccc" else route
        return self._submit("barrier", t.device, route, lambda comm, kop: comm.all_reduce(t, op=kop),
                            lambda b: b.barrier(opts), [t], describe("barrier"))

    # calls hccc has no algorithm kind for: the delegate, counted and logged
    def _passthrough(self, coll: str, tensors, call, result, text: str | None):
        dev = self._device(tensors, coll) if tensors else torch.device("cpu")
        if capture_active():
            self._check(coll, [])
        route = ("fallback", f"hccc has no {coll} algorithms", None, None, None)
        if self.device_backends.get(dev.type, "hccc") != "hccc":
            route = ("delegated", f"the device map gives {dev.type} to {self.device_backends[dev.type]}",
                     None, None, None)
        return self._submit(coll, dev, route, None, call, result, text)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        return self._passthrough("gather", list(input_tensors),
                                 lambda b: b.gather(output_tensors, input_tensors, opts), output_tensors,
                                 self._text("gather", list(input_tensors), root=int(opts.rootRank)))

    def scatter(self, output_tensors, input_tensors, opts=None):
        """torch.distributed.scatter: the root's ``scatter_list`` (``input_tensors[0]``, one tensor
        per rank) split over the ranks, tensor ``r`` into rank ``r``'s output. The route depends
        only on what every rank passes (the output, the root); a root whose list does not fit the
        output (another length, size, dtype or device) says so in its call's text, so that every
        rank's call fails on the comparison instead of waiting for the root."""
        opts = opts if opts is not None else dist.ScatterOptions()
        root = int(opts.rootRank)
        ins = [t for lst in input_tensors for t in lst]
        out = output_tensors[0]
        bad = ""
        if self._rank == root and (len(input_tensors) != 1 or len(ins) != self._size
                                   or any(i.numel() != out.numel() for i in ins)):
            bad = (f"the root's scatter_list holds {len(ins)} tensors of "
                   f"{'/'.join(str(i.numel()) for i in ins) or 'no'} elements")
        elif self._rank == root and any(i.dtype != out.dtype or i.device != out.device for i in ins):
            bad = "the root's scatter_list holds tensors of another dtype or device than the output"
        # only what every rank passes decides the route; a bad list goes to the delegate, which
        # refuses it on the root while the others fail on the comparison of the calls
        dev = self._check("scatter", [] if bad else ins, output_tensors)
        extra = "several tensors in one call" if len(output_tensors) != 1 else bad
        route = self._route("scatter", dev, [out, *ins], out.numel() * out.element_size() * self._size,
                            "sum", root=root, extra=extra, strided_ok=True)
        n = self._size

        def run(comm, _op):
            # the full buffer: the root's list in rank order; the other ranks' is never read
            flat = (torch.cat([i.reshape(-1) for i in ins]) if self._rank == root else
                    torch.empty(out.numel() * n, dtype=out.dtype, device=out.device))
            with _contiguous(out) as c:
                comm.scatter(flat, c.view(-1), root=root)
        text = describe("scatter", dtype=out.dtype, counts=[out.numel()], root=root,
                        device=out.device.type, extra=bad)
        return self._submit("scatter", dev, route, run,
                            lambda b: b.scatter(output_tensors, input_tensors, opts), output_tensors, text)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        return self._passthrough("alltoall (tensor lists)", list(input_tensors),
                                 lambda b: b.alltoall(output_tensors, input_tensors, opts), output_tensors,
                                 self._text("alltoall (tensor lists)", list(input_tensors),
                                            counts=[len(input_tensors)]))

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        opts = opts if opts is not None else _C.AllgatherOptions()
        return self._passthrough("allgather_coalesced", list(input_tensors),
                                 lambda b: b.allgather_coalesced(output_lists, input_tensors, opts),
                                 output_lists,
                                 self._text("allgather_coalesced", list(input_tensors)))

    def send(self, tensors, dst, tag=0):
        return self._passthrough("send", list(tensors), lambda b: b.send(tensors, dst, tag), tensors, None)

    def recv(self, tensors, src, tag=0):
        return self._passthrough("recv", list(tensors), lambda b: b.recv(tensors, src, tag), tensors, None)


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


def _sum_work(call, tensors):
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    return call(tensors, opts)


def _avg_on_sum(x: torch.Tensor, run_sum, n: int) -> None:
    """AVG of ``x`` in place through ``run_sum(tensor) -> work`` (a delegate without AVG)."""
    acc, pre = avg_plan(x.dtype, None) or (x.dtype, False)
    with _contiguous(x) as c:
        y = _avg_input(c, acc, pre, n, inplace=True)
        work = run_sum(y)
        if work is not None:
            work.wait()
        _avg_output(y, c, pre, n)


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
