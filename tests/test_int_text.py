"""hccc.compiler.ir.int_text against Python's own str / % formatting (the oracle)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.compiler.ir import int_text, int_text_kernel
from hccc.compiler.ir.int_text import RowText, decimal_digits, join_ints

needs_numba = pytest.mark.skipif(not int_text_kernel.HAVE_NUMBA, reason="the compiled path needs numba")
#: the compiled path's first run compiles the numba kernels (tens of seconds cold): with the slow tests
compiled_case = [needs_numba, pytest.mark.slow]
int64s = st.integers(-2 ** 63, 2 ** 63 - 1)
# small ranges exercise the gather path, wide ones the digit loop
columns = st.one_of(st.lists(int64s, max_size=80),
                    st.lists(st.integers(-3, 40), min_size=65, max_size=300))


@settings(max_examples=60)
@given(columns, st.sampled_from([",", ", ", "", "|"]))
def test_join_ints_is_the_plain_join(vals, sep):
    a = np.array(vals, np.int64)
    assert join_ints(a, sep) == sep.join(map(str, vals))


@settings(max_examples=40)
@given(columns)
def test_decimal_digits_right_aligned(vals):
    digits, length = decimal_digits(np.array(vals, np.int64))
    for i, v in enumerate(vals):
        assert digits[i, digits.shape[1] - length[i]:].tobytes().decode() == str(v)


names = st.lists(st.text("ABCXYZ_", max_size=5), min_size=1, max_size=4)


@st.composite
def row_programs(draw):
    """A random sequence of pieces over n rows, and the same lines built with % formatting."""
    n = draw(st.integers(0, 40))
    rows = [""] * n
    rt = RowText(n)
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["text", "int", "choice", "blob"]))
        where = None
        if draw(st.booleans()):
            where = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
        on = [True] * n if where is None else where.tolist()
        if kind == "text":
            s = draw(st.text("ab ,;(){}", max_size=6))
            rt.text(s, where)
            vals = [s] * n
        elif kind == "int":
            ints = draw(st.lists(int64s, min_size=n, max_size=n))
            rt.int(np.array(ints, np.int64), where)
            vals = ["%d" % x for x in ints]
        elif kind == "choice":
            nm = draw(names)
            idx = draw(st.lists(st.integers(0, len(nm) - 1), min_size=n, max_size=n))
            rt.choice(np.array(idx, np.int64), nm, where)
            vals = [nm[i] for i in idx]
        else:
            data = draw(st.binary(max_size=30)).replace(b"\0", b"x")
            data = bytes(c % 26 + 97 for c in data)
            spans = [draw(st.tuples(st.integers(0, len(data)), st.integers(0, len(data))))
                     for _ in range(n)]
            spans = [(min(a, b), max(a, b)) for a, b in spans]
            rt.blob(data, np.array([a for a, _ in spans], np.int64),
                    np.array([b - a for a, b in spans], np.int64), where)
            vals = [data[a:b].decode() for a, b in spans]
        rows = [r + (v if o else "") for r, v, o in zip(rows, vals, on)]
    end = draw(st.sampled_from(["\n", "", ";\n"]))
    return rt, [r + end for r in rows], end


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=compiled_case)])
@settings(max_examples=50)
@given(prog=row_programs())
def test_row_text_matches_python_formatting(compiled, prog):
    rt, expected, end = prog
    text, offsets = rt.render(end, compiled=compiled)
    assert text.decode() == "".join(expected)
    assert offsets[0] == 0 and len(offsets) == len(expected) + 1
    for i, line in enumerate(expected):
        assert text[offsets[i]:offsets[i + 1]].decode() == line


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=compiled_case)])
def test_rows_span_several_blocks(monkeypatch, compiled):
    monkeypatch.setattr(int_text, "_BLOCK", 7)
    vals = list(range(-30, 30))
    rt = RowText(len(vals)).text("v=").int(np.array(vals)).text(" odd", np.array(vals) % 2 == 1)
    text, _ = rt.render("\n", compiled=compiled)
    assert text.decode() == "".join(f"v={v}{' odd' if v % 2 else ''}\n" for v in vals)


@pytest.mark.slow
@needs_numba
def test_large_join_takes_the_compiled_path_and_agrees():
    vals = np.arange(-5, int_text.COMPILED_FROM + 5, 7, dtype=np.int64) * 1013
    assert join_ints(vals, ",") == ",".join(map(str, vals.tolist()))


@pytest.mark.slow
@needs_numba
def test_compiled_rows_across_kernel_blocks():
    """Rows past several of the compiled kernel's blocks (with a partial last one), every piece
    kind with and without a row mask, against Python formatting."""
    n = 3 * int_text_kernel.BLOCK + 5
    rng = np.random.default_rng(7)
    a = rng.integers(-10 ** 15, 10 ** 15, n)
    a[::97] = np.iinfo(np.int64).min
    odd = np.arange(n) % 2 == 1
    sel = rng.integers(0, 3, n)
    data = b"abcdefghij"
    start = rng.integers(0, 5, n)
    length = rng.integers(0, 6, n)
    rt = (RowText(n).text("P(").int(a).text(", ").choice(sel, ["SEND", "RECV", ""]).text(" odd", odd)
          .int(sel, odd).blob(data, start, length).blob(data, start, length, ~odd).text(")"))
    text, offsets = rt.render(";\n", compiled=True)
    names = ["SEND", "RECV", ""]
    expected = []
    for r in range(n):
        s, ln = int(start[r]), int(length[r])
        blob = data[s:s + ln].decode()
        expected.append(f"P({a[r]}, {names[sel[r]]}" + (f" odd{sel[r]}" if odd[r] else "") + blob
                        + ("" if odd[r] else blob) + ");\n")
    assert text.decode() == "".join(expected)
    assert offsets[-1] == len(text)
