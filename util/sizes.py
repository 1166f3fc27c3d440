"""Byte sizes as the languages and the command line write them: ``4096``, ``64K``, ``1.5M``, ``1G``,
``1MiB``, ``512B`` (binary multiples, any letter case, an optional ``i`` and ``B``).

One syntax for the whole tool: the ``.topo`` language's ``chunksize`` and every size option of the
``hccc`` command read sizes through :data:`SIZE_RE` / :func:`size_value`, and tables print them with
:func:`format_size`.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # fractions (and decimal under it) load only where a size is read or printed
    from fractions import Fraction

#: a number (optionally negative or with a fraction) and an optional unit
SIZE_RE = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?)([KMGkmg]i?[Bb]?|[Bb])?")
#: unit letter (lower case, "" or "b" for bytes) -> multiplier
SIZE_SUFFIX = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
#: longest digit string accepted (bounds the work of converting user text)
MAX_DIGITS = 40


def size_value(text: str) -> Fraction | None:
    """The exact number of bytes ``text`` names, or None when it is not a size."""
    from fractions import Fraction
    m = SIZE_RE.fullmatch(text.strip())
    if m is None or len(m.group(1)) > MAX_DIGITS:
        return None
    return Fraction(m.group(1)) * SIZE_SUFFIX[(m.group(2) or "")[:1].lower()]


def format_size(nbytes: int) -> str:
    """The shortest exact spelling in that syntax: 1048576 -> ``1M``, 1572864 -> ``1.5M``,
    4096 -> ``4K``, 1000 -> ``1000``. ``size_value(format_size(n)) == n`` for every n >= 0."""
    from fractions import Fraction
    n = int(nbytes)
    for unit, k in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k:
            whole, rest = divmod(n, k)
            if rest == 0:
                return f"{whole}{unit}"
            # a short exact decimal (at most two digits after the point), as 1.5M or 2.25G
            for digits in (1, 2):
                scaled = Fraction(n, k) * 10 ** digits
                if scaled.denominator == 1:
                    return f"{whole}.{str(scaled.numerator % 10 ** digits).zfill(digits).rstrip('0')}{unit}"
    return str(n)


def human_size(nbytes: int) -> str:
    """A size as people read it, to one decimal in the largest binary unit it reaches: ``8.0 GiB``,
    ``1.5 MiB``, ``512 bytes`` (approximate; :func:`format_size` is exact)."""
    n = int(nbytes)
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"
