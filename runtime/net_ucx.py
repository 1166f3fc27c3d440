"""The UCX engine of :mod:`hccc.runtime.net`: ``net_ucx.cpp`` (this package), compiled at run time
with the C++ compiler (``HCCC_CXX``, default ``g++``) against UCP and cached by content hash (as
the CPU emulation builds its kernels), loaded with ctypes.

Finding UCX: ``HCCC_UCX_HOME`` (a UCX installation: ``include/ucp/api/ucp.h``, ``lib/libucp.so``;
HPC-X, OpenMPI's, a pip-installed one), else the compiler's default paths (Debian / Ubuntu:
``apt-get install libucx-dev``). UCX reads its own environment (``UCX_TLS``, ``UCX_NET_DEVICES``,
...): ``UCX_TLS=tcp`` keeps every byte on TCP sockets.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import struct
import threading
from importlib import resources
from pathlib import Path

from hccc.runtime import cache
from hccc.runtime.net_transport import Transport, TransportError

_LOCK = threading.Lock()
_LIBS: dict[str, ctypes.CDLL] = {}


def _source() -> str:
    return (resources.files("hccc.runtime") / "net_ucx.cpp").read_text()


def _flags() -> list[str]:
    home = os.environ.get("HCCC_UCX_HOME")
    if not home:
        return []
    lib = next((Path(home) / d for d in ("lib", "lib64") if (Path(home) / d / "libucp.so").exists()),
               Path(home) / "lib")
    return [f"-I{Path(home) / 'include'}", f"-L{lib}", f"-Wl,-rpath,{lib}"]


def library(cache_dir=None) -> ctypes.CDLL:
    """The built proxy library (built on first use; TransportError when UCX is missing)."""
    cxx = os.environ.get("HCCC_CXX") or "g++"
    exe = shutil.which(cxx)
    if exe is None:
        raise TransportError(f"the network proxy is C++ built at run time: {cxx} not found "
                             "(install g++, or set HCCC_CXX)")
    flags = ["-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden", "-Wall",
             *_flags()]
    src = _source()
    key = cache.content_key("net-ucx", exe, " ".join(flags), src)
    with _LOCK:
        if key in _LIBS:
            return _LIBS[key]

        def make(tmp: Path) -> None:
            (tmp / "net_ucx.cpp").write_text(src)
            res = subprocess.run([exe, *flags, str(tmp / "net_ucx.cpp"), "-o", str(tmp / "net.so"),
                                  "-lucp", "-lucs"], capture_output=True, text=True)
            if res.returncode != 0:
                missing = "ucp/api/ucp.h" in res.stderr or "-lucp" in res.stderr
                hint = ("UCX not found: install it (Debian/Ubuntu: apt-get install libucx-dev) or "
                        "set HCCC_UCX_HOME to a UCX installation (include/ucp/api/ucp.h, "
                        "lib/libucp.so)" if missing else "the network proxy failed to build")
                raise TransportError(f"{hint}:\n{res.stderr[-2000:]}")

        path = cache.entry("net_ucx", key, make, root=cache_dir) / "net.so"
        lib = ctypes.CDLL(str(path))
        vp, u64, i32, lng = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.c_long
        sig = {
            "hn_create": (vp, [i32, i32, ctypes.c_char_p, i32]),
            "hn_address": (lng, [vp, ctypes.c_char_p, lng]),
            "hn_register": (lng, [vp, vp, u64, ctypes.c_char_p, lng]),
            "hn_connect": (i32, [vp, i32, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]),
            "hn_add_send": (None, [vp, i32, vp, vp, u64, u64, u64, u64, ctypes.c_uint32, u64, vp]),
            "hn_add_inbound": (None, [vp, ctypes.c_uint32, i32, vp, u64, u64, vp]),
            "hn_add_recv": (None, [vp, i32, vp, u64, vp, u64, i32]),
            "hn_add_watch": (None, [vp, vp]),
            "hn_set_segment": (None, [vp, vp, u64, u64, u64, vp]),
            "hn_set_shape": (None, [vp, u64, u64, u64]),
            "hn_start": (None, [vp]),
            "hn_drain": (i32, [vp, lng]),
            "hn_reset": (i32, [vp, lng]),
            "hn_peer_status": (i32, [vp, i32]),
            "hn_set_stall": (None, [vp, u64]),
            "hn_stalled_ms": (u64, [vp]),
            "hn_status_string": (ctypes.c_char_p, [i32]),
            "hn_counters": (None, [vp, ctypes.POINTER(u64)]),
            "hn_destroy": (None, [vp, lng]),
            "hn_trace": (None, [vp, u64]),
            "hn_send_message": (i32, [vp, i32, ctypes.c_uint, ctypes.c_char_p, u64, vp, u64, lng]),
            "hn_progress_for": (None, [vp, lng]),
            "hn_trace_take": (u64, [vp, ctypes.POINTER(u64), u64]),
        }
        for name, (res, args) in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        _LIBS[key] = lib
        return lib


#: the proxy's active-message ids and control-message kinds (``net_ucx.cpp``: AM_SLOT, AM_CTRL,
#: CTRL_CREDIT, CTRL_SEGMENT), for the diagnostics that send one by hand
_AM_SLOT, _AM_CTRL = 1, 2
_CTRL_KINDS = {"credit": 1, "segment": 2}


class UcxTransport(Transport):
    """UCP context, worker and progress thread of this process (see ``net_ucx.cpp``)."""

    name = "ucx"

    def __init__(self, rank: int, world: int, cache_dir=None):
        self._lib = library(cache_dir)
        self._rank = int(rank)
        err = ctypes.create_string_buffer(256)
        self._h = self._lib.hn_create(int(rank), int(world), err, len(err))
        if not self._h:
            raise TransportError(f"UCX cannot start: {err.value.decode(errors='replace')}")

    def _buf(self, fn, *args) -> bytes:
        buf = ctypes.create_string_buffer(1 << 16)
        n = fn(self._h, *args, buf, len(buf))
        if n < 0:
            raise TransportError("UCX: cannot get an address or register memory")
        return buf.raw[:n]

    def address(self) -> bytes:
        return self._buf(self._lib.hn_address)

    def register(self, ptr: int, nbytes: int, remote: bool = True) -> bytes:
        if not remote:
            if self._lib.hn_register(self._h, ptr, nbytes, None, 0) < 0:
                raise TransportError("UCX: cannot register memory")
            return b""
        return self._buf(self._lib.hn_register, ptr, nbytes)

    def connect(self, peer: int, address: bytes, keys: list[bytes]) -> None:
        st = self._lib.hn_connect(self._h, peer, address, keys[0], keys[1])
        if st:
            raise TransportError(f"UCX: cannot connect to rank {peer}: {self._status(st)}")

    def add_send(self, peer, mslots, mtail, rslots, rtail, slot_bytes, nslots, rconn=0,
                 am_bytes=0, head=None) -> None:
        self._lib.hn_add_send(self._h, peer, mslots, mtail, rslots, rtail, slot_bytes, nslots,
                              rconn, am_bytes, head)

    def add_inbound(self, conn, peer, slots, slot_bytes, nslots, tail) -> None:
        self._lib.hn_add_inbound(self._h, conn, peer, slots, slot_bytes, nslots, tail)

    def add_recv(self, peer, mhead, rhead, tail=None, nslots=0, message=False) -> None:
        self._lib.hn_add_recv(self._h, peer, mhead, rhead, tail, nslots, int(bool(message)))

    def add_watch(self, word) -> None:
        self._lib.hn_add_watch(self._h, word)

    def set_segment(self, ptr, nbytes, stride, beat_offset, mirrors) -> None:
        self._lib.hn_set_segment(self._h, ptr, nbytes, stride, beat_offset, mirrors)

    def set_shape(self, region_bytes, region_used, max_cnt) -> None:
        if not self._h:
            return
        self._lib.hn_set_shape(self._h, region_bytes, region_used, max_cnt)

    def start(self) -> None:
        self._lib.hn_start(self._h)

    def set_stall(self, seconds: float) -> None:
        """Stall for good after a stop of the process longer than ``seconds`` (the peers' limit
        for a silent heartbeat): see ``Net::stall_ns`` in ``net_ucx.cpp``."""
        if self._h:
            self._lib.hn_set_stall(self._h, int(seconds * 1e9))

    def stalled_s(self) -> float:
        """How long the stop that stalled this transport lasted (0.0: not stalled)."""
        return self._lib.hn_stalled_ms(self._h) / 1000.0 if self._h else 0.0

    def drain(self, timeout_s: float) -> bool:
        if not self._h:
            return False
        return self._lib.hn_drain(self._h, int(timeout_s * 1000)) == 0

    def reset(self, timeout_s: float) -> bool:
        if not self._h:
            return False
        return self._lib.hn_reset(self._h, int(timeout_s * 1000)) == 0

    def _status(self, st: int) -> str:
        return self._lib.hn_status_string(st).decode(errors="replace")

    def peer_error(self, peer: int) -> str | None:
        if not self._h:
            return "transport closed"
        st = self._lib.hn_peer_status(self._h, peer)
        return self._status(st) if st else None

    def counters(self) -> tuple[int, int]:
        s = self.stats()
        return (s["puts"] + s["ams"] + s["ctrls"], s["put_bytes"] + s["am_bytes"] + s["ctrl_bytes"])

    def stats(self) -> dict:
        """What the progress thread sent and received so far: ``puts`` / ``put_bytes`` (slots,
        tails and credits into device memory), ``ams`` / ``am_bytes`` (slots sent as active
        messages, their data bytes), ``accepted`` (slot messages received and placed),
        ``rejected`` (slot messages received that named no connection of this rank or did not fit
        it: dropped), ``ctrls`` / ``ctrl_bytes`` (control messages sent: credits into host memory,
        host segments, headers included), ``ctrl_rejected`` (control messages received that named
        no head of this rank's sends, held a segment of another size, or came again: dropped)."""
        out = (ctypes.c_uint64 * 9)()
        if self._h:
            self._lib.hn_counters(self._h, out)
        return dict(zip(("puts", "put_bytes", "ams", "am_bytes", "accepted", "rejected", "ctrls",
                         "ctrl_bytes", "ctrl_rejected"), map(int, out)))

    def send_slot_message(self, peer: int, conn: int, seq: int, data: bytes, *, sender=None,
                          nreg: int = 1, reg_used: int = 0, reg_stride: int = 0,
                          timeout_s: float = 10.0) -> None:
        """Diagnostics, before :meth:`start` only (this thread drives the worker): send one slot
        message as the proxy does, with any header (``sender`` defaults to this rank) -- for
        tests of what a receiver accepts and in which order it publishes."""
        header = struct.pack("<IIQIIQ", conn, self._rank if sender is None else sender, seq, nreg,
                             reg_used, reg_stride)
        self._send_message(peer, _AM_SLOT, header, data, timeout_s)

    def send_control_message(self, peer: int, kind: str, seq: int, *, addr: int = 0,
                             value: int = 0, data: bytes = b"", sender=None,
                             timeout_s: float = 10.0) -> None:
        """Diagnostics, before :meth:`start` only: send one control message as the proxy does
        (``kind``: ``"credit"``, the word at ``addr`` becomes ``value``; ``"segment"``, ``data``
        into the receiver's mirror of the sender's segment), numbered ``seq`` in the sender's
        order -- for tests of the order the receiver applies them in and what it drops."""
        header = struct.pack("<IIQQQ", _CTRL_KINDS[kind], self._rank if sender is None else sender,
                             seq, addr, value)
        self._send_message(peer, _AM_CTRL, header, data, timeout_s)

    def _send_message(self, peer: int, am: int, header: bytes, data: bytes, timeout_s: float) -> None:
        buf = ctypes.create_string_buffer(bytes(data), max(len(data), 1))
        st = self._lib.hn_send_message(self._h, peer, am, header, len(header), buf, len(data),
                                       int(timeout_s * 1000))
        if st:
            raise TransportError(f"UCX: message to rank {peer}: {self._status(st)}")

    def progress_for(self, seconds: float) -> None:
        """Diagnostics, before :meth:`start` only: drive this worker for ``seconds``."""
        self._lib.hn_progress_for(self._h, int(seconds * 1000))

    def trace(self, capacity: int) -> None:
        """Diagnostics: record what the progress thread does (at most ``capacity`` steps from now
        on; 0 stops): a send's new tail seen, its puts issued, a watched word changed by a peer's
        put (see :meth:`trace_take`)."""
        if self._h:
            self._lib.hn_trace(self._h, int(capacity))

    def trace_take(self):
        """The steps recorded so far (then dropped): rows of (CLOCK_MONOTONIC ns, kind, index,
        value); kind 1: send connection ``index``'s tail ``value`` seen, 2: its slots and tail put
        (issued), 3: watched word ``index`` (in ``add_watch`` order) changed to ``value``."""
        import numpy as np
        rows = []
        while self._h:
            buf = np.zeros((4096, 4), dtype=np.uint64)
            k = int(self._lib.hn_trace_take(self._h, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)),
                                            4096))
            rows.append(buf[:k])
            if k < 4096:
                break
        return np.concatenate(rows) if rows else np.zeros((0, 4), dtype=np.uint64)

    def close(self) -> None:
        if self._h:
            h, self._h = self._h, None
            self._lib.hn_destroy(h, 2000)


__all__ = ["UcxTransport", "library"]
