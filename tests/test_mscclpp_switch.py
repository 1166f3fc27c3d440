"""Switch (NVLS) channels in MSCCL++ plans (compiler/interop/mscclpp_switch.py): plans over them are
imported, proven, computed right by hccc's reference executor and run right in the independent
interpreter (tests/mscclpp_interp.py, whose switch semantics are the multimem ones, written from
the executor's kernel, not from the importer's rewrite); malformed switch channels and operations
are refused with located errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_runs import run_cli
from conftest import examples
from mscclpp_interp import InterpError, check_plan, run_plan
from mscclpp_plans import NOP, buf, refused, gpu_entry, mem_buffer_refs, plan_obj, remote_buf, sync_op
from mscclpp_switch_plans import (grouped, plan_switch_allgather, plan_switch_allreduce,
                                  plan_switch_butterfly_allreduce, plan_switch_packet_allgather, switch_channel)
from hccc.compiler.interop.mscclpp_import import import_plan_text
from hccc.runtime.reference import execute, expected_for, inputs_for
from hccc.util.diagnostics import CompileError


def _proven_and_right(plan, mult=2):
    """Imported (proven on the way in), right in hccc's reference executor, right in the
    interpreter: out of place three calls in a row, each end rank running its calls ahead in turn."""
    ir = import_plan_text(json.dumps(plan), "switch.json")
    ins = inputs_for(ir, ir.nchunks * ir.nranks * 2, "float32", seed=3)
    outs = execute(ir, [x.copy() for x in ins], inplace=plan["inplace"])
    for r, (o, w) in enumerate(zip(outs, expected_for(ir, ins))):
        np.testing.assert_array_equal(o, w, err_msg=f"rank {r}")
    if plan["inplace"]:
        check_plan(plan, mult, runs=1)
    else:
        for ahead in (None, 0, len(plan["gpus"]) - 1):
            check_plan(plan, mult, runs=3, eager=ahead, seed=1 if ahead is None else ahead)
    return ir


@pytest.mark.parametrize("make,kw", [
    (plan_switch_allreduce, dict(R=3, k=2, inplace=True, cuts=(1,))),
    (plan_switch_allreduce, dict(R=4, k=2, inplace=False, nblocks=2, cuts=(1,))),
    (plan_switch_allgather, dict(R=3, k=2, inplace=True)),
    (plan_switch_allgather, dict(R=3, k=3, inplace=False, cuts=(1, 2), nblocks=2)),
    (plan_switch_packet_allgather, dict(R=4, k=2, inplace=True, cuts=(1,))),
    (plan_switch_packet_allgather, dict(R=3, k=1, inplace=False)),
    (plan_switch_butterfly_allreduce, dict(k=2)),
    (lambda **kw: grouped(plan_switch_allreduce(**kw)), dict(R=3, k=2, inplace=False)),
    (lambda **kw: grouped(plan_switch_allgather(**kw)), dict(R=3, k=2, inplace=True)),
    (lambda **kw: _from_input(plan_switch_allgather(**kw)), dict(R=3, k=2, inplace=True)),
], ids=["glres_in", "glres_out_2tbs", "gstore_in", "gstore_out_2tbs", "gstorepkt_in", "gstorepkt_out", "butterfly",
        "glres_group_of_2", "gstore_group_of_2", "gstore_in_from_the_input"])
def test_a_plan_over_switch_channels_is_proven_and_runs_right(make, kw):
    _proven_and_right(make(**kw))


def _from_input(plan):
    """An in-place AllGather whose stores name the rank's input (its part of the output) as source."""
    for g in plan["gpus"]:
        for o in g["threadblocks"][0]["ops"]:
            if o["name"] == "gstore":
                o["src_buff"][0] = buf("i", 0, g["input_chunks"])
    return plan


@settings(max_examples=examples(20))
@given(kind=st.sampled_from(["glres", "gstore", "gstorepkt"]), R=st.integers(2, 5), k=st.integers(1, 3),
       cuts=st.sets(st.integers(1, 2)), inplace=st.booleans(), nblocks=st.integers(1, 2))
def test_random_switch_reductions_and_stores_compute_their_collective(kind, R, k, cuts, inplace, nblocks):
    """Any rank count, chunk count and cut of each rank's region into switch operations, in or out
    of place, over one or two thread blocks: proven, and right against numpy (the interpreter's
    oracle: the sum, or the concatenation, of the inputs) in both executors."""
    if kind == "glres":
        plan = plan_switch_allreduce(R, k, inplace, tuple(cuts), nblocks)
    elif kind == "gstore":
        plan = plan_switch_allgather(R, k, inplace, tuple(cuts), nblocks)
    else:
        plan = plan_switch_packet_allgather(R, k, inplace, tuple(cuts))
    _proven_and_right(plan, mult=1)


def test_the_interpreter_sums_every_members_copy_as_numpy_does():
    """The interpreter's glres alone, on one thread block of each rank, against numpy: the
    element-wise sum of every rank's input, on every rank."""
    plan = plan_switch_allreduce(R=3, k=1, inplace=False)
    rng = np.random.default_rng(5)
    ins = [rng.integers(-50, 50, 6).astype(np.float64) for _ in range(3)]
    outs = run_plan(plan, ins, 6)
    for o in outs:
        np.testing.assert_array_equal(o, ins[0] + ins[1] + ins[2])


# ------------------------------------------------------------------ synchronisation the plan must carry
def _ops(plan, r, t=0):
    return plan["gpus"][r]["threadblocks"][t]["ops"]



def test_a_switch_reduce_before_the_peers_are_ready_isrefused():
    plan = plan_switch_allreduce(R=2, k=1, inplace=True)
    ops = _ops(plan, 0)
    del ops[3]                                   # rank 0's first wait: it reads rank 1 unannounced
    msg, _ = refused(plan)
    assert "rank 0 reads rank 1's buffer without first waiting" in msg or "wait" in msg


def test_a_switch_store_no_signal_announces_isrefused():
    plan = plan_switch_allgather(R=2, k=1, inplace=False)
    ops = _ops(plan, 1)
    k = next(i for i, o in enumerate(ops) if o["name"] == "gstore")
    ops.append(ops.pop(k))                       # rank 1 stores after its last signal
    msg, line = refused(plan)
    assert "rank 1 puts into rank 0 without a signal" in msg and '"gstore"' in line


def test_a_semaphore_hands_a_blocks_waits_to_the_block_that_acquires_it():
    """A remote read in a block after a semaphore the waiting block releases (as the DSL's
    pipelined NVLS AllReduce reads): accepted; released before the wait, refused."""
    _proven_and_right(_semaphore_plan([0], [0]))
    msg, line = refused(_semaphore_plan([0], [0], release_first=True))
    assert "reads rank 1's buffer without first waiting" in msg and '"rre"' in line


# ------------------------------------------------------------------ malformed switch channels and operations
def _switch_chan(plan, r, k=1):
    return plan["gpus"][r]["channels"][k]


def _first(plan, r, name):
    return next(o for o in _ops(plan, r) if o["name"] == name)


def _bad_group_without_the_rank(p):
    _switch_chan(p, 1)["rank_groups"][0]["ranks"] = [0, 2]


def _bad_group_rank_out_of_range(p):
    _switch_chan(p, 0)["rank_groups"][0]["ranks"] = [0, 1, 7]


def _bad_partner_missing(p):
    for r in (0, 1):
        _switch_chan(p, r)["rank_groups"][0].update(ranks=[0, 1], size=2)      # rank 2 declares [0, 1, 2]


def _bad_partner_buffer(p):
    _switch_chan(p, 2)["buffer_type"] = "o"


def _bad_partner_order(p):
    g = p["gpus"][1]["channels"]
    g.insert(1, switch_channel("o", [0, 1]))                         # rank 1 and rank 0 disagree on order
    p["gpus"][0]["channels"].append(switch_channel("o", [0, 1]))


def _bad_buffer_type(p):
    _switch_chan(p, 0)["buffer_type"] = "x"


def _bad_region(p):
    _first(p, 1, "glres")["src_buff"][0]["index"] = 5


def _bad_sizes(p):
    _first(p, 1, "glres")["dst_buff"][0]["size"] = 2


def _bad_channel_id(p):
    _first(p, 0, "glres")["src_buff"][0]["switch_channel_id"] = 2     # the block lists two


def _bad_no_switch_in_block(p):
    p["gpus"][0]["threadblocks"][0]["channels"].pop()                  # the block lists none


def _bad_rank_channel(p):
    p["gpus"][0]["threadblocks"][0]["channels"][1]["channel_ids"] = [0, 5]


def _bad_two_sources(p):
    o = _first(p, 0, "glres")
    o["src_buff"].append(dict(o["src_buff"][0]))


def _bad_no_switch_ref(p):
    o = _first(p, 0, "glres")
    o["src_buff"][0] = buf("i", 0)


def _bad_other_op_on_switch(p):
    o = _first(p, 0, "glres")
    o.clear()
    o.update({"name": "copy", "src_buff": [buf("i", 0)], "dst_buff": [buf("o", 0)], "channel_type": "switch"})


def _bad_ops_not_a_list(p):
    p["gpus"][0]["threadblocks"][0]["ops"] = 3


def _bad_channels_not_a_list(p):
    p["gpus"][2]["channels"] = {"channel_type": "switch"}


def _bad_group_size(p):
    del _switch_chan(p, 0)["rank_groups"][0]["size"]      # the loader reads it


HOSTILE_GLRES = [
    (_bad_group_without_the_rank, "rank 1's switch (NVLS) channel is over ranks [0, 2], a group rank 1 is not in", '"ranks"'),
    (_bad_group_rank_out_of_range, "bad rank 7 in a switch channel's group", "7"),
    # rank 0 now shares only its output channel with rank 2, whose first shared channel is the input one
    (_bad_partner_missing, "rank 0's switch (NVLS) channel over ranks [0, 1, 2] (buffer 'o') has no partner on "
                           "rank 2: it is the first rank 0 shares with rank 2, and rank 2 declares its switch "
                           "channel over ranks [0, 1, 2] (buffer 'i') there", '"ranks"'),
    (_bad_partner_buffer, "has no partner on rank 2", '"ranks"'),
    (_bad_partner_order, "(buffer 'i') has no partner on rank 1", '"ranks"'),
    (_bad_buffer_type, "needs a 'buffer_type' (i, o or s)", '"buffer_type"'),
    (_bad_region, "chunks [5, 6) of rank 0's i buffer (a member of the switch channel's group): it has 3", '"index"'),
    (_bad_sizes, "'glres' moves 1 chunks from its source and 2 into its destination", '"size"'),
    (_bad_channel_id, "switch channel 2 of a thread block that lists 2 switch channels", '"switch_channel_id"'),
    (_bad_no_switch_in_block, "switch channel 0 of a thread block that lists 0 switch channels",
     '"switch_channel_id"'),
    (_bad_rank_channel, "is rank 0's switch channel 5; rank 0 declares 2", '"switch_channel_id"'),
    (_bad_two_sources, "'glres' needs exactly one 'src_buff' reference", '"src_buff"'),
    (_bad_no_switch_ref, "the reference needs a 'switch_channel_id'", '{'),
    (_bad_other_op_on_switch, "'copy' does not work over a switch channel", '"copy"'),
    (_bad_group_size, "a switch channel's rank group needs 'size', a non-negative integer", '{'),
    (_bad_ops_not_a_list, "'ops' must be a list", '"ops"'),
    (_bad_channels_not_a_list, "'channels' must be a list", '"channels"'),
]


@pytest.mark.parametrize("spoil,msg,at", HOSTILE_GLRES, ids=[f[0].__name__[5:] for f in HOSTILE_GLRES])
def test_a_malformed_switch_channel_or_reduce_is_refused_where_it_is_wrong(spoil, msg, at):
    plan = plan_switch_allreduce(R=3, k=1, inplace=False)
    spoil(plan)
    got, line = refused(plan)
    assert msg in got
    assert at in line, (got, line)


def _gstorepkt(p):
    return _first(p, 0, "gstorepkt")


HOSTILE_STORES = [
    (plan_switch_packet_allgather, lambda p: _gstorepkt(p)["src_buff"][0].update(type="o"),
     "its source must be the scratch ('s')", '"type"'),
    (plan_switch_packet_allgather, lambda p: [_switch_chan(p, r, 0).update(buffer_type="o") for r in range(2)],
     "its switch channel binds buffer 'o'", '"switch_channel_id"'),
    (plan_switch_packet_allgather, lambda p: _gstorepkt(p)["dst_buff"][0].update(index=1),
     "a packet copy within one rank's scratch is not modelled", '"index"'),
    (plan_switch_allgather, lambda p: _first(p, 0, "gstore")["src_buff"][0].pop("type"),
     "'gstore' stores a region of the rank's own buffers: its source needs a 'type'", '{'),
    (plan_switch_allgather, lambda p: _first(p, 0, "gstore").update(channel_type="memory"),
     "'gstore' works over a switch channel, not a 'memory' one", '"channel_type"'),
    (plan_switch_allgather, lambda p: _first(p, 0, "gstore")["dst_buff"].clear(),
     "'gstore' needs exactly one 'dst_buff' reference", '"dst_buff"'),
    (plan_switch_allgather, lambda p: _first(p, 1, "gstore")["dst_buff"][0].update(index=2),
     "chunks [2, 3) of rank 0's o buffer (a member of the switch channel's group): it has 2", '"index"'),
]


@pytest.mark.parametrize("make,spoil,msg,at", HOSTILE_STORES, ids=[f"store{i}" for i in range(len(HOSTILE_STORES))])
def test_a_malformed_switch_store_is_refused_where_it_is_wrong(make, spoil, msg, at):
    plan = make(R=2, k=1, inplace=False)
    spoil(plan)
    got, line = refused(plan)
    assert msg in got
    assert at in line, (got, line)


def test_a_simple_multimem_access_of_a_double_scratch_is_refused_and_runs_wrong():
    """The kernel's multimem address of glres/gstore has no scratch half: a plan alternating
    halves reads and writes different places on odd calls (the interpreter, running it as the
    kernel does, gets wrong results), so the import refuses it."""
    plan = plan_switch_allgather(R=2, k=1, inplace=False)
    plan["use_double_scratch_buffer"] = True
    for r, g in enumerate(plan["gpus"]):
        g["scratch_chunks"] = 2
        g["channels"][2]["buffer_type"] = g["channels"][1]["buffer_type"] = "s"
        ops = g["threadblocks"][0]["ops"]
        k = next(i for i, o in enumerate(ops) if o["name"] == "gstore")
        ops[k]["dst_buff"][0]["index"] = r
        ops[-1:] = [ops[-1], NOP, {"name": "copy", "src_buff": [buf("s", 0, 2)], "dst_buff": [buf("o", 0, 2)]}]
    msg, line = refused(plan)
    assert "use_double_scratch_buffer" in msg and '"switch_channel_id"' in line
    with pytest.raises(InterpError, match="expected"):                  # calls of both halves
        check_plan(plan, 1, runs=3)
    plan["use_double_scratch_buffer"] = False                           # one scratch: proven and right
    _proven_and_right(plan)


def test_the_interpreter_refuses_a_switch_group_without_its_rank():
    plan = plan_switch_allreduce(R=3, k=1, inplace=True)
    _bad_group_without_the_rank(plan)
    with pytest.raises(InterpError, match="is not a group of distinct ranks with rank 1"):
        check_plan(plan, 1, runs=1)


def test_a_malformed_switch_plan_exits_1_with_a_located_error_and_no_traceback(tmp_path):
    plan = plan_switch_allreduce(R=3, k=1, inplace=False)
    _bad_region(plan)
    f = tmp_path / "bad.mscclpp.json"
    f.write_text(json.dumps(plan, indent=1))
    proc = run_cli("check", f, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{f}:" in proc.stderr and ": error: chunks [5, 6) of rank 0's i buffer" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not [p for p in tmp_path.iterdir() if p.name != f.name]      # nothing half-written



# ------------------------------------------------------------------ fuzz: switch fields against the interpreter
FUZZED = (lambda: plan_switch_allreduce(3, 1, False), lambda: plan_switch_allreduce(2, 2, True, (1,), 2),
          lambda: plan_switch_allgather(2, 2, False, (1,)), lambda: plan_switch_packet_allgather(3, 1, False),
          lambda: plan_switch_butterfly_allreduce(1))


def _mutate_switch(plan, data) -> str:
    """One switch field of ``plan`` changed: a region's index or size, a reference's switch channel,
    a channel's group or buffer, a store's source buffer."""
    sw = [(g, o) for g in plan["gpus"] for tb in g["threadblocks"] for o in tb["ops"]
          if o["name"] in ("glres", "gstore", "gstorepkt")]
    g, o = data.draw(st.sampled_from(sw))
    chans = [c for c in g["channels"] if c["channel_type"] == "switch"]
    ref = o[data.draw(st.sampled_from(["src_buff", "dst_buff"]))][0]
    kind = data.draw(st.sampled_from(["index", "size", "channel", "group", "letter", "source"]))
    if kind == "index":
        ref["index"] = data.draw(st.integers(0, 6))
    elif kind == "size":
        ref["size"] = data.draw(st.integers(1, 3))
    elif kind == "channel" and "switch_channel_id" in ref:
        ref["switch_channel_id"] = data.draw(st.integers(0, 1))
    elif kind == "group":
        ranks = sorted(data.draw(st.sets(st.integers(0, len(plan["gpus"]) - 1), min_size=1)))
        data.draw(st.sampled_from(chans))["rank_groups"] = [{"size": len(ranks), "ranks": ranks}]
    elif kind == "letter":
        data.draw(st.sampled_from(chans))["buffer_type"] = data.draw(st.sampled_from("ios"))
    elif kind == "source" and "type" in ref:
        ref["type"] = data.draw(st.sampled_from("ios"))
    return kind


@settings(max_examples=examples(20))
@given(data=st.data())
def test_every_switch_mutation_the_import_accepts_runs_right_in_the_interpreter(data):
    plan = json.loads(json.dumps(data.draw(st.sampled_from(FUZZED))()))      # no object shared with the builders
    what = [_mutate_switch(plan, data) for _ in range(data.draw(st.integers(1, 2)))]
    try:
        import_plan_text(json.dumps(plan), "mutant.json")
    except CompileError:
        return
    for seed in range(2):
        try:
            check_plan(plan, 6, seed=seed, runs=1 if plan["inplace"] else 2, eager=seed % len(plan["gpus"]))
        except InterpError as exc:
            raise AssertionError(f"the import accepted a plan ({what}) the interpreter rejects: {exc}") from None


@pytest.mark.slow
@pytest.mark.parametrize("make,kw", [
    (plan_switch_allreduce, dict(R=4, k=2, inplace=False, nblocks=2, cuts=(1,))),
    (plan_switch_allgather, dict(R=3, k=2, inplace=False, cuts=(1,))),
    (plan_switch_packet_allgather, dict(R=4, k=1, inplace=False)),
    (plan_switch_butterfly_allreduce, dict(k=2)),
], ids=["glres_out", "gstore_out", "gstorepkt_out", "butterfly_in"])
def test_a_switch_plan_runs_right_on_hcccs_kernels_in_cpu_emulation(make, kw, tmp_path, capsys, monkeypatch):
    """``hccc run`` of the plan file: hccc's kernels, every rank in one process, in the placement
    the plan declares."""
    from hccc.cli import main
    plan = make(**kw)
    f = tmp_path / "switch.mscclpp.json"
    f.write_text(json.dumps(plan))
    size = 16 * plan["gpus"][0]["input_chunks"] * 4
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(f), "--sizes", str(size), "-n", "2", "-w", "0"]) == 0
    out = capsys.readouterr().out
    assert "Out of bounds values : 0 OK" in out
    assert ("in-place" in out) if plan["inplace"] else ("out-of-place" in out)


# ------------------------------------------------------------------ hostile values anywhere in the switch fields
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2, 9), st.floats(allow_nan=False), st.text(max_size=3),
                 st.lists(st.integers(-1, 4), max_size=3), st.dictionaries(st.sampled_from(["a", "size", "ranks"]),
                                                                         st.integers(0, 3), max_size=2))


def _paths(o, p=()):
    if isinstance(o, dict):
        for k, v in o.items():
            yield p + (k,)
            yield from _paths(v, p + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield p + (i,)
            yield from _paths(v, p + (i,))


@settings(max_examples=examples(30))
@given(data=st.data())
def test_any_value_in_any_field_of_a_switch_plan_is_imported_or_refused_located(data):
    """A value of any JSON kind put in any field of a plan over switch channels (or the field
    dropped): the import proves the plan or refuses it with a located error, never anything else."""
    plan = json.loads(json.dumps(data.draw(st.sampled_from(FUZZED))()))      # no object shared with the builders
    for _ in range(data.draw(st.integers(1, 2))):
        paths = list(_paths(plan))
        p = data.draw(st.sampled_from(paths))
        parent = plan
        for k in p[:-1]:
            parent = parent[k]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[p[-1]]
        else:
            parent[p[-1]] = data.draw(JUNK)
    try:
        import_plan_text(json.dumps(plan), "junk.json")
    except CompileError as exc:
        assert exc.diagnostics[0].location is not None


# ------------------------------------------------------------------ channels and semaphores named twice in one operation
def test_a_wait_naming_one_channel_twice_is_refused_as_a_race():
    """Thread t of a signal or wait works on the t-th channel it names: two threads on one channel
    move its counts at once."""
    plan = plan_switch_allreduce(R=3, k=1, inplace=False)
    _ops(plan, 1)[3]["channel_ids"] = [1, 1]
    msg, line = refused(plan)
    assert "'rlxwait' names channel 1 twice" in msg and '"channel_ids"' in line


def test_a_wait_naming_one_channel_twice_through_its_blocks_table_is_refused_as_a_race():
    """Two entries of a thread block's channel table may name one channel of the rank: a wait over
    both is the same race (it crashed the synchronisation check before it was refused)."""
    plan = plan_switch_allreduce(R=3, k=1, inplace=False)
    tb = plan["gpus"][1]["threadblocks"][0]
    wait = tb["ops"][3]
    table = next(c for c in tb["channels"] if c["channel_type"] == wait["channel_type"])
    c = wait["channel_ids"][0]
    table["channel_ids"].append(table["channel_ids"][c])
    wait["channel_ids"] = [c, len(table["channel_ids"]) - 1]
    msg, line = refused(plan)
    assert (f"names channels {c} and {len(table['channel_ids']) - 1} of its thread block, which are both "
            "the rank's" in msg) and '"channel_ids"' in line


def _semaphore_plan(release_ids, acquire_ids, release_first=False):
    """The read-reduce AllReduce on 2 ranks split over two blocks: block 0 signals and waits
    towards the peer and releases semaphore 0 (``release_ids``), block 1 acquires it
    (``acquire_ids``), reads and reduces the peer's chunk and puts the sum back. ``release_first``:
    block 0 releases before it waits."""
    gpus = []
    for r in range(2):
        p = 1 - r
        ready = [sync_op("signal", [0]), sync_op("wait", [0]), NOP]
        release = {"name": "sem_release", "semaphore_ids": release_ids}
        tb0 = {"id": 0, "ops": [release, NOP] + ready if release_first else ready + [release],
               "channels": [{"channel_type": "memory", "channel_ids": [0]}]}
        tb1 = {"id": 1, "ops": [{"name": "sem_acquire", "semaphore_ids": acquire_ids}, NOP,
                                {"name": "rre", "src_buff": [buf("i", r), remote_buf(0, r)],
                                 "dst_buff": [buf("o", r)], "channel_type": "memory"}, NOP,
                                {"name": "put", "src_buff": [buf("o", r)], "dst_buff": [remote_buf(1, r)],
                                 "channel_type": "memory", "channel_ids": [0]},
                                NOP, sync_op("signal", [0]), sync_op("wait", [0])],
               "channels": [{"channel_type": "memory", "channel_ids": [1]}],
               "remote_buffer_refs": mem_buffer_refs([0, 1])}
        gpus.append(gpu_entry(r, 2, 2, 0, [{"channel_type": "memory", "connected_to": [p, p]}],
                              [{"rank": p, "type": "i", "access_channel_types": ["memory"]},
                               {"rank": p, "type": "o", "access_channel_types": ["memory"]}], [tb0, tb1], sems=1))
    return plan_obj("allreduce", gpus)


def test_a_semaphore_named_twice_is_acquired_twice():
    """The executor's semaphores are atomic counters: an acquire naming one twice takes two
    releases. Released twice: proven and right; released once: a deadlock, refused."""
    _proven_and_right(_semaphore_plan([0, 0], [0, 0]))
    msg, line = refused(_semaphore_plan([0], [0, 0]))
    assert "sem_acquire" in line and "never passes" in msg


@pytest.mark.parametrize("make", [lambda: plan_switch_allgather(2, 2, False, (1,)),
                                  lambda: plan_switch_allreduce(3, 1, False)], ids=["gstore", "glres"])
def test_a_switch_operation_repeated_without_a_nop_is_a_race(make):
    """The executor runs a switch operation as one operation: repeated with no ``nop`` between,
    its threads store the same bytes of every member twice at once (a race the interpreter
    reports). The import reads it as several memory-channel operations, and must still compare
    them together with the operation before them; it once compared each part alone and accepted
    the plan."""
    plan = make()
    ops = plan["gpus"][0]["threadblocks"][0]["ops"]
    i = next(k for k, o in enumerate(ops) if o["name"] in ("gstore", "glres"))
    ops.insert(i + 1, json.loads(json.dumps(ops[i])))
    with pytest.raises(InterpError, match="no nop between data operations"):
        check_plan(plan, 2)
    msg, line = refused(plan)
    assert f"'{ops[i]['name']}' directly after '{ops[i]['name']}'" in msg and "(a race)" in msg, msg
    assert f'"name": "{ops[i]["name"]}"' in line
