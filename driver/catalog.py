"""An algorithm catalog: a directory of compiled algorithms, each declaring the calls it serves, and
the choice of one per collective call (the torch.distributed backend, :mod:`hccc.torch`, asks it
for every call; ``hccc catalog DIR`` lists what a directory covers and where the gaps are).

Entries are the directory's algorithm files and compiled OUTDIRs, in name order: ``*.rccl``,
MSCCL ``*.xml``, ProgramIR ``*.json`` and sub-directories holding a ``manifest.json``. Each entry
declares

- its collective and world size (the algorithm's own ``nRanks``), and for broadcast / reduce its
  root;
- the dtypes and ops it serves (default: every dtype and op hccc's kernels implement);
- a size band ``[min_bytes, max_bytes]`` of the full buffer (nccl-tests' size; default: an MSCCL
  XML's own ``minBytes`` / ``maxBytes``, else every size).

An optional ``catalog.json`` in the directory narrows them::

    {"entries": [{"file": "ring4.rccl", "dtypes": ["float32"], "ops": ["sum", "max"],
                  "min_bytes": 0, "max_bytes": 1048576}]}

Every file is read through the checks of every other input (regular files only, the input size
limit, the JSON limits for ``catalog.json``: nesting, integer digits, a key given twice), and each
``.rccl`` entry is evaluated under the language's work budget, so a FIFO or device named ``*.json``
or a runaway program is a located error, never a hang. The catalog's fingerprint (the ranks'
agreement) hashes a block at a time only what defines each entry: the file, or an OUTDIR's manifest
and the files it lists.

A call (collective, world size, bytes, dtype, op, root) is served by the entries whose
declarations all hold and whose chunk layout gives every rank an equal share (torch's collectives
have equal shares); when several do, the one the simulator predicts fastest on the given cluster
wins, else the narrowest band, then the first by name. A call no entry serves gets the reason
(:meth:`Catalog.select`), which the backend logs once when it hands the call to its delegate.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from hccc.compiler.frontend.collectives import OWN, SPECS
from hccc.compiler.pipeline.readers import HEAD_BYTES
from hccc.util.diagnostics import CompileError, Diagnostic, SourceFile, printable, read_input_bytes
from hccc.util.limits import loads_json

#: what hccc's kernels implement (the Communicator's dtypes and ops: the runtime's own tables)
from hccc.runtime.launcher import DTYPES as KERNEL_DTYPES, ELEMENT_BYTES  # noqa: E402
from hccc.runtime.launcher import OPS as KERNEL_OPS  # noqa: E402
from hccc.util.dtypes import instance_error  # noqa: E402
#: collectives with a root
ROOTED = tuple(name for name, spec in SPECS.items() if spec.rooted)
INDEX = "catalog.json"
_SUFFIXES = (".rccl", ".xml", ".json")
_KEYS = {"file", "dtypes", "ops", "min_bytes", "max_bytes"}


class CatalogError(CompileError):
    """A catalog directory that cannot be used (located message)."""


@dataclass
class Entry:
    """One algorithm of a catalog and the calls it declares it serves."""

    name: str                      # file or OUTDIR name inside the directory
    path: Path
    collective: str
    nranks: int
    root: int | None
    dtypes: tuple[str, ...]
    ops: tuple[str, ...]
    min_bytes: int
    max_bytes: int | None          # None: no upper bound
    ir: object = field(repr=False, default=None)
    outdir: bool = False

    def band(self) -> str:
        hi = "inf" if self.max_bytes is None else _size(self.max_bytes)
        return f"[{_size(self.min_bytes)}, {hi}]"

    def in_band(self, nbytes: int) -> bool:
        return self.min_bytes <= nbytes and (self.max_bytes is None or nbytes <= self.max_bytes)

    def even_shares(self, count: int) -> bool:
        """Whether ``count`` elements give every rank an equal share of the input (reduce-scatter)
        or output (all-gather) chunks, and all-to-all blocks split evenly, as torch's calls have."""
        from hccc.compiler.ir.extents import count_unit
        from hccc.runtime.launcher import program_layout
        spec = SPECS[self.collective]
        # AllToAll: equal blocks (1 for the others; an entry not yet loaded: its collective's unit)
        if count % (count_unit(self.ir) if self.ir is not None else spec.count_unit(self.nranks)):
            return False
        if OWN not in (spec.input, spec.output):
            return True
        if count % self.nranks:
            return False
        lay = program_layout(self.ir, count)
        pos = 1 if spec.input == OWN else 0      # the rank's own part: input / output length
        want = count // self.nranks
        return all(int(lay[r][1 - pos]) == want for r in range(self.nranks))


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _located(src: SourceFile, needle: str, msg: str) -> CatalogError:
    at = src.text.find(needle) if needle else -1
    return CatalogError([Diagnostic(msg, src.location_at(max(at, 0)))])


def _read_index(directory: Path) -> tuple[dict[str, dict], bytes]:
    """The declarations of ``catalog.json`` by file name, and the file's bytes (for the
    fingerprint); read through the input checks and the JSON limits (:func:`loads_json`)."""
    path = directory / INDEX
    if not os.path.lexists(path):
        return {}, b""
    data = read_input_bytes(path)
    src = SourceFile.from_bytes(str(path), data)
    try:
        doc = loads_json(src)
    except CompileError as exc:
        raise CatalogError(exc.diagnostics) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise _located(src, "", 'expected {"entries": [{"file": ..., ...}, ...]}')
    out: dict[str, dict] = {}
    for i, e in enumerate(doc["entries"]):
        if not isinstance(e, dict) or not isinstance(e.get("file"), str):
            raise _located(src, "", f"entry {i}: expected an object with a \"file\" name")
        name = e["file"]
        here = json.dumps(name)
        bad = sorted(set(e) - _KEYS)
        if bad:
            raise _located(src, here, f"entry {name!r}: unknown key {bad[0]!r} (expected "
                           f"{', '.join(sorted(_KEYS))})")
        if "/" in name or name in (".", "..") or not (directory / name).exists():
            raise _located(src, here, f"entry {name!r}: no such file or OUTDIR in {directory.name}")
        for key, allowed in (("dtypes", KERNEL_DTYPES), ("ops", KERNEL_OPS)):
            vals = e.get(key, list(allowed))
            if not isinstance(vals, list) or not vals or any(v not in allowed for v in vals):
                raise _located(src, here, f"entry {name!r}: {key} must be a non-empty list of "
                               f"{', '.join(allowed)}; got {vals!r}")
        for key in ("min_bytes", "max_bytes"):
            v = e.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise _located(src, here, f"entry {name!r}: {key} must be a byte count >= 0; got {v!r}")
        if e.get("max_bytes") is not None and e.get("min_bytes", 0) > e["max_bytes"]:
            raise _located(src, here, f"entry {name!r}: min_bytes {e.get('min_bytes', 0)} is above "
                           f"max_bytes {e['max_bytes']}")
        if name in out:
            raise _located(src, here, f"entry {name!r} is listed twice")
        out[name] = e
    return out, data


def _candidates(directory: Path) -> list[Path]:
    from hccc.compiler.pipeline import manifest_path
    found = []
    for p in sorted(directory.iterdir(), key=lambda q: q.name):
        if p.name == INDEX or p.name.startswith("."):
            continue
        if p.is_dir():
            if (p / "manifest.json").exists():
                found.append(p)
        elif p.suffix.lower() in (".rccl", ".xml"):
            found.append(p)
        elif p.suffix.lower() == ".json" and manifest_path(p) is None and _is_program_json(p):
            found.append(p)
    return found


def _is_program_json(p: Path) -> bool:
    """A ProgramIR ``.json`` (not a cluster profile or other JSON lying beside the algorithms),
    by its first bytes, read through the input checks: a FIFO or device named ``*.json`` is refused
    (a located error), never read."""
    head = read_input_bytes(p, head=HEAD_BYTES)
    return b'"prims"' in head or b'"collective"' in head


def _load_ir(path: Path):
    from hccc.compiler.pipeline import load_manifest, load_program, manifest_path
    m = manifest_path(path)
    if m is not None:
        return load_manifest(m)[0], True
    return load_program(path), False


def _defining_files(entry: Path) -> list[Path]:
    """The files that define a catalog entry: the file itself, or for an OUTDIR its manifest and
    the files that manifest lists as hccc's (build outputs and anything else the user keeps in the
    directory are not part of the algorithm and are never read)."""
    if not entry.is_dir():
        return [entry]
    man = entry / "manifest.json"
    doc = loads_json(SourceFile.read(man))
    listed = doc.get("files") if isinstance(doc, dict) else None
    names = sorted({n for n in listed if isinstance(n, str)} - {"manifest.json"}) \
        if isinstance(listed, list) else []
    bad = [n for n in names if "/" in n or n in (".", "..") or "\0" in n]
    if bad:
        raise CatalogError([Diagnostic(f"'{printable(str(man))}' lists '{printable(bad[0])}', "
                                       "not a file name in its directory", None)])
    return [man] + [entry / n for n in names if os.path.lexists(entry / n)]


def _digest(path: Path) -> str:
    """A fingerprint of what defines the entry ``path`` (:func:`_defining_files`), streamed."""
    h = hashlib.sha256()
    for q in _defining_files(path):
        h.update(str(q.relative_to(path.parent)).encode() + b"\0")
        read_input_bytes(q, sink=h.update)       # the input checks, a block at a time
        h.update(b"\0")
    return h.hexdigest()


class Catalog:
    """The entries of one directory (see the module docstring)."""

    def __init__(self, directory: Path | None, entries: list[Entry], fingerprint: str):
        self.directory = directory
        self.entries = entries
        self.fingerprint = fingerprint
        self._sim_cache: dict[tuple[str, int], float] = {}

    @classmethod
    def empty(cls) -> "Catalog":
        return cls(None, [], hashlib.sha256(b"").hexdigest())

    @classmethod
    def load(cls, directory) -> "Catalog":
        """Every entry of ``directory``; bad files and a bad ``catalog.json`` are located errors
        (:class:`CatalogError`). Every file is read through the input checks (regular files only,
        the size limit, the JSON limits), and each ``.rccl`` entry's evaluation through the
        language's work budget."""
        try:
            return cls._load(Path(directory))
        except CatalogError:
            raise
        except CompileError as exc:
            raise CatalogError(exc.diagnostics, exc.more) from None

    @classmethod
    def _load(cls, d: Path) -> "Catalog":
        if not d.is_dir():
            raise CatalogError([Diagnostic(f"{d}: the algorithm catalog must be a directory", None)])
        index, index_bytes = _read_index(d)
        h = hashlib.sha256()
        h.update(index_bytes)
        entries = []
        for p in _candidates(d):
            ir, outdir = _load_ir(p)
            h.update(_digest(p).encode())
            decl = index.get(p.name, {})
            lo = decl.get("min_bytes", ir.origin.min_bytes or 0)
            hi = decl.get("max_bytes", ir.origin.max_bytes or None)
            entries.append(Entry(
                name=p.name, path=p, collective=ir.collective, nranks=int(ir.nranks),
                root=int(ir.root) if ir.collective in ROOTED and getattr(ir, "root", None) is not None
                else None,
                dtypes=tuple(decl.get("dtypes", KERNEL_DTYPES)), ops=tuple(decl.get("ops", KERNEL_OPS)),
                min_bytes=int(lo), max_bytes=None if hi is None else int(hi), ir=ir, outdir=outdir))
        return cls(d, entries, h.hexdigest())

    # ------------------------------------------------------------------ choice per call
    def select(self, collective: str, world: int, nbytes: int, dtype: str, op: str,
               root: int | None = None, cluster=None) -> tuple[Entry | None, str]:
        """(entry, "") for the call, or (None, reason) when no entry serves it."""
        es = ELEMENT_BYTES.get(dtype)
        if es is None:
            return None, f"dtype {dtype} has no hccc kernel (hccc: {', '.join(KERNEL_DTYPES)})"
        if op not in KERNEL_OPS:
            return None, f"op {op} has no hccc kernel (hccc: {', '.join(KERNEL_OPS)})"
        why = instance_error(dtype, op)
        if why:
            return None, why
        pool = [e for e in self.entries if e.collective == collective]
        if not pool:
            return None, f"the catalog has no {collective} algorithm"
        sizes = sorted({e.nranks for e in pool})
        pool = [e for e in pool if e.nranks == world]
        if not pool:
            return None, (f"no {collective} algorithm for {world} ranks (the catalog has "
                          f"{', '.join(map(str, sizes))})")
        if collective in ROOTED:
            roots = sorted({e.root for e in pool if e.root is not None})
            pool = [e for e in pool if e.root == root]
            if not pool:
                return None, (f"no {collective} algorithm for root {root} (the catalog's roots: "
                              f"{', '.join(map(str, roots))})")
        kind = [e for e in pool if dtype in e.dtypes and op in e.ops]
        if not kind:
            return None, f"no {world}-rank {collective} entry declares {dtype} with op {op}"
        banded = [e for e in kind if e.in_band(nbytes)]
        if not banded:
            return None, (f"{nbytes} bytes lie outside every {world}-rank {collective} size band "
                          f"({', '.join(e.band() for e in kind)})")
        even = [e for e in banded if e.even_shares(nbytes // es)]
        if not even:
            return None, (f"{nbytes // es} elements do not split into equal per-rank shares of "
                          f"{', '.join(e.name for e in banded)}")
        if len(even) == 1:
            return even[0], ""
        if cluster is not None:
            timed = [(self._predict(e, cluster, nbytes), e.name, e) for e in even]
            if all(t is not None for t, _, _ in timed):
                return min(timed, key=lambda x: (x[0], x[1]))[2], ""
        # the narrowest band (an open-ended band is wider than every closed one; of two open-ended
        # bands the one that starts higher is the narrower), then the first by name
        def width(e: Entry):
            return (1, -e.min_bytes) if e.max_bytes is None else (0, e.max_bytes - e.min_bytes)
        return min(even, key=lambda e: (width(e), e.name)), ""

    def _predict(self, entry: Entry, cluster, nbytes: int) -> float | None:
        """The simulator's time for ``entry`` at ``nbytes`` on ``cluster`` (cached), or None when
        the cluster does not fit the algorithm."""
        key = (entry.name, nbytes)
        if key not in self._sim_cache:
            from hccc.runtime.simulator import simulate
            try:
                self._sim_cache[key] = float(simulate(entry.ir, cluster, nbytes,
                                                      slice_bytes="auto").time_s)
            except Exception:          # a cluster of another shape: no prediction
                self._sim_cache[key] = None
        return self._sim_cache[key]

    # ------------------------------------------------------------------ coverage
    def coverage(self) -> list[dict]:
        """One row per (collective, world size): its entries in band order and the gaps between
        their bands (byte ranges no entry covers, for any dtype)."""
        groups: dict[tuple[str, int], list[Entry]] = {}
        for e in self.entries:
            groups.setdefault((e.collective, e.nranks), []).append(e)
        rows = []
        for (coll, n), es in sorted(groups.items()):
            es = sorted(es, key=lambda e: (e.min_bytes, e.name))
            gaps, reach = [], 0                  # bytes below `reach` are covered
            for e in es:
                if e.min_bytes > reach:
                    gaps.append((reach, e.min_bytes - 1))
                if e.max_bytes is None:
                    reach = None
                    break
                reach = max(reach, e.max_bytes + 1)
            if reach is not None:
                gaps.append((reach, None))
            rows.append({"collective": coll, "nranks": n, "entries": es, "gaps": gaps})
        return rows


class FilledCatalog(Catalog):
    """A user's catalog (``first``: a directory's entries) whose gaps ``fill`` serves (the torch
    backend's built-in catalog): a call goes to ``first``'s choice when one of its entries serves
    it, else to ``fill``'s; its reason, when neither does, names both. :attr:`entries` lists
    ``first``'s entries, then those ``fill`` has made; :meth:`source` says which an entry came
    from."""

    def __init__(self, first: Catalog, fill: Catalog, fill_name: str = "the built-in catalog"):
        h = hashlib.sha256(f"{first.fingerprint}\0{fill.fingerprint}".encode()).hexdigest()
        super().__init__(first.directory, [], h)
        self.first, self.fill, self.fill_name = first, fill, fill_name
        #: entries appear as calls ask for them where ``fill`` makes its own so
        self.lazy = getattr(fill, "lazy", False)

    @property
    def entries(self) -> list[Entry]:
        return [*self.first.entries, *self.fill.entries]

    @entries.setter
    def entries(self, value) -> None:       # (Catalog.__init__ sets it: the parts hold them)
        pass

    def source(self, entry: Entry) -> str:
        """Where ``entry`` came from: the user's directory or the catalog that fills its gaps."""
        return "first" if any(e is entry for e in self.first.entries) else "fill"

    def select(self, collective: str, world: int, nbytes: int, dtype: str, op: str,
               root: int | None = None, cluster=None) -> tuple[Entry | None, str]:
        entry, why = self.first.select(collective, world, nbytes, dtype, op, root, cluster)
        if entry is not None:
            return entry, ""
        entry, why_fill = self.fill.select(collective, world, nbytes, dtype, op, root, cluster)
        if entry is not None:
            return entry, ""
        return None, f"{why}; and {self.fill_name}: {why_fill}"


def gap_text(gap: tuple[int, int | None]) -> str:
    lo, hi = gap
    return f"{_size(lo)} and up" if hi is None else f"{_size(lo)} .. {_size(hi)}"


__all__ = ["Catalog", "CatalogError", "Entry", "FilledCatalog", "KERNEL_DTYPES", "KERNEL_OPS", "gap_text"]
