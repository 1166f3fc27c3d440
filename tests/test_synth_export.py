"""What hccc synthesizes, hccc exports: programs synthesized on random small clusters become MSCCL
XML (one instance and two, the channels a header declares included) and an MSCCL++ plan; each
export is read back by its importer (which proves the collective) and run by an independent
emulator of its engine (tests/msccl_emulator.py, tests/mscclpp_interp.py)."""
from __future__ import annotations

import json
from pathlib import Path
import xml.etree.ElementTree as ET

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hccc.compiler.frontend import parse_rccl
from hccc.compiler.interop.msccl_export import export_algorithm
from hccc.compiler.interop.msccl_format import XmlLimits
from hccc.compiler.interop.msccl_xml import import_xml_text
from hccc.compiler.interop.mscclpp_export import export_plan, node_map, plan_text
from hccc.compiler.interop.mscclpp_import import import_plan_text
from hccc.compiler.passes.build import build_algorithm_level
from hccc.compiler.passes.verify import verify
from hccc.compiler.synth import synthesize, to_rccl

import msccl_emulator as emu
from mscclpp_interp import check_plan
from synth_oracles import mixed_clusters

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def _header_channels(text: str, k: int) -> str:
    """The .rccl text with its header declaring ``k`` channels (as a user edits it)."""
    head, sep, rest = text.partition("nChannels=1")
    assert sep, "the synthesized header declares nChannels=1"
    return f"{head}nChannels={k}{rest}"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topo=mixed_clusters(max_nodes=2, max_gpus=3),
       coll=st.sampled_from(["allgather", "reducescatter", "allreduce"]),
       k=st.sampled_from([1, 2]), channels=st.sampled_from([1, 2]))
def test_synthesized_programs_export_to_both_engines(topo, coll, k, channels):
    if topo.nranks < 2:
        return
    res = synthesize(topo, coll, time_limit=2, chunks_per_rank=k)
    alg = parse_rccl(_header_channels(to_rccl(res, topo), channels), "synth.rccl")
    verify(alg)
    # MSCCL XML: the header's channels are instances (the compile's rule), and a step limit small
    # enough that long connections are cut over channels
    for lim in (XmlLimits(), XmlLimits(max_steps=4)):
        _, text = export_algorithm(alg, lim, instances=channels)
        tbs = [tb for gpu in ET.fromstring(text) for tb in gpu]
        assert max(len(tb) for tb in tbs) <= lim.max_steps
        import_xml_text(text, "synth.xml")             # proves the collective
        emu.check(text, seed=k, capacity=2)
    # MSCCL++ plan, one instance and the header's channels as instances: what is written is what runs
    ir = build_algorithm_level(alg)
    for instances in sorted({1, channels}):
        plan = export_plan(ir, nodes=node_map(ir.nranks, alg.header.gpu_per_node), instances=instances)
        text = plan_text(plan)
        import_plan_text(text, "synth.json")           # proves the collective
        check_plan(json.loads(text), 1, seed=k)


def test_synthesized_program_with_two_channels_exports_from_the_command_line(tmp_path, capsys):
    """The tutorial's flow: a synthesized AllGather whose header declares nChannels=2 exports with
    `hccc xml` (its channels as instances, and --instances 2 on top) and `hccc plan`; each file is
    proven when read back and computes the collective in its engine's emulator."""
    from hccc.cli import main
    from hccc.compiler.pipeline import load_cluster

    topo = load_cluster(CLUSTERS / "heteccl_fig10.topo")
    res = synthesize(topo, "allgather", time_limit=3, chunks_per_rank=2)
    src = tmp_path / "ag.rccl"
    src.write_text(_header_channels(to_rccl(res, topo), 2))
    for extra, k in (([], 2), (["--instances", "1"], 2), (["--instances", "2"], 4)):
        out = tmp_path / "ag.xml"
        assert main(["xml", str(src), "-o", str(out), *extra]) == 0, capsys.readouterr().err
        text = out.read_text()
        assert ET.fromstring(text).get("nchannels") == str(k)
        import_xml_text(text, "ag.xml")
        emu.check(text, seed=k, capacity=2)
    out = tmp_path / "ag.mscclpp.json"
    assert main(["plan", str(src), "-o", str(out)]) == 0, capsys.readouterr().err
    import_plan_text(out.read_text(), "ag.json")
    check_plan(json.loads(out.read_text()), 1, seed=2)
