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
   the reason logged once per collective and reason;
4. queues the call on the group's worker thread, which runs the calls one at a time in the order
   they were made (the same order on every rank), and returns a :class:`HcccWork` (``wait``,
   ``is_completed``, ``get_future`` for DDP's communication hooks).

GPU tensors: the call records an event on the caller's current stream; the worker waits for it,
then the Communicator runs its kernel on its own stream and waits for it, so the tensors are
ready once the work completes (this path has not been run on a GPU here).

Failures: the Communicator's own checks (mismatched calls, a dead rank: an error on every rank
within the timeout) surface from ``wait()``; a catalog that differs between ranks is an error on
every rank when the group is made; the delegate gets the group's timeout.
"""
from __future__ import annotations

import logging
import os
import queue
import socket
import sys
import threading
import weakref
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.futures import Future

from hccc.catalog import Catalog, CatalogError

log = logging.getLogger("hccc.torch")

_C = torch._C._distributed_c10d
_OPS = [(dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.MAX, "max"), (dist.ReduceOp.MIN, "min"),
        (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.PRODUCT, "product"),
        (dist.ReduceOp.BAND, "band"), (dist.ReduceOp.BOR, "bor"), (dist.ReduceOp.BXOR, "bxor")]
_DTYPE = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
          torch.int32: "int32"}
_DEVICES = ("cpu", "cuda")


class CaptureError(RuntimeError):
    """A collective was issued while a CUDA graph was being captured."""


def capture_active() -> bool:
    """Whether the current CUDA stream is being captured into a graph (False without CUDA)."""
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


@dataclass
class Options:
    """The backend's options (``init_process_group(..., pg_options=Options(...))``; subgroups
    inherit the default group's). ``catalog``: the algorithm directory (default: the
    ``HCCC_ALGO_DIR`` environment variable; none: every call goes to the delegate). ``cluster``:
    a cluster description (``.topo`` or TACCL ``.json``; default ``HCCC_CLUSTER``) whose simulated
    times break ties between entries. ``kernel_timeout_s``: the kernels' spin-wait limit
    (default: the group's timeout, at most 30 s)."""

    catalog: str | os.PathLike | None = None
    cluster: str | os.PathLike | None = None
    kernel_timeout_s: float | None = None
    _resolved: bool = field(default=False, repr=False)

    def resolved(self) -> "Options":
        if self._resolved:
            return self
        return Options(catalog=self.catalog if self.catalog is not None
                       else (os.environ.get("HCCC_ALGO_DIR") or None),
                       cluster=self.cluster if self.cluster is not None
                       else (os.environ.get("HCCC_CLUSTER") or None),
                       kernel_timeout_s=self.kernel_timeout_s, _resolved=True)


# ------------------------------------------------------------------------------------- work
class HcccWork(_C.Work):
    """The result of one queued call: completes when the group's worker has run it."""

    def __init__(self, result):
        super().__init__()
        self._done = threading.Event()
        self._exc: BaseException | None = None
        self._result = result
        self._future = Future()

    def _finish(self, exc: BaseException | None = None) -> None:
        self._exc = exc
        self._done.set()
        if exc is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(exc)

    def wait(self, timeout=None) -> bool:
        secs = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if secs is not None and secs <= 0:
            secs = None
        if not self._done.wait(secs):
            raise RuntimeError(f"hccc: the collective did not complete within {secs:g} s")
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._exc is None

    def exception(self):
        return self._exc

    def get_future(self) -> Future:
        return self._future

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
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    for want, name in _OPS:
        if op == want:
            return name
    return str(op).lower()


# ------------------------------------------------------------------------------------- the group
_GROUPS: "weakref.WeakSet[HcccProcessGroup]" = weakref.WeakSet()


class HcccProcessGroup(dist.ProcessGroup):
    """See the module docstring. Made by torch through the registered creator."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, options: Options | None = None,
                 device_backends: dict[str, str] | None = None, global_ranks=None):
        super().__init__(rank, size)
        self._rank, self._size = int(rank), int(size)
        self.options = (options or Options()).resolved()
        self.timeout_s = max(1.0, timeout.total_seconds())
        self.kernel_timeout_s = (self.options.kernel_timeout_s if self.options.kernel_timeout_s
                                 else min(30.0, self.timeout_s))
        self._timeout = timeout
        self._store = dist.PrefixStore("hccc/", store)
        self._outer_store = store
        #: device type -> backend named by the device map ("hccc" where hccc serves it)
        self.device_backends = dict(device_backends or {d: "hccc" for d in _DEVICES})
        self.catalog = _catalog(self.options.catalog)
        self.cluster = _cluster(self.options.cluster)
        self.disabled: str | None = None
        self._agree()
        self._delegates: dict[str, object] = {}
        self._routes: dict[tuple, tuple] = {}
        self._comms: dict[tuple[str, str], object] = {}
        self._logged: set[tuple[str, str]] = set()
        self.counters = {"hccc": Counter(), "fallback": Counter(), "delegated": Counter(),
                         "entries": Counter(), "reasons": Counter(), "protos": Counter()}
        self._queue: queue.Queue = queue.Queue()
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
    def _agree(self) -> None:
        """Every rank must load the same catalog; ranks on several hosts run everything on the
        delegate (a Communicator maps its peers' memory)."""
        import json
        from hccc.runtime.bootstrap import BootstrapError, StoreBootstrap
        me = {"catalog": self.catalog.fingerprint, "entries": len(self.catalog.entries),
              "dir": str(self.catalog.directory) if self.catalog.directory else None,
              "host": socket.gethostname()}
        try:
            boot = StoreBootstrap(self._store, self._rank, self._size, name="agree",
                                  timeout_s=self.timeout_s)
            peers = [json.loads(b) for b in boot.all_gather(json.dumps(me).encode(), "catalog")]
        except BootstrapError as exc:
            raise RuntimeError(f"hccc: rank {self._rank}: {exc}") from None
        prints = {p["catalog"] for p in peers}
        if len(prints) > 1:
            desc = "; ".join(f"rank {r}: {p['entries']} entries from {p['dir'] or '(no catalog)'} "
                             f"[{p['catalog'][:12]}]" for r, p in enumerate(peers))
            raise RuntimeError(f"hccc: the ranks disagree on the algorithm catalog (every rank must "
                               f"load the same files): {desc}")
        hosts = sorted({p["host"] for p in peers})
        if len(hosts) > 1 and self.catalog.entries:
            self.disabled = (f"the group spans {len(hosts)} hosts; hccc's communicators map their "
                             "peers' memory, so every call runs on the delegate")

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
            fn, work = job
            try:
                fn()
            except BaseException as exc:
                work._finish(exc)
            else:
                work._finish()

    def _enqueue(self, fn, result) -> HcccWork:
        if self._closed:
            raise RuntimeError("hccc: the process group has been shut down")
        work = HcccWork(result)
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
        """("hccc", entry, kernel op) or ("fallback" | "delegated", reason, None); cached.
        ``strided_ok``: the call runs non-contiguous tensors on a contiguous copy."""
        t = tensors[0]
        key = (coll, dev.type, t.dtype, nbytes, op, root, extra,
               strided_ok or all(x.is_contiguous() for x in tensors))
        got = self._routes.get(key)
        if got is not None:
            return got
        if self.device_backends.get(dev.type, "hccc") != "hccc":
            got = ("delegated", f"the device map gives {dev.type} to "
                   f"{self.device_backends[dev.type]}", None)
        elif extra:
            got = ("fallback", extra, None)
        elif self.disabled:
            got = ("fallback", self.disabled, None)
        elif not self.catalog.entries:
            got = ("fallback", "no algorithm catalog (set HCCC_ALGO_DIR or Options(catalog=))", None)
        elif not key[-1]:
            got = ("fallback", "a non-contiguous tensor", None)
        elif nbytes == 0:
            got = ("fallback", "an empty tensor", None)
        else:
            dtype = _DTYPE.get(t.dtype, str(t.dtype).replace("torch.", ""))
            kop = op
            if op == "avg":
                kop = "sum"
                if not t.dtype.is_floating_point:
                    got = ("fallback", f"op avg of {dtype} (hccc averages floating-point tensors)", None)
            if got is None:
                entry, why = self.catalog.select(coll, self._size, nbytes, dtype, kop, root, self.cluster)
                got = ("hccc", entry, kop) if entry is not None else ("fallback", why, None)
        self._routes[key] = got
        return got

    def _count(self, coll: str, route: tuple, dev: str) -> None:
        kind, what, _ = route
        self.counters[kind][coll] += 1
        if kind == "hccc":
            self.counters["entries"][what.name] += 1
            return
        self.counters["reasons"][what] += 1
        if kind == "fallback" and (coll, what) not in self._logged:
            self._logged.add((coll, what))
            name = self.device_backends.get(dev, "hccc")
            name = name if name != "hccc" else ("gloo" if dev == "cpu" else "nccl")
            log.warning("hccc: %s falls back to %s: %s", coll, name, what)

    def _communicator(self, entry, dev: torch.device, dtype: str, op: str):
        key = (entry.name, dev.type)
        comm = self._comms.get(key)
        if comm is None:
            from hccc.runtime.bootstrap import StoreBootstrap
            from hccc.runtime.communicator import Communicator
            boot = StoreBootstrap(self._store, self._rank, self._size, name=f"entry/{entry.name}",
                                  timeout_s=self.timeout_s)
            backend = "cpu" if dev.type == "cpu" else ("hip" if torch.version.hip else "cuda")
            comm = Communicator(entry.path if entry.outdir else entry.ir, bootstrap=boot,
                                backend=backend, device=dev.index, timeout_s=self.timeout_s,
                                kernel_timeout_s=self.kernel_timeout_s, dtype=dtype, op=op)
            self._comms[key] = comm
        return comm

    def _submit(self, coll: str, dev: torch.device, route: tuple, run_hccc, run_delegate, result):
        """Queue the call on its route; ``run_hccc(comm, op)`` / ``run_delegate(backend)``."""
        self._count(coll, route, dev.type)
        ready = None
        if dev.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(dev))
        kind, entry, kop = route
        result_dtype = _result_dtype(result)
        if kind == "hccc":
            def fn():
                if ready is not None:
                    ready.synchronize()
                dtype = _DTYPE[result_dtype]
                comm = self._communicator(entry, dev, dtype, kop)
                run_hccc(comm, kop)
                self.counters["protos"][comm.last_proto] += 1     # auto: LL for small calls
        else:
            backend = self._delegate(dev.type)

            def fn():
                if ready is not None:
                    ready.synchronize()
                work = run_delegate(backend)
                if work is not None:
                    work.wait()
        return self._enqueue(fn, result)

    # ------------------------------------------------------------------ the collectives
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        dev = self._check("allreduce", tensors)
        op = _op_name(opts)
        extra = "several tensors in one call" if len(tensors) != 1 else ""
        t = tensors[0]
        route = self._route("allreduce", dev, tensors, t.numel() * t.element_size(), op, extra=extra,
                            strided_ok=True)

        def run(comm, kop):
            with _contiguous(t) as c:
                comm.all_reduce(c, op=kop)
                if op == "avg":
                    c.div_(self._size)
        return self._submit("allreduce", dev, route, run, lambda b: b.allreduce(tensors, opts), tensors)

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
                            lambda b: b._allgather_base(output, input, opts), [output])

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
                            lambda b: b.allgather(output_tensors, input_tensors, opts), output_tensors)

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

        def run(comm, kop):
            comm.reduce_scatter(input.clone() if _overlap(input, output) else input, output, op=kop)
            if op == "avg":
                output.div_(self._size)
        return self._submit("reducescatter", dev, route, run,
                            lambda b: b._reduce_scatter_base(output, input, opts), [output])

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
        route = self._route("reducescatter", dev, [out, *ins], out.numel() * out.element_size() * self._size,
                            op, extra=extra)

        def run(comm, kop):
            flat = torch.cat([i.reshape(-1) for i in ins])
            res = torch.empty(out.numel(), dtype=out.dtype, device=out.device)
            comm.reduce_scatter(flat, res, op=kop)
            if op == "avg":
                res.div_(self._size)
            out.copy_(res.view_as(out))
        return self._submit("reducescatter", dev, route, run,
                            lambda b: b.reduce_scatter(output_tensors, input_tensors, opts), output_tensors)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._together([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)],
                              outputs)

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        dev = self._check("broadcast", tensors)
        t = tensors[0]
        extra = "several tensors in one call" if len(tensors) != 1 else ""
        route = self._route("broadcast", dev, tensors, t.numel() * t.element_size(), "sum",
                            root=int(opts.rootRank), extra=extra, strided_ok=True)

        def run(comm, _op):
            with _contiguous(t) as c:
                comm.broadcast(c, int(opts.rootRank))
        return self._submit("broadcast", dev, route, run, lambda b: b.broadcast(tensors, opts), tensors)

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        dev = self._check("reduce", tensors)
        t = tensors[0]
        op = _op_name(opts)
        root = int(opts.rootRank)
        extra = "several tensors in one call" if len(tensors) != 1 else ""
        route = self._route("reduce", dev, tensors, t.numel() * t.element_size(), op, root=root,
                            extra=extra, strided_ok=True)

        def run(comm, kop):
            if self._rank != root:
                # the algorithm may leave partial sums in a non-root rank's buffer; torch keeps it
                comm.reduce(t.contiguous().clone(), root, op=kop)
                return
            with _contiguous(t) as c:
                comm.reduce(c, root, op=kop)
                if op == "avg":
                    c.div_(self._size)
        return self._submit("reduce", dev, route, run, lambda b: b.reduce(tensors, opts), tensors)

    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None,
                          opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        dev = self._check("all_to_all_single", [input], [output])
        splits = list(output_split_sizes or []) + list(input_split_sizes or [])
        extra = ""
        if splits and len(set(splits)) > 1:
            extra = "uneven all-to-all splits"
        elif input.numel() != output.numel():
            extra = "input and output of different sizes"
        route = self._route("alltoall", dev, [input, output], input.numel() * input.element_size(),
                            "sum", extra=extra)
        return self._submit("alltoall", dev, route,
                            lambda comm, _op: comm.all_to_all(input.clone() if _overlap(input, output)
                                                              else input, output),
                            lambda b: b.alltoall_base(output, input, list(output_split_sizes or []),
                                                      list(input_split_sizes or []), opts), [output])

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        """A one-element allreduce (through hccc when the catalog has one for it)."""
        opts = opts if opts is not None else dist.BarrierOptions()
        if capture_active():
            self._check("barrier", [])
        t = torch.zeros(1)
        route = self._route("barrier", t.device, [t], 4, "sum")
        if route[0] == "fallback" and self.catalog.entries and not self.disabled:
            r2 = self._route("allreduce", t.device, [t], 4, "sum")
            route = r2 if r2[0] == "hccc" else route
        return self._submit("barrier", t.device, route, lambda comm, kop: comm.all_reduce(t, op=kop),
                            lambda b: b.barrier(opts), [t])

    # calls hccc has no algorithm kind for: the delegate, counted and logged
    def _passthrough(self, coll: str, tensors, call, result):
        dev = self._device(tensors, coll) if tensors else torch.device("cpu")
        if capture_active():
            self._check(coll, [])
        route = ("fallback", f"hccc has no {coll} algorithms", None)
        if self.device_backends.get(dev.type, "hccc") != "hccc":
            route = ("delegated", f"the device map gives {dev.type} to {self.device_backends[dev.type]}",
                     None)
        return self._submit(coll, dev, route, None, call, result)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        return self._passthrough("gather", list(input_tensors),
                                 lambda b: b.gather(output_tensors, input_tensors, opts), output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        return self._passthrough("scatter", list(output_tensors),
                                 lambda b: b.scatter(output_tensors, input_tensors, opts), output_tensors)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        return self._passthrough("alltoall (tensor lists)", list(input_tensors),
                                 lambda b: b.alltoall(output_tensors, input_tensors, opts), output_tensors)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        opts = opts if opts is not None else _C.AllgatherOptions()
        return self._passthrough("allgather_coalesced", list(input_tensors),
                                 lambda b: b.allgather_coalesced(output_lists, input_tensors, opts),
                                 output_lists)

    def send(self, tensors, dst, tag=0):
        return self._passthrough("send", list(tensors), lambda b: b.send(tensors, dst, tag), tensors)

    def recv(self, tensors, src, tag=0):
        return self._passthrough("recv", list(tensors), lambda b: b.recv(tensors, src, tag), tensors)


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


def _result_dtype(result):
    t = result
    while isinstance(t, (list, tuple)):
        t = t[0] if t else None
    return t.dtype if t is not None else torch.float32


def stats(group=None) -> dict:
    """How this process's calls on ``group`` (default: the default group) went: ``hccc`` and
    ``fallback`` / ``delegated`` (calls per collective), ``entries`` (calls per catalog entry),
    ``reasons`` (calls per fallback reason), ``protos`` (hccc calls per FIFO protocol the
    Communicator chose by size: ``ll``, ``simple``)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, HcccProcessGroup):
        raise ValueError(f"not an hccc process group: {pg!r}")
    return {k: dict(v) for k, v in pg.counters.items()}


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
