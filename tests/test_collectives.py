"""hccc.compiler.frontend.collectives: every collective is one CollectiveSpec, and every place that
lists collectives derives from SPECS, so a new entry (plus its generators) shows up everywhere
(docs/architecture.md, "Adding a collective"). Each spec's data (chunk model, buffers) is checked
against its own semantics function, and every collective is taken through the whole pipeline:
verified, compiled, proven symbolically, run by the reference executor in both placements and
compared with its definition, and exported to MSCCL XML or refused with its reason."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend.algorithm import Collective
from hccc.compiler.frontend.collectives import ALL, DSL_NAMES, NAMES, SPECS, spec_of
from hccc.util.diagnostics import CompileError
from hccc.compiler.frontend.load import parse_rccl
from hccc.compiler.interop.msccl_format import COLLECTIVE_ALIASES, SUPPORTED_COLLECTIVES
from hccc.compiler.ir import program_ir
from hccc.compiler.ir.symbolic import prove
from hccc.compiler.passes.build import build_program
from hccc.compiler.passes.verify import verify
from hccc.runtime import reference
from hccc.runtime.busbw import busbw_factor
from hccc.runtime.communicator import METHODS, Communicator
from hccc import sweep, testing
from hccc.testing import valid_programs

#: nccl-tests' PERFORMANCE.md factors, written out here as the independent oracle
NCCL_TESTS_BUSBW = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
                    "reducescatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
                    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0,
                    "gather": lambda n: (n - 1) / n, "scatter": lambda n: (n - 1) / n}


# ------------------------------------------------------------------------- one list, everywhere
def test_the_collective_enum_is_the_spec_list():
    assert [c.value for c in Collective] == list(NAMES) == list(SPECS)
    for c in Collective:
        assert c.spec is SPECS[c.value] is spec_of(c) is spec_of(c.value.upper())
        assert Collective.parse(c.dsl_name) is c and Collective.parse(c.spec.method) is c
    assert Collective.parse("alltoallv") is None
    with pytest.raises(ValueError, match="unknown collective"):
        spec_of("alltoallv")


@pytest.mark.parametrize("name", list(SPECS))
def test_every_place_that_lists_collectives_has_every_spec(name):
    spec = SPECS[name]
    # ProgramIR, the sweep's redop/root columns
    assert name in program_ir.COLLECTIVES
    assert (name in program_ir.ROOTED) == spec.rooted == (name in sweep.ROOTED)
    assert (name in sweep.REDUCING) == spec.reduces
    assert sweep.redop_column(name, "max") == ("max" if spec.reduces else "none")
    assert sweep.root_column(name, 1) == (1 if spec.rooted else -1)
    # the Communicator: a method of the spec's name
    assert METHODS[name] == spec.method and callable(getattr(Communicator, spec.method))
    # busbw
    f = busbw_factor(name, 8)
    assert 0 < f <= 2 and busbw_factor(name, 0) == 0.0
    if name in NCCL_TESTS_BUSBW:
        for n in (1, 2, 3, 8, 1024):
            assert busbw_factor(name, n) == pytest.approx(NCCL_TESTS_BUSBW[name](n))
    # hccc.testing draws it (it has at least one generator family)
    assert testing._FAMILIES[Collective(name)], f"{name}: no generator family in generators.py"
    # the ResCCLang header accepts it, and names it when refusing an unknown OpType
    root = ", Root=1" if spec.rooted else ""
    alg = parse_rccl(f'def ResCCLAlgo(nRanks=2, OpType="{spec.dsl_name}"{root}):\n    pass\n')
    assert alg.header.collective is Collective(name)
    with pytest.raises(CompileError) as exc:
        parse_rccl('def ResCCLAlgo(nRanks=2, OpType="Alltoallv"):\n    pass\n')
    assert spec.dsl_name in str(exc.value) and spec.dsl_name in DSL_NAMES
    # MSCCL XML: accepted under its coll name, or refused with a reason
    assert (spec.msccl in SUPPORTED_COLLECTIVES) if spec.msccl else spec.msccl_refusal
    assert all(COLLECTIVE_ALIASES[a] == spec.msccl for a in spec.msccl_aliases)


# ------------------------------------------------------------------- data against semantics
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("nranks,k,root", [(1, 1, 0), (3, 1, 2), (4, 2, 1)])
def test_chunk_model_agrees_with_the_semantics(name, nranks, k, root):
    """Inputs laid out by the spec's precondition and input layout, one element per chunk, run
    through the spec's semantics: every output slot the postcondition names holds its chunk
    (values = chunk ids, reduced with max) with the contributions it names (values = 1 << rank,
    reduced with sum); outputs the postcondition leaves out are unspecified (None)."""
    spec = SPECS[name]
    N, C = nranks, nranks * k
    r0, ids0, contrib0 = spec.start_holders(N, C, root)
    r1, ids1, want = spec.end_holders(N, C, root)

    def run(value, red):
        inputs = [np.full(spec.slots("input", N, C), -1, np.int64) for _ in range(N)]
        for r, i, c in zip(r0.tolist(), ids0.tolist(), contrib0.tolist()):
            inputs[r][spec.slot("input", r, i, N, C)] = value(i, c)
        return spec.semantics(inputs, red, C, root)

    by_id = run(lambda i, c: i, np.maximum)
    by_rank = run(lambda i, c: 1 << c, np.add)
    ends = set(r1.tolist())
    for r in range(N):
        assert (by_id[r] is None) == (r not in ends), f"{name}: rank {r}"
    for r, i, w in zip(r1.tolist(), ids1.tolist(), want.tolist()):
        s = spec.slot("output", r, i, N, C)
        assert by_id[r][s] == i, f"{name}: rank {r} output slot {s}"
        assert by_rank[r][s] == ((1 << N) - 1 if w == ALL else 1 << w), f"{name}: rank {r} slot {s}"


# --------------------------------------------------- the chunk model's facts, stated independently
@settings(max_examples=20, deadline=None)
@given(N=st.integers(1, 5), K=st.integers(1, 3), data=st.data())
def test_sendrecv_spec_facts_agree_with_the_written_out_model(N, K, data):
    """SendRecv's chunk model written out: rank ``i``'s piece ``k`` is id ``i*K + k``, sits at slot
    ``k`` of rank ``i``'s input and must end at slot ``k`` of rank ``(i + shift) % N``'s output;
    in place, that slot is the receiver's own piece ``k`` (the overlay is crossed)."""
    spec = SPECS["sendrecv"]
    shift = data.draw(st.integers(0, N - 1))
    C = N * K
    assert spec.parameter == "shift" and not spec.rooted and not spec.blockwise and not spec.reduces
    assert spec.nids(N, C) == C and spec.count_unit(N) == N and spec.crossed_overlay
    assert spec.alias == "same" and spec.buffer_sizes(N, K)[:2] == (K, K)
    for i in range(N):
        j = (i + shift) % N
        for k in range(K):
            cid = i * K + k
            assert int(spec.slot("input", i, cid, N, C)) == k == int(spec.slot("output", j, cid, N, C))
            assert int(spec.id_at("input", i, k, N, C, shift)) == cid
            assert int(spec.id_at("output", j, k, N, C, shift)) == cid
            assert bool(spec.holds(spec.start, i, cid, N, C, shift))
            assert [bool(spec.holds(spec.end, r, cid, N, C, shift)) for r in range(N)] == [r == j for r in range(N)]
            assert int(spec.id_at("input", j, spec.slot("output", j, cid, N, C), N, C, shift)) == j * K + k
    r, ids, want = spec.end_holders(N, C, shift)
    assert sorted(zip(r.tolist(), ids.tolist(), want.tolist())) == sorted(
        ((i + shift) % N, i * K + k, i) for i in range(N) for k in range(K))
    assert spec.busbw(N) == pytest.approx(1 / N)    # nccl-tests' sendrecv: busbw = one part / time



def _alltoall_model(N, K):
    """AllToAll's chunk model written out piece by piece (not from the spec's arithmetic): rows
    ``(id, source, destination, piece, source's input slot, destination's output slot)``, ids
    numbered in the order (source, destination, piece)."""
    rows, cid = [], 0
    for i in range(N):
        for j in range(N):
            for k in range(K):
                rows.append((cid, i, j, k, j * K + k, i * K + k))
                cid += 1
    return rows


@settings(max_examples=20, deadline=None)
@given(N=st.integers(1, 5), K=st.integers(1, 3))
def test_blockwise_spec_facts_agree_with_the_written_out_alltoall_model(N, K):
    """What the lowering, the verifier, the prover and the executors ask the spec (ids, blocks,
    slots, the in-place overlay, buffer sizes, count unit) against the model written out above."""
    spec = SPECS["alltoall"]
    C = N * K                                 # the full buffer's chunks
    rows = _alltoall_model(N, K)
    assert spec.nids(N, C) == len(rows) and spec.full_chunks(N, len(rows)) == C
    assert spec.count_unit(N) == N and spec.split_by_rank and spec.crossed_overlay
    assert spec.buffer_sizes(N, K)[:2] == (C, C)
    slot_in = {}
    for cid, i, j, k, s_in, s_out in rows:
        assert tuple(int(x) for x in spec.block_of(cid, N, C)) == (i, j, k)
        assert int(spec.block_id(i, j, k, N, C)) == cid
        assert int(spec.slot("input", i, cid, N, C)) == s_in
        assert int(spec.slot("output", j, cid, N, C)) == s_out
        assert int(spec.id_at("input", i, s_in, N, C)) == cid
        assert int(spec.id_at("output", j, s_out, N, C)) == cid
        assert bool(spec.holds(spec.start, i, cid, N, C)) and bool(spec.holds(spec.end, j, cid, N, C))
        slot_in[(i, s_in)] = cid
    for cid, i, j, k, s_in, s_out in rows:
        # in place, the destination's output slot of this block is its input slot of the block
        # it sends back to the source
        back = slot_in[(j, s_out)]
        assert back == (j * N + i) * K + k
        assert int(spec.id_at("input", j, spec.slot("output", j, cid, N, C), N, C)) == back
    # the array forms agree with the scalar ones
    ids = np.array([r[0] for r in rows])
    src, dst, piece = spec.block_of(ids, N, C)
    assert src.tolist() == [r[1] for r in rows] and dst.tolist() == [r[2] for r in rows]
    assert piece.tolist() == [r[3] for r in rows]


@pytest.mark.parametrize("name", [n for n in SPECS if not SPECS[n].blockwise and n != "sendrecv"])
@pytest.mark.parametrize("N,K", [(1, 1), (3, 2), (4, 1)])
def test_other_collectives_spec_facts_are_the_trivial_cases(name, N, K):
    """Every other collective: ids are the full buffer's chunks, id ``r*K + k`` is piece ``k`` of
    rank ``r``'s part (source = destination = ``r``), any count runs, its in-place overlay keeps
    every id in one slot, and ``id_at`` undoes ``slot`` wherever a rank holds an id."""
    spec = SPECS[name]
    C = N * K
    assert spec.nids(N, C) == C and spec.full_chunks(N, C) == C and spec.count_unit(N) == 1
    assert spec.split_by_rank == ("own" in (spec.input, spec.output))
    assert not spec.crossed_overlay
    for r in range(N):
        for k in range(K):
            cid = r * K + k
            assert tuple(int(x) for x in spec.block_of(cid, N, C)) == (r, r, k)
            assert int(spec.block_id(r, r, k, N, C)) == cid
    for buffer, holders in (("input", spec.start_holders(N, C)), ("output", spec.end_holders(N, C))):
        for r, cid in zip(holders[0].tolist(), holders[1].tolist()):
            s = spec.slot(buffer, r, cid, N, C)
            assert int(spec.id_at(buffer, r, s, N, C)) == cid, (buffer, r, cid)
            if spec.alias != "same" or buffer == "output":
                continue
            # in place the two layouts are one: the output slot of an id the rank keeps is its
            # input slot of the same id
            if spec.holds(spec.end, r, cid, N, C):
                assert int(spec.slot("output", r, cid, N, C)) == int(s)


# ------------------------------------------------------------------------- end to end, every one
@settings(max_examples=4, deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("name", list(SPECS))
def test_every_collective_end_to_end(name, data):
    """A random valid program of the collective verifies, compiles, is proven in both placements,
    and the reference executor's outputs equal the collective's definition in both placements."""
    alg = data.draw(valid_programs(name, max_ranks=5))
    verify(alg)
    ir = build_program(alg, chunk_bytes=64)
    count = data.draw(st.integers(0, 40)) + ir.nranks
    count = reference.alltoall_count(count, reference.alltoall_unit(ir))   # AllToAll, SendRecv: N parts
    for inplace in (False, True):
        prove(ir, inplace)
        inputs = reference.inputs_for(ir, count, "int32", seed=count)
        got = reference.execute(ir, inputs, op="max", inplace=inplace)
        want = reference.expected_for(ir, inputs, "max")
        for r, (g, w) in enumerate(zip(got, want)):
            if w is not None:
                np.testing.assert_array_equal(g[:len(w)] if inplace else g, w, err_msg=f"rank {r}")


@pytest.mark.parametrize("name", list(SPECS))
def test_msccl_export_accepts_or_refuses_with_the_specs_reason(name):
    """A program of the collective's first generator family on 4 ranks (HM: 2 x 2)."""
    from hccc.compiler.interop.msccl_export import export_xml

    spec = SPECS[name]
    alg = _first_family_program(name, 4)
    ir = build_program(alg, chunk_bytes=64)
    if spec.msccl:
        assert f'coll="{spec.msccl}"' in export_xml(ir)
    else:
        with pytest.raises(CompileError, match="cannot export collective") as exc:
            export_xml(ir)
        assert spec.msccl_refusal in str(exc.value)


def _first_family_program(name: str, n: int):
    """A program of the collective's first generator family on ``n`` ranks (HM: 2 x n/2)."""
    spec = SPECS[name]
    fam = testing._FAMILIES[Collective(name)][0]
    gen = testing._generator(fam, Collective(name))
    root = [1] if spec.rooted else []
    if fam == "tree":
        return gen(n, [(i, i - 1) for i in range(1, n)], *root)
    if fam == "hm":
        return gen(2, n // 2)
    return gen(n, *root)


@pytest.mark.parametrize("name", list(SPECS))
def test_every_collective_simulates(name):
    """The alpha-beta simulator runs every collective on an 8-GPU cluster and reports nccl-tests'
    bus bandwidth with the spec's factor."""
    from pathlib import Path

    from hccc.compiler.pipeline import load_cluster
    from hccc.runtime import simulator as sim

    topo = load_cluster(Path(__file__).resolve().parent.parent / "examples" / "clusters" / "a100_topo1.topo")
    ir = build_program(_first_family_program(name, 8), chunk_bytes=1 << 16)
    res = sim.simulate(ir, topo, 1 << 20)
    assert res.time_us > 0 and res.algbw_GBps > 0
    assert res.busbw_GBps == pytest.approx(res.algbw_GBps * SPECS[name].busbw(8))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_segment_chunks_is_the_block_or_the_smaller_buffer(name):
    """The unit instances rename chunks by: an AllToAll's block (its input's chunks over the
    ranks), else the smaller of a program's input and output, as written out here per layout."""
    spec = SPECS[name]
    for n, k in ((2, 1), (4, 3), (8, 2)):
        ins, outs, _ = spec.buffer_sizes(n, k)
        want = ins // n if spec.blockwise else min(ins, outs)       # as the MSCCL export asked before
        assert spec.segment_chunks(n, ins, outs) == want
    assert spec.per_pair_counts == (name == "alltoall")


def test_only_the_specs_and_alltoallv_ask_for_the_raw_chunk_model_flag():
    """Code outside the collective specs asks them for a fact (``count_unit``, ``split_by_rank``,
    ``per_pair_counts``, ``segment_chunks``, ...), not for AllToAll's ``blockwise`` flag; left:
    the parser's size limits and the C2C breakdown table's own consistency check."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    allowed = {"compiler/frontend/collectives.py", "compiler/ir/vblocks.py", "compiler/frontend/rccl_parser.py",
               "compiler/cluster/c2c.py"}
    found = []
    for d in ("compiler", "runtime", "driver", "util"):
        for f in (root / d).rglob("*.py"):
            rel = f.relative_to(root).as_posix()
            if rel not in allowed and re.search(r"\.blockwise\b", f.read_text()):
                found.append(rel)
    assert found == []
