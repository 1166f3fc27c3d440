"""``hccc catalog DIR [--ranks N [--nodes K]] [--json]``: what an algorithm catalog covers and
where its gaps are.

DIR is the directory the torch.distributed backend reads (``HCCC_ALGO_DIR``, :mod:`hccc.catalog`):
one row per entry (collective, ranks, root, dtypes, ops, size band, where it comes from: ``dir`` or
``built-in``), then per
collective and world size the byte ranges no entry covers, and the collectives with no entry at
all. The backend's built-in catalog (:mod:`hccc.builtin_catalog`) serves the calls DIR's entries
do not (DIR's entries first; ``HCCC_BUILTIN_CATALOG=0`` turns that off); its entries depend on the
group, so ``--ranks N`` (and ``--nodes K``: N ranks on K nodes, contiguous) lists them beside DIR's,
marked ``built-in``, and counts them in the gaps. Calls neither serves fall back to the delegate
backend. ``--json`` prints the same (schema ``hccc.catalog/1``; each entry's ``source``: ``dir`` or
``built-in``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from hccc.args import positive_int
from hccc.table import table_lines

SUMMARY = "list what an algorithm catalog directory covers and where the gaps are"
SCHEMA = "hccc.catalog/1"
#: how an entry of the built-in catalog is marked (the ``from`` column, JSON ``source``)
BUILTIN = "built-in"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="the catalog directory (algorithm files, OUTDIRs, "
                   "an optional catalog.json)")
    p.add_argument("--ranks", type=positive_int, metavar="N",
                   help="also list the built-in catalog's entries for a group of N ranks: the torch "
                   "backend runs them for the calls DIR's entries do not serve")
    p.add_argument("--nodes", type=positive_int, metavar="K", default=1,
                   help="with --ranks: the group's N ranks lie on K nodes, N/K each, contiguous "
                   "(the built-in catalog's hierarchical entries)")
    p.add_argument("--json", action="store_true", help=f"print the coverage as JSON ({SCHEMA})")


def builtin_entries(ranks: int, nodes: int) -> list:
    """The built-in catalog's entries for a group of ``ranks`` on ``nodes`` nodes, as catalog
    entries without programs (nothing is built: :func:`hccc.builtin_catalog.plan` names them);
    a rooted collective's for root 0 (every root has its own, alike)."""
    from hccc.builtin_catalog import plan
    from hccc.catalog import KERNEL_DTYPES, KERNEL_OPS, Entry
    from hccc.compiler.frontend.collectives import SPECS
    from hccc.torch_calls import ROUTED
    names = [f"node{r // (ranks // nodes)}" for r in range(ranks)]
    out = []
    for coll in ROUTED:
        root = 0 if SPECS[coll].rooted else None
        for name, _make, lo, hi in plan(coll, ranks, names, root):
            out.append(Entry(name=name, path=Path(BUILTIN), collective=coll, nranks=ranks, root=root,
                             dtypes=tuple(KERNEL_DTYPES), ops=tuple(KERNEL_OPS), min_bytes=lo,
                             max_bytes=hi))
    return out


def run(args) -> int:
    import sys

    from hccc.catalog import Catalog, gap_text
    from hccc.compiler.frontend.collectives import SPECS
    # the collectives the torch backend routes through a catalog entry, and the calls it never does
    from hccc.torch_calls import DELEGATE_ONLY, ROUTED

    if args.ranks is None and args.nodes != 1:
        print("hccc: error: --nodes needs --ranks (the group the built-in catalog is for)", file=sys.stderr)
        return 1
    if args.ranks is not None and args.ranks % args.nodes:
        print(f"hccc: error: --ranks {args.ranks} do not split evenly over --nodes {args.nodes}",
              file=sys.stderr)
        return 1
    cat = Catalog.load(args.dir)
    extra = builtin_entries(args.ranks, args.nodes) if args.ranks is not None else []
    source = {id(e): BUILTIN for e in extra}
    both = Catalog(cat.directory, [*cat.entries, *extra], cat.fingerprint)
    cov = both.coverage()
    missing = [c for c in ROUTED if not any(r["collective"] == c for r in cov)]
    if args.json:
        print(json.dumps({
            "schema": SCHEMA, "dir": args.dir, "fingerprint": cat.fingerprint,
            "builtin": None if args.ranks is None else {"ranks": args.ranks, "nodes": args.nodes},
            "entries": [{"name": e.name, "source": source.get(id(e), "dir"), "collective": e.collective,
                         "nranks": e.nranks, "root": e.root, "dtypes": list(e.dtypes), "ops": list(e.ops),
                         "min_bytes": e.min_bytes, "max_bytes": e.max_bytes} for e in both.entries],
            "gaps": [{"collective": r["collective"], "nranks": r["nranks"], "min_bytes": lo,
                      "max_bytes": hi} for r in cov for lo, hi in r["gaps"]],
            "no_entries": missing}, indent=1))
        return 0
    n = len(cat.entries)
    print(f"{args.dir}: {n} entr{'y' if n == 1 else 'ies'}" + (
        f"; the built-in catalog for {args.ranks} ranks on {args.nodes} node"
        f"{'' if args.nodes == 1 else 's'}: {len(extra)} (each root of a rooted collective has its own)"
        if args.ranks is not None else ""))
    # DIR's entries first within each collective and world size: the backend tries them first
    rows = [[e.collective, str(e.nranks), "-" if e.root is None else str(e.root), e.name,
             source.get(id(e), "dir"), ",".join(e.dtypes),
             ",".join(e.ops) if SPECS[e.collective].reduces else "-", e.band()]
            for r in cov for e in sorted(r["entries"], key=lambda e: id(e) in source)]
    if rows:
        print("\n".join(table_lines(["collective", "ranks", "root", "entry", "from", "dtypes", "ops",
                                     "bytes"], rows, {1, 2})))
    what = "DIR and the built-in catalog" if args.ranks is not None else "DIR"
    print(f"gaps of {what} (these calls fall back to the delegate backend"
          + (")" if args.ranks is not None else
             ", unless the built-in catalog has an entry for the group: list it with --ranks N)") + ":")
    gaps = [f"  {r['collective']} on {r['nranks']} ranks: {gap_text(g)}" for r in cov for g in r["gaps"]]
    print("\n".join(gaps) if gaps else "  no size gaps for the collectives and world sizes listed")
    if missing:
        print(f"  no entries: {', '.join(missing)}")
    print("  always: world sizes, dtypes and ops no entry declares; calls on several tensors at once; "
          + ", ".join(DELEGATE_ONLY))
    return 0
