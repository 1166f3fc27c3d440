"""Bootstrap for one rank per process: exchanging bytes between the ranks of a job, through
torch.distributed (an existing engine, not a home-made one; ``pip install 'hccc[dist]'``).

Three ways in for ranks in separate processes, all giving a :class:`Bootstrap` with
``all_gather(bytes) -> [bytes per rank]`` and ``barrier()``:

- a torch ``ProcessGroup`` (``group=``), or the default group when ``torch.distributed`` is
  initialised (``torchrun``, any launcher torch supports): :func:`torch.distributed.
  all_gather_object` moves the bytes (the group's own timeout applies);
- a ``torch.distributed.Store`` (``store=``: a ``TCPStore``, ``FileStore``, or the store of an
  existing job), shared by every rank of the communicator;
- an ``init_method`` URL when the caller has neither: ``tcp://HOST:PORT`` (a ``TCPStore`` served
  by rank 0), ``file:///PATH`` (a ``FileStore`` on a file system every rank sees) or ``env://``
  (``MASTER_ADDR`` / ``MASTER_PORT``, as torch's own ``env://``).

With a store, every communicator takes its keys under a prefix of its own (``hccc/<name>/<n>``,
``n`` counting the communicators this rank made on that store), so a later communicator on the
same store never reads an earlier one's keys; a rank that does not arrive within ``timeout_s`` is
named in the error (:class:`BootstrapError`), never waited for forever.

The ranks of a job may also be threads of one process: :func:`local_bootstraps` gives each its
:class:`LocalBootstrap`, all meeting at one :class:`LocalRendezvous` in memory (no torch needed),
with the same errors (a missing rank named at the timeout, a failed rank's reason at once). What
a communicator's set-up exchanges (:meth:`Bootstrap.exchange`: its program's terms, its handles)
travels as JSON text between processes and as the objects themselves between the threads of one.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from datetime import timedelta
from urllib.parse import urlparse


class BootstrapError(RuntimeError):
    """The ranks could not be brought together (message for the user)."""


def _torch_dist():
    try:
        import torch.distributed as dist
    except ImportError:
        raise BootstrapError("one rank per process bootstraps through torch.distributed, which is "
                             "not installed (pip install 'hccc[dist]')") from None
    if not dist.is_available():
        raise BootstrapError("this torch build has no torch.distributed")
    return dist


def _ranges(ranks) -> str:
    return ", ".join(str(r) for r in ranks)


class Bootstrap:
    """Moves bytes between the ``world_size`` ranks of one communicator."""

    rank: int
    world_size: int
    #: a ``threading.Condition`` every rank of the job shares when its ranks are threads of this
    #: process (:class:`LocalBootstrap`), which their host barriers wait on; None otherwise
    wake = None
    #: every rank of the job is a thread of this process: the ranks exchange their memory's
    #: pointers, not handles to map (:class:`LocalBootstrap`)
    same_process = False

    def all_gather(self, data: bytes, tag: str) -> list[bytes]:
        """Every rank's ``data`` (in rank order); ``tag`` names the exchange (unique per call)."""
        raise NotImplementedError

    def exchange(self, value, tag: str) -> list:
        """Every rank's ``value`` (a JSON value: dicts, lists, strings, numbers), in rank order,
        sent as JSON text through :meth:`all_gather`; a bootstrap of ranks in this process
        (:class:`LocalBootstrap`) hands the values over as they are."""
        return json_exchange(self, value, tag)

    def barrier(self, tag: str) -> None:
        self.all_gather(b"", tag)

    def fail(self, reason: str) -> None:
        """Tell the peers that this rank's set-up failed and why: their exchanges end at once with
        that reason instead of waiting for this rank until the timeout (where the bootstrap can
        carry it; a no-op otherwise)."""

    def close(self) -> None:
        """Release what the bootstrap holds."""


def json_exchange(boot, value, tag: str) -> list:
    """:meth:`Bootstrap.exchange` as JSON text through ``boot.all_gather``: what a bootstrap
    that only moves bytes (any object with ``all_gather(bytes, tag)``) exchanges."""
    return [json.loads(b) for b in boot.all_gather(json.dumps(value, sort_keys=True).encode(), tag)]


def exchange(boot, value, tag: str) -> list:
    """Every rank's ``value`` through ``boot``: its own :meth:`~Bootstrap.exchange`, or JSON text
    through its ``all_gather`` where it has none (a caller's object that only moves bytes)."""
    own = getattr(boot, "exchange", None)
    return own(value, tag) if own is not None else json_exchange(boot, value, tag)


class StoreBootstrap(Bootstrap):
    """All-gather and barrier through a ``torch.distributed.Store``."""

    def __init__(self, store, rank: int, world_size: int, *, name: str = "comm",
                 timeout_s: float = 60.0, owned: bool = False, watch=None):
        self.store, self.rank, self.world_size = store, int(rank), int(world_size)
        #: a callable polled while a step waits: a reason to give up (the caller knows the peers
        #: went elsewhere), or None
        self.watch = watch
        self.timeout_s = float(timeout_s)
        self._owned = owned
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:64] or "comm"
        # the n-th communicator this rank makes on this store: equal on every rank when they make
        # communicators in the same order (as collectives must be called anyway)
        n = int(store.add(f"hccc/{safe}/made/{self.rank}", 1))
        self.prefix = f"hccc/{safe}/{n}"
        self._failed_key = f"{self.prefix}/failed"

    def fail(self, reason: str) -> None:
        text = f"rank {self.rank}: {reason}"[:2000]
        try:
            # the first failure is the one every peer names (later ones are its echoes)
            self.store.compare_set(self._failed_key, "", text)
        except Exception:
            pass

    def _peer_failure(self) -> str | None:
        if not self.store.check([self._failed_key]):
            return None
        return bytes(self.store.get(self._failed_key)).decode("utf-8", "replace")

    def all_gather(self, data: bytes, tag: str) -> list[bytes]:
        keys = [f"{self.prefix}/{tag}/{r}" for r in range(self.world_size)]
        self.store.set(keys[self.rank], bytes(data))
        deadline = time.monotonic() + self.timeout_s
        # wait in short rounds, so a missing rank can be named when time runs out
        while True:
            missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
            if not missing:
                break
            why = self.watch() if self.watch is not None else None
            if why:
                raise BootstrapError(f"{why} (communicator set-up, step '{tag}')")
            failure = self._peer_failure()
            if failure is not None:
                raise BootstrapError(f"the set-up failed on {failure} (communicator set-up, step "
                                     f"'{tag}')")
            if time.monotonic() >= deadline:
                raise BootstrapError(
                    f"rank{'s' if len(missing) > 1 else ''} {_ranges(missing)} of {self.world_size} "
                    f"did not arrive within {self.timeout_s:g} s (communicator set-up, step "
                    f"'{tag}'); a peer that died or was never started cannot be waited for")
            time.sleep(min(0.01, max(0.0, deadline - time.monotonic())))
        return [bytes(self.store.get(k)) for k in keys]

    def close(self) -> None:
        if self._owned:
            self.store = None


class GroupBootstrap(Bootstrap):
    """All-gather through ``torch.distributed.all_gather_object`` on a process group."""

    def __init__(self, group=None):
        dist = _torch_dist()
        if not dist.is_initialized():
            raise BootstrapError("torch.distributed is not initialised: call "
                                 "torch.distributed.init_process_group first, or pass store= / "
                                 "init_method=")
        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if self.rank < 0:
            raise BootstrapError("this process is not a member of the given process group")

    def all_gather(self, data: bytes, tag: str) -> list[bytes]:
        out = [None] * self.world_size
        try:
            self.dist.all_gather_object(out, bytes(data), group=self.group)
        except RuntimeError as exc:
            raise BootstrapError(f"torch.distributed all_gather_object failed (communicator "
                                 f"set-up, step '{tag}'): {exc}") from None
        return [bytes(x) for x in out]


class LocalRendezvous:
    """Where the ``world_size`` ranks of one job in this process (threads) meet: each exchange's
    data by tag, kept until every rank has read it, and the first failure reported."""

    def __init__(self, world_size: int, timeout_s: float = 60.0):
        if int(world_size) < 1:
            raise BootstrapError(f"a job has at least one rank, not {world_size}")
        self.world_size, self.timeout_s = int(world_size), float(timeout_s)
        self._cond = threading.Condition()
        #: what the ranks' host barriers wait on and notify (:attr:`Bootstrap.wake`)
        self.wake = threading.Condition()
        #: tag -> (each rank's data or None, ranks that have read it)
        self._steps: dict[str, tuple[list, set]] = {}
        #: the first failure reported, "rank R: reason", or None
        self.failed: str | None = None

    def all_gather(self, rank: int, data: bytes, tag: str) -> list[bytes]:
        """Rank ``rank``'s ``data`` for step ``tag``; every rank's, in rank order, once all gave
        theirs (the step is forgotten when the last rank has read it)."""
        return self.gather(rank, bytes(data), tag)

    def gather(self, rank: int, value, tag: str) -> list:
        """:meth:`all_gather` of any object but None (the object itself, not a copy: the ranks
        share what they exchange and must only read it)."""
        if value is None:
            raise BootstrapError(f"rank {rank} gave nothing at step '{tag}' (communicator set-up)")
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            got, read = self._steps.setdefault(tag, ([None] * self.world_size, set()))
            if got[rank] is not None or rank in read:
                raise BootstrapError(f"rank {rank} took part in step '{tag}' twice (communicator set-up)")
            got[rank] = value
            if all(d is not None for d in got):
                # only the rank that completes the step wakes the others (one wake-up per waiter,
                # not one per waiter and arrival)
                self._cond.notify_all()
            while True:
                if self.failed is not None:
                    raise BootstrapError(f"the set-up failed on {self.failed} (communicator set-up, "
                                         f"step '{tag}')")
                if all(d is not None for d in got):
                    break
                missing = [r for r, d in enumerate(got) if d is None]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BootstrapError(
                        f"rank{'s' if len(missing) > 1 else ''} {_ranges(missing)} of {self.world_size} "
                        f"did not arrive within {self.timeout_s:g} s (communicator set-up, step "
                        f"'{tag}'); a peer that died or was never started cannot be waited for")
                self._cond.wait(left)
            read.add(rank)
            if len(read) == self.world_size:
                del self._steps[tag]
            return list(got)

    def fail(self, rank: int, reason: str) -> None:
        """Rank ``rank``'s set-up failed: every rank waiting, or arriving later, ends with it (the
        first failure is the one every peer names)."""
        with self._cond:
            if self.failed is None:
                self.failed = f"rank {rank}: {reason}"[:2000]
            self._cond.notify_all()


class LocalBootstrap(Bootstrap):
    """Rank ``rank`` of a job whose ranks are threads of this process, meeting at ``rendezvous``."""

    same_process = True

    def __init__(self, rendezvous: LocalRendezvous, rank: int):
        if not 0 <= int(rank) < rendezvous.world_size:
            raise BootstrapError(f"rank {rank} is not in 0..{rendezvous.world_size - 1}")
        self.rendezvous, self.rank, self.world_size = rendezvous, int(rank), rendezvous.world_size
        self.wake = rendezvous.wake

    def all_gather(self, data: bytes, tag: str) -> list[bytes]:
        return self.rendezvous.all_gather(self.rank, data, tag)

    def exchange(self, value, tag: str) -> list:
        """Every rank's ``value`` as it was given (no JSON text: the ranks share one process), in
        rank order; besides JSON values, objects of this process (a peer's in-process host
        segment, :func:`hccc.runtime.shm.private`)."""
        return self.rendezvous.gather(self.rank, value, tag)

    def fail(self, reason: str) -> None:
        self.rendezvous.fail(self.rank, reason)


def local_bootstraps(world_size: int, *, timeout_s: float = 60.0) -> list[LocalBootstrap]:
    """One :class:`LocalBootstrap` per rank of a job of ``world_size`` threads of this process."""
    rv = LocalRendezvous(world_size, timeout_s)
    return [LocalBootstrap(rv, r) for r in range(rv.world_size)]


def store_from_url(url: str, rank: int, world_size: int, timeout_s: float = 60.0):
    """A ``torch.distributed`` store for ``tcp://HOST:PORT``, ``file:///PATH`` or ``env://``."""
    dist = _torch_dist()
    u = urlparse(url)
    timeout = timedelta(seconds=timeout_s)
    if u.scheme == "env":
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port or not port.isdigit():
            raise BootstrapError("env:// needs MASTER_ADDR and MASTER_PORT in the environment")
        u = urlparse(f"tcp://{host}:{port}")
    if u.scheme == "tcp":
        if not u.hostname or u.port is None:
            raise BootstrapError(f"{url!r}: expected tcp://HOST:PORT")
        try:
            return dist.TCPStore(u.hostname, u.port, world_size, rank == 0, timeout=timeout,
                                 wait_for_workers=False)
        except (RuntimeError, OSError) as exc:
            raise BootstrapError(f"cannot reach the store at {u.hostname}:{u.port}: {exc}") from None
    if u.scheme == "file":
        path = u.path
        if not path:
            raise BootstrapError(f"{url!r}: expected file:///PATH")
        try:
            return dist.FileStore(path, world_size)
        except (RuntimeError, OSError) as exc:
            raise BootstrapError(f"cannot open the file store {path}: {exc}") from None
    raise BootstrapError(f"{url!r}: init_method must be tcp://HOST:PORT, file:///PATH or env://")


def make_bootstrap(rank: int | None, world_size: int | None, *, group=None, store=None,
                   init_method: str | None = None, bootstrap: Bootstrap | None = None,
                   name: str = "comm", timeout_s: float = 60.0) -> Bootstrap:
    """The bootstrap for the given arguments (see the module docstring); checks that ``rank`` and
    ``world_size`` agree with the group's when both are given."""
    given = [x is not None for x in (group, store, init_method, bootstrap)]
    if sum(given) > 1:
        raise BootstrapError("give at most one of group=, store=, init_method= and bootstrap=")
    if bootstrap is not None:
        b = bootstrap
    elif store is not None or init_method is not None:
        if rank is None or world_size is None:
            raise BootstrapError("a store needs rank= and world_size=")
        owned = store is None
        if store is None:
            store = store_from_url(init_method, rank, world_size, timeout_s)
        b = StoreBootstrap(store, rank, world_size, name=name, timeout_s=timeout_s, owned=owned)
    else:
        dist = _torch_dist()
        if group is None and not dist.is_initialized():
            raise BootstrapError("no bootstrap: torch.distributed is not initialised and neither "
                                 "group=, store= nor init_method= was given")
        b = GroupBootstrap(group)
    for what, want, have in (("rank", rank, b.rank), ("world_size", world_size, b.world_size)):
        if want is not None and int(want) != int(have):
            raise BootstrapError(f"{what}={want} but the bootstrap says {have}")
    return b


__all__ = ["Bootstrap", "BootstrapError", "exchange", "json_exchange", "StoreBootstrap", "GroupBootstrap", "LocalBootstrap",
           "LocalRendezvous", "local_bootstraps", "make_bootstrap", "store_from_url"]
