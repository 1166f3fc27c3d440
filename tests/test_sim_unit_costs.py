"""The simulator's units and hops (the kernels' cost model, compiler/passes/kernel_cost.py) against
closed forms worked out by hand.

A unit (one primitive, one micro-batch) pays its op's fixed cost once its waits are met and
before its flows; a dependency on another block of the rank is met a hop (half a flag round
trip) after the micro-batch it waits for finished; a message takes its link's latency, as
without units. tests/test_simulator.py holds the alpha-beta model's own closed forms (no unit
costs) and tests/test_simulator_oracle.py the engine against a reference simulator with random
unit costs.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hccc.compiler.ir.program_ir import Op
from hccc.compiler.passes import kernel_cost as kc
from hccc.runtime.sim_model import unit_costs
from hccc.runtime.simulator import prepare, simulate
from sim_programs import MiB, cluster, hand_ir, single_transfer_ir

US = 1e-6


def flat(send_us: float, recv_us: float, copy_us: float = 0.2, hop_us: float = 0.0) -> kc.KernelCosts:
    """Costs whose every row holds one figure at any warps (RECV_REDUCE_COPY: the RECV figure)."""
    rows = {"COPY": (copy_us,) * 3, "SEND": (send_us,) * 3, "RECV": (recv_us,) * 3,
            "RECV_REDUCE_COPY": (recv_us,) * 3}
    return dataclasses.replace(kc.DESIGN_TARGETS, unit_us=rows, flag_round_trip_us=2 * hop_us)


@pytest.mark.parametrize("nbytes", [4096, MiB])
@pytest.mark.parametrize("alpha_us", [0.0, 1.7])
def test_one_transfer_pays_a_send_unit_and_a_recv_unit(nbytes, alpha_us):
    """Sender: its unit's 3 us, then S / 50 GB/s; the message is visible alpha later; the
    receiver then pays its 4 us. Busy: each block its unit, the receiver also while its slot is
    written."""
    topo = cluster(2, {(0, 1): (25, 2, alpha_us)})
    r = simulate(single_transfer_ir(), topo, nbytes, block_gbps=None, costs=flat(3.0, 4.0))
    move = nbytes / 50e9
    assert r.time_s == pytest.approx(3 * US + move + alpha_us * US + 4 * US, rel=1e-12)
    sender, receiver = np.argsort(r.tb_rank)
    assert r.tb_finish[sender] == pytest.approx(3 * US + move, rel=1e-12)
    assert r.tb_busy[sender] == pytest.approx(3 * US + move, rel=1e-12)
    assert r.tb_busy[receiver] == pytest.approx(move + alpha_us * US + 4 * US, rel=1e-12)


def test_a_stream_of_micro_batches_pays_the_senders_unit_each_and_the_receivers_last():
    """16 micro-batches of 64 KiB on a 25 GB/s link (2.62 us each) with 3 us a SEND unit and 2 us
    a RECV unit: the receiver keeps up (2 < 3 + 2.62), so the call takes 16 x (3 + 2.62) us, the
    link's latency and one RECV unit."""
    s, bw = 64 << 10, 25e9
    topo = cluster(2, {(0, 1): (25, 1, 1.0)})
    r = simulate(single_transfer_ir(chunk_bytes=s), topo, 16 * s, block_gbps=None, costs=flat(3.0, 2.0))
    assert r.micro_batches == 16
    assert r.time_s == pytest.approx(16 * (3 * US + s / bw) + 1.0 * US + 2 * US, rel=1e-12)


def test_a_dependency_on_another_block_is_met_a_hop_later():
    """Rank 0 sends to rank 1, whose other block sends back once the receive is done (a
    dependency): two one-way trips of a SEND unit, the bytes, the latency and a RECV unit, and one
    hop between them."""
    ir = hand_ir(2, 1, [(0, [(Op.SEND, 1, -1, 0)]), (0, [(Op.RECV, -1, 1, 0)]),
                        (1, [(Op.RECV, -1, 0, 0)]), (1, [(Op.SEND, 0, -1, 0)])],
                 deps=[((1, 1, 0), (1, 0, 0))], check=False)
    topo = cluster(2, {(0, 1): (25, 1, 0.5), (1, 0): (25, 1, 0.5)})
    nbytes = 64 << 10
    trip = 3 * US + nbytes / 25e9 + 0.5 * US + 2 * US
    for hop_us in (0.0, 0.7, 1.5):
        r = simulate(ir, topo, nbytes, block_gbps=None, costs=flat(3.0, 2.0, hop_us=hop_us))
        assert r.time_s == pytest.approx(2 * trip + hop_us * US, rel=1e-12), hop_us


def test_the_per_block_limit_applies_to_the_bytes_beyond_the_unit():
    """A 10 GB/s block on a 50 GB/s link: the sender's bytes at 10 GB/s after its unit."""
    topo = cluster(2, {(0, 1): (25, 2, 0.0)})
    r = simulate(single_transfer_ir(), topo, MiB, block_gbps=10.0, costs=flat(3.0, 4.0))
    assert r.time_s == pytest.approx(3 * US + MiB / 10e9 + 4 * US, rel=1e-12)


def test_the_bound_counts_a_blocks_units_and_its_bytes_at_its_rate():
    """Sixteen micro-batches of 1 KiB: the link bound (16 KiB / 50 GB/s) is far below a block's
    units, so the bound is the busier block's: the receiver's 16 x 4 us, or the sender's 16 x 3 us
    plus its bytes at the block's 1 GB/s, whichever is more."""
    topo = cluster(2, {(0, 1): (25, 2, 0.0)})
    ir = single_transfer_ir(chunk_bytes=1024)
    r = simulate(ir, topo, 16 * 1024, block_gbps=None, costs=flat(3.0, 4.0))
    assert r.lower_bound_s == pytest.approx(16 * 4 * US, rel=1e-12)
    r = simulate(ir, topo, 16 * 1024, block_gbps=1.0, costs=flat(3.0, 4.0))
    assert r.lower_bound_s == pytest.approx(16 * 3 * US + 16 * 1024 / 1e9, rel=1e-12)
    assert r.time_s >= r.lower_bound_s
    none = simulate(ir, topo, 16 * 1024, block_gbps=None, costs=None)
    assert none.lower_bound_s == pytest.approx(16 * 1024 / 50e9, rel=1e-12)


def test_the_default_costs_are_the_measured_calibration():
    """Without ``costs`` the simulator charges kernel_cost.SIM_COSTS, the fifth GPU run's units at
    the program's warps (16: SEND 2.47, RECV 2.56 us) and half its 1.13 us flag round trip a hop."""
    ir = single_transfer_ir()
    ir.nwarps = 16
    prog = prepare(ir, cluster(2))
    assert sorted(prog.p_unit.tolist()) == pytest.approx([2.47e-6, 2.56e-6], rel=1e-12)
    assert prog.hop == pytest.approx(0.565e-6, rel=1e-12)
    ir.nwarps = 4                                            # the 4-warp column: 2.46 and 2.55
    assert sorted(prepare(ir, cluster(2)).p_unit.tolist()) == pytest.approx([2.46e-6, 2.55e-6], rel=1e-12)
    assert prepare(ir, cluster(2), costs=None).p_unit.tolist() == [0.0, 0.0]


def test_a_hop_longer_than_a_unit_depended_on_is_refused():
    """The event loop keeps one micro-batch's progress on its way a primitive: a hop longer than
    the unit it follows is refused with the figures, not simulated wrongly."""
    ir = hand_ir(2, 1, [(0, [(Op.SEND, 1, -1, 0)]), (0, [(Op.RECV, -1, 1, 0)]),
                        (1, [(Op.RECV, -1, 0, 0)]), (1, [(Op.SEND, 0, -1, 0)])],
                 deps=[((1, 1, 0), (1, 0, 0))], check=False)
    with pytest.raises(ValueError, match="hop .* longer than the fixed cost"):
        unit_costs(ir, flat(3.0, 1.0, hop_us=1.5))
    p_unit, hop = unit_costs(ir, flat(3.0, 1.0, hop_us=1.0))
    assert hop == pytest.approx(1e-6) and sorted(p_unit.tolist()) == pytest.approx([1e-6, 1e-6, 3e-6, 3e-6])
