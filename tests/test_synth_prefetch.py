"""``hccc synth``'s prefetched simulations (``Simulations.prefetch``): the tree candidate that would be
simulated next runs on a spare core while the current one does. The same programs are simulated,
with the same times, and the same one is written; only the wall time differs."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hccc.cli import main
from hccc.commands import synth as synth_cmd

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


# a cluster not in the repository: a 6-GPU mesh and an 8-GPU ring of AMD GPUs, behind NICs shared
# by pairs of the first and one per GPU of the second
TOPO = """define nodenum = 2
define node1 = 6
define vendor = amd
define bandwidth = {direct => [((0,1) -> (50,4)), ((1,0) -> (50,4)), ((0,2) -> (50,3)), ((2,0) -> (50,3)),
    ((0,3) -> (50,4)), ((3,0) -> (50,4)), ((0,4) -> (50,1)), ((4,0) -> (50,1)),
    ((0,5) -> (50,2)), ((5,0) -> (50,2)), ((1,2) -> (50,4)), ((2,1) -> (50,4)),
    ((1,3) -> (50,4)), ((3,1) -> (50,4)), ((1,4) -> (50,2)), ((4,1) -> (50,2)),
    ((1,5) -> (50,2)), ((5,1) -> (50,2)), ((2,3) -> (50,1)), ((3,2) -> (50,1)),
    ((2,4) -> (50,1)), ((4,2) -> (50,1)), ((2,5) -> (50,2)), ((5,2) -> (50,2)),
    ((3,4) -> (50,4)), ((4,3) -> (50,4)), ((3,5) -> (50,2)), ((5,3) -> (50,2)),
    ((4,5) -> (50,2)), ((5,4) -> (50,2))]}
define nic = [((0,1) -> (50,1)), ((2,3) -> (50,1)), ((4,5) -> (50,1))]
define node2 = 8
define vendor = amd
define bandwidth = {direct => [((0,1) -> (25,2)), ((1,0) -> (25,2)), ((0,7) -> (25,1)), ((7,0) -> (25,1)),
    ((1,2) -> (25,3)), ((2,1) -> (25,3)), ((2,3) -> (25,4)), ((3,2) -> (25,4)),
    ((3,4) -> (25,2)), ((4,3) -> (25,2)), ((4,5) -> (25,4)), ((5,4) -> (25,4)),
    ((5,6) -> (25,4)), ((6,5) -> (25,4)), ((6,7) -> (25,4)), ((7,6) -> (25,4))]}
define nic = [((0) -> (12.5,1)), ((1) -> (12.5,1)), ((2) -> (12.5,1)), ((3) -> (12.5,1)),
    ((4) -> (12.5,1)), ((5) -> (12.5,1)), ((6) -> (12.5,1)), ((7) -> (12.5,1))]
define internode = all
define interbandwidth = nic
"""


def _synth(topo: Path, collective: str, out: Path, capsys, monkeypatch, prefetch: bool):
    """The program written (less its synthesis-time line), the JSON summary (less its seconds),
    the simulations' times, and how many prefetched simulations were used and unused."""
    monkeypatch.setattr(synth_cmd, "PREFETCH", prefetch)
    monkeypatch.setattr(synth_cmd, "_spare_core", lambda: True)     # as on any machine of 2+ cores
    seen: list = []
    real_exit = synth_cmd.Simulations.__exit__

    def exit_(self, *exc):
        real_exit(self, *exc)
        seen.append((dict(self.times), dict(self.prefetched)))

    monkeypatch.setattr(synth_cmd.Simulations, "__exit__", exit_)
    assert main(["synth", str(topo), "--collective", collective, "-o", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    for key in ("seconds", "output"):
        summary.pop(key)
    for detail in summary.get("trees", {}).values():
        for key in [k for k in detail if k.endswith("_s")]:
            detail.pop(key)                 # the packing's own wall times
    text = [line for line in out.read_text().splitlines() if not line.startswith("# synthesis time")]
    (times, prefetched), = seen
    return text, summary, times, prefetched


@pytest.mark.parametrize("collective", ["allgather", "reducescatter"])
def test_prefetching_changes_no_result(tmp_path, capsys, monkeypatch, collective):
    """The same simulations give the same times, and the same program is written, with and
    without prefetching. ReduceScatter: its programs run short of their link-model time, so
    five are simulated, two of them prefetched while another ran."""
    topo = tmp_path / "mesh6_ring8.topo"
    topo.write_text(TOPO)
    without = _synth(topo, collective, tmp_path / "a.rccl", capsys, monkeypatch, prefetch=False)
    with_ = _synth(topo, collective, tmp_path / "b.rccl", capsys, monkeypatch, prefetch=True)
    assert without[3] == {"used": 0, "unused": 0}
    if collective == "reducescatter":
        assert with_[3]["used"] >= 2 and len(with_[2]) >= 4
    assert with_[2] == without[2]
    assert with_[0] == without[0] and with_[1] == without[1]


def test_a_prefetch_nobody_asks_for_is_halted(monkeypatch):
    """``close`` halts a prefetched simulation still running (the engine looks at its halt flag as
    it looks at the clock) and waits for it: no thread outlives the command, its time unused."""
    from hccc.compiler.pipeline import load_cluster
    from hccc.compiler.synth import synthesize

    monkeypatch.setattr(synth_cmd, "_spare_core", lambda: True)
    topo = load_cluster(CLUSTERS / "a100_topo4.topo")
    res = synthesize(topo, "allgather", method="trees", bandwidth_bound_bytes=1 << 30, time_limit=60)
    sims = synth_cmd.Simulations(topo, 1 << 38, time.perf_counter() + 600)    # a simulation of seconds
    sims.prefetch(res, 1)
    (th, _, box), = sims._pending.values()
    time.sleep(1.0)
    assert th.is_alive(), box
    t0 = time.perf_counter()
    sims.close()
    assert not th.is_alive() and time.perf_counter() - t0 < 1.0
    assert "t" not in box and sims.prefetched == {"used": 0, "unused": 1} and sims.times == {}
    # asked for after all, it is simulated here, to the same time as the engine gives
    from hccc.runtime.simulator import prepare, simulate
    from hccc.compiler.passes.build import build_program
    from hccc.compiler.synth import to_algorithm
    from hccc.runtime.sim_model import DEFAULT_BLOCK_GBPS

    small = synth_cmd.Simulations(topo, 1 << 30, time.perf_counter() + 600)
    small.prefetch(res, 1)
    got = small.seconds(res, 1)
    ir = build_program(to_algorithm(res, topo))
    assert got == simulate(prepare(ir, topo, DEFAULT_BLOCK_GBPS), topo, 1 << 30, slice_bytes="auto").time_s
    assert small.prefetched == {"used": 1, "unused": 0}
    small.close()
