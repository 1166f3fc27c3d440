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

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")


def _step(s, typ, sb, so, db, do, cnt=1, depid=-1, deps=-1, hasdep=0):
    return (f'      <step s="{s}" type="{typ}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" '
            f'cnt="{cnt}" depid="{depid}" deps="{deps}" hasdep="{hasdep}"/>')


def _algo(name, proto, nch, C, N, gpus, inplace=0, extra=""):
    head = (f'<algo name="{name}" proto="{proto}" nchannels="{nch}" nchunksperloop="{C}" ngpus="{N}" '
            f'coll="alltoall" inplace="{inplace}"{extra}>')
    return "\n".join(["<!-- test program -->", head] + gpus + ["</algo>"]) + "\n"


def allpairs_xml(N: int, instances: int = 1, proto: str = "Simple", wrong: tuple | None = None) -> str:
    """All-pairs AllToAll; ``wrong=(gpu, peer)`` makes gpu receive peer's block at the wrong slot."""
    I = instances
    C = N * I
    gpus = []
    for g in range(N):
        tbs = []
        tid = 0
        for c in range(I):
            tbs.append(f'    <tb id="{tid}" send="-1" recv="-1" chan="{c}">\n'
                       + _step(0, "cpy", "i", g * I + c, "o", g * I + c) + "\n    </tb>")
            tid += 1
        for c in range(I):
            for p in range(N):
                if p == g:
                    continue
                do = p * I + c
                if wrong == (g, p):
                    do = ((p + 1) % N if (p + 1) % N != g else (p + 2) % N) * I + c
                tbs.append(f'    <tb id="{tid}" send="-1" recv="{p}" chan="{c}">\n'
                           + _step(0, "r", "i", 0, "o", do) + "\n    </tb>")
                tid += 1
        for c in range(I):
            for p in range(N):
                if p == g:
                    continue
                tbs.append(f'    <tb id="{tid}" send="{p}" recv="-1" chan="{c}">\n'
                           + _step(0, "s", "i", p * I + c, "o", 0) + "\n    </tb>")
                tid += 1
        gpus.append(f'  <gpu id="{g}" i_chunks="{C}" o_chunks="{C}" s_chunks="0">\n' + "\n".join(tbs)
                    + "\n  </gpu>")
    return _algo(f"alltoall_allpairs_i{I}", proto, I, C, N, gpus, extra=' outofplace="1" minBytes="0" maxBytes="0"')


def hierarchical_xml(nnodes: int, G: int, proto: str = "Simple") -> str:
    """2-D hierarchical AllToAll on nnodes x G gpus (rank G*n + r).

    Phase 1 (channel 0): gpu (n, r) sends its block for (m, r2), m != n, into scratch slot
    m'*G + r of its local peer (n, r2) (m' = index of m among the other nodes) and copies its own
    block for (m, r) into its scratch slot m'*G + r; blocks for its own node go straight to the
    output. Phase 2 (channel 1): gpu (n, r) sends scratch slots m'*G .. m'*G+G-1 (cnt G) to
    (m, r), into output G*n .. G*n+G-1; it waits for the gathers through nop steps."""
    N = nnodes * G
    gpus = []
    for n in range(nnodes):
        for r in range(G):
            g = G * n + r
            others = [m for m in range(nnodes) if m != n]
            scr = len(others) * G
            tbs = []
            tid = 0
            gather_tbs = []
            # receive-only thread blocks from local peers (phase 1)
            for r2 in range(G):
                if r2 == r:
                    continue
                p = G * n + r2
                steps = []
                for k, m in enumerate(others):
                    steps.append(_step(len(steps), "r", "i", 0, "s", k * G + r2, hasdep=1))
                steps.append(_step(len(steps), "r", "i", 0, "o", p))
                tbs.append(f'    <tb id="{tid}" send="-1" recv="{p}" chan="0">\n' + "\n".join(steps) + "\n    </tb>")
                gather_tbs.append(tid)
                tid += 1
            # send-only thread blocks to local peers (phase 1)
            own_tb = None
            for r2 in range(G):
                if r2 == r:
                    continue
                p = G * n + r2
                steps = [_step(k, "s", "i", G * m + r2, "o", 0) for k, m in enumerate(others)]
                steps.append(_step(len(steps), "s", "i", p, "o", 0))
                if own_tb is None:
                    for k, m in enumerate(others):
                        steps.append(_step(len(steps), "cpy", "i", G * m + r, "s", k * G + r, hasdep=1))
                    steps.append(_step(len(steps), "cpy", "i", g, "o", g))
                    own_tb = tid
                tbs.append(f'    <tb id="{tid}" send="{p}" recv="-1" chan="0">\n' + "\n".join(steps) + "\n    </tb>")
                tid += 1
            if own_tb is None:   # G == 1: a thread block of its own for the copies
                steps = [_step(k, "cpy", "i", G * m + r, "s", k * G + r, hasdep=1) for k, m in enumerate(others)]
                steps.append(_step(len(steps), "cpy", "i", g, "o", g))
                tbs.append(f'    <tb id="{tid}" send="-1" recv="-1" chan="0">\n' + "\n".join(steps) + "\n    </tb>")
                own_tb = tid
                tid += 1
            # phase 2: receive from and send to the same local id on every other node
            for k, m in enumerate(others):
                p = G * m + r
                tbs.append(f'    <tb id="{tid}" send="-1" recv="{p}" chan="1">\n'
                           + _step(0, "r", "i", 0, "o", G * m, cnt=G) + "\n    </tb>")
                tid += 1
            for k, m in enumerate(others):
                p = G * m + r
                waits = [(t, k) for t in gather_tbs] + [(own_tb, len(others) + 1 + k if G > 1 else k)]
                steps = []
                for t, s in waits[:-1]:
                    steps.append(_step(len(steps), "nop", "i", -1, "o", -1, cnt=0, depid=t, deps=s))
                t, s = waits[-1]
                steps.append(_step(len(steps), "s", "s", k * G, "o", 0, cnt=G, depid=t, deps=s))
                tbs.append(f'    <tb id="{tid}" send="{p}" recv="-1" chan="1">\n' + "\n".join(steps) + "\n    </tb>")
                tid += 1
            gpus.append(f'  <gpu id="{g}" i_chunks="{N}" o_chunks="{N}" s_chunks="{scr}">\n' + "\n".join(tbs)
                        + "\n  </gpu>")
    return _algo(f"hierarchical_all_to_all_{nnodes}x{G}", proto, 2, N, N, gpus)


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
