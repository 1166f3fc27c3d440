"""``hccc synth``'s prefetched simulations (``Simulations.prefetch``): the tree candidate that would be
simulated next runs on a spare core while the current one does. The same programs are simulated,
with the same times, and the same one is written; only the wall time differs."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from hccc.cli import main
from hccc.commands import synth as synth_cmd

CLUSTERS = Path(__file__).resolve().parents[1] / "examples" / "clusters"


def _mi250_one_node(tmp_path: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from synth_quality import mi250_text

    p = tmp_path / "mi250_1.topo"
    p.write_text(mi250_text(1))
    return p


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
    """One MI250 node: the first candidate runs short of its link-model time, so a second is
    simulated, the one prefetched while the first ran. With and without prefetching the same
    simulations give the same times and the same program is written."""
    topo = _mi250_one_node(tmp_path)
    without = _synth(topo, collective, tmp_path / "a.rccl", capsys, monkeypatch, prefetch=False)
    with_ = _synth(topo, collective, tmp_path / "b.rccl", capsys, monkeypatch, prefetch=True)
    assert without[3] == {"used": 0, "unused": 0}
    assert with_[3]["used"] >= 1 and len(with_[2]) >= 2
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
