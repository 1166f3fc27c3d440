"""The algorithm catalog reads its directory through the input checks every reader uses: regular
files only (a FIFO or device named ``*.json`` / ``*.rccl`` is refused, never read), the size limit,
the JSON limits (nesting, integer digits, duplicate keys) of ``catalog.json``, and a fingerprint
that streams only the files defining an entry (never a build artefact lying in an OUTDIR)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tracemalloc
from json.decoder import scanstring
from pathlib import Path

import pytest

from conftest import needs_torch
from hypothesis import given, settings, strategies as st

from hccc.catalog import Catalog, CatalogError
from hccc.util.diagnostics import CompileError, SourceFile, render_all
from hccc.util.limits import MAX_JSON_DEPTH, loads_json

from cli_runs import run_cli

ROOT = Path(__file__).resolve().parents[1]
RING = ROOT / "examples" / "direct_allgather_8.rccl"
HCCC = [sys.executable, "-m", "hccc.cli"]
#: a catalog command that hangs on a FIFO would block forever; this only guards the test run
HANG_GUARD_S = 60


def _catalog(tmp_path: Path) -> Path:
    d = tmp_path / "cat"
    d.mkdir()
    shutil.copy(RING, d / RING.name)
    return d


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """``RING`` compiled to an OUTDIR once for the module (copied into each test's catalog)."""
    out = tmp_path_factory.mktemp("built") / "built"
    r = run_cli(RING, "-o", out, env={"HCCC_DEBUG": None})
    assert r.returncode == 0, r.stderr + r.stdout
    return out


def _with_outdir(tmp_path: Path, built: Path) -> tuple[Path, Path]:
    d = _catalog(tmp_path)
    shutil.copytree(built, d / "built")
    return d, d / "built"


def _cli(*args):
    """hccc in a subprocess, for a command that a regression would block (``HANG_GUARD_S`` ends it)."""
    r = subprocess.run([*HCCC, *map(str, args)], capture_output=True, text=True, timeout=HANG_GUARD_S,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, HCCC_DEBUG=""))
    return r.returncode, r.stderr + r.stdout


# ------------------------------------------------------------------ item: non-regular files
def test_fifo_in_catalog_is_refused_not_read(tmp_path):
    """``hccc catalog`` end to end (a hang here is the bug: the guard ends it)."""
    d = _catalog(tmp_path)
    os.mkfifo(d / "pipe.json")
    code, out = _cli("catalog", d)
    assert code == 1, out
    assert "FIFO" in out and "pipe.json" in out and "Traceback" not in out


@pytest.mark.parametrize("name", ["pipe.rccl", "pipe.xml", "pipe.JSON"])
def test_fifo_of_any_algorithm_suffix_is_refused(tmp_path, name):
    d = _catalog(tmp_path)
    os.mkfifo(d / name)
    with pytest.raises(CatalogError, match="FIFO"):
        Catalog.load(d)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_device_named_json_is_refused_in_process(tmp_path, device):
    """The loader the torch backend calls: a device behind a ``*.json`` name is a CatalogError
    (the backend turns it into one clear message), found without reading it."""
    d = _catalog(tmp_path)
    (d / "dev.json").symlink_to(device)
    t0 = time.process_time()
    with pytest.raises(CatalogError, match="character device"):
        Catalog.load(d)
    assert time.process_time() - t0 < 2.0


def test_fifo_inside_an_outdir_entry_is_refused(tmp_path, built):
    d, out = _with_outdir(tmp_path, built)
    man = json.loads((out / "manifest.json").read_text())
    victim = out / man["files"][0]
    victim.unlink()
    os.mkfifo(victim)
    with pytest.raises(CatalogError, match="FIFO"):
        Catalog.load(d)


def test_catalog_index_over_the_size_limit(tmp_path, monkeypatch):
    d = _catalog(tmp_path)
    (d / "catalog.json").write_text(json.dumps({"entries": []}) + " " * 4096)
    monkeypatch.setenv("HCCC_MAX_INPUT_BYTES", "1K")
    with pytest.raises(CatalogError, match="input limit"):
        Catalog.load(d)


# ------------------------------------------------------------------ item: the fingerprint
def test_fingerprint_ignores_what_does_not_define_an_outdir_entry(tmp_path, built):
    """A multi-GB build artefact (sparse here) in an OUTDIR entry is never read: the fingerprint
    is that of the manifest and the files it lists, and loading allocates no more for it."""
    d, out = _with_outdir(tmp_path, built)
    before = Catalog.load(d).fingerprint
    big = out / "build" / "libhuge.so"
    big.parent.mkdir()
    with open(big, "wb") as f:
        f.truncate(8 << 30)                   # 8 GiB, sparse: no disk used
    tracemalloc.start()
    t0 = time.process_time()
    after = Catalog.load(d).fingerprint
    cpu = time.process_time() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert after == before
    assert peak < 64 << 20, f"{peak} bytes traced"
    assert cpu < 5.0


def test_fingerprint_streams_a_large_listed_file(tmp_path, built):
    """A large file the manifest lists is hashed a block at a time (memory does not grow with
    it), and a change to it changes the fingerprint; compared with an independent hash."""
    d, out = _with_outdir(tmp_path, built)
    man = json.loads((out / "manifest.json").read_text())
    listed = out / sorted(n for n in man["files"] if n.endswith(".xml"))[0]
    with open(listed, "ab") as f:
        f.truncate(listed.stat().st_size + (48 << 20))   # grows by 48 MiB of zeros, sparse
    tracemalloc.start()
    fp1 = Catalog.load(d).fingerprint
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 24 << 20, f"{peak} bytes traced for a 48 MiB file"
    with open(listed, "r+b") as f:
        f.seek(40 << 20)
        f.write(b"x")
    assert Catalog.load(d).fingerprint != fp1
    # an unlisted file changes nothing
    (out / "notes.txt").write_text("mine")
    fp2 = Catalog.load(d).fingerprint
    (out / "notes.txt").write_text("changed")
    assert Catalog.load(d).fingerprint == fp2


def test_fingerprint_changes_with_each_defining_file(tmp_path):
    d = _catalog(tmp_path)
    fps = {Catalog.load(d).fingerprint}
    (d / RING.name).write_text((d / RING.name).read_text() + "\n# edited\n")
    fps.add(Catalog.load(d).fingerprint)
    (d / "catalog.json").write_text(json.dumps({"entries": [{"file": RING.name, "dtypes": ["float32"]}]}))
    fps.add(Catalog.load(d).fingerprint)
    assert len(fps) == 3


# ------------------------------------------------------------------ item: catalog.json JSON limits
def _index_error(d: Path, text: str) -> str:
    (d / "catalog.json").write_text(text)
    with pytest.raises(CatalogError) as ei:
        Catalog.load(d)
    msg = render_all(ei.value)
    assert re.search(r"catalog\.json:\d+:\d+: error: ", msg), msg
    return msg


def test_index_nesting_digits_and_duplicates_are_located(tmp_path):
    d = _catalog(tmp_path)
    assert "nested" in _index_error(d, "[" * 100_000 + "]" * 100_000)
    assert "nested" in _index_error(d, '{"entries": ' + "[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5) + "}")
    assert "digits" in _index_error(d, '{"entries": [{"file": "%s", "max_bytes": %s}]}' % (RING.name, "9" * 5000))
    msg = _index_error(d, '{"entries": [{"file": "%s",\n  "max_bytes": 10,\n  "max_bytes": 99999}]}' % RING.name)
    assert "catalog.json:3:3: error: key 'max_bytes' is given twice" in msg
    msg = _index_error(d, '{"entries": [],\n "entries": [{"file": "%s"}]}' % RING.name)
    assert "catalog.json:2:2: error: key 'entries'" in msg


_KEY = st.text(st.sampled_from("ab\"\\:{}[] \u00e9\n"), max_size=4)
_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10 ** 6, 10 ** 6) | _KEY,
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_KEY, kids, max_size=4),
                     max_leaves=20)


@settings(max_examples=40)
@given(doc=st.dictionaries(_KEY, _JSON, min_size=1, max_size=5), data=st.data())
def test_duplicate_key_found_wherever_it_is(doc, data):
    """Any object with one key written twice is refused, located at the second occurrence
    (oracle: the offset where the duplicate was spliced in); without it the value round-trips."""
    text = json.dumps(doc)
    assert loads_json(SourceFile("x.json", text)) == doc
    key = data.draw(st.sampled_from(sorted(doc)))
    dup = "{" + json.dumps(key) + ": 0, "
    spliced = dup + text[1:]
    # the parser sees the spliced copy first; the original member comes second: find it, the
    # first member of the outer object after the splice whose key is ``key``
    depth, i, found = 0, len(dup), None
    while i < len(spliced):
        c = spliced[i]
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        elif c == '"':
            s, end = scanstring(spliced, i + 1)
            if depth == 0 and s == key and spliced[end:].lstrip().startswith(":"):
                found = i
                break
            i = end
            continue
        i += 1
    assert found is not None
    with pytest.raises(CompileError) as ei:
        loads_json(SourceFile("x.json", spliced))
    loc = ei.value.diagnostics[0].location
    want_line = spliced.count("\n", 0, found) + 1
    want_col = found - (spliced.rfind("\n", 0, found) + 1) + 1
    assert (loc.line, loc.col) == (want_line, want_col)
    assert "given twice" in ei.value.diagnostics[0].message


@pytest.mark.slow          # imports torch (seconds)
def test_the_torch_backend_refuses_a_fifo_catalog_at_once(tmp_path):
    """What ``init_process_group("hccc")`` loads on every rank: a FIFO named ``*.json`` is one clear
    error (before the group's timeout), not a rank blocked on the read."""
    needs_torch()
    from hccc.torch.options import load_catalog
    d = _catalog(tmp_path)
    os.mkfifo(d / "pipe.json")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="FIFO"):
        load_catalog(d)
    assert time.monotonic() - t0 < HANG_GUARD_S
