"""A catalog directory's gaps filled by the built-in catalog (:class:`hccc.catalog.FilledCatalog`):
the directory's entries first, the built-in catalog's for the calls none of them serves.

The choice against a brute-force oracle (hypothesis: every entry whose declarations hold, the
directory's before the filler's, the narrowest band); the built-in catalog filling a directory that
holds only an AllToAll; ``hccc catalog --ranks`` marking each entry's source; and, with torch, two
ranks in threads whose user catalog holds only an AllToAll: the all_gather runs on the built-in
catalog's algorithm (no longer on gloo), the all_to_all on the user's, each against its definition,
and ``HCCC_BUILTIN_CATALOG=0`` (``Options(builtin=False)``) sends the all_gather to gloo again.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples, needs_torch

from hccc.catalog import Catalog, Entry, FilledCatalog

ROOT = Path(__file__).resolve().parent.parent
CATALOG4 = ROOT / "examples" / "torch" / "catalog4"


def _fake(name, lo, hi, dtypes):
    return Entry(name=name, path=Path(name), collective="allreduce", nranks=4, root=None,
                 dtypes=tuple(dtypes), ops=("sum",), min_bytes=lo, max_bytes=hi)


bands = st.lists(st.tuples(st.integers(0, 64), st.one_of(st.none(), st.integers(0, 64)),
                           st.sampled_from([("float32",), ("float16",), ("float32", "float16")])),
                 min_size=0, max_size=4)


def _serving(entries, nbytes, dtype):
    """The oracle: every entry whose declarations hold for the call, by brute force."""
    return [e for e in entries if dtype in e.dtypes
            and nbytes in range(e.min_bytes, (e.max_bytes if e.max_bytes is not None else 1 << 30) + 1)]


def _narrowest(ok):
    width = {e.name: (e.max_bytes if e.max_bytes is not None else 1 << 40) - e.min_bytes for e in ok}
    best = min(width.values())
    return min(n for n, w in width.items() if w == best)


@settings(max_examples=examples(80))
@given(bands, bands, st.integers(0, 70), st.sampled_from(["float32", "float16"]))
def test_the_directorys_entries_come_first_and_the_filler_serves_the_rest(first, fill, kib, dtype):
    mine = [_fake(f"d{i}", lo * 1024, None if hi is None else max(lo, hi) * 1024, dts)
            for i, (lo, hi, dts) in enumerate(first)]
    theirs = [_fake(f"b{i}", lo * 1024, None if hi is None else max(lo, hi) * 1024, dts)
              for i, (lo, hi, dts) in enumerate(fill)]
    cat = FilledCatalog(Catalog(None, mine, "d"), Catalog(None, theirs, "b"))
    nbytes = kib * 1024
    got, why = cat.select("allreduce", 4, nbytes, dtype, "sum")
    ok_mine, ok_theirs = _serving(mine, nbytes, dtype), _serving(theirs, nbytes, dtype)
    if ok_mine:
        assert got is not None and got.name == _narrowest(ok_mine) and cat.source(got) == "first"
    elif ok_theirs:
        assert got is not None and got.name == _narrowest(ok_theirs) and cat.source(got) == "fill"
    else:
        assert got is None and "; and the built-in catalog: " in why
    assert [e.name for e in cat.entries] == [e.name for e in mine + theirs]


def _alltoall_only(tmp_path) -> Path:
    d = tmp_path / "a2a"
    d.mkdir()
    shutil.copy(CATALOG4 / "direct_alltoall_4.rccl", d)
    return d


def test_the_built_in_catalog_fills_a_directory_holding_only_an_alltoall(tmp_path):
    from hccc.builtin_catalog import BuiltinCatalog
    user = Catalog.load(_alltoall_only(tmp_path))
    cat = FilledCatalog(user, BuiltinCatalog(4, ["a"] * 4, cache_dir=tmp_path / "cache"))
    got, why = cat.select("allgather", 4, 1 << 20, "float32", "sum")
    assert got is not None and got.name == "ring_allgather_4" and cat.source(got) == "fill", why
    got, _ = cat.select("alltoall", 4, 1 << 20, "float32", "sum")
    assert got.name == "direct_alltoall_4.rccl" and cat.source(got) == "first"
    got, why = cat.select("allgather", 4, 1 << 20, "int8", "sum")
    assert got is None and why.startswith("dtype int8 has no hccc kernel")
    # the directory alone: the gap the built-in catalog fills
    assert user.select("allgather", 4, 1 << 20, "float32", "sum") == (
        None, "the catalog has no allgather algorithm")


def test_catalog_command_marks_built_in_entries_and_counts_them_in_the_gaps(tmp_path, capsys):
    from hccc.cli import main
    d = _alltoall_only(tmp_path)
    assert main(["catalog", str(d)]) == 0
    out = capsys.readouterr().out
    assert "direct_alltoall_4.rccl" in out and " dir " in out and "  built-in  " not in out
    assert "no entries: allreduce, allgather, reducescatter, broadcast, reduce, scatter" in out
    assert "list it with --ranks N" in out
    assert main(["catalog", str(d), "--ranks", "4", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[3]: line.split()[4] for line in out.splitlines()
            if line.startswith("  ") and len(line.split()) >= 8}
    assert rows["direct_alltoall_4.rccl"] == "dir"
    assert rows["hm_allgather_2x2"] == rows["hierarchical_alltoall_2x2"] == "built-in"
    assert "no entries" not in out
    assert main(["catalog", str(d), "--ranks", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["builtin"] == {"ranks": 4, "nodes": 1}
    src = {e["name"]: e["source"] for e in doc["entries"]}
    assert src["direct_alltoall_4.rccl"] == "dir" and src["ring_allgather_4"] == "built-in"
    assert doc["no_entries"] == [] and doc["gaps"] == []
    for argv, msg in ((["--nodes", "2"], "--nodes needs --ranks"),
                      (["--ranks", "3", "--nodes", "2"], "--ranks 3 do not split evenly over --nodes 2")):
        assert main(["catalog", str(d), *argv]) == 1
        assert msg in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("builtin", [True, False])
def test_two_ranks_whose_catalog_holds_only_an_alltoall_gather_on_the_built_in_catalog(tmp_path, builtin):
    torch = needs_torch()
    dist = needs_torch("torch.distributed")
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program
    from hccc.torch import Options
    from hccc.torch.process_group import stats
    from torch_ranks import ranks_in_threads
    d = tmp_path / "a2a2"
    d.mkdir()
    (d / "direct_alltoall_2.json").write_text(build_program(gen.direct_alltoall(2), name="a2a").to_json())
    n = 8

    def inp(r, k=n):
        return torch.arange(k, dtype=torch.float32) + 100 * r

    def job(r):
        def run(pg):
            out = torch.zeros(2 * n)
            pg._allgather_base(out, inp(r), torch._C._distributed_c10d.AllgatherOptions()).wait()
            a2a = torch.zeros(2 * n)
            pg.alltoall_base(a2a, inp(r, 2 * n), [], [], torch._C._distributed_c10d.AllToAllOptions()).wait()
            return out, a2a, stats(pg)
        return run
    got = ranks_in_threads([job(0), job(1)], Options(catalog=d, builtin=builtin), timeout_s=60.0)
    for r, res in enumerate(got):
        assert res is not None and not isinstance(res[0], BaseException), (r, res)
        out, a2a, st = res[0]
        assert torch.equal(out, torch.cat([inp(0), inp(1)]))
        assert torch.equal(a2a, torch.cat([inp(q, 2 * n).chunk(2)[r] for q in range(2)]))
        assert st["entries"].get("direct_alltoall_2.json") == 1, st
        if builtin:
            assert st["hccc"] == {"allgather": 1, "alltoall": 1}, st
            assert st["entries"].get("direct_allgather_2") == 1, st
        else:
            assert st["fallback"] == {"allgather": 1}, st
            assert list(st["reasons"]) == ["the catalog has no allgather algorithm"], st
    del dist


def test_ranks_that_disagree_on_the_filling_all_get_an_error_naming_it(tmp_path, monkeypatch):
    """``HCCC_BUILTIN_CATALOG`` is an input to the choice: set differently on two ranks, both
    ranks' set-up fails naming it; a value other than 0 or 1 is refused, naming the variable."""
    needs_torch("torch.distributed")
    from hccc.torch import Options
    from torch_ranks import ranks_in_threads
    d = _alltoall_only(tmp_path)
    out = ranks_in_threads([lambda pg: None] * 2, [Options(catalog=d, builtin=True),
                                                   Options(catalog=d, builtin=False)], timeout_s=20.0)
    for res, _ in out:
        assert isinstance(res, RuntimeError), res
        assert "HCCC_BUILTIN_CATALOG" in str(res) and "rank 0" in str(res) and "rank 1" in str(res), res
    monkeypatch.setenv("HCCC_BUILTIN_CATALOG", "yes")
    with pytest.raises(ValueError, match="HCCC_BUILTIN_CATALOG must be 0 or 1; got 'yes'"):
        Options(catalog=d).resolved()
    monkeypatch.setenv("HCCC_BUILTIN_CATALOG", "0")
    assert Options(catalog=d).resolved().builtin is False
    assert Options(catalog=d, builtin=True).resolved().builtin is True
