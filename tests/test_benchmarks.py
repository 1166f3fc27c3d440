"""The benchmark scripts' building blocks (the scripts themselves are run by hand: see each one)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from hccc.compiler.cluster.topo_parser import load_topology
from hccc.compiler.passes.verify import verify

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mixed_vendor_compares_ring_c2c_and_synthesis():
    mv = _load("mixed_vendor")
    topo = load_topology(ROOT / "examples" / "clusters" / "mixed_v100_w7800.topo")
    for coll in ("allgather", "allreduce"):
        algs = mv.algorithms(topo, coll, None, synth_time=5.0)
        labels = [a[0] for a in algs]
        assert labels[0] == "flat ring" and any(lb.startswith("c2c") for lb in labels)
        assert labels[-1].startswith("synth") and algs[-1][3] is not None
        for _, alg, hier, _ in algs:
            assert verify(alg).collective.value == coll and hier.nclusters == 2
        assert [a[0] for a in mv.algorithms(topo, coll, None, synth_time=None)] == labels[:-1]
