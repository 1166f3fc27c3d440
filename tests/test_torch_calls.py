"""The table of torch calls (hccc.torch_calls): every ProcessGroup method the backend overrides is made
from a row, every row's collective is a spec, and the modules that name the collectives the backend
routes (``hccc catalog``) read them from the table."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import needs_torch

from hccc.compiler.frontend.collectives import SPECS
from hccc.torch_calls import DELEGATE_ONLY, ROUTED, TORCH_CALLS

#: what the process group answers that is no call (torch's queries and the group's life cycle)
NOT_CALLS = {"__doc__", "__init__", "__module__", "__repr__", "abort", "group_name", "rank", "shutdown",
             "size"}


def test_every_row_names_a_spec_and_a_method_torch_calls():
    torch = needs_torch()
    base = torch.distributed.ProcessGroup
    for call in TORCH_CALLS:
        assert call.collective is None or call.collective in SPECS, call
        for name in (call.method, *call.aliases):
            assert hasattr(base, name), f"torch's ProcessGroup has no {name}"
        assert call.options is None or hasattr(torch._C._distributed_c10d, call.options), call


def test_every_method_the_group_overrides_is_made_from_the_table():
    """A collective method written by hand (not from a row) fails here."""
    needs_torch()
    import torch.distributed as dist
    from hccc.torch.process_group import HcccProcessGroup
    overridden = (set(vars(HcccProcessGroup)) & set(dir(dist.ProcessGroup))) - NOT_CALLS
    names = {n for c in TORCH_CALLS for n in (c.method, *c.aliases)}
    assert overridden == names
    for call in TORCH_CALLS:
        for name in (call.method, *call.aliases):
            made = getattr(vars(HcccProcessGroup)[name], "torch_call", None)
            assert made is call, (name, made)


def test_the_routed_collectives_are_the_built_in_catalogs():
    """Independent of the table: the built-in catalog (hccc.builtin_catalog.plan) has algorithms for
    exactly the collectives the table routes through a catalog entry, on one node and on two."""
    from hccc.builtin_catalog import plan
    for nodes in (["a"] * 4, ["a", "a", "b", "b"]):
        offered = {c for c, s in SPECS.items() if plan(c, 4, nodes, 0 if s.rooted else None)}
        assert offered == set(ROUTED), nodes


def test_catalog_command_reports_every_routed_collective_as_a_gap(tmp_path, capsys):
    from hccc.cli import main
    assert main(["catalog", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["no_entries"] == list(ROUTED) and not doc["entries"]
    assert main(["catalog", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"no entries: {', '.join(ROUTED)}" in out
    always = next(line for line in out.splitlines() if line.strip().startswith("always:"))
    assert always.endswith(", ".join(DELEGATE_ONLY))
    assert set(DELEGATE_ONLY) == {c.kind for c in TORCH_CALLS if c.collective is None}


def test_catalog_command_runs_without_torch(tmp_path):
    """The table imports no torch: ``hccc catalog`` works where torch is not installed."""
    code = ("import sys; sys.modules['torch'] = None; from hccc.cli import main; "
            f"sys.exit(main(['catalog', {str(tmp_path)!r}]))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert f"no entries: {', '.join(ROUTED)}" in got.stdout
    # the built-in catalog's entries too (hccc.builtin_catalog imports no torch)
    code = code.replace("]))", ", '--ranks', '4']))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert "ring_allreduce_4" in got.stdout and "no entries" not in got.stdout


def test_catalog_command_shows_ops_exactly_for_reducing_collectives(tmp_path, capsys):
    from hccc.cli import main
    cat4 = Path(__file__).resolve().parent.parent / "examples" / "torch" / "catalog4"
    files = sorted(cat4.glob("*.rccl"))
    for f in files:
        (tmp_path / f.name).write_bytes(f.read_bytes())
    assert main(["catalog", str(tmp_path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.split() and line.split()[0] in SPECS]
    assert rows
    for row in rows:
        ops_shown = row[6] != "-"
        assert ops_shown == SPECS[row[0]].reduces, row
