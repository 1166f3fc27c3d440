"""Text helpers of the code generator against plain oracles: the manifest's JSON (the document
``json.dumps`` writes) and each TB's sub-pipeline ranges (the per-TB ``_ranges`` of its values)."""
from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings, strategies as st

from conftest import examples
from hccc.compiler.backend.codegen import _LONG_LIST, _ranges, _tb_pipeline_ranges, manifest_json

_scalars = st.one_of(st.integers(-10 ** 12, 10 ** 12), st.booleans(), st.none(),
                     st.text(max_size=8), st.floats(allow_nan=False, allow_infinity=False))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=_LONG_LIST + 8), st.dictionaries(st.text(max_size=6), inner, max_size=5)),
    max_leaves=120)


@settings(max_examples=examples(40), deadline=None)
@given(st.dictionaries(st.text(max_size=10), _values, max_size=8))
def test_manifest_json_is_the_document(manifest):
    text = manifest_json(manifest)
    assert json.loads(text) == json.loads(json.dumps(manifest))
    assert text.endswith("}\n")
    if not any(isinstance(v, list) and len(v) > _LONG_LIST for v in manifest.values()):
        assert text == json.dumps(manifest, indent=1, sort_keys=True) + "\n"


def test_a_long_list_is_one_entry_per_line():
    ranks = [{"rank": r, "conns": [[r, 0], [r + 1, 1]]} for r in range(_LONG_LIST + 1)]
    lines = manifest_json({"ranks": ranks, "n": 1}).splitlines()
    assert lines[3] == '  {"conns": [[0, 0], [1, 1]], "rank": 0},'
    assert len(lines) == len(ranks) + 5 and lines[-2] == " ]"


class _Slices(dict):
    """``ir.tb_slices()``-like: only the starts are read."""


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=20), min_size=1, max_size=12), st.data())
def test_tb_pipeline_ranges_are_each_tbs_ranges(tbs, data):
    # most TBs run their sub-pipelines in order (sorted values); some do not
    tbs = [sorted(t) if data.draw(st.booleans()) else t for t in tbs]
    pipe = np.concatenate([np.asarray(t, np.int64) for t in tbs])
    starts = np.cumsum([0] + [len(t) for t in tbs[:-1]])
    slices = {(0, k): slice(int(s), int(s) + len(t)) for k, (s, t) in enumerate(zip(starts, tbs))}

    class _IR:
        prims = {"pipeline": pipe}

    got = _tb_pipeline_ranges(_IR(), slices)
    assert got == {int(s): _ranges(sorted(set(t))) for s, t in zip(starts, tbs)}
