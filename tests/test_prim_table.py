"""The decoded-primitive table (hccc.compiler.backend.prim_table; hccc_ptable_decode in
hccc_prims.h): which programs' blocks decode their primitives into shared memory at launch, with how
many entries, what the manifest says of it, and that the kernels are right either way (the table,
and the per-primitive load a program over the budget falls back to) on the CPU emulation."""
from __future__ import annotations

import collections
import json
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.backend import prim_table
from hccc.compiler.backend.codegen import generate
from hccc.compiler.backend.table_codegen import generate_table
from hccc.compiler.frontend import generators as gen
from hccc.compiler.passes.build import build_program
from hccc import testing
from hccc.testing import describe_failure, kernel_cases, run_case, valid_programs

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def test_the_budget_holds_its_entries_and_leaves_the_block_its_state():
    assert prim_table.PTABLE_MAX_PRIMS * prim_table.SPRIM_BYTES <= prim_table.PTABLE_BUDGET_BYTES
    assert (prim_table.PTABLE_MAX_PRIMS + 1) * prim_table.SPRIM_BYTES > prim_table.PTABLE_BUDGET_BYTES
    # the table and the block's other state within CUDA's 48 KiB of static shared memory per block
    assert prim_table.PTABLE_BUDGET_BYTES + 8 * 1024 <= 48 * 1024


@settings(max_examples=examples(50))
@given(cells=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 7)), max_size=200),
       big=st.integers(0, 80), no_table=st.booleans(),
       collective=st.sampled_from(["allreduce", "allgather", "alltoall"]), a2a_table=st.booleans(),
       grouped=st.booleans(), groups_table=st.booleans())
def test_entries_are_the_most_primitives_of_a_block_within_the_budget(cells, big, no_table, collective,
                                                                       a2a_table, grouped, groups_table):
    """Against a count of (rank, tb) pairs: the table holds the largest block's primitives where
    they fit the budget and the program may have one (an AllToAll program only where
    prim_table.ALLTOALL_TABLE is set, a program with receive groups only where
    prim_table.GROUPS_TABLE is), else there is none."""
    cells = cells + [(6, 0)] * big
    ir = SimpleNamespace(nprims=len(cells), collective=collective,
                         prims={"rank": np.array([r for r, _ in cells], np.int32),
                                "tb": np.array([t for _, t in cells], np.int32)})
    most = max(collections.Counter(cells).values(), default=0)
    assert prim_table.max_block_prims(ir) == most
    may = not no_table and (collective != "alltoall" or a2a_table) and (not grouped or groups_table)
    want = most if most and most <= prim_table.PTABLE_MAX_PRIMS and may else 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prim_table, "ALLTOALL_TABLE", a2a_table)
        mp.setattr(prim_table, "GROUPS_TABLE", groups_table)
        mp.setattr(prim_table, "has_receive_groups", lambda _ir: grouped)
        assert prim_table.ptable_prims(ir, no_table) == want
        stats = prim_table.ptable_stats(ir, no_table)
    assert stats == {"prim_decode": "table" if want else "load", "prim_table_entries": want,
                     "prim_table_bytes": want * prim_table.SPRIM_BYTES}


@pytest.mark.parametrize("n", [3, 5, 8])
def test_a_program_with_receive_groups_loads_each_primitive(n):
    """The one-shot AllReduce's receives form a group on every rank (its RECV_REDUCE_COPY rows,
    counted here): the engine runs N-source units only without a decoded table, so its program
    takes the per-primitive load; the ring AllReduce, whose rows form none, keeps its table."""
    from hccc.compiler.ir.one_shot import one_shot_allreduce
    from hccc.compiler.ir.program_ir import Op
    one = one_shot_allreduce(n)
    rr = [int(r) for r, o in zip(one.prims["rank"], one.prims["op"]) if int(o) == int(Op.RECV_REDUCE_COPY)]
    assert collections.Counter(rr) == {r: n - 1 for r in range(n)}
    assert prim_table.has_receive_groups(one) and not prim_table.GROUPS_TABLE
    assert 0 < prim_table.max_block_prims(one) <= prim_table.PTABLE_MAX_PRIMS
    assert prim_table.ptable_prims(one) == 0
    assert prim_table.ptable_stats(one, False)["prim_decode"] == "load"
    ring = build_program(gen.ring_allreduce(n))
    assert not prim_table.has_receive_groups(ring)
    assert prim_table.ptable_prims(ring) == prim_table.max_block_prims(ring) > 0


def _program_types(out) -> set[str]:
    pat = r"\b(HCCC_TV?PROGRAM\(\d+\)|hccc_v?program) \w+_program\(\)"
    return {m for src in out.glob("*.cu") for m in re.findall(pat, src.read_text())}


def test_codegen_picks_the_table_and_the_manifest_says_so(tmp_path, monkeypatch):
    """Ring AllReduce 3: HCCC_TPROGRAM(N) in every source (N: its largest block's primitives), the
    manifest's stats the table's; over the budget (monkeypatched) hccc_program and "load"; an AllToAll
    program HCCC_TVPROGRAM(N) (prim_table.ALLTOALL_TABLE; hccc_vprogram and "load" without it); the
    table mode's generic kernels always load."""
    ir = build_program(gen.ring_allreduce(3))
    n = prim_table.max_block_prims(ir)
    nv = prim_table.max_block_prims(build_program(gen.ring_alltoall(3)))
    assert prim_table.ALLTOALL_TABLE is True
    cases = [("fits", gen.ring_allreduce(3), f"HCCC_TPROGRAM({n})", "table", n, False),
             ("alltoall", gen.ring_alltoall(3), "hccc_vprogram", "load", 0, False),
             ("alltoall_table", gen.ring_alltoall(3), f"HCCC_TVPROGRAM({nv})", "table", nv, True)]
    for name, alg, typ, decode, entries, a2a_table in cases:
        out = tmp_path / name
        out.mkdir()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(prim_table, "ALLTOALL_TABLE", a2a_table)
            generate(build_program(alg), out, platforms=["cuda"] * 3)
        assert _program_types(out) == {typ}, name
        stats = json.loads((out / "manifest.json").read_text())["stats"]
        assert (stats["prim_decode"], stats["prim_table_entries"]) == (decode, entries), name
        assert stats["prim_table_bytes"] == entries * prim_table.SPRIM_BYTES
    out = tmp_path / "table_mode"
    out.mkdir()
    generate_table(ir, out, platforms=["cuda"] * 3)
    assert json.loads((out / "manifest.json").read_text())["stats"]["prim_decode"] == "load"
    monkeypatch.setattr(prim_table, "PTABLE_MAX_PRIMS", n - 1)
    out = tmp_path / "over"
    out.mkdir()
    generate(ir, out, platforms=["cuda"] * 3)
    assert _program_types(out) == {"hccc_program"}
    assert json.loads((out / "manifest.json").read_text())["stats"]["prim_decode"] == "load"


@needs_gxx
@pytest.mark.parametrize("collective", ["allreduce", "reducescatter", "allgather", "alltoall"])
@pytest.mark.parametrize("budget", ["table", "load"])
@settings(max_examples=examples(1), deadline=None)
@given(data=st.data())
def test_kernels_match_the_oracle_with_the_table_and_with_the_per_primitive_load(collective, budget, data):
    """The same random program run on the CPU emulation with its blocks' primitives decoded into
    the table at launch (by every thread of the block, however many) and, with the budget set below
    its largest block, loaded one at a time: both give the reference executor's result (an AllToAll
    program's table is an hccc_tvprogram, prim_table.ALLTOALL_TABLE)."""
    alg = data.draw(valid_programs(collective, max_ranks=5), label="program")
    ir = build_program(alg, chunk_bytes=64)
    runners = collections.OrderedDict()   # (this build's own: never one built with the other choice)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(testing, "_RUNNERS", runners)
            if budget == "load":
                mp.setattr(prim_table, "PTABLE_MAX_PRIMS", prim_table.max_block_prims(ir) - 1)
            else:
                mp.setattr(prim_table, "ALLTOALL_TABLE", True)
            assert prim_table.ptable_prims(ir, False) == (prim_table.max_block_prims(ir) if budget == "table" else 0)
            for _ in range(2):
                case = data.draw(kernel_cases(ir, dtypes=["float32"], ops=["sum"], max_microbatches=8),
                                 label="case")
                res = run_case(ir, case)
                assert res.ok, f"{alg.header.name} ({alg.header.nranks} ranks): " + describe_failure(case, res)
    finally:
        for r in runners.values():
            if not isinstance(r, BaseException):
                r.close()
