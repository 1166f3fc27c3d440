"""MSCCL export of algorithms in step order: busbw kept under algorithm-level execution, fused steps,
instances, and the up-front limit check on the transfer table."""
from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend import generators as G
from hccc.util.diagnostics import CompileError
from hccc.compiler.interop.msccl_export import export_algorithm, export_xml
from hccc.compiler.interop.msccl_format import SUPPORTED_COLLECTIVES, XmlLimits
from hccc.compiler.interop.msccl_limits import check_algorithm_fits
from hccc.compiler.interop.msccl_xml import import_xml_text
from hccc.compiler.passes.build import build_algorithm_level
from hccc.compiler.pipeline import load_algorithm, load_cluster
from hccc.runtime.simulator import simulate
from hccc.testing import valid_programs

import msccl_emulator as emu
from msccl_checks import same_results, structure

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
CL = EX / "clusters"

#: (algorithm, cluster) pairs of the examples whose rank counts match
PAIRS = [("ring_allreduce_8", "a100_topo1"), ("ring_allgather_8", "a100_topo1"),
         ("ring_reducescatter_8", "a100_topo1"), ("hm_allreduce_2x4", "a100_topo1"),
         ("hm_allgather_2x4", "a100_topo1"), ("hm_allreduce_2x8", "a100_topo2")]


def _types(text: str) -> collections.Counter:
    return collections.Counter(re.findall(r'type="(\w+)"', text))


@pytest.mark.parametrize("name,cluster", PAIRS)
def test_export_keeps_the_programs_algorithm_level_busbw(name, cluster):
    """The exported XML, read back and simulated under algorithm-level execution, keeps >= 98% of
    the busbw the algorithm itself reaches under that execution (the simulator is the oracle)."""
    alg = load_algorithm(EX / f"{name}.rccl")
    topo = load_cluster(CL / f"{cluster}.topo")
    ir, text = export_algorithm(alg)
    structure(text)
    back = import_xml_text(text)
    size = 256 << 20
    prog = simulate(build_algorithm_level(alg), topo, size, execution="algorithm", slice_bytes="auto").busbw_GBps
    xml = simulate(back, topo, size, execution="algorithm", slice_bytes="auto").busbw_GBps
    assert xml >= 0.98 * prog, f"XML {xml:.2f} GB/s vs program {prog:.2f} GB/s"


def test_fused_ring_allreduce_has_msccl_tools_step_shape():
    """Ring AllReduce on 8 ranks: s, 6 rrs, rrcs, 6 rcs, r per rank = 15 steps (msccl-tools' 120)."""
    alg = load_algorithm(EX / "ring_allreduce_8.rccl")
    _, text = export_algorithm(alg, fuse=True)
    structure(text)
    assert text.count("<step ") == 120 and text.count("<tb ") == 8
    assert _types(text) == {"s": 8, "rrs": 48, "rrcs": 8, "rcs": 48, "r": 8}
    back = import_xml_text(text)             # proves the collective, checks deadlock freedom
    same_results(build_algorithm_level(alg), back)
    for inplace in (False, True):
        emu.check(text, inplace=inplace, seed=2, capacity=2)


def test_unfused_export_has_no_fused_steps_and_fused_has_fewer_steps():
    alg = load_algorithm(EX / "ring_reducescatter_8.rccl")
    _, plain = export_algorithm(alg)
    _, fused = export_algorithm(alg, fuse=True)
    assert not {"rcs", "rrcs", "rrs"} & set(_types(plain))
    assert {"rrcs"} <= set(_types(fused))
    assert fused.count("<step ") < plain.count("<step ")


@pytest.mark.parametrize("k", [2, 3])
def test_instances_multiply_thread_blocks_and_chunks(k):
    alg = load_algorithm(EX / "hm_allgather_2x4.rccl")
    _, one = export_algorithm(alg)
    _, many = export_algorithm(alg, instances=k)
    structure(many)
    assert many.count("<tb ") == k * one.count("<tb ")
    assert many.count("<step ") == k * one.count("<step ")
    n1 = int(re.search(r'nchunksperloop="(\d+)"', one).group(1))
    assert f'nchunksperloop="{n1 * k}"' in many
    chans = {int(c) for c in re.findall(r'chan="(\d+)"', many)}
    assert len(chans) == k * len({int(c) for c in re.findall(r'chan="(\d+)"', one)})
    import_xml_text(many)
    emu.check(many, seed=5, capacity=2)


def _counting_importer(monkeypatch) -> list:
    """Calls of the importer by the exporter, recorded (the importer itself still runs)."""
    import hccc.compiler.interop.msccl_import as mi
    calls, real = [], mi.import_xml_text
    monkeypatch.setattr(mi, "import_xml_text", lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


@pytest.mark.parametrize("name", ["hm_allreduce_2x4", "ring_reducescatter_8", "hm_allgather_2x4"])
def test_one_chunk_instances_are_a_renaming(monkeypatch, name):
    """Instances of one-chunk steps are written without re-reading them (a renaming of the chunks);
    the importer (an independent proof) and the emulator confirm they compute the collective."""
    calls = _counting_importer(monkeypatch)
    _, text = export_algorithm(load_algorithm(EX / f"{name}.rccl"), instances=3)
    assert calls == []
    assert set(re.findall(r' cnt="(\d+)"', text)) <= {"0", "1"}
    import_xml_text(text)
    emu.check(text, seed=3, capacity=2)


def _broken_limits(text: str, lim: XmlLimits) -> list[str]:
    """The runtime limits an MSCCL XML text breaks, read off the text alone (the oracle of the
    exporter's limit check)."""
    import xml.etree.ElementTree as ET

    algo = ET.fromstring(text)
    ngpus = len(algo)
    broken = []
    if int(algo.get("nchannels")) > lim.max_channels:
        broken.append("channels")
    for gpu in algo:
        tbs = list(gpu)
        steps = [list(tb) for tb in tbs]
        if len(tbs) > lim.max_tbs:
            broken.append("tbs")
        if 1 + ngpus + len(tbs) + sum(map(len, steps)) > lim.max_xml_nodes:
            broken.append("elements")
        if len(tbs) > lim.max_children or ngpus > lim.max_children:
            broken.append("children")
        for end in ("send", "recv"):
            per = collections.Counter(tb.get("chan") for tb in tbs if tb.get(end) != "-1")
            if per and max(per.values()) > lim.max_tbs_per_channel:
                broken.append("tbs per channel")
        for tb, ss in zip(tbs, steps):
            if len(ss) > lim.max_steps:
                broken.append("steps")
            for x in ss:
                cnt = int(x.get("cnt"))
                if cnt > lim.max_count:
                    broken.append("count")
                if any(x.get(f) != "-1" and int(x.get(f)) + cnt - 1 > lim.max_offset for f in ("srcoff", "dstoff")):
                    broken.append("offset")
                if int(x.get("depid")) > lim.max_dep_tb:
                    broken.append("dependency")
    return sorted(set(broken))


def _limit_check_is_the_xml_oracle(ir, merge, k, lim) -> None:
    import hccc.compiler.interop.msccl_export as me
    from hccc.compiler.interop import msccl_prims as mp
    from hccc.compiler.interop import msccl_tbs as mt
    from hccc.compiler.interop.msccl_text import xml_text

    full = mt.lay_out(mp.unfuse(mp.allgather_sources(ir, mp.from_ir(ir))), lim, lim.max_steps if merge else 0, k)
    broken = _broken_limits(xml_text(ir, full, lim, k), lim)
    try:
        me._check_limits(ir, full, lim)
        refused = []
    except CompileError as exc:
        refused = [d.message for d in exc.diagnostics]
    assert bool(refused) == bool(broken), (refused, broken)
    assert len(refused) == len(broken) or "children" in broken


_limits = st.builds(lambda steps, tbs, dep, nodes, per, ch, short: (steps, tbs, dep, nodes, per, ch, short),
                    st.integers(4, 64), st.integers(2, 16), st.integers(1, 12), st.integers(40, 2000),
                    st.integers(1, 4), st.integers(1, 8), st.integers(0, 3))


def _lim(ir, k, drawn) -> XmlLimits:
    """Drawn limits; the offset limit at the largest offset k instances can use, or up to 3 below."""
    steps, tbs, dep, nodes, per, ch, short = drawn
    top = max(ir.in_chunks, ir.out_chunks, ir.scratch_chunks) * k - 1
    return XmlLimits(max_steps=steps, max_tbs=tbs, max_offset=max(0, top - short), max_dep_tb=dep,
                     max_xml_nodes=nodes, max_channels=ch, max_tbs_per_channel=per)


@given(valid_programs(SUPPORTED_COLLECTIVES, max_ranks=5), st.booleans(), st.integers(1, 4), _limits)
@settings(max_examples=60, deadline=None)
def test_limit_check_agrees_with_the_written_xml(alg, merge, k, drawn):
    """The exporter's limit check (on its columns, instances materialised) refuses a layout exactly
    when the XML written from it breaks a limit read off the text."""
    ir = build_algorithm_level(alg)
    _limit_check_is_the_xml_oracle(ir, merge, k, _lim(ir, k, drawn))


@given(st.sampled_from(sorted((EX / "msccl").glob("*.xml"))), st.booleans(), st.integers(1, 3), _limits,
       st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_limit_check_agrees_with_the_xml_of_multi_chunk_steps(path, merge, k, drawn, count):
    """The same on MSCCL XML programs, whose steps move several chunks at once (offset and count
    limits at the ends of ranges)."""
    from hccc.compiler.interop.msccl_xml import import_xml

    ir = import_xml(path)
    lim = _lim(ir, k, drawn)
    lim = XmlLimits(**{**lim.__dict__, "max_count": count})
    _limit_check_is_the_xml_oracle(ir, merge, k, lim)


def test_offset_limit_counts_the_end_of_a_multi_chunk_source_range():
    """A two-rank ReduceScatter that sends input chunks [2, 4) in one step: its largest offset is 3,
    on the send's source only (the receiver stores at [0, 2))."""
    from hccc.compiler.interop.msccl_xml import import_xml_text

    def tb(peer, own, other):
        return (f'    <tb id="0" send="{peer}" recv="{peer}" chan="0">\n'
                f'      <step s="0" type="s" srcbuf="i" srcoff="{other}" dstbuf="o" dstoff="0" cnt="2" depid="-1" '
                f'deps="-1" hasdep="0"/>\n'
                f'      <step s="1" type="rrc" srcbuf="i" srcoff="{own}" dstbuf="o" dstoff="0" cnt="2" depid="-1" '
                f'deps="-1" hasdep="0"/>\n    </tb>\n')
    text = ('<algo name="rs2" proto="Simple" nchannels="1" nchunksperloop="4" ngpus="2" coll="reducescatter" '
            'inplace="0" outofplace="1" minBytes="0" maxBytes="0">\n'
            + "".join(f'  <gpu id="{r}" i_chunks="4" o_chunks="2" s_chunks="0">\n{tb(1 - r, 2 * r, 2 - 2 * r)}  </gpu>\n'
                      for r in range(2)) + "</algo>\n")
    ir = import_xml_text(text, "rs2.xml")
    assert export_xml(ir, XmlLimits(max_offset=3))
    with pytest.raises(CompileError, match="uses chunk offset 3"):
        export_xml(ir, XmlLimits(max_offset=2))


def _renamed(one: str, k: int) -> list:
    """The k-instance XML expected from the one-instance text, by msccl-tools' instance rule read
    off the XML itself: TB ``t`` becomes TBs ``t*k + i`` on channels ``i*nch + ch``, a step on chunks
    ``[off, off+cnt)`` uses ``[off*k + i*cnt, ...)`` in instance ``i`` and waits for TB ``depid*k + i``."""
    import xml.etree.ElementTree as ET

    algo = ET.fromstring(one)
    nch = int(algo.get("nchannels"))
    head = dict(algo.attrib, nchannels=str(nch * k), nchunksperloop=str(int(algo.get("nchunksperloop")) * k))
    gpus = []
    for gpu in algo:
        g = dict(gpu.attrib, **{f"{b}_chunks": str(int(gpu.get(f"{b}_chunks")) * k) for b in "ios"})
        tbs = []
        for tb in sorted(gpu, key=lambda t: int(t.get("id"))):
            for i in range(k):
                steps = []
                for st_ in tb:
                    a = dict(st_.attrib)
                    cnt = int(a["cnt"])
                    for f in ("srcoff", "dstoff"):
                        if a[f] != "-1":
                            a[f] = str(int(a[f]) * k + i * cnt)
                    if a["depid"] != "-1":
                        a["depid"] = str(int(a["depid"]) * k + i)
                    steps.append(a)
                tbs.append((dict(tb.attrib, id=str(int(tb.get("id")) * k + i),
                                 chan=str(i * nch + int(tb.get("chan")))), steps))
        gpus.append((g, tbs))
    return [head, gpus]


def _parsed(text: str) -> list:
    import xml.etree.ElementTree as ET

    algo = ET.fromstring(text)
    return [dict(algo.attrib), [(dict(g.attrib), [(dict(t.attrib), [dict(x.attrib) for x in t]) for t in g])
                                for g in algo]]


@pytest.mark.parametrize("name", ["direct_alltoall_8", "hierarchical_alltoall_2x4", "hm_allreduce_2x4",
                                  "ring_allgather_8"])
@pytest.mark.parametrize("k", [2, 3])
def test_instances_are_the_renamed_one_instance_export(name, k):
    """Every element of a k-instance export (nop steps and their dependencies included) is the
    one-instance export's, renamed by the instance rule (an oracle that reads only the XML)."""
    alg = load_algorithm(EX / f"{name}.rccl")
    _, one = export_algorithm(alg)
    _, many = export_algorithm(alg, instances=k)
    assert _parsed(many) == _renamed(one, k)


def _step(s, t, sb, so, db, do, cnt):
    return (f'      <step s="{s}" type="{t}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" '
            f'cnt="{cnt}" depid="-1" deps="-1" hasdep="0"/>')


def _two_rank_allreduce(split_back: bool) -> str:
    """Rank 0 sends both chunks in one step, rank 1 reduces them in one step and sends the sums back
    in one step, or (``split_back``) one chunk per step."""
    back = ([_step(1, "s", "o", 0, "o", 0, 1), _step(2, "s", "o", 1, "o", 1, 1)] if split_back
            else [_step(1, "s", "o", 0, "o", 0, 2)])
    recv = ([_step(1, "r", "i", 0, "o", 0, 1), _step(2, "r", "i", 0, "o", 1, 1)] if split_back
            else [_step(1, "r", "i", 0, "o", 0, 2)])
    head = '  <gpu id="{r}" i_chunks="2" o_chunks="2" s_chunks="0">\n    <tb id="0" send="{q}" recv="{q}" chan="0">'
    return "\n".join(['<algo name="ar2" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" '
                      'coll="allreduce" inplace="0" outofplace="1">',
                      head.format(r=0, q=1), _step(0, "s", "i", 0, "o", 0, 2), *recv, "    </tb>", "  </gpu>",
                      head.format(r=1, q=0), _step(0, "rrc", "i", 0, "o", 0, 2), *back, "    </tb>", "  </gpu>",
                      "</algo>"])


def test_multi_chunk_instances_are_a_renaming(monkeypatch):
    """Multi-chunk ranges are renamed by segments of the collective (one renaming for every step),
    so instances are correct without a second proof even where two steps see one chunk in
    different ranges (a two-chunk reduce whose sums go back one chunk per step: renamed per step,
    instance 0 would send a sum instance 1 writes). The independent emulator checks both."""
    calls = _counting_importer(monkeypatch)
    for split_back in (False, True):
        prog = import_xml_text(_two_rank_allreduce(split_back=split_back))
        for k in (2, 3):
            text = export_xml(prog, instances=k)
            emu.check(text, seed=k, capacity=2)
            import_xml_text(text)                   # and the importer proves it
    assert not calls                                # the exporter re-read none


@given(valid_programs(SUPPORTED_COLLECTIVES, max_ranks=6), st.booleans(), st.integers(1, 3), st.integers(0, 4))
@settings(max_examples=25, deadline=None)
def test_random_algorithms_export_correctly(alg, fuse, k, seed):
    """Every export (fused or not, any instance count) is proven by the importer and computes the
    collective in the independent emulator."""
    _, text = export_algorithm(alg, XmlLimits(max_steps=256, max_tbs=1024), fuse=fuse, instances=k)
    structure(text)
    back = import_xml_text(text)
    if k == 1:
        same_results(build_algorithm_level(alg), back, seed=seed)
    emu.check(text, seed=seed, capacity=2)


@given(valid_programs(SUPPORTED_COLLECTIVES, max_ranks=6), st.booleans(), st.integers(1, 3),
       st.integers(1, 12), st.integers(8, 200), st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_up_front_check_refuses_only_what_the_export_refuses(alg, fuse, k, max_steps, max_nodes, per_channel):
    """The transfer-table check is a lower bound: whatever it refuses, the full export refuses too."""
    lim = XmlLimits(max_steps=max_steps, max_xml_nodes=max_nodes, max_tbs_per_channel=per_channel,
                    max_channels=4)
    try:
        check_algorithm_fits(alg, lim, instances=k, fuse=fuse)
        return
    except CompileError:
        pass
    with pytest.raises(CompileError):
        export_xml(build_algorithm_level(alg), lim, fuse=fuse, instances=k)


def _on_channels(alg, channels):
    """``alg`` with its transfers on the given channels (a column, cycled to the transfer count)."""
    import dataclasses

    import numpy as np
    ch = np.resize(np.asarray(channels, np.int64), len(alg.src)) if len(alg.src) else np.zeros(0, np.int64)
    return dataclasses.replace(alg, channel=ch)


@given(valid_programs(SUPPORTED_COLLECTIVES, max_ranks=5), st.lists(st.integers(0, 5), min_size=1, max_size=12),
       st.booleans(), st.integers(1, 2), st.integers(1, 6), st.integers(1, 5))
@settings(max_examples=40, deadline=None)
def test_up_front_check_counts_channels_and_refuses_only_what_the_export_refuses(alg, channels, fuse, k, max_steps,
                                                                                 max_channels):
    """Transfers of one pair on different channels are connections of their own, so the up-front
    check counts them (a pair on more channels than the runtime has is refused before anything is
    built), and it stays a lower bound: whatever it refuses, the full export refuses too."""
    alg = _on_channels(alg, channels)
    lim = XmlLimits(max_steps=max_steps, max_channels=max_channels, max_tbs_per_channel=32)
    try:
        check_algorithm_fits(alg, lim, instances=k, fuse=fuse)
        return
    except CompileError:
        pass
    with pytest.raises(CompileError):
        export_xml(build_algorithm_level(alg), lim, fuse=fuse, instances=k)


def test_pair_on_more_channels_than_the_runtime_is_refused_up_front(monkeypatch):
    """A ring AllGather whose every transfer of a pair is on a channel of its own: 8 ranks, 7
    transfers a pair, 7 channels: refused from the transfer table at 4 channels (the oracle:
    counted here by hand, 7 distinct channels on the pair 0 -> 1), accepted at 8."""
    import hccc.compiler.passes.build as build
    alg = G.ring_allgather(8)
    steps = alg.step.copy()
    alg = _on_channels(alg, steps)                    # a ring sends one chunk a step on each pair
    assert len({int(c) for s, d, c in zip(alg.src, alg.dst, alg.channels) if (s, d) == (0, 1)}) == 7
    check_algorithm_fits(alg, XmlLimits(max_channels=8))
    monkeypatch.setattr(build, "build_algorithm_level", lambda *a, **k: pytest.fail("built a refused program"))
    with pytest.raises(CompileError, match="to rank 1 on 7 channels .* 7 connections .* has 4 channels"):
        export_algorithm(alg, XmlLimits(max_channels=4))


def test_large_program_is_refused_before_anything_is_built(monkeypatch):
    """1,024 GPUs of HM AllReduce cannot fit the runtimes: refused from the transfer table alone."""
    import hccc.compiler.passes.build as build

    def boom(*a, **k):
        raise AssertionError("built a program the limits refuse")

    monkeypatch.setattr(build, "build_algorithm_level", boom)
    alg = G.hm_allreduce(128, 8)
    with pytest.raises(CompileError, match="XML elements"):
        export_algorithm(alg)
    with pytest.raises(CompileError, match="steps per thread block cut that into .* channels"):
        export_algorithm(alg, XmlLimits(max_channels=1))
    with pytest.raises(CompileError, match="XML elements"):
        export_algorithm(alg, XmlLimits(max_steps=1024))


def test_export_algorithm_refuses_rooted_collectives():
    alg = load_algorithm(EX / "ring_broadcast_8.rccl")
    with pytest.raises(CompileError, match="no root attribute"):
        export_algorithm(alg)


def test_cli_xml_options(tmp_path, capsys):
    from hccc.cli import main

    out = tmp_path / "r.xml"
    assert main(["xml", str(EX / "ring_allreduce_8.rccl"), "-o", str(out), "--xml-fuse", "--instances", "2"]) == 0
    text = out.read_text()
    assert text.count("<tb ") == 16 and 'nchunksperloop="16"' in text and "rrs" in text
    kern = tmp_path / "k.xml"
    assert main(["xml", str(EX / "hm_allreduce_2x4.rccl"), "-o", str(kern), "--xml-order", "kernel"]) == 0
    import_xml_text(kern.read_text())
    capsys.readouterr()
    assert main(["xml", str(EX / "hm_allreduce_2x4.rccl"), "-o", str(tmp_path / "e.xml"),
                 "--xml-max-elements", "30"]) == 1
    assert "--xml-max-elements" in capsys.readouterr().err


def test_compile_writes_the_step_ordered_export(tmp_path):
    """``hccc ALGO -o OUT`` writes the same XML as ``hccc xml ALGO``; ``--xml-order kernel`` the
    export of the kernels' own IR; a program past the limits gets kernels and a warning only."""
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.pipeline import CompileOptions, compile_algorithm

    alg = load_algorithm(EX / "hm_allreduce_2x4.rccl")
    assert alg.header.nchannels == 4          # one MSCCL instance per declared channel
    _, text = export_algorithm(alg, fuse=True, instances=2 * 4)
    compile_algorithm(alg, tmp_path / "a", CompileOptions(xml_fuse=True, xml_instances=2))
    assert (tmp_path / "a" / "hm_allreduce_2x4.xml").read_text() == text
    compile_algorithm(alg, tmp_path / "b", CompileOptions(xml_order="kernel"))
    assert (tmp_path / "b" / "hm_allreduce_2x4.xml").read_text() == export_xml(build_program(alg), instances=4)
    _, _, notes = compile_algorithm(alg, tmp_path / "c", CompileOptions(),
                                    xml_limits=XmlLimits(max_steps=2, max_channels=4))
    assert not (tmp_path / "c" / "hm_allreduce_2x4.xml").exists()
    assert any("MSCCL XML not written" in n and "--xml-max-steps" in n for n in notes)


@given(valid_programs(SUPPORTED_COLLECTIVES, max_ranks=5), st.integers(2, 8), st.integers(1, 2))
@settings(max_examples=25, deadline=None)
def test_long_connections_are_cut_to_the_step_limit(alg, max_steps, k):
    """Under a small step limit every export either keeps each thread block within it (long
    connections cut over channels of their own), is proven by the importer and computes the
    collective in the independent emulator, or is refused naming a limit; never an export over it."""
    import xml.etree.ElementTree as ET

    lim = XmlLimits(max_steps=max_steps, max_tbs=4096, max_xml_nodes=1 << 20)
    try:
        _, text = export_algorithm(alg, lim, instances=k)
    except CompileError as exc:
        assert "the algorithm does not fit the MSCCL runtime" in str(exc) or "cannot export" in str(exc)
        return
    algo = ET.fromstring(text)
    assert max(len(tb) for gpu in algo for tb in gpu) <= max_steps
    import_xml_text(text)
    emu.check(text, seed=max_steps, capacity=2)
