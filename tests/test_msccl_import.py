"""MSCCL XML import: real-world shapes, the in-place normalisation, located errors, robustness."""
from __future__ import annotations

import json

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.util.diagnostics import CompileError, render_all
from hccc.compiler.interop.msccl_xml import export_xml, import_xml, import_xml_text
from hccc.compiler.pipeline import load_program
from hccc.compiler.ir.program_ir import Buf, Op
from hccc.runtime.reference import execute, expected, make_inputs


ROOT = Path(__file__).resolve().parent.parent
SAMPLES = sorted((ROOT / "examples" / "msccl").glob("*.xml"))


def modes(ir):
    return [m for m, ok in ((False, ir.origin.outofplace), (True, ir.origin.inplace)) if ok]


def computes(ir, inplace, seed=0, op="sum"):
    inp = make_inputs(ir.collective, ir.nranks, 5 * ir.nchunks, nchunks=ir.nchunks, seed=seed, low=-500, high=500)
    got = execute(ir, inp, inplace=inplace, op=op, seed=seed)
    want = expected(ir.collective, inp, op, nchunks=ir.nchunks)
    return all(np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_import_and_compute(path):
    ir = import_xml(path)
    assert ir.origin.source == "msccl-xml"
    for inplace in modes(ir):
        for seed in (0, 1):
            assert computes(ir, inplace, seed), f"{path.name} inplace={inplace}"
    assert load_program(path).nprims == ir.nprims


def test_msccl_tools_in_place_program_is_normalised():
    ir = import_xml(ROOT / "examples" / "msccl" / "allreduce_ring_4.xml")   # inplace="1", no outofplace
    assert ir.stats["inplace_normalised"] and ir.origin.outofplace and ir.origin.inplace
    p = ir.prims
    # the program used only the input buffer; now it works on the output after a copy into it
    assert not np.any((p["src_buf"] == Buf.INPUT) & (p["op"] != Op.COPY))
    assert not np.any(p["dst_buf"] == Buf.INPUT)
    assert int(np.sum(p["op"] == Op.COPY)) == ir.nranks
    assert ir.origin.execution == "algorithm"
    for inplace in (False, True):
        assert computes(ir, inplace) and computes(ir, inplace, op="max")


def test_out_of_place_only_without_outofplace_attribute():
    ir = import_xml(ROOT / "examples" / "msccl" / "reducescatter_ring_4.xml")   # inplace="0", no outofplace
    assert ir.origin.outofplace and not ir.origin.inplace
    assert not ir.stats["inplace_normalised"]


def test_in_place_reducescatter_gets_an_epilogue_copy():
    text = (ROOT / "examples" / "msccl" / "reducescatter_ring_4.xml").read_text().replace('inplace="0"', 'inplace="1"')
    for r in range(4):   # reduce into the input chunk the output aliases in place
        text = re.sub(rf'(<gpu id="{r}"(?:.|\n)*?type="rrc" srcbuf="i" srcoff="{r}") dstbuf="o" dstoff="0"',
                      rf'\1 dstbuf="i" dstoff="{r}"', text, count=1)
    assert text.count('dstbuf="i" dstoff=') >= 4
    ir = import_xml_text(text)
    assert ir.stats["inplace_normalised"]
    p = ir.prims
    assert int(np.sum((p["op"] == Op.COPY) & (p["dst_buf"] == Buf.OUTPUT))) == 4
    for inplace in (False, True):
        assert computes(ir, inplace)


def test_in_place_allgather_with_no_input_chunks():
    ir = import_xml(ROOT / "examples" / "msccl" / "allgather_direct_4.xml")    # i_chunks="0", 2 chunks per rank
    assert (ir.in_chunks, ir.out_chunks, ir.nchunks) == (2, 8, 8)
    assert ir.stats["inplace_normalised"]
    for inplace in (False, True):
        assert computes(ir, inplace)


def test_comments_declaration_and_unknown_attributes_are_accepted():
    text = (ROOT / "examples" / "msccl" / "allreduce_allpairs_4.xml").read_text()
    text = '<?xml version="1.0"?>\n<!-- note -->\n' + text.replace('<algo ', '<algo maxcount="1" nthreadblocks="4" ', 1)
    ir = import_xml_text(text)
    assert computes(ir, False)


def test_local_thread_block_without_channel():
    """msccl-tools writes chan="-1" on thread blocks that only copy and reduce."""
    text = (ROOT / "examples" / "msccl" / "allreduce_allpairs_4.xml").read_text()
    text = text.replace('send="-1" recv="-1" chan="0"', 'send="-1" recv="-1" chan="-1"')
    assert computes(import_xml_text(text), False)
    bad = text.replace('<tb id="0" send="1" recv="1" chan="0">', '<tb id="0" send="1" recv="1" chan="-1">', 1)
    with pytest.raises(CompileError, match="chan=-1 is out of range"):
        import_xml_text(bad)


def test_wait_ends_at_the_first_signalling_step():
    """deps names a step without hasdep: the runtimes wait for the next step that signals."""
    text = (ROOT / "examples" / "msccl" / "allreduce_allpairs_4.xml").read_text()
    # the local TB's nops wait for step 1 (hasdep=1) of the peer TBs; point one at step 0 instead
    text2 = text.replace('type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="1" depid="0" deps="1"',
                         'type="nop" srcbuf="i" srcoff="-1" dstbuf="o" dstoff="-1" cnt="1" depid="0" deps="0"', 1)
    assert text2 != text
    a, b = import_xml_text(text), import_xml_text(text2)
    assert np.array_equal(a.dep_on, b.dep_on) and np.array_equal(a.dep_prim, b.dep_prim)


# ------------------------------------------------------------------ located errors
def ag2(**kw) -> list[str]:
    """A 2-GPU out-of-place AllGather, one line per element (line numbers = index + 1)."""
    lines = ['<algo name="ag2" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" '
             'inplace="0" outofplace="1" minBytes="0" maxBytes="0">']
    for r in (0, 1):
        q = 1 - r
        lines += [f'  <gpu id="{r}" i_chunks="1" o_chunks="2" s_chunks="0">',
                  f'    <tb id="0" send="{q}" recv="{q}" chan="0">',
                  f'      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="{r}" cnt="1" depid="-1" '
                  f'deps="-1" hasdep="0"/>',
                  f'      <step s="1" type="s" srcbuf="o" srcoff="{r}" dstbuf="o" dstoff="{r}" cnt="1" depid="-1" '
                  f'deps="-1" hasdep="0"/>',
                  f'      <step s="2" type="r" srcbuf="o" srcoff="{q}" dstbuf="o" dstoff="{q}" cnt="1" depid="-1" '
                  f'deps="-1" hasdep="0"/>',
                  '    </tb>', '  </gpu>']
    lines.append('</algo>')
    return lines


def err(lines, line=None, col=None):
    text = "\n".join(lines) + "\n"
    with pytest.raises(CompileError) as e:
        import_xml_text(text, "t.xml")
    d = e.value.diagnostics[0]
    assert d.location is not None
    if line is not None:
        assert d.location.line == line, render_all(e.value)
    if col is not None:
        assert d.location.col == col, render_all(e.value)
    return d.message, render_all(e.value)


def col_of(line: str, attr: str) -> int:
    return line.index(f" {attr}=") + 2


def test_base_case_is_valid():
    ir = import_xml_text("\n".join(ag2()))
    assert computes(ir, False) and not ir.origin.inplace
    assert ir.origin.execution == "algorithm"    # s then r in one TB: fine for the runtimes only


def test_malformed_xml():
    L = ag2()
    del L[6]                                       # </tb> of gpu 0
    msg, _ = err(L, line=7)
    assert "malformed XML" in msg and "mismatched tag" in msg


def test_doctype_and_entities_are_refused():
    bomb = ('<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]>\n'
            '<algo name="&lol2;"/>\n')
    with pytest.raises(CompileError) as e:
        import_xml_text(bomb)
    assert "DOCTYPE" in str(e.value) and e.value.diagnostics[0].location.line == 2


@pytest.mark.parametrize("case", [
    ("root", lambda L: [L[0].replace("<algo ", "<algorithm ")] + L[1:-1] + ["</algorithm>"], 1,
     "root element is <algorithm>"),
    ("child", lambda L: L[:3] + ['      <foo/>'] + L[3:], 4, "unexpected <foo> inside <tb>"),
    ("text", lambda L: L[:3] + ['      hello'] + L[3:], 4, "unexpected text"),
    ("missing", lambda L: L[:3] + [L[3].replace(' cnt="1"', '')] + L[4:], 4, "lacks attribute(s) cnt"),
])
def test_structure_errors(case):
    _, f, line, text = case
    msg, _ = err(f(ag2()), line=line)
    assert text in msg


ATTR_CASES = [
    # (line index, attribute, old, new, message)
    (0, "proto", 'proto="Simple"', 'proto="LL256"', "unknown protocol 'LL256'"),
    (0, "coll", 'coll="allgather"', 'coll="alltoallv"', "unsupported collective 'alltoallv'"),
    # a collective hccc has, which MSCCL XML cannot state: the reason, not "hccc runs only ..."
    (0, "coll", 'coll="allgather"', 'coll="scatter"', "unsupported collective 'scatter': an MSCCL "
     "<algo> has no root attribute, so it cannot express a Scatter; hccc reads allgather"),
    (0, "coll", 'coll="allgather"', 'coll="bogus"', "unknown collective 'bogus'"),
    (0, "nchunksperloop", 'nchunksperloop="2"', 'nchunksperloop="3"', "not a multiple of ngpus=2"),
    (0, "outofplace", 'outofplace="1"', 'outofplace="0"', "neither in-place nor out-of-place"),
    (0, "ngpus", 'nchunksperloop="2" ngpus="2"', 'nchunksperloop="6" ngpus="3"', "gpu(s) 2 are missing"),
    (1, "id", 'gpu id="0"', 'gpu id="5"', "ngpus=2 allows gpu ids 0..1"),
    (8, "id", 'gpu id="1"', 'gpu id="0"', "gpu 0 is defined twice"),
    (2, "send", 'send="1"', 'send="7"', "peers are -1 (none) or gpu ids 0..1"),
    (2, "send", 'send="1"', 'send="0"', "cannot send to its own gpu"),
    (2, "chan", 'chan="0"', 'chan="1"', "nchannels=1 allows channels 0..0"),
    (3, "s", 's="0"', 's="5"', "steps must be numbered 0, 1, 2"),
    (3, "type", 'type="cpy"', 'type="xx"', "unknown step type 'xx'"),
    (3, "srcbuf", 'srcbuf="i"', 'srcbuf="z"', "is not a buffer"),
    (3, "cnt", 'cnt="1"', 'cnt="x"', 'cnt="x" is not an integer'),
    (3, "dstoff", 'dstoff="0"', 'dstoff="2"', "outside gpu 0's output buffer (2 chunk(s) declared)"),
    (3, "srcoff", 'srcoff="0"', 'srcoff="-3"', "must not be negative"),
    (3, "hasdep", 'hasdep="0"', 'hasdep="2"', "must be 0 or 1"),
    (4, "type", 'type="s"', 'type="r"', None),   # two receives, no send: a connection mismatch
    (5, "cnt", 'cnt="1"', 'cnt="2"', None),
    (3, "depid", 'depid="-1" deps="-1"', 'depid="3" deps="0"', "depid=3 names no thread block of gpu 0"),
    (4, "deps", 'depid="-1" deps="-1"', 'depid="0" deps="9"', None),
]


@pytest.mark.parametrize("case", ATTR_CASES, ids=lambda c: f"{c[1]}-{c[3]}")
def test_attribute_errors_point_at_the_attribute(case):
    idx, attr, old, new, text = case
    L = ag2()
    assert old in L[idx]
    L[idx] = L[idx].replace(old, new, 1)
    msg, rendered = err(L)
    if text is not None:
        assert text in msg, rendered
    assert re.match(r"t\.xml:\d+:\d+: error: ", rendered)


def test_located_columns():
    L = ag2()
    L[0] = L[0].replace('coll="allgather"', 'coll="alltoallv"')
    err(L, line=1, col=col_of(L[0], "coll"))
    L = ag2()
    L[3] = L[3].replace('dstoff="0"', 'dstoff="9"')
    err(L, line=4, col=col_of(L[3], "dstoff"))


def test_send_without_send_peer():
    L = ag2()
    L[2] = L[2].replace('send="1"', 'send="-1"')
    msg, _ = err(L, line=5)
    assert "has no send peer" in msg


def test_two_thread_blocks_on_one_connection():
    L = ag2()
    extra = ['    <tb id="1" send="1" recv="-1" chan="0">',
             '      <step s="0" type="s" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" '
             'hasdep="0"/>', '    </tb>']
    msg, _ = err(L[:7] + extra + L[7:], line=8)
    assert "both send to gpu 1 on channel 0" in msg


def test_unmatched_messages_and_counts():
    L = ag2()
    del L[11]                                     # gpu 1 no longer sends: gpu 0's receive waits forever
    L[11] = L[11].replace('s="2"', 's="1"')
    msg, _ = err(L, line=6)
    assert "gpu 0 receives 1 message(s) from gpu 1 on channel 0, but gpu 1 sends 0" in msg
    L = ag2()
    L[12] = L[12].replace('cnt="1"', 'cnt="2"').replace('dstoff="0"', 'dstoff="0"')
    msg, _ = err(L, line=13)
    assert "received with cnt=2" in msg


def test_dependency_errors():
    L = ag2()
    L[4] = L[4].replace('depid="-1" deps="-1"', 'depid="0" deps="0"')
    msg, _ = err(L, line=5)
    assert "own thread block" in msg or "never signals" in msg
    L = ag2()
    L[3] = L[3].replace('type="cpy"', 'type="nop"').replace('cnt="1"', 'cnt="0"')
    msg, _ = err(L, line=4)
    assert "nop step without a dependency" in msg


def two_tb_ag2(dep: bool) -> list[str]:
    """gpu 0 copies in TB 1 and sends from TB 0; with dep=False nothing orders them."""
    L = ag2()
    cpy = L[3]
    L[3] = L[4].replace('s="1"', 's="0"').replace(
        'depid="-1" deps="-1"', 'depid="1" deps="0"' if dep else 'depid="-1" deps="-1"')
    L[4] = L[5].replace('s="2"', 's="1"')
    del L[5]
    local = ['    <tb id="1" send="-1" recv="-1" chan="0">',
             cpy.replace('hasdep="0"', 'hasdep="1"' if dep else 'hasdep="0"'), '    </tb>']
    return L[:6] + local + L[6:]


def test_race_is_reported_and_dependency_fixes_it():
    ir = import_xml_text("\n".join(two_tb_ag2(True)))
    assert computes(ir, False)
    msg, _ = err(two_tb_ag2(False))
    assert "data race on rank 0 output chunk 0" in msg and "neither waits for the other" in msg


def test_deadlock_is_reported():
    L = ag2()
    # gpu 0 receives before it sends, gpu 1 too: each waits for the other
    for a, b in ((4, 5), (11, 12)):
        sa, sb = L[a], L[b]
        L[a] = sb.replace('s="2"', 's="1"')
        L[b] = sa.replace('s="1"', 's="2"')
    msg, _ = err(L)
    assert msg.startswith("deadlock") and "gpu 0 thread block 0" in msg and "gpu 1 thread block 0" in msg


def test_wrong_result_is_reported():
    L = ag2()
    L[12] = L[12].replace('dstoff="0"', 'dstoff="1"', 1)
    msg, _ = err(L)
    assert "does not implement allgather" in msg and "rank 1 output chunk 0" in msg


def ar2_double() -> list[str]:
    lines = ['<algo name="ar2" proto="LL" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" inplace="0">']
    for r in (0, 1):
        q = 1 - r
        lines += [f'  <gpu id="{r}" i_chunks="2" o_chunks="2" s_chunks="0">',
                  f'    <tb id="0" send="{q}" recv="{q}" chan="0">',
                  '      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="2" depid="-1" '
                  'deps="-1" hasdep="0"/>',
                  '      <step s="1" type="rrc" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="2" depid="-1" '
                  'deps="-1" hasdep="0"/>',
                  '      <step s="2" type="re" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="2" depid="-1" '
                  'deps="-1" hasdep="0"/>',
                  '    </tb>', '  </gpu>']
    return lines + ['</algo>']


def test_double_counting_is_reported():
    L = ar2_double()
    msg, _ = err(L, line=6)
    assert "counts rank {0} twice" in msg
    ok = [x for x in L if 'type="re"' not in x]
    ok = [x.replace('s="2"', 's="2"') for x in ok]
    ir = import_xml_text("\n".join(ok))
    assert computes(ir, False)


AG2_CLOBBER = """<algo name="clobber" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allgather" inplace="{ip}" outofplace="1">
  <gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="1" recv="1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="cpy" srcbuf="o" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="3" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="1" o_chunks="2" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="cpy" srcbuf="i" srcoff="0" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="s" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="2" type="r" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
</algo>
"""


def test_parking_a_chunk_in_a_slot_of_another_size_is_refused():
    """Rank 0 parks the received chunk 1 in output slot 0 (chunk 0's place), then copies it to
    slot 1: at an odd element count chunk 1 is one element larger than slot 0. Refused at the
    copy; in place, the parked chunk also clobbers the rank's own chunk (the prover says so first)."""
    msg, text = err(AG2_CLOBBER.format(ip=0).splitlines(), line=6)
    assert "differ in size at 1 element (0 vs 1)" in msg, text
    msg, text = err(AG2_CLOBBER.format(ip=1).splitlines())
    assert "rank 0 output chunk 0 (in-place run) must hold chunk 0" in msg and "holds chunk 1" in msg


def test_fused_reductions_must_share_a_count():
    text = (ROOT / "examples" / "msccl" / "allreduce_allpairs_4.xml").read_text()
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if 'type="re" srcbuf="s" srcoff="2" dstbuf="o" dstoff="0"' in ln)
    lines[i] = lines[i].replace('cnt="1"', 'cnt="2"')
    msg, _ = err(lines, line=i + 1)
    assert "fuse this reduction with step" in msg


# ------------------------------------------------------------------ robustness
@given(st.data())
@settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_files_fail_cleanly(data):
    text = SAMPLES[data.draw(st.integers(0, len(SAMPLES) - 1))].read_text()
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(text) - 1))
        kind = data.draw(st.sampled_from(["delete", "insert", "digit"]))
        if kind == "delete":
            text = text[:i] + text[i + data.draw(st.integers(1, 5)):]
        elif kind == "insert":
            text = text[:i] + data.draw(st.sampled_from(['"', "<", ">", "=", " ", "-1", "x", "&", "/"])) + text[i:]
        else:
            m = list(re.finditer(r"\d+", text))
            j = m[data.draw(st.integers(0, len(m) - 1))]
            text = text[:j.start()] + str(data.draw(st.integers(-2, 70))) + text[j.end():]
    try:
        ir = import_xml_text(text, "m.xml")
    except CompileError as e:
        rendered = render_all(e)
        assert rendered.startswith("m.xml:"), rendered
        return
    for inplace in modes(ir):     # whatever is accepted is proven, so it computes the collective
        assert computes(ir, inplace)


# ------------------------------------------------------------------ generated kernels (CPU emulation)
launcher = importlib.util.find_spec("hccc.runtime.launcher")
needs_launcher = pytest.mark.skipif(launcher is None, reason="hccc.runtime.launcher is not available")


@needs_launcher
def test_exported_program_runs_on_cpu_kernels():
    from hccc.runtime.launcher import run_program
    ir = load_program(ROOT / "examples" / "ring_allreduce_8.rccl")
    back = import_xml_text(export_xml(ir))
    back.chunk_bytes = 1024                 # many micro-batches per chunk
    res = run_program(back, backend="cpu", nbytes=8 * 8192, timeout_s=20)
    assert res.ok


@needs_launcher
def test_msccl_sample_runs_on_cpu_kernels():
    from hccc.runtime.launcher import run_program
    ir = import_xml(ROOT / "examples" / "msccl" / "allreduce_allpairs_4.xml")
    res = run_program(ir, backend="cpu", nbytes=4 * 1024, timeout_s=20)   # one micro-batch per chunk
    assert res.ok


@needs_launcher
@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "msccl").glob("*.xml")), ids=lambda p: p.name)
def test_msccl_samples_run_at_sizes_with_many_slices(path, capsys):
    """``hccc run X.xml`` at a size the size-aware slice would cut into many micro-batches: an
    algorithm-level import must still run one micro-batch per chunk (or it deadlocks). One timed
    run and no warm-up: the checked launches (in and out of place) are what prove it."""
    from hccc.cli import main

    assert main(["run", str(path), "--bytes", "3M", "--iters", "1", "--warmup", "0", "--timeout", "5", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)["results"][0]
    assert res["wrong"] == 0 and res["stuck"] is None and res["slice_bytes"] >= (3 << 20) // 16
