"""Fusion on channels of its own (compiler/passes/lower.py, "Channels of fused traffic").

Properties, on random valid programs of every collective lowered with fusion:

* the emitted kernels on the CPU emulation compute what the reference executor computes, and that
  is the collective (uneven counts, every dtype and operator, in place and out of place);
* a connection end on a channel >= 1 serves one purpose: the fused primitives of one
  (receive-from, send-to) pair of its rank, or plain sends / receives; channel 0 carries no fused
  primitive; no connection end is shared by two TBs (recomputed from the IR alone);
* the program cannot deadlock: an independent rendezvous executor (a send, the fused primitives it
  feeds and the final receive fire together, each when it is first in its TB and its cross-TB
  dependencies have fired) runs every primitive.
"""
from __future__ import annotations

import shutil
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.frontend import generators as gen
from hccc.compiler.ir.program_ir import Op
from hccc.compiler.passes.build import build_program
from hccc.testing import describe_failure, kernel_cases, run_case, valid_programs

COLLECTIVES = ["allgather", "reducescatter", "allreduce", "broadcast", "reduce", "alltoall"]
FUSED_OPS = (Op.RECV_COPY_SEND, Op.RECV_REDUCE_SEND, Op.RECV_REDUCE_COPY_SEND)


def _ends(ir):
    """(rank, peer, direction, channel) -> list of primitive indices using that end."""
    p = ir.prims
    ends = defaultdict(list)
    for i in range(ir.nprims):
        r, ch = int(p["rank"][i]), int(p["channel"][i])
        if p["send_peer"][i] >= 0:
            ends[(r, int(p["send_peer"][i]), "s", ch)].append(i)
        if p["recv_peer"][i] >= 0:
            ends[(r, int(p["recv_peer"][i]), "r", ch)].append(i)
    return ends


def assert_channel_purposes(ir):
    p = ir.prims
    fused = np.isin(p["op"], [int(o) for o in FUSED_OPS])
    assert not (fused & (p["channel"] == 0)).any(), "a fused primitive on channel 0"
    for end, prims in _ends(ir).items():
        tbs = {int(p["tb"][i]) for i in prims}
        assert len(tbs) == 1, f"connection end {end} on TBs {sorted(tbs)}"
        if end[3] == 0:
            continue
        purposes = {(int(p["recv_peer"][i]), int(p["send_peer"][i])) if fused[i] else "plain" for i in prims}
        assert len(purposes) == 1, f"connection end {end} serves {purposes}"


def assert_runs_to_completion(ir):
    """Rendezvous executor, independent of ir/check.py: messages are matched k-th send to k-th
    receive per (sender, receiver, channel); a component (primitives linked by messages) fires
    when each member is first in its TB and all their dependencies have fired."""
    p = ir.prims
    n = ir.nprims
    sends, recvs = defaultdict(list), defaultdict(list)
    order = np.lexsort((p["seq"], p["tb"], p["rank"]))
    for i in order.tolist():
        r, ch = int(p["rank"][i]), int(p["channel"][i])
        if p["send_peer"][i] >= 0:
            sends[(r, int(p["send_peer"][i]), ch)].append(i)
        if p["recv_peer"][i] >= 0:
            recvs[(int(p["recv_peer"][i]), r, ch)].append(i)
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    assert set(sends) == set(recvs)
    for k, s in sends.items():
        assert len(s) == len(recvs[k]), f"connection {k}: {len(s)} sends, {len(recvs[k])} receives"
        for a, b in zip(s, recvs[k]):
            parent[find(a)] = find(b)
    comp = defaultdict(list)
    for i in range(n):
        comp[find(i)].append(i)
    deps = defaultdict(list)
    for a, b in zip(ir.dep_prim.tolist(), ir.dep_on.tolist()):
        deps[a].append(b)
    queues = defaultdict(list)
    for i in order.tolist():
        queues[(int(p["rank"][i]), int(p["tb"][i]))].append(i)
    head = {q: 0 for q in queues}
    tb_of = {i: (int(p["rank"][i]), int(p["tb"][i])) for i in range(n)}
    done = np.zeros(n, bool)
    progress = True
    while progress:
        progress = False
        for q, lst in queues.items():
            if head[q] >= len(lst):
                continue
            members = comp[find(lst[head[q]])]
            if all(queues[tb_of[m]][head[tb_of[m]]] == m if head[tb_of[m]] < len(queues[tb_of[m]]) else False
                   for m in members) and all(done[d] for m in members for d in deps[m]):
                for m in members:
                    done[m] = True
                    head[tb_of[m]] += 1
                progress = True
    assert done.all(), f"{int((~done).sum())} primitive(s) never run"


@pytest.mark.parametrize("collective", COLLECTIVES)
@settings(max_examples=examples(15))
@given(data=st.data())
def test_fused_programs_structure(collective, data):
    alg = data.draw(valid_programs(collective, max_ranks=7), label="program")
    ir = build_program(alg, fuse=True, scheduler=data.draw(st.sampled_from(["hpds", "rr"])))
    assert_channel_purposes(ir)
    assert_runs_to_completion(ir)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("collective", COLLECTIVES)
# three builds a collective by default (the channel and direct-mode files run random fused programs
# too); the thorough profile ten times that
@settings(max_examples=examples(3))
@given(data=st.data())
def test_fused_programs_kernels_match_oracle(collective, data):
    alg = data.draw(valid_programs(collective, max_ranks=6), label="program")
    chunk = data.draw(st.sampled_from([32, 64, 256]), label="chunk_bytes")
    ir = build_program(alg, chunk_bytes=chunk, fuse=True)
    case = data.draw(kernel_cases(ir, max_microbatches=12), label="case")
    res = run_case(ir, case)
    assert res.ok, f"{alg.header.name} ({alg.header.nranks} ranks): " + describe_failure(case, res)


@pytest.mark.parametrize("n", [3, 5, 8])
def test_ring_forwards_all_fuse_and_keep_channel_zero_free(n):
    """Every forward of a ring fuses: AllGather the ``n - 2`` middle hops of each of the ``n``
    chunks; AllReduce the same in each half (a chain visits a rank once, so the reduced chunk
    leaves its owner with a send of its own). With one TB per allocation unit no TB holding fused
    primitives holds channel 0's traffic."""
    for alg, per_chunk in ((gen.ring_allgather(n), n - 2), (gen.ring_allreduce(n), 2 * (n - 2))):
        ir = build_program(alg, fuse=True, tb_alloc="connection")
        assert ir.allocation.fused == n * per_chunk
        assert_channel_purposes(ir)
        p = ir.prims
        fused_tbs = {(int(p["rank"][i]), int(p["tb"][i])) for i in range(ir.nprims)
                     if p["op"][i] in [int(o) for o in FUSED_OPS]}
        for i in range(ir.nprims):
            if (int(p["rank"][i]), int(p["tb"][i])) in fused_tbs and p["op"][i] != Op.COPY:
                assert p["channel"][i] >= 1


def test_rendezvous_oracle_finds_a_cycle():
    """The oracle can fail: two ranks that each receive before they send deadlock."""
    alg = gen.ring_allgather(3)
    ir = build_program(alg)
    p = ir.prims
    for r in range(3):
        m = np.flatnonzero((p["rank"] == r))
        # one TB per rank, receives first
        p["tb"][m] = 0
        recv_first = sorted(m.tolist(), key=lambda i: (p["send_peer"][i] >= 0, int(p["seq"][i])))
        p["seq"][recv_first] = np.arange(len(m))
    with pytest.raises(AssertionError, match="never run"):
        assert_runs_to_completion(ir)


@pytest.mark.parametrize("program", ["recursive_doubling_allgather_8", "hm_allreduce_2x4"])
def test_faster_fusion_keeps_fused_only_where_it_is_never_slower(program):
    from pathlib import Path

    from hccc.compiler.pipeline import load_algorithm, load_cluster
    from hccc.compiler.pipeline.cost_model import not_slower
    from hccc.runtime.simulator import ALLOCATION_SIZES, build_for_execution, faster_fusion, simulate

    root = Path(__file__).resolve().parent.parent
    topo = load_cluster(root / "examples" / "clusters" / "a100_topo1.topo")
    alg = load_algorithm(root / "examples" / f"{program}.rccl")
    plain = build_for_execution(alg, "task", topology=topo)
    fused = build_for_execution(alg, "task", topology=topo, fuse=True)
    assert fused.allocation.fused > 0
    # a tie is a tie within the simulator's rounding (cost_model.SAME_TIME)
    never_slower = all(not_slower(simulate(fused, topo, s, slice_bytes="auto").time_s,
                                  simulate(plain, topo, s, slice_bytes="auto").time_s) for s in ALLOCATION_SIZES)
    kept = faster_fusion(alg, topo, plain, fused)
    assert (kept is fused) == never_slower and kept.stats["fusion_kept"] == never_slower
    # both outcomes occur on these two programs (recursive doubling: a tie, fused kept; each program
    # runs at its own model slice, so ring broadcast's fused program, whose chain is shorter and
    # whose slices are larger, no longer ties at 64 MiB in the link model)
    assert never_slower == (program == "recursive_doubling_allgather_8")


def test_compile_fuse_option(tmp_path):
    import json
    from pathlib import Path

    from hccc.cli import main

    root = Path(__file__).resolve().parent.parent
    # without nChannels in its header, so that the channels are hccc's choice (a written
    # nChannels=1 is honoured: one block per thread block, where fusing gains nothing here)
    text = (root / "examples" / "ring_broadcast_8.rccl").read_text()
    assert "nChannels=1, " in text
    algo = str(tmp_path / "ring_broadcast_8.rccl")
    Path(algo).write_text(text.replace("nChannels=1, ", ""))
    topo = str(root / "examples" / "clusters" / "a100_topo1.topo")

    def fused(*opts):
        out = tmp_path / f"o{len(list(tmp_path.glob('o*')))}"
        assert main([algo, "-o", str(out), *opts]) == 0
        return json.loads((out / "manifest.json").read_text())["stats"]["fused"]

    assert fused() == 0                           # auto without a cluster: off
    assert fused("--fuse") > 0                    # on
    assert fused("--fuse=off", "--topology", topo) == 0
    assert fused("--topology", topo) > 0          # auto: the simulator finds it never slower there


def test_a_tie_within_rounding_is_not_slower():
    """The choices between programs (fusion, allocation) take a time within SAME_TIME of the other's
    as a tie: the simulator's sums differ in their last places between equal programs."""
    from hccc.compiler.pipeline.cost_model import SAME_TIME, not_slower
    t = 4.364304e-05
    assert not_slower(t * (1 + 1e-15), t) and not_slower(t, t) and not_slower(t * 0.5, t)
    assert not not_slower(t * (1 + 10 * SAME_TIME), t)
