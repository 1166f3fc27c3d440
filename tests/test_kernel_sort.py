"""util/kernel_sort.py: the kernels' sorts, compiled, equal numpy's (the plain twins run numpy's);
and no kernel uses what makes numba compile for seconds (numpy's sorts, an array assigned to a
slice), which ``benchmarks/jit_compile.py`` measures on a fresh cache."""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hccc.util import jit, kernel_sort
from source_modules import MODULES

needs_numba = pytest.mark.skipif(not jit.have_numba(), reason="numba is not installed")


def _kernel_modules() -> list[str]:
    """Every module of the package that declares its kernels (``KERNELS = Kernels(...)``)."""
    return sorted(name for name, path in MODULES.items()
                  if re.search(r"^KERNELS = Kernels\(", path.read_text(), re.M))


@needs_numba
@settings(max_examples=60)
@given(st.lists(st.integers(-2 ** 62, 2 ** 62), max_size=70), st.data())
def test_compiled_sort_range_sorts_the_range_only(values, data):
    a = np.array(values, np.int64)
    lo = data.draw(st.integers(0, a.size))
    hi = data.draw(st.integers(lo, a.size))
    want = a.copy()
    want[lo:hi] = np.sort(want[lo:hi])
    got = a.copy()
    kernel_sort.compiled_sort_range()(got, lo, hi)
    assert (got == want).all()
    plain = a.copy()
    kernel_sort.sort_range(plain, lo, hi)
    assert (plain == want).all()


@needs_numba
@settings(max_examples=60)
@given(st.lists(st.integers(0, 5), max_size=70), st.booleans())
def test_compiled_argsort_is_stable_as_numpys(keys, floats):
    k = np.array(keys, np.float64 if floats else np.int64)
    if floats:
        k = -k / 3.0                      # ties stay ties after the arithmetic
    want = np.argsort(k, kind="stable")
    assert (kernel_sort.compiled_argsort_stable()(k) == want).all()
    assert (kernel_sort.argsort_stable(k) == want).all()


def _costly(fn) -> list[str]:
    """What in ``fn``'s source makes numba compile for seconds: numpy's sorts, and an array
    expression assigned to a slice (its shape check's error message)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("sort", "argsort", "lexsort"):
            found.append(f"line {node.lineno}: .{node.func.attr}()")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                sliced = isinstance(t, ast.Subscript) and (
                    isinstance(t.slice, ast.Slice) or
                    (isinstance(t.slice, ast.Tuple) and any(isinstance(e, ast.Slice) for e in t.slice.elts)))
                if sliced and not isinstance(node.value, ast.Constant):
                    found.append(f"line {node.lineno}: an array assigned to a slice")
    return found


@pytest.mark.parametrize("module", _kernel_modules())
def test_kernels_avoid_what_numba_compiles_slowly(module):
    mod = importlib.import_module(module)
    bad = {}
    for name in mod.KERNELS._names:
        got = _costly(getattr(mod, name))
        if got:
            bad[name] = got
    assert not bad, f"{module}: {bad} (use hccc.util.kernel_sort, or a loop)"
