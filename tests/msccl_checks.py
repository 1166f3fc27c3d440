"""Checks shared by the MSCCL export tests: two programs give the same reference-executor results,
and an exported XML keeps the format rules of the runtimes' readers and of the dialect."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np

from hccc.runtime.reference import execute, make_inputs


def same_results(a, b, *, inplace_modes=(False, True), seed=0):
    """Reference-executor outputs of two programs agree on random inputs (and random orders).

    Uneven element counts only for programs without scratch: MSCCL-style scratch slots hold any
    chunk, so their sizes only agree when every chunk has the same size (as the runtimes pad to).
    """
    count = 3 * a.nchunks + (0 if a.scratch_chunks or b.scratch_chunks else 2)
    for inplace in inplace_modes:
        inp = make_inputs(a.collective, a.nranks, count, nchunks=a.nchunks, seed=seed, low=-1000, high=1000)
        x = execute(a, inp, inplace=inplace)
        y = execute(b, inp, inplace=inplace, seed=seed + 1)
        assert all(np.array_equal(u, v) for u, v in zip(x, y)), f"results differ (inplace={inplace})"


def structure(text: str) -> None:
    """Format rules of the runtimes' XML readers and of the dialect."""
    assert not text.lstrip().startswith("<?xml"), "the runtimes' readers do not accept an XML declaration"
    for line in text.splitlines():
        assert line.count("<") == 1, f"one element per line: {line!r}"
        assert "  =" not in line and "= " not in line and "'" not in line
    root = ET.fromstring(text)
    assert list(root.attrib) == ["name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace",
                                 "outofplace", "minBytes", "maxBytes"]
    for g in root:
        tbs = list(g)
        assert [int(t.get("id")) for t in tbs] == list(range(len(tbs)))
        targets = set()
        signals = set()
        for t in tbs:
            assert list(t.attrib) == ["id", "send", "recv", "chan"]
            steps = list(t)
            assert [int(s.get("s")) for s in steps] == list(range(len(steps)))
            pending = False
            for s in steps:
                a = s.attrib
                assert list(a) == ["s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps",
                                   "hasdep"]
                if a["type"] == "nop":
                    assert int(a["depid"]) >= 0 and a["hasdep"] == "0"
                    pending = True
                else:
                    assert not pending or int(a["depid"]) >= 0, "nops must be followed by a waiting step"
                    pending = False
                if int(a["depid"]) >= 0:
                    assert int(a["depid"]) != int(t.get("id"))
                    targets.add((int(a["depid"]), int(a["deps"])))
                if a["hasdep"] == "1":
                    signals.add((int(t.get("id")), int(a["s"])))
            assert not pending, "a thread block ends with nops"
        assert targets == signals, "hasdep must mark exactly the steps others wait for"
