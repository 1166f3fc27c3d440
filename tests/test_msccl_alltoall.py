"""MSCCL XML AllToAll: import (proof in and out of place, located errors), ``hccc run`` in CPU
emulation at uneven sizes, and export back to the runtime dialect.

The XML builders below write programs shaped like the AllToAll files RCCL ships with its MSCCL
path and like msccl-tools' AllToAll generators: all-pairs (one local copy thread block, one
receive-only and one send-only thread block per peer, ``instances`` copies on their own channels
with ``nchunksperloop = ngpus * instances``), and the 2-D hierarchical algorithm (blocks for the
other nodes gathered in scratch by local id, then one multi-chunk send per node pair from
scratch, waiting on the gathers through ``nop`` steps, on channels of its own).
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from hccc.util.diagnostics import CompileError
from hccc.compiler.frontend import generators as gen
from hccc.compiler.interop.msccl_xml import export_xml, import_xml_text
from hccc.compiler.ir.symbolic import prove
from hccc.compiler.passes.build import build_program
from hccc.runtime.reference import execute, make_inputs

import msccl_emulator as emu
from msccl_texts import allpairs_xml, hierarchical_xml

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def _definition(inputs):
    n = len(inputs)
    b = len(inputs[0]) // n
    return [np.concatenate([x[j * b:(j + 1) * b] for x in inputs]) for j in range(n)]


# ------------------------------------------------------------------------------ import + proof
@pytest.mark.parametrize("xml", [lambda: allpairs_xml(4), lambda: allpairs_xml(5, instances=2, proto="LL"),
                                 lambda: allpairs_xml(3, instances=3, proto="LL128"),
                                 lambda: hierarchical_xml(2, 2), lambda: hierarchical_xml(2, 3),
                                 lambda: hierarchical_xml(3, 2), lambda: hierarchical_xml(3, 1)])
def test_import_proves_and_the_reference_computes_alltoall(xml):
    text = xml()
    for seed in range(3):   # the independent emulator agrees that the file is an AllToAll
        emu.check(text, seed=seed, capacity=2)
    ir = import_xml_text(text, "a2a.xml")
    assert ir.collective == "alltoall" and ir.in_chunks == ir.out_chunks == ir.nchunks
    prove(ir, inplace=False)
    unit = ir.nchunks
    for count in (unit, 7 * unit):
        ins = make_inputs("alltoall", ir.nranks, count, "int32", nchunks=ir.nchunks, seed=count)
        out = execute(ir, ins, nmicro=1)
        assert all(np.array_equal(a, b) for a, b in zip(out, _definition(ins)))


def test_block_at_the_wrong_position_is_refused_with_a_location():
    text = allpairs_xml(4, wrong=(2, 0))
    with pytest.raises(emu.EmulationError):
        emu.check(text)
    with pytest.raises(CompileError) as ei:
        import_xml_text(text, "bad.xml")
    d = ei.value.diagnostics[0]
    assert "does not implement alltoall" in d.message and "output chunk" in d.message
    line = text.splitlines()[d.location.line - 1]
    assert "<step" in line or "<tb" in line


def test_alltoallv_is_still_refused_by_name():
    text = allpairs_xml(2).replace('coll="alltoall"', 'coll="alltoallv"')
    with pytest.raises(CompileError, match="unsupported collective 'alltoallv'"):
        import_xml_text(text, "v.xml")


def test_in_place_only_file_is_normalised_and_proven_both_ways():
    # a program written for in-place buffers: everything read from and written to the output
    text = allpairs_xml(3).replace('srcbuf="i"', 'srcbuf="o"').replace('inplace="0"', 'inplace="1"') \
        .replace(' outofplace="1"', ' outofplace="0"')
    # in place, the local copy is a no-op and the exchanges must not overwrite what is still to be
    # sent: the all-pairs file has no such order, so the prover refuses it with a race
    with pytest.raises(CompileError, match="race|does not implement"):
        import_xml_text(text, "inplace.xml")


# ------------------------------------------------------------------------------ export round trip
@pytest.mark.parametrize("make", [lambda: gen.direct_alltoall(4, chunks_per_rank=2),
                                  lambda: gen.hierarchical_alltoall(2, 2),
                                  lambda: gen.ring_alltoall(4)])
def test_export_then_import_is_proven(make):
    ir = build_program(make())
    text = export_xml(ir)
    assert 'coll="alltoall"' in text
    emu.check(text, capacity=2)
    emu.check(text, inplace=True, capacity=2)
    back = import_xml_text(text, "round.xml")
    assert back.collective == "alltoall" and back.nchunks == ir.nchunks
    prove(back, inplace=False)
    prove(back, inplace=True)


# ------------------------------------------------------------------------------ kernels
@needs_gxx
@pytest.mark.parametrize("xml,counts", [(lambda: allpairs_xml(4, instances=2), [8 * 13 + 4, 8 * 100 + 7]),
                                        (lambda: hierarchical_xml(2, 2), [4 * 29 + 3, 4 * 64])])
def test_hccc_run_checks_imported_alltoall_in_cpu_emulation(tmp_path, capsys, xml, counts):
    from hccc.cli import main
    path = tmp_path / "a2a.xml"
    path.write_text(xml())
    sizes = ",".join(str(4 * c) for c in counts)
    rc = main(["run", str(path), "--backend", "cpu", "--bytes", sizes, "--dtype", "float32", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    import json
    res = json.loads(out)
    assert res["ok"] and all(r["wrong"] == 0 for r in res["results"])


@needs_gxx
def test_hccc_run_keeps_to_the_placements_the_file_declares(tmp_path, capsys):
    """An out-of-place-only file (``inplace="0"``, as RCCL's AllToAll files) is not run in place:
    its proof covers distinct buffers only, and aliasing them lets a receive overwrite a block
    before it is sent. ``--inplace`` is refused, the default sweep runs out of place only."""
    from hccc.cli import main
    from hccc.runtime.launcher import Runner
    text = allpairs_xml(4)
    ir = import_xml_text(text, "a2a.xml")
    assert ir.placements == (False,)
    assert build_program(gen.direct_alltoall(4)).placements == (False, True)
    with Runner(ir, "cpu", "float32", "sum") as runner:
        with pytest.raises(ValueError, match="out of place only"):
            runner.run(count=4 * 13, inplace=True)
    path = tmp_path / "a2a.xml"
    path.write_text(text)
    assert main(["run", str(path), "--backend", "cpu", "--sizes", str(4 * 4 * 13), "--inplace"]) == 1
    assert 'proven out of place only (its MSCCL XML declares inplace="0" outofplace="1")' in capsys.readouterr().err
    assert main(["run", str(path), "--backend", "cpu", "--sizes", str(4 * 4 * 13), "--json"]) == 0
    res = __import__("json").loads(capsys.readouterr().out)
    assert [r["inplace"] for r in res["results"]] == [False] and res["ok"]
    assert main(["run", str(path), "--backend", "cpu", "--sizes", str(4 * 4 * 13)]) == 0
    out = capsys.readouterr().out
    assert "# in-place: not run (alltoall_allpairs_i1 is proven out-of-place only" in out
    assert "in-place" not in out.replace("# in-place: not run", "")
