"""The one table printer of the ``hccc`` commands (rich): plain ASCII text, a header, a rule of
dashes under each column, then the rows; chosen columns right-aligned. Deterministic (no colour,
no terminal width: the table is as wide as its cells), so reports stay stable in logs and tests.

nccl-tests-style tables (``hccc run``, ``hccc sim``) keep nccl-tests' own fixed-width layout
(:mod:`hccc.sweep`), which scripts that parse nccl-tests output expect.
"""
from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table


def table_lines(headers: list[str], rows: list[list[str]], right=frozenset(), indent: int = 2) -> list[str]:
    """The table as text lines; ``right`` holds the indices of right-aligned columns."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    t = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), show_header=True, header_style=None)
    for i, h in enumerate(headers):
        t.add_column(h, justify="right" if i in right else "left", no_wrap=True, min_width=widths[i])
    t.add_row(*["-" * w for w in widths])
    for r in cells:
        t.add_row(*r)
    buf = io.StringIO()
    Console(file=buf, width=sum(widths) + 2 * len(widths) + 8, color_system=None, force_terminal=False,
            highlight=False, emoji=False, markup=False, legacy_windows=False).print(t)
    return [" " * indent + ln.rstrip() for ln in buf.getvalue().splitlines()]
