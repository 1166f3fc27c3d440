"""benchmarks/synth_speed.py's clusters: the held-out 64-GPU clusters of the speed targets
(``--asym``) and the one built there to check that a speed-up carries over (``--ladder``)."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from hccc.compiler.cluster.topo_parser import parse_topology
from hccc.compiler.synth import network_from_topology
from hccc.compiler.synth.symmetry import class_symmetry, node_symmetry, period_symmetry

ROOT = Path(__file__).resolve().parent.parent


def _speed():
    sys.path.insert(0, str(ROOT / "benchmarks"))      # synth_speed imports synth_quality
    spec = importlib.util.spec_from_file_location("synth_speed", ROOT / "benchmarks" / "synth_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_ladder_cluster_has_64_gpus_in_nodes_each_unlike_the_others():
    """Ten nodes, 64 GPUs, two vendors; no two nodes alike (their links and NICs as the parser
    reads them), so none of the symmetries synthesis reduces by applies."""
    topo = parse_topology(_speed().ladder_text(), "ladder")
    assert topo.nranks == 64
    text = _speed().ladder_text()
    bodies = re.split(r"\ndefine node\d+ = \d+\n", text)[1:]    # each node's lines after its size
    assert len(bodies) == 10
    assert len(set(bodies)) == 10
    assert {"vendor = nvidia", "vendor = amd"} <= {ln.strip().removeprefix("define ") for b in bodies
                                                    for ln in b.splitlines()}
    net = network_from_topology(topo)
    assert node_symmetry(net) is None and period_symmetry(net) is None and class_symmetry(net) is None


def test_cases_name_the_clusters_asked_for():
    """``--no-multirail --asym 1,2 --ladder --collectives allgather`` times exactly those three
    clusters' AllGather; the default stays the multi-rail clusters (64 GPUs, three collectives,
    and 512 GPUs' AllGather)."""
    speed = _speed()
    got = speed.cases(False, True, False, (1, 2), True, ("allgather",))
    assert [(Path(t).stem, c) for t, c in got] == [("asym1", "allgather"), ("asym2", "allgather"),
                                                   ("ladder", "allgather")]
    assert parse_topology(Path(got[0][0]).read_text(), "asym1").nranks == 64
    default = speed.cases(False, True)
    assert [(Path(t).stem, c) for t, c in default] == [("multirail_64", c) for c in speed.COLLECTIVES] + \
        [("multirail_512", "allgather")]
