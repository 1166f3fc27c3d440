"""``hccc catalog DIR [--json]``: what an algorithm catalog covers and where its gaps are.

DIR is the directory the torch.distributed backend reads (``HCCC_ALGO_DIR``, :mod:`hccc.catalog`):
one row per entry (collective, ranks, root, dtypes, ops, size band), then per collective and world
size the byte ranges no entry covers, and the collectives with no entry at all; calls there fall
back to the delegate backend. ``--json`` prints the same (schema ``hccc.catalog/1``).
"""
from __future__ import annotations

import argparse
import json

from hccc.table import table_lines

SUMMARY = "list what an algorithm catalog directory covers and where the gaps are"
SCHEMA = "hccc.catalog/1"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="the catalog directory (algorithm files, OUTDIRs, "
                   "an optional catalog.json)")
    p.add_argument("--json", action="store_true", help=f"print the coverage as JSON ({SCHEMA})")


def run(args) -> int:
    from hccc.catalog import Catalog, gap_text
    from hccc.compiler.frontend.collectives import SPECS
    # the collectives the torch backend routes through a catalog entry, and the calls it never does
    from hccc.torch_calls import DELEGATE_ONLY, ROUTED

    cat = Catalog.load(args.dir)
    cov = cat.coverage()
    missing = [c for c in ROUTED if not any(r["collective"] == c for r in cov)]
    if args.json:
        print(json.dumps({
            "schema": SCHEMA, "dir": args.dir, "fingerprint": cat.fingerprint,
            "entries": [{"name": e.name, "collective": e.collective, "nranks": e.nranks, "root": e.root,
                         "dtypes": list(e.dtypes), "ops": list(e.ops), "min_bytes": e.min_bytes,
                         "max_bytes": e.max_bytes} for e in cat.entries],
            "gaps": [{"collective": r["collective"], "nranks": r["nranks"], "min_bytes": lo,
                      "max_bytes": hi} for r in cov for lo, hi in r["gaps"]],
            "no_entries": missing}, indent=1))
        return 0
    print(f"{args.dir}: {len(cat.entries)} entr{'y' if len(cat.entries) == 1 else 'ies'}")
    rows = [[e.collective, str(e.nranks), "-" if e.root is None else str(e.root), e.name,
             ",".join(e.dtypes), ",".join(e.ops) if SPECS[e.collective].reduces else "-", e.band()]
            for r in cov for e in r["entries"]]
    if rows:
        print("\n".join(table_lines(["collective", "ranks", "root", "entry", "dtypes", "ops", "bytes"],
                                    rows, {1, 2})))
    print("gaps (these calls fall back to the delegate backend):")
    gaps = [f"  {r['collective']} on {r['nranks']} ranks: {gap_text(g)}" for r in cov for g in r["gaps"]]
    print("\n".join(gaps) if gaps else "  no size gaps for the collectives and world sizes listed")
    if missing:
        print(f"  no entries: {', '.join(missing)} (every call falls back)")
    print("  always: world sizes, dtypes and ops no entry declares; calls on several tensors at once; "
          + ", ".join(DELEGATE_ONLY))
    return 0
