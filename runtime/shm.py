"""POSIX shared memory segments for one-rank-per-process runs on one host.

A :class:`Segment` is a named POSIX shared-memory object (``shm_open``) mapped into this process.
Its creator shares :attr:`Segment.handle` (opaque bytes: the name and the size) with its peers,
which :func:`attach` it; once every peer has mapped it the creator :meth:`~Segment.unlink` s the
name, so nothing is left in ``/dev/shm`` even if processes are killed later: the memory lives as
long as its last mapping. Names carry who created them (``/hccc-<pid>-<pidns>-<start>-<token>``:
the process id, the inode of its PID namespace and the process's start time in clock ticks), so a
segment whose creator died before it could unlink it (killed during set-up) is recognised and
removed by :func:`reap_stale`, which every communicator runs when it starts. Only what is provably
this user's and dead is removed: a segment of this PID namespace (containers sharing ``/dev/shm``
have namespaces of their own, whose process ids mean nothing here), owned by this user, whose
creator process no longer exists or is another process now (a different start time).

Ranks that are threads of one process need none of this: their host segments are blocks of the
process's own memory (:func:`private`), which the peers hold as objects.

Addresses are plain host addresses (``int``), like every CPU-emulated device pointer.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re
import secrets
import struct

try:                      # the module multiprocessing.shared_memory is built on
    import _posixshmem
except ImportError:       # pragma: no cover - non-POSIX systems
    _posixshmem = None

PREFIX = "hccc"
_NAME = re.compile(rf"/{PREFIX}-(\d+)-(\d+)-(\d+)-[0-9a-f]{{16}}")
_MAGIC = b"HCCCSHM1"
_HANDLE = struct.Struct("<8sQ64s")     # magic, size, name (NUL padded)
#: where Linux shows POSIX shared-memory objects
SHM_DIR = "/dev/shm"


class ShmError(RuntimeError):
    """A segment cannot be created, attached or released (message for the user)."""


class ShmNoMemory(ShmError):
    """The system has no memory (or no room in ``/dev/shm``) for a segment of ``nbytes``."""

    def __init__(self, message: str, nbytes: int):
        super().__init__(message)
        self.nbytes = int(nbytes)


#: what the system says when it has no memory or no room for a segment
_NO_MEMORY = (errno.ENOMEM, errno.ENOSPC)


class Segment:
    """One mapped POSIX shared-memory object (created here or attached from a handle)."""

    def __init__(self, name: str, size: int, mapping: mmap.mmap, owner: bool):
        self.name, self.size, self._map, self.owner = name, int(size), mapping, owner
        self._anchor = ctypes.c_char.from_buffer(mapping)
        self.address = ctypes.addressof(self._anchor)
        self._linked = owner

    @property
    def handle(self) -> bytes:
        """Opaque bytes a peer passes to :func:`attach`."""
        return _HANDLE.pack(_MAGIC, self.size, self.name.encode())

    def unlink(self) -> None:
        """Remove the name (mappings stay valid); idempotent, only the creator's call acts."""
        if self._linked:
            self._linked = False
            _unlink(self.name)

    def close(self) -> None:
        """Unmap (and unlink when still linked). The memory must no longer be in use."""
        self.unlink()
        if self._map is not None:
            self._anchor = None
            try:
                self._map.close()
            except BufferError:
                pass          # a view still exported: the mapping goes with its last user
            self._map = None


class PrivateSegment(Segment):
    """A block of this process's memory with a segment's face (:func:`private`), for ranks that are
    threads of one process: no name, nothing in ``/dev/shm``, no handle; the peers hold the object
    itself, and the memory goes with its last holder (:meth:`close` leaves it to them)."""

    def __init__(self, size: int, mapping: mmap.mmap):
        super().__init__("", size, mapping, owner=True)
        self._linked = False

    @property
    def handle(self) -> bytes:
        raise ShmError("memory private to this process has no handle: its peers in this process "
                       "take the segment itself")

    def close(self) -> None:
        """Nothing to unmap while a peer may still read it: the mapping goes with its last holder."""


def private(size: int) -> PrivateSegment:
    """A new zeroed block of this process's memory of ``size`` bytes (at least one page), for
    peers that are threads of this process (:class:`PrivateSegment`)."""
    size = max(int(size), mmap.PAGESIZE)
    try:
        m = mmap.mmap(-1, size)
    except OSError as exc:
        message = f"cannot map {size} bytes of memory: {exc.strerror or exc}"
        if exc.errno in _NO_MEMORY:
            raise ShmNoMemory(message, size) from None
        raise ShmError(message) from None
    return PrivateSegment(size, m)


def _require() -> None:
    if _posixshmem is None:
        raise ShmError("POSIX shared memory is not available on this system")


def create(size: int) -> Segment:
    """A new zeroed segment of ``size`` bytes (at least one page)."""
    _require()
    size = max(int(size), mmap.PAGESIZE)
    name = f"/{PREFIX}-{_creator()}-{secrets.token_hex(8)}"
    try:
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    except OSError as exc:
        raise ShmError(f"cannot create shared memory {name}: {exc.strerror}") from None
    try:
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size)
    except OSError as exc:
        os.close(fd)
        _unlink(name)
        message = f"cannot size or map shared memory {name} ({size} bytes): {exc.strerror or exc}"
        if exc.errno in _NO_MEMORY:
            raise ShmNoMemory(message, size) from None
        raise ShmError(message) from None
    os.close(fd)
    return Segment(name, size, m, owner=True)


def parse_handle(handle: bytes) -> tuple[str, int]:
    """(name, size) of a handle; ShmError for anything that is not one of ours."""
    if not isinstance(handle, (bytes, bytearray)) or len(handle) != _HANDLE.size:
        raise ShmError("not a shared-memory handle (wrong length)")
    magic, size, raw = _HANDLE.unpack(bytes(handle))
    name = raw.rstrip(b"\0").decode("ascii", errors="replace")
    if magic != _MAGIC or not _NAME.fullmatch(name) or size <= 0:
        raise ShmError("not a shared-memory handle")
    return name, int(size)


def attach(handle: bytes) -> Segment:
    """Map a peer's segment from its handle."""
    _require()
    name, size = parse_handle(handle)
    try:
        fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
    except FileNotFoundError:
        raise ShmError(f"shared memory {name} is gone (its creator exited or already "
                       "released it)") from None
    except OSError as exc:
        raise ShmError(f"cannot open shared memory {name}: {exc.strerror}") from None
    try:
        if os.fstat(fd).st_size < size:
            raise ShmError(f"shared memory {name} is smaller than its handle says")
        m = mmap.mmap(fd, size)
    except OSError as exc:
        message = f"cannot map shared memory {name} ({size} bytes): {exc.strerror or exc}"
        if exc.errno in _NO_MEMORY:
            raise ShmNoMemory(message, size) from None
        raise ShmError(message) from None
    finally:
        os.close(fd)
    return Segment(name, size, m, owner=False)


def _unlink(name: str) -> None:
    try:
        _posixshmem.shm_unlink(name)
    except FileNotFoundError:
        pass


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` (of this host) exists and is not a zombie."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True      # no /proc: trust kill()


def pid_namespace() -> int:
    """The inode of this process's PID namespace (0 when unknown: then nothing is reaped)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def start_time(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (0 when unknown or gone)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


#: (process id, "PID-NAMESPACE-START") of this process's segment names, read once per process
_CREATOR: tuple[int, str] | None = None


def _creator() -> str:
    """What a segment's name says of the process that creates it (:func:`reap_stale` reads it):
    its id, PID namespace and start time, read from /proc once per process (again after a fork),
    not for every segment."""
    global _CREATOR
    pid = os.getpid()
    if _CREATOR is None or _CREATOR[0] != pid:
        _CREATOR = (pid, f"{pid}-{pid_namespace()}-{start_time(pid)}")
    return _CREATOR[1]


def ours() -> list[str]:
    """Names of the hccc segments present on this host (``/dev/shm``)."""
    try:
        entries = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted("/" + e for e in entries if _NAME.fullmatch("/" + e))


def _creator_gone(name: str, namespace: int) -> bool:
    """Whether segment ``name`` is provably this user's and its creator dead (see the module
    docstring)."""
    pid, ns, start = (int(g) for g in _NAME.fullmatch(name).groups())
    if not namespace or ns != namespace or pid == os.getpid():
        return False
    try:
        if os.stat(SHM_DIR + name).st_uid != os.getuid():
            return False
    except OSError:
        return False
    if not process_alive(pid):
        return True
    now = start_time(pid)
    return bool(start and now and now != start)       # the pid belongs to another process now


def reap_stale() -> list[str]:
    """Unlink the hccc segments that are provably this user's and whose creating process no longer
    runs (:func:`_creator_gone`); returns their names."""
    namespace = pid_namespace()
    gone = []
    for name in ours():
        if _creator_gone(name, namespace):
            _unlink(name)
            gone.append(name)
    return gone


__all__ = ["Segment", "ShmError", "ShmNoMemory", "create", "attach", "parse_handle", "process_alive", "ours",
           "pid_namespace", "private", "PrivateSegment", "reap_stale", "start_time", "SHM_DIR"]
