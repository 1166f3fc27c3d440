"""One single-process run's buffers (hccc.runtime.run_buffers): laid out as program_layout says,
filled with garbage and inputs, read back, and freed whole, even when an allocation fails half
way. The oracle is a fake platform's own record of what it handed out and what it was given."""
from __future__ import annotations

import numpy as np
import pytest

from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc.runtime.launcher import program_layout
from hccc.runtime.oracle import GARBAGE
from hccc.runtime.run_buffers import RunBuffers


class _Heap:
    """A platform over host memory that records live allocations and can fail the n-th malloc."""
    name = "fake"

    def __init__(self, fail_at: int | None = None):
        self.live: dict[int, np.ndarray] = {}
        self.calls, self.fail_at = 0, fail_at

    def set_device(self, d):
        pass

    def malloc(self, n):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise MemoryError("out of device memory")
        a = np.zeros(int(n), np.uint8)
        self.live[a.ctypes.data] = a
        return a.ctypes.data

    def free(self, p):
        del self.live[p]

    def _at(self, p, nbytes):
        for base, a in self.live.items():
            if base <= p and p + nbytes <= base + a.nbytes:
                return a[p - base:p - base + nbytes]
        raise AssertionError(f"{p:#x} is not in a live allocation")

    def memcpy_htod(self, p, host):
        raw = np.ascontiguousarray(host).view(np.uint8).ravel()
        self._at(p, raw.nbytes)[:] = raw

    def memcpy_dtoh(self, host, p):
        raw = host.view(np.uint8).reshape(-1)
        raw[:] = self._at(p, raw.nbytes)


@pytest.mark.parametrize("inplace", [False, True])
def test_buffers_take_the_layout_and_read_back_the_inputs(inplace):
    ir = build_program(gen.ring_allgather(3), chunk_bytes=256)
    lay = program_layout(ir, 30)
    heap = _Heap()
    bufs = RunBuffers([heap] * 3, [0] * 3, "float32")
    bufs.alloc(lay, inplace, 4)
    inputs = [np.arange(lay[r][0], dtype=np.float32) + 100 * r for r in range(3)]
    bufs.fill(lay, inputs)
    outs = bufs.outputs([row[1] for row in lay])
    for r, (n_in, n_out, _, in_off, _) in enumerate(lay):
        assert len(outs[r]) == n_out
        if inplace:       # the input overlays the output at its offset; the rest is garbage
            assert np.array_equal(outs[r][in_off:in_off + n_in], inputs[r])
            rest = np.delete(outs[r], np.arange(in_off, in_off + n_in))
        else:
            rest = outs[r]
        assert np.isnan(rest).all() and np.isnan(GARBAGE["float32"])
    assert bufs.stage(1, None) == 0
    staged = bufs.stage(1, np.arange(4, dtype=np.int64))
    assert staged in heap.live
    bufs.free()
    assert heap.live == {} and len(bufs) == 0


@pytest.mark.parametrize("fail_at", range(1, 7))
def test_a_failed_allocation_leaves_nothing_behind(fail_at):
    """Two ranks out of place: input, output and scratch each (6 allocations); whichever fails,
    freeing the run gives back every allocation made before it."""
    ir = build_program(gen.ring_allgather(2), chunk_bytes=256)
    heap = _Heap(fail_at)
    bufs = RunBuffers([heap] * 2, [0] * 2, "float32")
    with pytest.raises(MemoryError):
        bufs.alloc(program_layout(ir, 16), False, 4)
    assert len(heap.live) == fail_at - 1
    bufs.free()
    assert heap.live == {}
