"""Unit tests of hccc.compiler.passes.verify: every error class, its message and its location."""
from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.frontend import generators as gen
from conftest import examples
from hccc.compiler.frontend.algorithm import MAX_CHANNEL, RECV, RRC, Algorithm, Collective, Header, TransferSite
from hccc.util.diagnostics import CompileError, Location, SourceFile, render, render_all
from hccc.compiler.passes.verify import VerifyError, VerifyReport, verify

SRC = SourceFile("algo.rccl", "\n".join(f"    transfer line {i}" for i in range(1, 60)))


def located(coll: str, nranks: int, rows, loop_vars=("n", "r"), loop_values=None) -> Algorithm:
    """Algorithm whose transfer i sits at algo.rccl line 10+i, col 13, with loop values (0, i)."""
    header = Header(nranks, Collective.parse(coll), "t", location=Location(SRC, 1, 1))
    rows = list(rows)
    n = len(rows)
    arr = np.asarray(rows, dtype=np.int64).reshape(-1, 5)
    sites = [TransferSite(Location(SRC, 10 + i, 13), tuple(loop_vars)) for i in range(n)]
    vals = loop_values or [[0, i] for i in range(n)]
    return Algorithm(header, arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy(), arr[:, 3].copy(),
                     arr[:, 4].astype(np.uint8), np.arange(n, dtype=np.int64), sites,
                     [np.asarray([v], dtype=np.int64).reshape(1, len(loop_vars)) for v in vals])


def errors_of(alg: Algorithm, **kw) -> VerifyError:
    with pytest.raises(VerifyError) as ei:
        verify(alg, **kw)
    assert isinstance(ei.value, CompileError)
    return ei.value


def ring_ag_rows(n):
    return [(r, (r + 1) % n, k, (r - k) % n, RECV) for k in range(n - 1) for r in range(n)]


# ---------------------------------------------------------------- success
def test_report_fields():
    rep = verify(gen.ring_allreduce(6))
    assert rep == VerifyReport(Collective.ALLREDUCE, 6, 60, 10)


def test_single_rank_empty_program_is_valid():
    for coll in Collective:
        assert verify(Algorithm.from_rows(Header(1, coll), [])).transfers == 0


def test_step_values_need_not_be_dense():
    rows = [(s, d, 10 * t + 3, c, o) for s, d, t, c, o in ring_ag_rows(4)]
    assert verify(Algorithm.from_rows(Header(4, Collective.ALLGATHER), rows)).steps == 3


def test_more_than_64_ranks_bitsets():
    alg = gen.ring_allreduce(70)
    assert verify(alg).nranks == 70
    bad = alg.subset(np.arange(len(alg)) != 5)
    err = errors_of(bad)
    assert err.kinds[0] == "postcondition"


# ---------------------------------------------------------------- the message format of the brief
def test_written_twice_exact_rendering():
    # rank 0 and rank 1 both write rank 2 chunk 0 at step 0; the second writer carries the error
    alg = located("allreduce", 4, [(0, 2, 0, 0, RRC), (1, 2, 0, 0, RRC)],
                  loop_values=[[0, 1], [0, 2]])
    err = errors_of(alg)
    assert err.kinds == ["write-write-race"]
    d = err.diagnostics[0]
    assert render(d).splitlines()[0] == "algo.rccl:11:13: error: rank 2 chunk 0 is written twice at step 0 (n=0, r=2)"
    assert d.notes == ("the other write is at algo.rccl:10:13 (n=0, r=1)",)
    assert render(d).splitlines()[2].index("^") == 4 + 12


# ---------------------------------------------------------------- static errors
@pytest.mark.parametrize("row,kind,msg", [
    ((4, 1, 0, 0, RECV), "src-out-of-range", "source rank 4 is out of range (nRanks=4: ranks 0..3)"),
    ((-1, 1, 0, 0, RECV), "src-out-of-range", "source rank -1 is out of range"),
    ((0, 7, 0, 0, RECV), "dst-out-of-range", "destination rank 7 is out of range"),
    ((0, 1, 0, 4, RECV), "chunk-out-of-range", "chunk 4 is out of range (each rank holds chunks 0..3)"),
    ((0, 1, 0, -2, RECV), "chunk-out-of-range", "chunk -2 is out of range"),
    ((0, 1, -1, 0, RECV), "negative-step", "step -1 is negative"),
    ((0, 1, 0, 0, 5), "bad-op", "unknown transfer operation 5"),
    ((2, 2, 3, 1, RECV), "self-transfer", "rank 2 sends chunk 1 to itself at step 3"),
])
def test_static_errors(row, kind, msg):
    rows = ring_ag_rows(4) + [row]
    alg = located("allgather", 4, rows)
    err = errors_of(alg)
    assert err.kinds[0] == kind
    d = err.diagnostics[0]
    assert d.message.startswith(msg)
    assert d.message.endswith(f"(n=0, r={len(rows) - 1})")
    assert (d.location.line, d.location.col) == (10 + len(rows) - 1, 13)


@pytest.mark.parametrize("channel", [-1, 1024])
def test_channel_out_of_range(channel):
    import dataclasses

    rows = ring_ag_rows(4)
    alg = located("allgather", 4, rows)
    ch = np.zeros(len(rows), np.int64)
    ch[2] = channel
    err = errors_of(dataclasses.replace(alg, channel=ch))
    assert err.kinds[0] == "channel-out-of-range"
    d = err.diagnostics[0]
    assert d.message.startswith(f"channel {channel} is out of range (channels 0..1023)")
    assert (d.location.line, d.location.col) == (12, 13)


def test_static_error_precedence_one_per_transfer():
    alg = located("allgather", 4, [(9, 9, -1, 9, 7)])
    err = errors_of(alg)
    assert err.kinds == ["src-out-of-range"]


# ---------------------------------------------------------------- dynamic errors
def test_read_write_race():
    # step 0: 0 -> 1 writes rank 1 chunk 0; 1 -> 2 reads rank 1 chunk 0 in the same step
    alg = located("allgather", 3, [(0, 1, 0, 0, RECV), (1, 2, 0, 0, RECV)])
    err = errors_of(alg)
    assert err.kinds[0] == "read-write-race"
    d = err.diagnostics[0]
    assert d.message == "rank 1 chunk 0 is written and read at step 0 (n=0, r=0)"
    assert d.location.line == 10
    assert d.notes == ("it is read at algo.rccl:11:13 (n=0, r=1)",)


def test_undefined_source():
    alg = located("allgather", 3, [(1, 2, 0, 0, RECV)])
    err = errors_of(alg)
    assert err.kinds == ["undefined-source"]
    assert err.diagnostics[0].message == "rank 1 does not hold chunk 0 at step 0 (it sends it to rank 2) (n=0, r=0)"


def test_undefined_target():
    alg = located("allgather", 3, [(0, 1, 0, 0, RRC)])
    err = errors_of(alg)
    assert err.kinds == ["undefined-target"]
    assert "rrc into rank 1 chunk 0 at step 0, which holds no data yet (reduction into undefined data)" \
        in err.diagnostics[0].message


def test_reduction_in_allgather():
    alg = located("allgather", 3, [(1, 0, 0, 1, RECV), (1, 0, 1, 1, RRC)])
    err = errors_of(alg)
    assert err.kinds[0] == "allgather-reduction"
    assert err.diagnostics[0].message.startswith("reduction (rrc) of chunk 1 from rank 1 into rank 0 at step 1 "
                                                 "in an Allgather")
    assert err.diagnostics[0].location.line == 11


def test_double_count():
    alg = located("reducescatter", 3, [(0, 1, 0, 1, RRC), (1, 2, 1, 1, RRC), (2, 1, 2, 1, RRC)])
    err = errors_of(alg)
    assert err.kinds == ["double-count"]
    assert err.diagnostics[0].message == ("rrc of chunk 1 from rank 2 into rank 1 at step 2 counts the "
                                          "contribution of ranks 0, 1 twice (n=0, r=2)")


def test_postcondition_allgather_and_summary():
    rows = ring_ag_rows(4)[:-1]  # rank 0 never receives chunk 1
    err = errors_of(located("allgather", 4, rows))
    assert err.kinds == ["postcondition"]
    d = err.diagnostics[0]
    assert d.message == "rank 0 does not hold chunk 1 at the end"
    assert (d.location.line, d.location.col) == (1, 1)


def test_postcondition_reduce_message_and_summary():
    # ring AllReduce over 8 ranks cut after AllGather step 2 (global step 9): rank j holds chunks
    # j, j-1, j-2, j-3 complete and misses 4 others
    alg = gen.ring_allreduce(8)
    alg = Algorithm.from_rows(Header(8, Collective.ALLREDUCE, location=Location(SRC, 1, 1)),
                              [r for r in alg.rows() if r[2] < 10])
    err = errors_of(alg)
    assert err.kinds == ["postcondition"] * 5 + ["postcondition-summary"]
    assert err.diagnostics[0].message == "rank 0 does not hold chunk 1 at the end (has contributions from 7 of 8 ranks)"
    assert err.diagnostics[0].notes == ("postcondition of Allreduce",)
    assert err.total == 32 and err.more == 0
    assert err.diagnostics[5].message == "27 more (rank, chunk) pairs do not meet the Allreduce postcondition (32 of 64 in total)"
    assert all(d.location == Location(SRC, 1, 1) for d in err.diagnostics)


def test_postcondition_counts_contributions():
    # ring ReduceScatter without its last step: chunk r never reaches rank r (only its own part)
    alg = gen.ring_reducescatter(8)
    alg = alg.subset(alg.step < 6)
    err = errors_of(alg)
    assert err.diagnostics[0].message == "rank 0 does not hold chunk 0 at the end (has contributions from 1 of 8 ranks)"
    assert err.total == 8


def test_empty_program_unmet_unless_single_rank():
    err = errors_of(Algorithm.from_rows(Header(2, Collective.ALLREDUCE), []))
    assert err.kinds[0] == "postcondition"
    assert "the program has no transfers" in err.diagnostics[0].notes


def test_postcondition_not_reported_after_other_errors():
    rows = ring_ag_rows(4)[:-1] + [(0, 0, 0, 0, RECV)]
    err = errors_of(located("allgather", 4, rows))
    assert err.kinds == ["self-transfer"]


def test_max_errors_and_more():
    rows = [(0, 0, 0, 0, RECV)] * 30
    err = errors_of(located("allgather", 2, rows), max_errors=7)
    assert len(err.diagnostics) == 7 and err.more == 23 and err.total == 30
    assert "23 more errors not shown" in render_all(err)


def test_error_order_static_then_by_step_then_kind():
    rows = [(1, 2, 5, 1, RECV),            # fine: rank 1 owns chunk 1
            (2, 0, 3, 1, RECV),            # undefined source at step 3 (rank 2 gets chunk 1 at step 5)
            (0, 1, 3, 0, RECV), (2, 1, 3, 0, RECV),  # rank 1 chunk 0 written twice at step 3
            (0, 9, 1, 0, RECV)]            # static
    err = errors_of(located("allgather", 3, rows))
    assert err.kinds == ["dst-out-of-range", "write-write-race", "undefined-source"]
    assert [d.location.line for d in err.diagnostics] == [14, 13, 11]


def test_racing_transfers_do_not_change_state():
    # the race on rank 1 chunk 0 leaves it empty, so forwarding it later reads undefined data
    rows = [(0, 1, 0, 0, RECV), (2, 1, 0, 0, RECV), (1, 2, 1, 0, RECV)]
    err = errors_of(located("allreduce", 3, rows))
    assert err.kinds == ["write-write-race"]  # allreduce: rank 1 still holds its own part
    err = errors_of(located("allgather", 3, rows))
    assert err.kinds == ["write-write-race", "undefined-source"]


def test_bad_header():
    with pytest.raises(CompileError):
        verify(Algorithm.from_rows(Header(0, Collective.ALLGATHER), []))


def test_a_header_whose_nranks_the_transfers_do_not_fill_is_refused_for_its_size_not_replayed():
    """An 8-rank AllGather under a header of nRanks=2500: its replay would keep 1.9 GiB of state
    (6.25 million rows of 2,500 bits), and nRanks=8192 would name 67 million holdings; both are
    refused at the header, saying which ranks the transfers use, before that state is made."""
    from hccc.compiler.passes.verify import DEFAULT_PROOF_BYTES, HOLDINGS_PER_GIB
    rows = ring_ag_rows(8)
    for n, said in ((2500, "the replay that checks this program step by step would keep 1.9 GiB of state "
                           "(6,250,000 (rank, chunk) rows of 2500 ranks' bits), more than the 1.0 GiB it may"),
                    (8192, "pre- and postcondition name 67,117,056 (rank, chunk) holdings")):
        err = errors_of(located("allgather", n, rows))
        assert err.kinds == ["too-large"]
        d = err.diagnostics[0]
        assert d.message.startswith(f"nRanks={n}: ") and said in d.message, d.message
        assert (d.location.line, d.location.col) == (1, 1)
        assert d.notes == (f"the transfers use ranks 0..7 of the header's {n}",)
        assert d.message.endswith("(HCCC_MAX_PROOF_BYTES raises it)")
    # the default budget is what a whole program at those sizes needs: 4096 ranks' holdings are
    # proven, and a 1,024-rank replay fits
    assert 4096 * 4096 + 4096 <= HOLDINGS_PER_GIB * DEFAULT_PROOF_BYTES // (1 << 30) < 8192 * 8192
    assert 1024 * 1024 * 16 * 8 <= DEFAULT_PROOF_BYTES < 4096 * 4096 * 64 * 8


def test_hccc_max_proof_bytes_sets_the_proofs_budget(monkeypatch):
    """HCCC_MAX_PROOF_BYTES moves the replay's limit both ways, and a value that is not a size is
    an error naming the variable."""
    alg = located("allgather", 600, ring_ag_rows(8))        # 360,000 rows of 10 words: 27.5 MiB
    assert errors_of(alg).kinds[0] == "postcondition"       # the default budget: replayed
    monkeypatch.setenv("HCCC_MAX_PROOF_BYTES", "16M")
    err = errors_of(alg)
    assert err.kinds == ["too-large"] and "more than the 16.0 MiB it may" in err.diagnostics[0].message
    monkeypatch.setenv("HCCC_MAX_PROOF_BYTES", "lots")
    with pytest.raises(CompileError, match="HCCC_MAX_PROOF_BYTES must be a positive size such as 8G, not 'LOTS'"):
        verify(alg)


def test_the_postcondition_compared_in_blocks_finds_what_one_comparison_finds(monkeypatch):
    """The postcondition compares its rows a block at a time; with blocks of one row it lists and
    counts the same unmet pairs as with the default."""
    import hccc.compiler.passes.verify as v
    cases = [located("allgather", 4, ring_ag_rows(4)[:-3]), located("allgather", 70, ring_ag_rows(70)[:-100])]
    alg = gen.ring_allreduce(8)
    cases.append(Algorithm.from_rows(Header(8, Collective.ALLREDUCE, location=Location(SRC, 1, 1)),
                                     [r for r in alg.rows() if r[2] < 10]))
    for case in cases:
        whole = errors_of(case)
        monkeypatch.setattr(v, "POSTCONDITION_BLOCK_BYTES", 1)
        blocks = errors_of(case)
        monkeypatch.undo()
        assert [d.message for d in blocks.diagnostics] == [d.message for d in whole.diagnostics]
        assert (blocks.total, blocks.kinds) == (whole.total, whole.kinds)
        assert whole.kinds[0] == "postcondition"


# ---------------------------------------------------------------- performance (printed, not asserted)
@pytest.mark.slow
def test_verify_1024_gpu_hm_allreduce_time(capsys):
    alg = gen.hm_allreduce(128, 8)
    assert len(alg) == 2_095_104
    t0 = time.perf_counter()
    rep = verify(alg)
    dt = time.perf_counter() - t0
    assert rep.transfers == 2_095_104 and rep.steps == 128 * 7 + 2 * 127 + 128
    with capsys.disabled():
        print(f"\n[perf] verify HM AllReduce 128x8 (2,095,104 transfers): {dt:.2f} s")


@settings(max_examples=examples(30), deadline=None)
@given(n=st.integers(2, 12), data=st.data())
def test_errors_of_one_kind_at_one_place_are_one_diagnostic_counting_the_rest(n, data):
    """Thousands of transfers failing alike at one place (one loop line, or a program without
    locations such as synthesis makes) are one diagnostic per kind, its note counting the others."""
    rows = [list(r) + [0] for r in ring_ag_rows(n)]
    bad_ch = data.draw(st.sets(st.integers(0, len(rows) - 1), min_size=1))
    for i in bad_ch:
        rows[i][5] = MAX_CHANNEL + 1 + i
    selfs = data.draw(st.sets(st.integers(0, len(rows) - 1).filter(lambda i: i not in bad_ch)))
    for i in selfs:
        rows[i][1] = rows[i][0]                 # a self transfer (a kind listed before channels)
    located_at = data.draw(st.sampled_from([None, Location(SRC, 3, 5)]))
    alg = Algorithm.from_rows(Header(n, Collective.ALLGATHER, location=located_at), rows)
    err = errors_of(alg)
    want = [("channel-out-of-range", len(bad_ch))] + ([("self-transfer", len(selfs))] if selfs else [])
    want.sort(key=lambda kc: min(selfs if kc[0] == "self-transfer" else bad_ch))   # by transfer index
    # the static errors first; the transfers they leave out of the replay leave later ones
    # unfed (undefined sources): every kind, at the one place, is one diagnostic
    assert err.kinds[:len(want)] == [k for k, _ in want]
    assert len(set(err.kinds)) == len(err.kinds)
    assert err.total >= len(selfs) + len(bad_ch) and err.more == 0
    counted = sum(1 + int(str(d.notes[-1]).split()[0]) if d.notes and "same error" in str(d.notes[-1]) else 1
                  for d in err.diagnostics)
    assert counted == err.total
    for diag, (kind, count) in zip(err.diagnostics, want):
        assert diag.location == located_at
        first = min(selfs if kind == "self-transfer" else bad_ch)
        if kind == "channel-out-of-range":
            assert f"channel {MAX_CHANNEL + 1 + first} is out of range" in diag.message
        if count == 1:
            assert not any("same error" in str(note) for note in diag.notes)
        else:
            assert f"{count - 1} other transfer" in str(diag.notes[-1])
