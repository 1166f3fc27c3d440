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
spec it runs as, the form in which torch passes the buffers), made by :mod:`hccc.torch.forms`,
whose adapters map torch's arguments onto the spec's buffers, root and op.

Its parts: :mod:`~hccc.torch.options` (what the group is configured with),
:mod:`~hccc.torch.agreement` (what the ranks agree on when the group is made),
:mod:`~hccc.torch.routes` (a call's route), :mod:`~hccc.torch.forms` (torch's call forms),
:mod:`~hccc.torch.work` (the calls' queue and works), :mod:`~hccc.torch.jobs` (what a call runs on
the worker: posted, run on a Communicator or the delegate, a peer's different call named),
:mod:`~hccc.torch.averages` (AVG as a SUM),
:mod:`~hccc.torch.ledger` (the comparison of the ranks' calls).

GPU tensors: the call records an event on the caller's current stream; the worker waits for it,
then the Communicator runs its kernel on its own stream and waits for it, so the tensors are
ready once the work completes (this path has not been run on a GPU here).

Agreement: every rank's calls are numbered, described (kind, torch's op, dtype, counts, root) and
compared (:mod:`hccc.torch.ledger`): ranks whose calls differ all get a :class:`CallMismatch` at
once, on any route; so do the peers of a rank whose call failed or was refused before it was
queued (:meth:`HcccProcessGroup._refused`: the call keeps its number). When the group is made,
every input to the choice of algorithm (catalog, ``HCCC_CLUSTER``, ``HCCC_TOPOLOGY``, device map,
version) and every rank's set-up outcome are compared: a difference or a failure is an error on
every rank naming the ranks. Other failures are
the Communicator's (a dead rank: an error on every rank within the timeout), surfacing from
``wait()``; the delegate gets the group's timeout.
"""
from __future__ import annotations

import sys
import weakref
from collections import Counter, defaultdict
from datetime import timedelta

import torch
import torch.distributed as dist

from hccc.torch.agreement import agree, choice_inputs
from hccc.torch.capture import CaptureError, capture_active
from hccc.torch.forms import CallForms, install
from hccc.torch.jobs import CallJobs, error_text
from hccc.torch.ledger import ShmLedger, describe
from hccc.torch.options import Options, load_catalog, load_cluster, with_detected_topology
from hccc.torch.routes import ROUTE_CACHE_MAX, choose_route, dtype_name, log_fallback
from hccc.torch.work import CallQueue, HcccWork

_C = torch._C._distributed_c10d
_DEVICES = ("cpu", "cuda")

_GROUPS: "weakref.WeakSet[HcccProcessGroup]" = weakref.WeakSet()


class HcccProcessGroup(CallForms, dist.ProcessGroup):
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
        self._texts: dict[tuple, str] = {}       # call shape -> its description
        # this rank's set-up: whatever fails is told to every peer at the agreement below, so that
        # every rank fails at once with the reason (not after the timeout, waiting for this one)
        problem, inputs, node, ledger = None, {}, None, None
        try:
            self.options = (options or Options()).resolved()
            self.topology_note = None
            if self.options.topology is None:
                self.options, self.topology_note = with_detected_topology(
                    self.options, self.device_backends, self._size)
            self.kernel_timeout_s = (self.options.kernel_timeout_s if self.options.kernel_timeout_s
                                     else min(30.0, self.timeout_s))
            self.catalog = load_catalog(self.options.catalog)
            # the simulator breaks ties between entries on the cluster, else on the topology
            self.cluster = load_cluster(self.options.cluster if self.options.cluster is not None
                                    else self.options.topology)
            from hccc.runtime import net
            node = net.node_name()
            inputs = choice_inputs(self.options, self.catalog, self.device_backends)
            ledger = ShmLedger(self._rank, self._size)
        except Exception as exc:
            problem = str(exc).removeprefix("hccc: ") or type(exc).__name__
        try:
            agreed = agree(self._store, self._rank, self._size, self.timeout_s, problem=problem,
                           inputs=inputs, node=node, ledger=ledger,
                           catalog_used=(bool(self.catalog.entries) or self.options.catalog is None
                                         or self.options.builtin))
        except BaseException:
            if ledger is not None:
                ledger.close()
            raise
        self.nodes, self.disabled = agreed.nodes, agreed.disabled
        if (self.options.catalog is None or self.options.builtin) and not self.disabled:
            # the built-in catalog: the whole catalog without a directory, else what fills its gaps
            # (the directory's entries first)
            from hccc.catalog import FilledCatalog
            from hccc.builtin_catalog import BuiltinCatalog
            builtin = BuiltinCatalog(self._size, self.nodes, topology=self.options.topology,
                                     topology_digest=inputs.get("HCCC_TOPOLOGY", [""])[0])
            self.catalog = builtin if self.options.catalog is None else FilledCatalog(self.catalog, builtin)
        self._delegates: dict[str, object] = {}
        self._routes: dict[tuple, tuple] = {}
        #: one-tensor call shape -> (device, route, description): what _in_place derives from it
        self._shapes: dict[tuple, tuple] = {}
        self.counters = {"hccc": Counter(), "fallback": Counter(), "delegated": Counter(),
                         "entries": Counter(), "reasons": Counter(), "protos": Counter()}
        #: calls hccc's kernels carried, per collective and dtype
        self.carried: dict[str, Counter] = defaultdict(Counter)
        #: seconds the worker spent on calls, per route kind and collective (where a step's time
        #: goes: benchmarks/torch_backend.py)
        self.seconds: dict[str, Counter] = defaultdict(Counter)
        #: the calls' jobs: numbered, posted, run on a Communicator or the delegate
        self._jobs = CallJobs(self._rank, self._size, self._store, agreed.ledger, self.timeout_s,
                              self.kernel_timeout_s, self.counters["protos"], self.seconds)
        self._calls_queue = CallQueue(f"hccc-pg-{rank}")
        # the delegate of every device this process can use (gloo's connect is collective: every
        # rank makes it here, together)
        for dev in _DEVICES:
            if dev == "cpu" or torch.cuda.is_available():
                self._delegate(dev)
        _GROUPS.add(self)


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


    # ------------------------------------------------------------------ the calls' queue
    def _enqueue(self, fn, result) -> HcccWork:
        """Run the call in its turn (:class:`~hccc.torch.work.CallQueue`), unless the group is shut
        down or broken."""
        if self._calls_queue.closed:
            raise RuntimeError("hccc: the process group has been shut down")
        if self._jobs.broken:
            raise RuntimeError(f"hccc: rank {self._rank}: the process group is unusable after an "
                               f"earlier failure: {self._jobs.broken}")
        return self._calls_queue.submit(fn, result)

    def _refused(self, kind: str, exc: Exception) -> None:
        """This rank refused a ``kind`` call before queueing it (``exc``, about to be raised): the
        call's number is taken all the same, by a job that posts it as refused, so that the ranks
        keep numbering their calls alike and a peer waiting in that call fails at once, naming the
        refusal, instead of at the timeout (nothing when the group is shut down or unusable)."""
        jobs = getattr(self, "_jobs", None)
        if jobs is None or self._calls_queue.closed or jobs.broken:
            return
        self._calls_queue.submit(jobs.refused_job(f"{kind}(refused: {error_text(exc)})"), None)

    def shutdown(self) -> None:
        """Stop the worker (after the calls already queued) and close the communicators."""
        calls = getattr(self, "_calls_queue", None)
        if calls is None or calls.closed:
            return
        calls.close(self.timeout_s)
        self._jobs.close()

    def abort(self) -> None:
        self.shutdown()

    def __del__(self):
        try:
            calls = getattr(self, "_calls_queue", None)
            if calls is not None:
                calls.close()
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
        """The call's route (:func:`~hccc.torch.routes.choose_route`), cached per call signature
        (stable values only)."""
        t = tensors[0]
        key = (coll, dev.type, t.dtype, nbytes, op, root, extra,
               strided_ok or all(x.is_contiguous() for x in tensors))
        got = self._routes.get(key)
        if got is not None:
            return got
        backend = self.device_backends.get(dev.type, "hccc")
        got = choose_route(coll, t.dtype, t.element_size(), nbytes, op, size=self._size, root=root,
                           extra=extra, contiguous=key[-1],
                           delegate_to=f"{dev.type} to {backend}" if backend != "hccc" else None,
                           disabled=self.disabled, catalog=self.catalog, cluster=self.cluster)
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
            log_fallback(self._rank, coll, name, what)

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
        if route[0] == "hccc":
            fn = self._jobs.hccc_job(coll, dev, route, run_hccc, ready, text, result_dtype)
        else:
            fn = self._jobs.delegate_job(coll, route[0], self._delegate(devtype), run_delegate, ready,
                                         text)
        return self._enqueue(fn, result)

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


install(HcccProcessGroup)


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
