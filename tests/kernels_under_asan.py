"""Kernel properties run under AddressSanitizer (collected only by ``test_kernels_asan.py``, which
starts pytest on this file in a child process with the ASan runtime preloaded and
``HCCC_CPU_SANITIZE=address``: every buffer the CPU platform hands the kernels then ends in a
poisoned redzone, and any access one element past a chunk aborts the child with ASan's report).

Random programs of every collective (hccc's lowering: sends, receives, fused forwarding
primitives, local copies), imported MSCCL programs with multi-chunk steps, scratch, local
``cpy``/``re`` steps, at uneven sizes (empty, one-element and ragged chunks), in place and out of
place. A few examples per run; ``HYPOTHESIS_PROFILE=thorough`` runs many more. And AllToAllv
through the Communicator with device counts drawn near and past the buffers they address.
"""
from __future__ import annotations

import ctypes
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.compiler.interop.msccl_xml import import_xml_text
from hccc.compiler.passes.build import build_program
from hccc.runtime.cpu import asan_loaded
from hccc.runtime.platform import get_platform
from hccc.testing import KernelCase, describe_failure, kernel_cases, run_case, valid_programs

from msccl_texts import allpairs_allreduce, direct_allgather
from alltoallv_fit import fit_verdict      # the oracle of what fits a call's buffers

pytestmark = pytest.mark.skipif(os.environ.get("HCCC_CPU_SANITIZE") != "address" or not asan_loaded(),
                                reason="run through test_kernels_asan.py (ASan runtime preloaded)")

FEW = settings(max_examples=int(os.environ.get("HCCC_ASAN_EXAMPLES", "2")), deadline=None)
if os.environ.get("HYPOTHESIS_PROFILE") == "thorough":
    FEW = settings(max_examples=200, deadline=None)


def test_buffers_end_in_a_redzone():
    """The negative control: one byte past any buffer of the platform is poisoned."""
    plat = get_platform("cpu")
    assert plat.sanitize == "address"
    poisoned = ctypes.CDLL(None).__asan_address_is_poisoned
    poisoned.restype = ctypes.c_int
    poisoned.argtypes = [ctypes.c_void_p]
    for n in (1, 4, 60, 4096, 1 << 17):
        ptr = plat.malloc(n)
        try:
            assert not poisoned(ptr) and not poisoned(ptr + n - 1)
            assert poisoned(ptr + n)
        finally:
            plat.free(ptr)


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce", "alltoall"])
@FEW
@given(data=st.data())
def test_random_programs_in_bounds(collective, data):
    alg = data.draw(valid_programs(collective, max_ranks=4), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([32, 64])), fuse=data.draw(st.booleans()))
    case = data.draw(kernel_cases(ir, dtypes=["float32", "float16", "int32"], max_microbatches=5,
                                  threads=(1, 2)), label="case")
    res = run_case(ir, case, timeout_s=60)
    assert res.ok, describe_failure(case, res)


@pytest.mark.parametrize("collective", ["allgather", "reducescatter", "allreduce"])
@FEW
@given(data=st.data())
def test_random_fused_programs_under_ll_in_bounds(collective, data):
    """Fused programs under LL: their marked rows run as fused LL chains (every unit's slot, source
    and destination from the decoded table, hccc_chain_enter), at 1 to 5 micro-batches."""
    alg = data.draw(valid_programs(collective, max_ranks=4), label="program")
    ir = build_program(alg, chunk_bytes=data.draw(st.sampled_from([32, 64])), fuse=True)
    case = data.draw(kernel_cases(ir, dtypes=["float32", "float16", "int32"], max_microbatches=5,
                                  threads=(1, 2)), label="case")
    res = run_case(ir, case, timeout_s=60, proto="ll")
    assert res.ok, describe_failure(case, res)


@FEW
@given(family=st.sampled_from([allpairs_allreduce, direct_allgather]), n=st.integers(2, 3),
       per=st.integers(1, 17), data=st.data())
def test_imported_multi_chunk_steps_in_bounds(family, n, per, data):
    """Steps of ``per`` chunks; AllReduce with scratch smaller than the loop and local ``re``
    steps (in place the importer's input copy is a ``cpy`` between coinciding chunks, out of place a
    real one), AllGather with a local ``cpy`` of the rank's block."""
    ir = import_xml_text(family(n, per), "algo.xml")
    ir.chunk_bytes = 64 * ir.max_step_chunks
    count = data.draw(st.integers(0, 16 * ir.nchunks), label="count")
    case = KernelCase(count, data.draw(st.sampled_from(["float32", "int32"])), "sum",
                      data.draw(st.booleans(), label="inplace"), data.draw(st.sampled_from([1, 2])))
    res = run_case(ir, case, timeout_s=60)
    assert res.ok, describe_failure(case, res)


# ---------------------------------------------------------------------------- AllToAllv device counts
@pytest.fixture(scope="module")
def comm_pool(tmp_path_factory):
    """Three Communicator ranks (one process each, started here: under the ASan runtime this
    process was started with, and with its HCCC_CPU_SANITIZE)."""
    pytest.importorskip("torch.distributed")
    from rank_pool import RankPool
    p = RankPool(3, tmp_path_factory.mktemp("stores"), lazy=True)
    yield p
    p.close()


@settings(max_examples=int(os.environ.get("HCCC_ASAN_COMM_EXAMPLES", "6")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_communicator_device_counts_stay_in_bounds(comm_pool, data):
    """``Communicator.all_to_all_v(device_counts=True)`` with hypothesis-drawn matrices the host
    never reads, near and past what the buffers (one size on every rank, ASan's redzone right after
    each) hold, in and out of place: every call matches the definition, or every rank raises
    the kernels' refusal of the entry the oracle of what fits names; no access past a buffer."""
    import numpy as np
    from hccc.compiler.frontend import generators as gen
    from hccc.runtime.alltoallv_call import block_tables
    n = 3
    ir = build_program(gen.ring_alltoall(n))
    inplace = data.draw(st.booleans(), label="inplace")
    vm, _ = block_tables(ir, inplace)
    c = np.array(data.draw(st.lists(st.lists(st.integers(0, 9), min_size=n, max_size=n), min_size=n, max_size=n),
                           label="counts"), np.int64)
    if inplace and data.draw(st.booleans(), label="symmetric"):
        c = np.triu(c) + np.triu(c, 1).T
    if data.draw(st.integers(0, 3), label="hostile entry") == 0:
        at = data.draw(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), label="at")
        c[at] = data.draw(st.sampled_from([-1, 2 ** 62, 2 ** 63 - 1, 40]), label="value")
    need = max(max(int(np.clip(c[r], 0, 64).sum()), int(np.clip(c[:, r], 0, 64).sum())) for r in range(n))
    length = max(1, need + data.draw(st.integers(-4, 2), label="slack"))
    want = fit_verdict(c, [length] * n, [length] * n, inplace, vm.k, -(-length // vm.k))
    calls = [[{"method": "all_to_all_v", "x": np.arange(length, dtype=np.float32) + 1000 * r,
               **({} if inplace else {"out": length}),
               "kwargs": {"counts": c.ravel(), "device_counts": True}}] for r in range(n)]
    replies = comm_pool.run(ir.to_json(), n, calls, timeout=60.0)
    if want is None:
        sd = np.cumsum(c, axis=1) - c
        for r, rep in enumerate(replies):
            assert rep["ok"], (r, rep.get("error"), rep.get("trace"))
            got = rep["outputs"][0]
            for s in range(n):
                k, at_r = int(c[s, r]), int(c[:s, r].sum())
                assert got[at_r:at_r + k].tolist() == (np.arange(sd[s, r], sd[s, r] + k) + 1000 * s).tolist()
    else:
        why, x = want
        entry = f"counts[{x // n}][{x % n}]"
        for r, rep in enumerate(replies):
            assert not rep["ok"] and "refused the AllToAllv counts" in rep["error"] and entry in rep["error"], \
                (r, want, rep["error"])
