"""Lines made from columns with numpy (compiler/interop/column_text.py) equal the same lines
formatted one by one in Python (the oracle)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from hccc.compiler.interop.column_text import Choice, column_lines

_ints = st.integers(-(10 ** 18), 10 ** 18)
_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=6)


@st.composite
def pieces(draw):
    n = draw(st.integers(1, 40))
    parts = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["const", "int", "small", "choice"]))
        if kind == "const":
            parts.append(draw(_text))
        elif kind == "int":
            parts.append(np.array(draw(st.lists(_ints, min_size=n, max_size=n)), np.int64))
        elif kind == "small":
            parts.append(np.array(draw(st.lists(st.integers(-1, 12), min_size=n, max_size=n)), np.int64))
        else:
            strings = tuple(draw(st.lists(_text.filter(lambda s: "\0" not in s), min_size=1, max_size=4)))
            parts.append(Choice(np.array(draw(st.lists(st.integers(0, len(strings) - 1), min_size=n, max_size=n))),
                                strings))
    if all(isinstance(p, str) for p in parts):
        parts.append(np.arange(n))
    return n, parts


def _oracle(n, parts) -> list[str]:
    def piece(p, i):
        if isinstance(p, str):
            return p
        if isinstance(p, Choice):
            return p.strings[int(p.codes[i])]
        return str(int(p[i]))
    return ["".join(piece(p, i) for p in parts) + "\n" for i in range(n)]


@given(pieces())
@settings(max_examples=examples(100), deadline=None)    # the thorough profile: ten times as many
def test_lines_equal_python_formatting(case):
    n, parts = case
    want = _oracle(n, parts)
    blob, ends = column_lines(parts)
    assert blob.decode() == "".join(want)
    assert ends.tolist() == np.cumsum([len(x) for x in want]).tolist()


def test_zero_lines_and_mismatched_columns():
    blob, ends = column_lines(["a", np.zeros(0, np.int64)])
    assert blob == b"" and len(ends) == 0
    with pytest.raises(ValueError):
        column_lines(["only text"])
    with pytest.raises(ValueError):
        column_lines([np.arange(3), np.arange(4)])
    with pytest.raises(ValueError):
        column_lines([np.arange(3), Choice(np.zeros(2, np.int64), ("x",))])
