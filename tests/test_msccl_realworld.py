"""Real-world-shaped MSCCL XML: what ``hccc check`` accepts, ``hccc run`` executes correctly.

* allpairs AllReduce with steps of 16 and 32 chunks, both peers sending before either receives:
  the kernels carry a step as one FIFO message (MSCCL's semantics), so the step always fits;
* scratch smaller than ``nchunksperloop`` (every allpairs AllReduce): the reference executor and
  the kernels lay scratch out the same way, whatever its size;
* the ``coll`` spellings real tools write.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.msccl_xml import export_xml, import_xml_text
from hccc.compiler.passes.build import build_program
from hccc.compiler.frontend import generators as gen
from hccc.runtime.reference import execute, expected, make_inputs
from hccc.testing import KernelCase, describe_failure, run_case

from msccl_texts import allpairs_allreduce, direct_allgather

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


#: the reported file: rank 0 finally copies the received chunk 1 over its input chunk 0
AG2_COPY_BACK = """<algo name="ag" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" inplace="0">
  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="cpy" srcbuf="o" srcoff="1" dstbuf="i" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="s" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"""


def test_check_refuses_the_two_rank_allgather_that_wrote_past_its_input(tmp_path, capsys):
    from hccc.cli import main
    f = tmp_path / "ag2.xml"
    f.write_text(AG2_COPY_BACK)
    assert main(["check", str(f)]) == 1
    err = capsys.readouterr().err
    assert f"{f}:7:7: error: gpu 0 thread block 0 step 3 (cpy): copies between chunks of different sizes" in err
    assert "differ in size at 1 element (1 vs 0)" in err and "Traceback" not in err
    assert main(["run", str(f), "--bytes", "131076"]) == 1


def _small_slots(ir):
    """Slots of 64 bytes per chunk of the largest step: up to 16 four-byte elements per chunk in
    the one micro-batch an algorithm-level program runs (counts up to 16 * nchunks)."""
    ir.chunk_bytes = 64 * ir.max_step_chunks
    return ir


@needs_gxx
@pytest.mark.parametrize("n,per", [(2, 16), (3, 16), (2, 32)])
def test_allpairs_with_16_and_32_chunk_steps_runs(n, per):
    ir = _small_slots(import_xml_text(allpairs_allreduce(n, per), "allpairs.xml"))
    assert ir.origin.execution == "algorithm" and ir.max_step_chunks == per
    assert ir.scratch_chunks < ir.nchunks
    C = ir.nchunks
    # uneven: some chunks one element larger; one micro-batch per chunk (algorithm-level order)
    for count, inplace in ((C * 4 + 3, False), (C * 2 + C - 1, True), (5, False)):
        case = KernelCase(count, "float32", "sum", inplace, 2)
        res = run_case(ir, case, timeout_s=20)
        assert res.stuck is None and res.ok, describe_failure(case, res)
        assert res.oracle == "reference"


@needs_gxx
@settings(max_examples=6, deadline=None)
@given(family=st.sampled_from([allpairs_allreduce, direct_allgather]), n=st.integers(2, 3),
       per=st.integers(2, 24), proto=st.sampled_from(["Simple", "LL", "LL128"]), data=st.data())
def test_accepted_multi_chunk_steps_run_to_completion(family, n, per, proto, data):
    """check valid => run completes with 0 wrong elements, for steps of many chunks that both
    peers send before either receives (AllReduce with scratch and local reductions, AllGather with
    a local multi-chunk copy)."""
    ir = _small_slots(import_xml_text(family(n, per, proto), "algo.xml"))
    C = ir.nchunks
    count = data.draw(st.integers(0, 4 * C), label="count")
    case = KernelCase(count, data.draw(st.sampled_from(["float32", "int32"])), "sum",
                      data.draw(st.booleans(), label="inplace"), data.draw(st.sampled_from([1, 2, 3])))
    res = run_case(ir, case, timeout_s=20)
    assert res.stuck is None and res.ok, describe_failure(case, res)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 5), per=st.integers(1, 9), count=st.integers(0, 300), inplace=st.booleans(),
       seed=st.integers(0, 3))
def test_reference_follows_a_scratch_smaller_than_the_loop(n, per, count, inplace, seed):
    """s_chunks = (n-1)*per < nchunksperloop = n*per: the oracle computes the AllReduce, checked
    against the collective's definition at every (also uneven) count."""
    ir = import_xml_text(allpairs_allreduce(n, per), "allpairs.xml")
    assert ir.scratch_chunks < ir.nchunks
    ins = make_inputs("allreduce", n, count, "int32", seed=seed)
    out = execute(ir, ins, inplace=inplace, seed=seed)
    assert all(np.array_equal(a, b) for a, b in zip(out, expected("allreduce", ins)))


def test_reduce_scatter_spelling_is_accepted():
    text = export_xml(build_program(gen.ring_reducescatter(4)))
    assert 'coll="reducescatter"' in text
    ir = import_xml_text(text.replace('coll="reducescatter"', 'coll="reduce_scatter"'), "rs.xml")
    assert ir.collective == "reducescatter"
    ins = make_inputs("reducescatter", 4, 23, "int32", seed=2)
    out = execute(ir, ins)
    assert all(np.array_equal(a, b) for a, b in zip(out, expected("reducescatter", ins)))


def test_custom_collective_is_unsupported_not_unknown():
    text = allpairs_allreduce(2, 1).replace('coll="allreduce"', 'coll="custom"')
    with pytest.raises(CompileError) as e:
        import_xml_text(text, "c.xml")
    d = e.value.diagnostics[0]
    assert d.message.startswith("unsupported collective 'custom'")
    assert (d.location.line, d.location.source.name) == (1, "c.xml")
