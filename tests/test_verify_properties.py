"""Property tests through hccc.testing: valid programs verify, mutants are rejected."""
from __future__ import annotations

import collections

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import examples
from hccc.compiler.frontend import generators as gen
from hccc.compiler.frontend.algorithm import RECV, RRC, Algorithm, Collective, Header
from hccc.compiler.passes.verify import VerifyError, verify
from hccc.testing import (DTYPES, OPS, assert_implements, dtypes, live_transfers, mutations, ops, relabel_ranks,
                          renumber_steps, sizes, valid_programs)

SLOW_OK = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(max_examples=150, **SLOW_OK)
@given(valid_programs(max_ranks=8))
def test_valid_programs_verify(alg):
    rep = verify(alg)
    assert rep.transfers == len(alg) and rep.nranks == alg.header.nranks


@pytest.mark.parametrize("coll", ["allgather", "reducescatter", "Allreduce"])
@settings(max_examples=30, **SLOW_OK)
@given(data=st.data())
def test_valid_programs_of_one_collective(coll, data):
    alg = data.draw(valid_programs(coll, max_ranks=6))
    assert alg.header.collective is Collective.parse(coll)
    assert_implements(alg)


@settings(max_examples=examples(150), **SLOW_OK)     # the thorough profile: ten times as many
@given(st.data())
def test_mutants_are_rejected(data):
    alg = data.draw(valid_programs(max_ranks=8, min_ranks=2))
    desc, mutant = data.draw(mutations(alg))
    with pytest.raises(VerifyError):
        verify(mutant)
    with pytest.raises(AssertionError):
        assert_implements(mutant)


def test_every_mutation_kind_is_available():
    seen = collections.defaultdict(set)
    for alg in (gen.ring_allreduce(5), gen.ring_allgather(5), gen.hm_allreduce(2, 3), gen.tree_reducescatter(
            5, [(0, 1), (1, 2), (1, 3), (3, 4)])):
        @settings(max_examples=80, database=None, **SLOW_OK)
        @given(mutations(alg))
        def run(m):
            seen[alg.header.collective].add(m[0].split()[0])
            with pytest.raises(VerifyError):
                verify(m[1])
        run()
    assert seen[Collective.ALLREDUCE] >= {"drop", "duplicate", "repeat", "swap"}
    assert seen[Collective.ALLGATHER] >= {"drop", "duplicate", "swap"}


@given(data=st.data())
@settings(max_examples=1, database=None)
def test_mutations_need_a_nonempty_program(data):
    with pytest.raises(ValueError):
        data.draw(mutations(Algorithm.from_rows(Header(1, Collective.ALLGATHER), [])))


def test_live_transfers_ring():
    # ring ReduceScatter: every transfer feeds rank r's chunk r
    assert live_transfers(gen.ring_reducescatter(4)).all()


def test_live_transfers_dead_write():
    # Allreduce over 2 ranks: 0 -> 1 rrc chunk 0 at step 0 is dead when step 1 overwrites it by recv
    rows = [(0, 1, 0, 0, RRC), (0, 1, 1, 0, RECV), (1, 0, 2, 1, RRC), (0, 1, 3, 1, RECV)]
    alg = Algorithm.from_rows(Header(2, Collective.ALLREDUCE), rows)
    assert live_transfers(alg).tolist() == [False, True, True, True]


@settings(max_examples=60, **SLOW_OK)
@given(valid_programs(max_ranks=6), st.randoms(use_true_random=False), st.data())
def test_renumber_and_relabel_keep_validity(alg, rnd, data):
    n = alg.header.nranks
    if alg.header.collective.spec.parameter == "shift":   # SendRecv: a renaming keeps it only as a rotation
        a = data.draw(st.integers(0, n - 1))
        perm = [(r + a) % n for r in range(n)]
    else:
        perm = data.draw(st.permutations(list(range(n))))
    verify(renumber_steps(relabel_ranks(alg, perm), rnd))


def test_assert_implements_message():
    bad = gen.ring_allgather(4).subset(gen.ring_allgather(4).step < 2)
    with pytest.raises(AssertionError, match="does not implement Allgather") as ei:
        assert_implements(bad)
    assert "does not hold chunk" in str(ei.value)
    assert_implements(gen.ring_allgather(4))


@settings(max_examples=50, deadline=None)
@given(sizes(), dtypes(), ops())
def test_simple_strategies(size, dtype, op):
    assert 1 <= size <= 1 << 16
    assert dtype in DTYPES and op in OPS
