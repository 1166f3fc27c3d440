"""The built-in catalog's band-limited entries are built with slots sized to their band
(``builtin_catalog.band_chunk_bytes``, ``build_entry``): a call at the band's top fits every chunk
in one slot share under Simple and LL for every element size (checked by the slice arithmetic the
kernels use, ``abi.ll_share_bytes`` and ``slicing.slot_share_bytes``); the run-time channel rule
then gives the small-message programs channels by their band's size; entries without a band keep
the default slot; and the programs still run correctly in the CPU emulation."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.builtin_catalog import DEFAULT_CHUNK_BYTES, BuiltinCatalog, band_chunk_bytes, build_entry, plan
from hccc.compiler.backend import abi
from hccc.compiler.passes.channels import device_channels
from hccc.compiler.passes.slicing import slot_share_bytes


def _largest_chunk(nbytes: int, nchunks: int, es: int) -> int:
    """Bytes of the largest chunk of a call of ``nbytes`` in elements of ``es`` (the kernels' split)."""
    count = nbytes // es
    return -(-count // nchunks) * es


@settings(max_examples=200, deadline=None)
@given(max_bytes=st.integers(1, 1 << 22), nchunks=st.integers(1, 64), steps=st.integers(1, 8))
def test_a_bands_slot_holds_its_largest_chunk_in_one_micro_batch(max_bytes, nchunks, steps):
    cb = band_chunk_bytes(max_bytes, nchunks, steps)
    assert cb % 16 == 0 and 16 * steps <= cb <= DEFAULT_CHUNK_BYTES
    share = slot_share_bytes(cb, steps)
    for es in (1, 2, 4, 8):
        chunk = _largest_chunk(max_bytes - max_bytes % es, nchunks, es)
        if 2 * chunk * steps <= DEFAULT_CHUNK_BYTES:
            assert chunk <= share and chunk <= abi.ll_share_bytes(share), (es, chunk, share)
    # the smallest such slot: one a line (16 bytes, LL's two) a chunk of a step smaller holds no
    # 16-byte slice of the widest element's largest chunk under LL (slices are multiples of 16)
    if 16 * steps < cb < DEFAULT_CHUNK_BYTES:
        smaller = cb - 32 * steps
        chunk8 = _largest_chunk(-(-max_bytes // 8) * 8, nchunks, 8)
        assert smaller < 16 * steps or abi.ll_share_bytes(slot_share_bytes(smaller, steps)) < -(-chunk8 // 16) * 16


@pytest.mark.parametrize("world", [2, 4, 8])
def test_band_limited_entries_get_their_bands_slot_and_unbounded_ones_the_default(world):
    for collective in ("allreduce", "allgather", "reducescatter"):
        for name, make, _lo, hi in plan(collective, world, ["n0"] * world, None):
            ir = build_entry(make, name, hi)
            assert ir.name == name
            if hi is None:
                assert ir.chunk_bytes == DEFAULT_CHUNK_BYTES
                continue
            assert ir.chunk_bytes == band_chunk_bytes(hi, ir.nchunks, ir.max_step_chunks) < DEFAULT_CHUNK_BYTES
            share = slot_share_bytes(ir.chunk_bytes, ir.max_step_chunks)
            assert abi.ll_share_bytes(share) >= _largest_chunk(hi, ir.nchunks, 8)
            # one rank a GPU of 132 SMs: channels by the band (16 KiB a channel's slice at least)
            assert device_channels(ir, 132) == max(1, min(32, 132 // int(max(ir.ntbs)), share // (16 << 10)))


def test_the_one_shot_at_8_ranks_runs_one_channel():
    (name, make, _lo, hi), = [p for p in plan("allreduce", 8, ["n"] * 8, None) if p[0].startswith("one_shot")]
    ir = build_entry(make, name, hi)
    # a primitive moves all 8 chunks: 8 shares of 16 KiB (LL: 8 KiB, the chunk of a 64 KiB call)
    assert hi == 64 << 10 and ir.max_step_chunks == 8 and ir.chunk_bytes == 128 << 10
    assert device_channels(ir, 132) == 1


def test_catalog_picks_run_correctly_at_their_bands_sizes(tmp_path):
    """The entries the catalog picks for small calls on 4 ranks of one node, built as it builds
    them, run in the CPU emulation against the oracle under Simple and LL, in and out of place,
    at 16 bytes and at the band's top (32 KiB: the one-shot's)."""
    from hccc.runtime.launcher import Runner
    cat = BuiltinCatalog(4, ["n0"] * 4, cache_dir=tmp_path / "cache")
    for collective in ("allreduce", "allgather"):
        picks = {n: cat.select(collective, 4, n, "float32", "sum")[0] for n in (16, 32 << 10)}
        entry = picks[16]
        assert entry is not None and picks[32 << 10] is entry and entry.max_bytes >= 32 << 10
        assert entry.ir.chunk_bytes < DEFAULT_CHUNK_BYTES
        with Runner(entry.ir, backend="cpu", cache_dir=tmp_path / "k") as r:
            for nbytes in picks:
                for proto in ("simple", "ll"):
                    for inplace in (False, True):
                        res = r.run(nbytes, inplace=inplace, proto=proto, seed=nbytes)
                        assert res.wrong == 0 and res.stuck is None, (entry.name, nbytes, proto, inplace,
                                                                      res.first_wrong)
