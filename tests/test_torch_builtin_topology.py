"""The torch backend's built-in catalog with a topology (``HCCC_TOPOLOGY``): each collective hccc
synthesizes for also gets the synthesized program, made on the first call that asks for it, read
from the cache by later runs, keyed by the topology's contents; the choice times every entry on
the topology. One process, no torch process group (the catalog is plain Python)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import needs_torch

from hccc.builtin_catalog import SYNTH_COLLECTIVES, BuiltinCatalog

#: 2 nodes x 2 GPUs, NVLink within a node and one NIC per node pair
SMALL_TOPO = """# 2 nodes x 2 GPUs
define nodenum = 2
define chunksize = 1M
""" + "".join(f"""
define node{k} = 2
define vendor = nvidia
define gpu = A100-SXM4-80GB
define gamma = 650
define bandwidth = {{direct => [((0,1) -> (25,4)), ((1,0) -> (25,4))]}}
define nic = [((0,1) -> (25,1))]
""" for k in (1, 2)) + """
define internode = all
define interbandwidth = nic
"""


@pytest.fixture
def topo(tmp_path) -> Path:
    p = tmp_path / "small.topo"
    p.write_text(SMALL_TOPO)
    return p


def _names(cat, coll, root=None):
    return sorted(e.name for e in cat._entries(coll, root))


def test_a_topology_adds_the_synthesized_program_and_the_choice_times_every_entry(topo, tmp_path):
    from hccc.compiler.pipeline import load_cluster
    from hccc.runtime.reference import execute, expected_for, inputs_for
    from hccc.runtime.simulator import simulate
    cluster = load_cluster(topo)
    cat = BuiltinCatalog(4, ["h"] * 4, cache_dir=tmp_path / "cache", topology=topo)
    assert _names(cat, "allgather") == ["direct_allgather_4", "ring_allgather_4", "synth_allgather_4"]
    synth = next(e for e in cat.entries if e.name == "synth_allgather_4")
    # the synthesized program computes its collective (hccc's reference executor)
    ins = inputs_for(synth.ir, synth.ir.nchunks * 4 * 3, "float32", seed=1)
    for got, want in zip(execute(synth.ir, [x.copy() for x in ins]), expected_for(synth.ir, ins)):
        assert (got == want).all()
    for nbytes in (4 << 10, 16 << 20):
        entry, why = cat.select("allgather", 4, nbytes, "float32", "sum", cluster=cluster)
        assert why == ""
        # the oracle: every entry that serves the size, timed by the simulator on the topology
        serving = [e for e in cat.entries if e.collective == "allgather" and e.in_band(nbytes)]
        best = min(serving, key=lambda e: (simulate(e.ir, cluster, nbytes, slice_bytes="auto").time_s, e.name))
        assert entry.name == best.name
    # a rooted collective: the root asked for
    assert "synth_broadcast_4_root2" in _names(cat, "broadcast", 2)
    assert next(e for e in cat.entries if e.name == "synth_broadcast_4_root2").ir.root == 2
    # reduce is not synthesized: generators only
    assert _names(cat, "reduce", 1) == ["direct_reduce_4_root1", "ring_reduce_4_root1"] and "reduce" not in SYNTH_COLLECTIVES


def test_the_synthesized_entry_is_built_from_the_algorithm_and_keeps_its_text(topo, tmp_path, monkeypatch):
    """Synthesis hands the catalog its Algorithm (no .rccl text is parsed); the text is kept beside
    the program, and the program is the one the compiler makes from that text."""
    from hccc.compiler.frontend import load, parse_rccl
    from hccc.compiler.passes.build import build_program

    def no_parse(*a, **k):
        raise AssertionError("parsed .rccl text")
    with monkeypatch.context() as m:
        m.setattr(load, "parse_program", no_parse)
        cat = BuiltinCatalog(4, ["h"] * 4, cache_dir=tmp_path / "cache", topology=topo)
        synth = next(e for e in cat._entries("allreduce", None) if e.name == "synth_allreduce_4")
    text = (synth.path.parent / "synth_allreduce_4.rccl").read_text()
    assert text.startswith("# Synthesised by hccc synth")
    assert synth.ir.to_json() == build_program(parse_rccl(text, "synth_allreduce_4.rccl"),
                                               name="synth_allreduce_4").to_json()


def test_the_synthesis_is_cached_across_runs_by_the_topologys_contents(topo, tmp_path, monkeypatch):
    import hccc
    cache = tmp_path / "cache"
    first = BuiltinCatalog(4, ["h"] * 4, cache_dir=cache, topology=topo)
    ir1 = next(e.ir for e in first._entries("reducescatter", None) if e.name.startswith("synth_"))

    def refuse(*a, **k):
        raise AssertionError("synthesized again")
    monkeypatch.setattr(hccc, "synthesize_program", refuse)
    again = BuiltinCatalog(4, ["h"] * 4, cache_dir=cache, topology=topo)      # a later run
    ir2 = next(e.ir for e in again._entries("reducescatter", None) if e.name.startswith("synth_"))
    assert ir2.to_json() == ir1.to_json()
    # the same contents under another path: the same entry; other contents: another one
    moved = tmp_path / "elsewhere.topo"
    moved.write_text(SMALL_TOPO)
    third = BuiltinCatalog(4, ["h"] * 4, cache_dir=cache, topology=moved)
    assert third.fingerprint == again.fingerprint
    assert _names(third, "reducescatter")[-1] == "synth_reducescatter_4"
    changed = tmp_path / "changed.topo"
    changed.write_text(SMALL_TOPO.replace("(25,4)", "(50,4)"))
    other = BuiltinCatalog(4, ["h"] * 4, cache_dir=cache, topology=changed)
    assert other.fingerprint != again.fingerprint
    with pytest.raises(AssertionError, match="synthesized again"):
        other._entries("reducescatter", None)


def test_a_topology_of_another_size_or_one_synthesis_refuses_adds_nothing(topo, tmp_path, monkeypatch):
    cat = BuiltinCatalog(8, ["h"] * 8, cache_dir=tmp_path / "cache", topology=topo)
    from hccc.builtin_catalog import plan
    assert _names(cat, "allreduce") == sorted(p[0] for p in plan("allreduce", 8, ["h"] * 8, None))
    assert "4 GPUs" in cat.synth_notes["allreduce"] and "8 ranks" in cat.synth_notes["allreduce"]
    import hccc
    from hccc.util.diagnostics import CompileError, Diagnostic
    calls = []

    def refuse(path, coll, **k):
        calls.append(coll)
        raise CompileError([Diagnostic(f"cannot synthesize {coll} here", None)])
    monkeypatch.setattr(hccc, "synthesize_program", refuse)
    cat = BuiltinCatalog(4, ["h"] * 4, cache_dir=tmp_path / "cache", topology=topo)
    assert _names(cat, "alltoall") == ["direct_alltoall_4"]
    assert "cannot synthesize alltoall here" in cat.synth_notes["alltoall"]
    again = BuiltinCatalog(4, ["h"] * 4, cache_dir=tmp_path / "cache", topology=topo)
    assert _names(again, "alltoall") == ["direct_alltoall_4"] and calls == ["alltoall"]   # the refusal is cached


def test_without_a_topology_nothing_is_synthesized(tmp_path, monkeypatch):
    import hccc
    monkeypatch.setattr(hccc, "synthesize_program", lambda *a, **k: (_ for _ in ()).throw(AssertionError("synthesized")))
    cat = BuiltinCatalog(4, ["h"] * 4, cache_dir=tmp_path / "cache")
    for coll in SYNTH_COLLECTIVES:
        assert not any(n.startswith("synth_") for n in _names(cat, coll, 0 if coll == "broadcast" else None))


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="g++ not installed")
def test_a_job_with_only_a_topology_runs_the_synthesized_programs(topo, tmp_path, monkeypatch):
    """4 processes, ``backend="hccc"``, no catalog, ``HCCC_TOPOLOGY`` the 2 x 2 topology: the 1 MiB
    AllReduce and AllGather run on the simulator's fastest entry there, the program synthesized for
    it or the ring (with the measured unit costs charged, the ring's fewer units win at 1 MiB), with
    the right result on every rank. That the synthesized entries are offered and the choice times
    every entry: test_a_topology_adds_the_synthesized_program_and_the_choice_times_every_entry."""
    needs_torch()
    for var in ("HCCC_ALGO_DIR", "HCCC_CLUSTER", "HCCC_NODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HCCC_TOPOLOGY", str(topo))
    from torch_ranks import spawn, topology_job
    res = spawn(topology_job, 4, tmp_path)
    for r, (ok, rep) in enumerate(res):
        assert ok, (r, rep)
        assert all(rep["checks"].values()), (r, rep["checks"])
        got = rep["stats"]["entries"]
        assert sum(got.values()) == 2 and set(got) <= {"synth_allreduce_4", "synth_allgather_4", "ring_allreduce_4",
                                                        "ring_allgather_4"}, rep["stats"]
        assert rep["stats"]["fallback"] == {}, rep["stats"]["reasons"]


# ------------------------------------------------------------ the machine's topology, detected
def _detector(tmp_path, text=SMALL_TOPO, fail=None):
    """A stand-in for NVML detection: the .topo text of a machine and its Topology, or ``fail``."""
    from hccc.compiler.pipeline import load_cluster

    def detect():
        if fail is not None:
            raise fail
        p = tmp_path / "machine.topo"
        p.write_text(text)
        return text, load_cluster(p)
    return detect


def test_a_detected_topology_is_written_once_by_its_contents_and_given_to_the_group(tmp_path, monkeypatch):
    """No topology given, hccc serves CUDA tensors, the machine has the group's GPUs: the detected
    .topo lands in the cache under its contents' digest (every rank names the same file), and the
    options carry it as the topology, said to be detected."""
    import hashlib

    needs_torch()                  # (hccc.torch.options: the torch backend's package)
    from hccc.torch.options import Options, with_detected_topology as _with_detected_topology
    monkeypatch.setenv("HCCC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HCCC_DETECT_TOPOLOGY", raising=False)
    opts = Options().resolved()
    got, note = _with_detected_topology(opts, {"cpu": "gloo", "cuda": "hccc"}, 4, detect=_detector(tmp_path))
    assert note is None and got.topology is not None
    path = Path(got.topology)
    assert path.read_text() == SMALL_TOPO
    assert path.name == hashlib.sha256(SMALL_TOPO.encode()).hexdigest() + ".topo"
    assert got._sources["topology"] == "detected through NVML"
    again, _ = _with_detected_topology(opts, {"cuda": "hccc"}, 4, detect=_detector(tmp_path))
    assert again.topology == got.topology
    # the built-in catalog takes it like a given topology: the synthesized entries join
    cat = BuiltinCatalog(4, ["h"] * 4, cache_dir=tmp_path / "cat", topology=got.topology)
    assert "synth_allgather_4" in _names(cat, "allgather")


@pytest.mark.parametrize("case", ["other size", "no nvml", "switched off", "cuda delegated"])
def test_detection_that_does_not_apply_leaves_the_options_alone(tmp_path, monkeypatch, case):
    from hccc.compiler.cluster.detect import DetectError
    needs_torch()                  # (hccc.torch.options: the torch backend's package)
    from hccc.torch.options import Options, with_detected_topology as _with_detected_topology
    monkeypatch.setenv("HCCC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HCCC_DETECT_TOPOLOGY", raising=False)
    devices, world, fail = {"cuda": "hccc"}, 4, None
    if case == "other size":
        world = 8
    elif case == "no nvml":
        fail = DetectError("--detect needs NVML's Python bindings: pip install 'hccc[detect]' (nvidia-ml-py)")
    elif case == "switched off":
        monkeypatch.setenv("HCCC_DETECT_TOPOLOGY", "0")
    else:
        devices = {"cuda": "nccl"}
    opts = Options().resolved()
    got, note = _with_detected_topology(opts, devices, world, detect=_detector(tmp_path, fail=fail))
    assert got is opts
    if case == "other size":
        assert "4 GPUs, the group 8 ranks" in note
    elif case == "no nvml":
        assert "nvidia-ml-py" in note
    else:
        assert note is None
    assert not (tmp_path / "cache" / "detected_topology").exists() or case == "other size"


def test_a_changed_compiler_never_reuses_a_cached_program(tmp_path, monkeypatch):
    """The cached entries are keyed by the compiler's sources, not by hccc's version alone: a tree
    whose compiler changed under the same version builds its programs again (and its ranks do not
    agree with ranks of the old compiler)."""
    from hccc.runtime import cache
    first = BuiltinCatalog(4, ["h"] * 4, cache_dir=tmp_path / "cache")
    path1 = first._entries("allreduce", None)[0].path
    assert BuiltinCatalog(4, ["h"] * 4, cache_dir=tmp_path / "cache")._entries("allreduce", None)[0].path == path1
    monkeypatch.setattr(cache, "_COMPILER_DIGEST", ["another compiler"])
    other = BuiltinCatalog(4, ["h"] * 4, cache_dir=tmp_path / "cache")
    assert other.fingerprint != first.fingerprint
    path2 = other._entries("allreduce", None)[0].path
    assert path2 != path1 and path2.read_text() == path1.read_text()     # built again, the same program
