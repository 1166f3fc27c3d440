#!/usr/bin/env python3
"""Render the tables of docs/measurements.md that a benchmark printed as JSON, from the JSON kept
beside this script, so that a table cannot drift from the run it reports.

    python docs/results/generate.py            # rewrite the generated tables (run from anywhere)
    python docs/results/generate.py --check    # exit 1 if a table differs from its JSON

A generated table sits in docs/measurements.md between two marker lines,

    <!-- table: NAME (docs/results/generate.py) -->
    ...
    <!-- end table: NAME -->

and everything between them is this script's: the table, then one line naming the JSON file, the
command that printed it, the machine and the date (:data:`TABLES`). To refresh a table, run the
command its line names (from the repository root; it writes ``docs/results/NAME.json``), set the
date and machine in :data:`TABLES` if they changed, and run this script.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PAGE = ROOT / "docs" / "measurements.md"


@dataclass(frozen=True)
class Source:
    """Where a generated table's JSON came from: the benchmark command that wrote
    ``docs/results/<name>.json`` (run from the repository root), the machine and the date."""
    command: str
    machine: str
    date: str
    render: Callable[[object], list[str]]


def _f(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def _kib(nbytes: int) -> str:
    return f"{nbytes // 1024} KiB" if nbytes % 1024 == 0 else f"{nbytes:,} B"


def render_mscclpp_plan(data) -> list[str]:
    """``benchmarks/mscclpp_plan.py --json``: ``{"size": ..., "rows": [...]}``, one row per
    (algorithm, cluster) pair. The export's wall time is left out: it is the machine's, not the
    plan's."""
    out = ["| algorithm | cluster | program GB/s | plan GB/s | plan/prog | KiB | TBs | ops | nops | max ops | port ch |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        out.append(f"| {r['algorithm']} | {r['cluster']} | {_f(r['program_GBps'], 2)} | {_f(r['plan_GBps'], 2)} "
                   f"| {_f(r['ratio'], 3)} | {round(r['bytes'] / 1024)} | {r['tbs']} | {r['ops']} | {r['nops']} "
                   f"| {r['max_ops']} | {r['port_channels']} |")
    return out


def render_rs_ag_gap(data) -> list[str]:
    """``benchmarks/rs_ag_gap.py --json F``: a list of rows, one per (cluster, trees per rank,
    slice)."""
    out = ["| cluster | GPUs | K | slice AG / RS | link model | AllGather | ReduceScatter | RS/AG |",
           "|---|---|---|---|---|---|---|---|"]
    for r in data:
        out.append(f"| {r['cluster']} | {r['N']} | {r['chunks']} | {_kib(r['slice AG'])} / {_kib(r['slice RS'])} "
                   f"| {_f(r['model'], 3)} | {_f(r['AG'], 3)} | {_f(r['RS'], 3)} | {_f(r['RS/AG'], 3)} |")
    return out


DEV = "the 2-core development machine (no GPU)"

#: table name -> where its JSON (``docs/results/<name>.json``) came from and how it is drawn
TABLES: dict[str, Source] = {
    "mscclpp_plan": Source("python benchmarks/mscclpp_plan.py --json > docs/results/mscclpp_plan.json",
                           DEV, "29 November 2026", render_mscclpp_plan),
    "rs_ag_gap": Source("python benchmarks/rs_ag_gap.py --clusters a100_topo1,v100_4x2_8 --mi250 1,2,4 --chunks 2 "
                        "--json docs/results/rs_ag_gap.json", DEV, "29 November 2026", render_rs_ag_gap),
}

_BEGIN = re.compile(r"^<!-- table: (\w+) \(docs/results/generate\.py\) -->$")


class PageError(ValueError):
    """The page's markers are not as this script writes them (the message names the line)."""


def block(name: str, root: Path = ROOT) -> list[str]:
    """The lines between table ``name``'s markers: the table, then where it came from."""
    src = TABLES[name]
    data = json.loads((root / "docs" / "results" / f"{name}.json").read_text())
    return src.render(data) + ["", f"*Generated from `docs/results/{name}.json`, printed by `{src.command}` on "
                                   f"{src.machine}, {src.date}.*"]


def render(text: str, root: Path = ROOT) -> str:
    """``text`` (the page) with every generated table drawn again from its JSON."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _BEGIN.match(lines[i])
        out.append(lines[i])
        i += 1
        if not m:
            continue
        name = m.group(1)
        if name not in TABLES:
            raise PageError(f"docs/measurements.md:{i}: no generated table named {name!r} "
                            f"(known: {', '.join(sorted(TABLES))})")
        end = f"<!-- end table: {name} -->"
        try:
            j = lines.index(end, i)
        except ValueError:
            raise PageError(f"docs/measurements.md:{i}: table {name!r} has no line {end!r} after it") from None
        out += block(name, root) + [end]
        i = j + 1
    return "\n".join(out)


def names_on(text: str) -> list[str]:
    """The generated tables the page holds, in order."""
    return [m.group(1) for line in text.split("\n") if (m := _BEGIN.match(line))]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a generated table differs from its JSON")
    args = ap.parse_args(argv)
    text = PAGE.read_text()
    try:
        new = render(text)
    except (PageError, OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    missing = sorted(set(TABLES) - set(names_on(text)))
    if args.check:
        stale = new != text
        if stale:
            print("docs/measurements.md is out of date: run python docs/results/generate.py")
        for n in missing:
            print(f"docs/measurements.md has no table {n!r} (add its markers)")
        return 1 if stale or missing else 0
    if new != text:
        tmp = PAGE.with_name(PAGE.name + ".tmp")
        tmp.write_text(new)
        os.replace(tmp, PAGE)          # never a half-written page
    for n in missing:
        print(f"docs/measurements.md has no table {n!r} (add its markers)", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
