"""The test MSCCL XML executor (:mod:`msccl_emulator`) on the shipped samples: each computes its
collective under random schedules, a missing ``hasdep`` deadlocks, a wrong slot is caught, and the
strict rules refuse an in-place-only algorithm."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from msccl_emulator import EmulationError, check

SAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples" / "msccl").glob("*.xml"))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_samples_compute_their_collective(path, seed):
    text = path.read_text()
    inplace = 'inplace="1"' in text
    outofplace = 'outofplace="1"' in text or ('outofplace' not in text and not inplace)
    if outofplace:
        check(text, seed=seed, capacity=2)
    if inplace:
        check(text, inplace=True, seed=seed, capacity=2)


def test_missing_hasdep_deadlocks_and_wrong_slot_is_caught():
    text = (SAMPLES[0].parent / "allreduce_allpairs_4.xml").read_text()
    # the peer thread blocks wait for the local reduction's last step: without its signal, deadlock
    broken = re.sub(r'(type="re" srcbuf="s" srcoff="3" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1") '
                    r'hasdep="1"', r'\1 hasdep="0"', text, count=1)
    assert broken != text
    with pytest.raises(EmulationError, match="deadlock"):
        check(broken)
    wrong = text.replace('type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="1"',
                         'type="r" srcbuf="o" srcoff="1" dstbuf="o" dstoff="2"', 1)
    assert wrong != text
    with pytest.raises(EmulationError):
        check(wrong)


def test_strict_rules_reject_mismatched_message_fields():
    text = (SAMPLES[0].parent / "allgather_direct_4.xml").read_text()
    # an in-place-only algorithm is not what the strict checker accepts
    with pytest.raises(EmulationError, match="out-of-place"):
        check(text, strict=True)
