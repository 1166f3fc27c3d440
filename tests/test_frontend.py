"""Unit tests for the ResCCLang front end (grammar, header, evaluator, bounds, diagnostics)."""
from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hccc.compiler.frontend.algorithm import RECV, RRC, Collective
from hccc.util.diagnostics import CompileError, render_all
from hccc.compiler.frontend import load_rccl, parse_rccl
from rccl_ast import ast_dump

H = 'ResCCLAlgo(nRanks=8, OpType="Allgather"):\n'


def hm_allreduce_text(nodes: int, gpus: int = 8) -> str:
    """The HM AllReduce (ResCCL Fig. 16, reconstructed)."""
    return f'''# HM AllReduce, {nodes} nodes x {gpus} GPUs
def ResCCLAlgo(nRanks={nodes * gpus}, nChannels=4, nWarps=16, AlgoName="HM", OpType="Allreduce", GPUPerNode={gpus}, NICPerNode={gpus}):
    nNodes = {nodes}
    nGpusperNode = {gpus}
    nChunks = nNodes * nGpusperNode
    # 1. intra-node ReduceScatter (full mesh)
    for n in range(0, nNodes):
        for r in range(0, nGpusperNode):
            for baseStep in range(0, nNodes):
                for offset in range(0, nGpusperNode - 1):
                    srcRank = nGpusperNode * n + r
                    dstRank = (r + offset + 1) % nGpusperNode + nGpusperNode * n
                    step = baseStep * (nGpusperNode - 1) + offset
                    transfer(srcRank, dstRank, step, (r + offset + 1) % nGpusperNode + nGpusperNode * baseStep, rrc)
    # 2. inter-node ReduceScatter (ring)
    for n in range(0, nNodes):
        for r in range(0, nGpusperNode):
            for baseStep in range(0, nNodes - 1):
                srcRank = nGpusperNode * n + r
                dstRank = (srcRank + nGpusperNode) % nChunks
                step = nNodes * (nGpusperNode - 1) + baseStep
                transfer(srcRank, dstRank, step, (srcRank + nChunks - baseStep * nGpusperNode) % nChunks, rrc)
    # 3. inter-node AllGather (ring)
    for n in range(0, nNodes):
        for r in range(0, nGpusperNode):
            for baseStep in range(0, nNodes - 1):
                srcRank = nGpusperNode * n + r
                dstRank = (srcRank + nGpusperNode) % nChunks
                step = nNodes * (nGpusperNode - 1) + nNodes - 1 + baseStep
                chunkId = (srcRank + nChunks - (baseStep + nNodes - 1) * nGpusperNode) % nChunks
                transfer(srcRank, dstRank, step, chunkId, recv)
    # 4. intra-node AllGather (full mesh)
    for n in range(0, nNodes):
        for r in range(0, nGpusperNode):
            for baseStep in range(0, nNodes):
                for offset in range(0, nGpusperNode - 1):
                    srcRank = nGpusperNode * n + r
                    dstRank = (r + offset + 1) % nGpusperNode + nGpusperNode * n
                    step = nNodes * (nGpusperNode - 1) + 2 * nNodes - 2 + baseStep
                    transfer(srcRank, dstRank, step, (srcRank + baseStep * nGpusperNode) % nChunks, recv)
'''


def hm_allreduce_numpy(nodes: int, G: int = 8):
    """Direct construction of the four phases from the data model (independent of the DSL)."""
    N = nodes * G
    n, r, b, o = (a.ravel() for a in np.meshgrid(np.arange(nodes), np.arange(G), np.arange(nodes),
                                                 np.arange(G - 1), indexing="ij"))
    s = G * n + r
    d = (r + o + 1) % G
    p1 = (s, G * n + d, b * (G - 1) + o, d + G * b, np.full(s.size, RRC))
    n2, r2, k = (a.ravel() for a in np.meshgrid(np.arange(nodes), np.arange(G),
                                                np.arange(nodes - 1), indexing="ij"))
    s2 = G * n2 + r2
    p2 = (s2, (s2 + G) % N, nodes * (G - 1) + k, (s2 - k * G) % N, np.full(s2.size, RRC))
    p3 = (s2, (s2 + G) % N, nodes * (G - 1) + nodes - 1 + k, (s2 - (k + nodes - 1) * G) % N,
          np.full(s2.size, RECV))
    p4 = (s, G * n + d, nodes * (G - 1) + 2 * nodes - 2 + b, (s + b * G) % N, np.full(s.size, RECV))
    return [p1, p2, p3, p4]


def rows_of(alg, site=None):
    m = slice(None) if site is None else alg.site == site
    return np.stack([alg.src[m], alg.dst[m], alg.step[m], alg.chunk[m], alg.op[m].astype(np.int64)], 1)


def err(text: str, **kw) -> CompileError:
    with pytest.raises(CompileError) as ei:
        parse_rccl(text, "t.rccl", **kw)
    e = ei.value
    assert e.diagnostics and e.diagnostics[0].location is not None
    return e


def where(e: CompileError) -> tuple[int, int, str]:
    d = e.diagnostics[0]
    return d.location.line, d.location.col, d.message


# ------------------------------------------------------------------------------- HM
def test_hm_allreduce_4x8_matches_numpy_construction():
    alg = parse_rccl(hm_allreduce_text(4), "hm.rccl")
    assert alg.ntransfers == 1984
    h = alg.header
    assert (h.nranks, h.collective, h.name, h.nchannels, h.nwarps, h.gpu_per_node,
            h.nic_per_node) == (32, Collective.ALLREDUCE, "HM", 4, 16, 8, 8)
    assert h.location.line == 2 and h.location.col == 1
    assert len(alg.sites) == 4
    for site, cols in enumerate(hm_allreduce_numpy(4)):
        assert np.array_equal(rows_of(alg, site), np.stack(cols, 1))
    assert alg.sites[0].loop_vars == ("n", "r", "baseStep", "offset")
    assert alg.sites[1].loop_vars == ("n", "r", "baseStep")
    assert alg.sites[0].location.line == 14 and alg.sites[0].location.col == 21
    for col in (alg.src, alg.dst, alg.step, alg.chunk, alg.site):
        assert col.dtype == np.int64
    assert alg.op.dtype == np.uint8
    # loop values identify each transfer's iteration
    i = int(np.flatnonzero(alg.site == 0)[5])
    assert alg.describe(i) == "(n=0, r=0, baseStep=0, offset=5)"
    j = int(np.flatnonzero(alg.site == 2)[-1])
    assert alg.loop_bindings(j) == {"n": 3, "r": 7, "baseStep": 2}


@pytest.mark.slow
def test_hm_allreduce_1024_gpus_evaluates():
    text = hm_allreduce_text(128)
    t0 = time.perf_counter()
    alg = parse_rccl(text, "hm1024.rccl")
    elapsed = time.perf_counter() - t0
    print(f"HM AllReduce 128x8: {alg.ntransfers} transfers in {elapsed:.2f} s")
    assert alg.ntransfers == 2_095_104
    expect = hm_allreduce_numpy(128)
    for site, cols in enumerate(expect):
        m = alg.site == site
        assert int(m.sum()) == cols[0].size
        got = rows_of(alg, site)
        # spot checks (full comparison is done at 4x8)
        for k in (0, 1, cols[0].size // 2, cols[0].size - 1):
            assert got[k].tolist() == [int(c[k]) for c in cols]
    assert alg.loop_values[0].shape == (128 * 8 * 128 * 7, 4)


def test_deterministic():
    a = parse_rccl(hm_allreduce_text(2))
    b = parse_rccl(hm_allreduce_text(2))
    for c in ("src", "dst", "step", "chunk", "op", "site"):
        assert np.array_equal(getattr(a, c), getattr(b, c))


# ---------------------------------------------------------------------------- header
@pytest.mark.parametrize("head", [
    'ResCCLAlgo(nRanks=8, OpType="Allgather"):',
    'def ResCCLAlgo(nRanks=8, OpType="Allgather"):',
    "def ResCCLAlgo(OpType='allgather', nRanks=8):",
    'ResCCLAlgo(\n    nRanks=8,\n    OpType="ALLGATHER",\n):',
    'ResCCLAlgo(nRanks=8, OpType=Allgather):',
])
def test_header_forms(head):
    alg = parse_rccl(head + "\n    transfer(0, 1, 0, 0, recv)\n")
    h = alg.header
    assert h.nranks == 8 and h.collective is Collective.ALLGATHER
    assert (h.name, h.nchannels, h.nwarps, h.gpu_per_node, h.nic_per_node) == ("algo", 1, 16, 0, 0)
    assert alg.ntransfers == 1


def test_header_all_parameters_any_order():
    alg = parse_rccl("ResCCLAlgo(NICPerNode=2, GPUPerNode=4, AlgoName='ring', nWarps=8, "
                     "nChannels=2, OpType=\"Reducescatter\", nRanks=4): pass\n")
    h = alg.header
    assert (h.nranks, h.collective, h.name, h.nchannels, h.nwarps, h.gpu_per_node,
            h.nic_per_node) == (4, Collective.REDUCESCATTER, "ring", 2, 8, 4, 2)
    assert alg.ntransfers == 0 and len(alg.sites) == 0


def test_header_values_are_predefined_variables():
    alg = parse_rccl("ResCCLAlgo(nRanks=4, OpType='Allgather', GPUPerNode=2):\n"
                     "    for r in range(nRanks):\n"
                     "        transfer(r, (r + 1) % nRanks, r // GPUPerNode, r, recv)\n")
    assert alg.dst.tolist() == [1, 2, 3, 0] and alg.step.tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("name", ['a"b', "x\ny", "../../etc/passwd", "α" * 5000, "", "\\"])
def test_hostile_algo_name_kept_raw(name):
    esc = name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    alg = parse_rccl(f'ResCCLAlgo(nRanks=2, OpType="Allgather", AlgoName="{esc}"):\n'
                     f"    transfer(0, 1, 0, 0, recv)\n")
    assert alg.header.name == name


@pytest.mark.parametrize("text,line,col,msg", [
    ('ResCCLAlgo(nRanks=4, OpType="Allgather", nRanks=3): pass\n', 1, 42,
     "duplicate header parameter 'nRanks'"),
    ('ResCCLAlgo(nranks=4, OpType="Allgather"): pass\n', 1, 12, "did you mean 'nRanks'"),
    ('ResCCLAlgo(nRanks=4, OpType="Allgather", colour=3): pass\n', 1, 42,
     "unknown header parameter 'colour'"),
    ('ResCCLAlgo(OpType="Allgather"): pass\n', 1, 1, "missing required header parameter 'nRanks'"),
    ('def ResCCLAlgo(nRanks=4): pass\n', 1, 1, "missing required header parameter 'OpType'"),
    ('ResCCLAlgo(nRanks="4", OpType="Allgather"): pass\n', 1, 19, "must be an integer"),
    ('ResCCLAlgo(nRanks=4, OpType=3): pass\n', 1, 29, "must be a collective name"),
    ('ResCCLAlgo(nRanks=4, OpType="Alltoallv"): pass\n', 1, 29, "unknown OpType 'Alltoallv'"),
    ('ResCCLAlgo(nRanks=4, OpType="Alltoall", Root=1): pass\n', 1, 46, "'Root' applies to Broadcast"),
    ('ResCCLAlgo(nRanks=4, OpType="Allgather", Root=1): pass\n', 1, 47, "'Root' applies to Broadcast"),
    ('ResCCLAlgo(nRanks=4, OpType="Reduce", Root=4): pass\n', 1, 44, "Root 4 is out of range"),
    ('ResCCLAlgo(nRanks=4, OpType="Reduce", Root=-1): pass\n', 1, 44, "'Root' must be at least 0"),
    ('ResCCLAlgo(nRanks=4, OpType="Reduce", nChunksPerRank=0): pass\n', 1, 54, "'nChunksPerRank' must be at least 1"),
    ('ResCCLAlgo(nRanks=65536, OpType="Allgather", nChunksPerRank=1024): pass\n', 1, 61, "must be at most"),
    ('ResCCLAlgo(nRanks=0, OpType="Allgather"): pass\n', 1, 19, "at least 1"),
    ('ResCCLAlgo(nRanks=-2, OpType="Allgather"): pass\n', 1, 19, "at least 1"),
    ('ResCCLAlgo(nRanks=4, OpType="Allgather", AlgoName=5): pass\n', 1, 51, "must be a string"),
    ('ResCCLAlgo(nRanks=4, OpType="Allgather", AlgoName=hm): pass\n', 1, 51, "quoted string"),
    ('ResCCLAlgo(nRanks=4, OpType="Allgather", nWarps=0): pass\n', 1, 49, "at least 1"),
    ('ResCCLAlgo(nRanks=99999999999999999999, OpType="Allgather"): pass\n', 1, 19, "too large"),
    ('def Foo(nRanks=4, OpType="Allgather"): pass\n', 1, 5, "expected the 'ResCCLAlgo(...)' header"),
])
def test_header_errors(text, line, col, msg):
    e = err(text)
    ln, cl, m = where(e)
    assert (ln, cl) == (line, col), m
    assert msg in m


# ---------------------------------------------------------------------------- syntax
def test_comments_blank_lines_and_one_line_forms():
    alg = parse_rccl("# leading comment\n\n"
                     "ResCCLAlgo(nRanks=4, OpType='Allgather'):  # header comment\n"
                     "    # body comment\n\n"
                     "    x = 1  # trailing\n"
                     "        # oddly indented comment line is fine\n"
                     "    for i in range(3): transfer(i, i + x, 0, i, recv)\n"
                     "    a = 2; b = 3;\n"
                     "    transfer(a, b,\n"
                     "             7, 0,   # inside parentheses\n"
                     "  rrc)\n"
                     "    pass\n"
                     "# trailing comment without newline")
    assert rows_of(alg).tolist() == [[0, 1, 0, 0, RECV], [1, 2, 0, 1, RECV], [2, 3, 0, 2, RECV],
                                     [2, 3, 7, 0, RRC]]


def test_crlf_and_tabs():
    alg = parse_rccl("ResCCLAlgo(nRanks=4, OpType='Allgather'):\r\n\tfor i in range(2):\r\n"
                     "\t\ttransfer(i, 3, 0, 0, recv)\r\n")
    assert alg.src.tolist() == [0, 1]


@pytest.mark.parametrize("args,expected", [
    ("4", [0, 1, 2, 3]), ("2, 5", [2, 3, 4]), ("1, 8, 3", [1, 4, 7]), ("5, 0, -2", [5, 3, 1]),
    ("3, 3", []), ("-2", []), ("0, 5, -1", []), ("-1, -7, -3", [-1, -4]), ("2, 5,", [2, 3, 4]),
])
def test_range_forms(args, expected):
    alg = parse_rccl(H + f"    for i in range({args}):\n        transfer(i, 0, 0, 0, recv)\n")
    assert alg.src.tolist() == expected


def test_loop_variable_after_loop_and_zero_trip():
    alg = parse_rccl(H + "    i = 42\n    for i in range(0): pass\n    transfer(i, 0, 0, 0, recv)\n"
                         "    for i in range(3): pass\n    transfer(i, 0, 0, 0, recv)\n")
    assert alg.src.tolist() == [42, 2]


@pytest.mark.parametrize("a", [-7, -6, -1, 0, 1, 5, 6, 7, 2 ** 62, -2 ** 62])
@pytest.mark.parametrize("b", [-7, -3, -1, 1, 3, 7, 2 ** 61])
def test_floor_division_and_modulo_match_python(a, b):
    text = H + (f"    x = {a}\n    y = {b}\n"
                "    transfer(x / y, x // y, x % y, -x // y, recv)\n"
                "    for k in range(2):\n"
                "        u = x + k * 0\n        v = y + k * 0\n"
                "        transfer(u / v, u // v, u % v, -u % v, rrc)\n")
    alg = parse_rccl(text)
    assert rows_of(alg)[0, :4].tolist() == [a // b, a // b, a % b, -a // b]
    assert rows_of(alg)[1:, :4].tolist() == [[a // b, a // b, a % b, -a % b]] * 2


def test_operator_precedence_and_unary():
    alg = parse_rccl(H + "    transfer(2 + 3 * 4, -2 // 3, -(7 - 10) % 4, 10 - 4 - 3, recv)\n"
                         "    transfer(+5, - -5, 2 * -3, 1 - -1, recv)\n")
    assert rows_of(alg)[:, :4].tolist() == [[14, -1, 3, 3], [5, 5, -6, 2]]


def test_string_op_and_case_insensitive_op_names():
    alg = parse_rccl(H + "    transfer(0, 1, 0, 0, 'rrc')\n    transfer(0, 1, 1, 0, RECV)\n")
    assert alg.op.tolist() == [RRC, RECV]


# ---------------------------------------------------------------------- syntax errors
@pytest.mark.parametrize("text,line,col,msg", [
    ("", 1, 1, "empty program"),
    ("# nothing\n\n   \n", 1, 1, "empty program"),
    ("x = 1\n", 1, 1, "expected the 'ResCCLAlgo(...)' header"),
    (H, 1, 42, "expected an indented block"),
    (H + "    x = 1\n   y = 2\n", 3, 4, "unindent does not match"),
    (H + "    x = 1\n        y = 2\n", 3, 9, "unexpected indent"),
    (H + "\tx = 1\n        y = 2\n", 3, 1, "inconsistent use of tabs and spaces"),
    ("  " + H + "    pass\n", 1, 1, "unexpected indent"),
    (H + "    x = 'abc\n", 2, 9, "unterminated string"),
    (H + '    x = "abc\n', 2, 9, "unterminated string"),
    (H + "    x = 1 $ 2\n", 2, 11, "unexpected character '$'"),
    (H + "    x = 1\u00a0+ 2\n", 2, 10, "unexpected character U+00A0"),
    (H + "    x = [1]\n", 2, 9, "lists and dicts"),
    (H + "    x = 3.5\n", 2, 10, "floating-point"),
    (H + "    x = 2 ** 3\n", 2, 11, "'**'"),
    (H + "    for = 3\n", 2, 5, "'for' is a reserved word"),
    (H + "    range = 3\n", 2, 5, "'range' is a reserved word"),
    (H + "    recv = 3\n", 2, 5, "'recv' is a reserved word"),
    (H + "    x = rrc + 1\n", 2, 9, "'rrc' is a reserved word"),
    (H + "    for transfer in range(3): pass\n", 2, 9, "'transfer' is a reserved word"),
    (H + "    if x: pass\n", 2, 5, "'if' is not supported"),
    (H + "    while 1: pass\n", 2, 5, "'while' is not supported"),
    (H + "    for i in range(3)\n        pass\n", 2, 22, "expected ':'"),
    (H + "    x = (1 + 2\n", 2, 9, "'(' was never closed"),
    (H + "    transfer(1, 2,\n    x = 3\n", 3, 7, "unexpected '='"),
    (H + "    x = 1 2\n", 2, 11, "expected an operator or end of line"),
    (H + "    pass\nx = 1\n", 3, 1, "after the algorithm body"),
    (H + "    for i range(3): pass\n", 2, 11, "expected 'in'"),
    (H + "    for i in 3: pass\n", 2, 14, "expected 'range'"),
    (H + "    x = 1 < 2\n", 2, 11, "comparisons and conditionals"),
    ('ResCCLAlgo(nRanks=4 OpType="Allgather"): pass\n', 1, 21, "expected ')' or ','"),
    (H + "    x = 1 +\n", 2, 12, "expected an expression"),
    (H + "    x == 1\n", 2, 7, "comparisons"),
    (H + "    x = 1 = 2\n", 2, 11, "unexpected '='"),
    (H + "    x = 'abc'\n", 2, 9, "strings are only allowed"),
    (H + "    x = 'a' + 1\n", 2, 13, "unsupported operand for '+'"),
    (H + "    x = 9223372036854775807\n", 2, 9, "too large"),
    (H + "    transfer(0, 1, 0, 0)\n", 2, 5, "transfer() takes 5 or 6 arguments"),
    (H + "    transfer(0, 1, 0, 0, recv, 1, 2)\n", 2, 5, "got 7"),
    (H + "    transfer(0, 1, 0, 0, recv, rrc)\n", 2, 32, "argument 6 (channel)"),
    (H + "    transfer(0, 1, 0, 0, foo)\n", 2, 26, "unknown transfer op foo"),
    (H + "    transfer(0, 1, 0, 0, 'send')\n", 2, 26, "unknown transfer op 'send'"),
    (H + "    transfer(0, 1, 0, 0, 1 + 2)\n", 2, 26, "must be the operation"),
    (H + "    transfer(recv, 1, 0, 0, recv)\n", 2, 14, "argument 1 (src)"),
    (H + "    for i in range(): pass\n", 2, 14, "range() takes 1 to 3 arguments, got 0"),
    (H + "    for i in range(1, 2, 3, 4): pass\n", 2, 14, "got 4"),
])
def test_syntax_errors(text, line, col, msg):
    e = err(text)
    ln, cl, m = where(e)
    assert msg in m
    assert (ln, cl) == (line, col), m
    assert "Traceback" not in render_all(e)


def test_transfer_channel_argument():
    """The optional sixth argument names the transfer's channel (0 where it is left out); a
    program that names none has no channel column."""
    alg = parse_rccl(H + "    for i in range(3):\n        transfer(i, i + 1, 0, i, recv, i % 2)\n"
                     "    transfer(5, 6, 0, 5, recv)\n")
    assert alg.channels.tolist() == [0, 1, 0, 0]
    assert parse_rccl(H + "    transfer(0, 1, 0, 0, recv)\n").channel is None


def test_unclosed_parenthesis_note():
    e = err(H + "    transfer(0, 1, 0, 0, recv\n    x = 1\n")
    d = e.diagnostics[0]
    assert (d.location.line, d.location.col) == (3, 5)
    assert d.notes == ("the '(' at line 2, column 13 is not closed",)


def test_nesting_depth_limits():
    deep = H + "".join("    " * (k + 1) + f"for v{k} in range(1):\n" for k in range(65)) + \
        "    " * 66 + "pass\n"
    ln, cl, m = where(err(deep))
    assert "nested too deeply" in m and ln == 66
    ok = H + "".join("    " * (k + 1) + f"for v{k} in range(1):\n" for k in range(64)) + \
        "    " * 65 + "transfer(0, 1, 0, 0, recv)\n"
    assert parse_rccl(ok).loop_values[0].shape == (1, 64)
    expr = "(" * 300 + "1" + ")" * 300  # parentheses alone do not nest the AST
    assert parse_rccl(H + f"    transfer({expr}, 0, 0, 0, recv)\n").src.tolist() == [1]
    ln, cl, m = where(err(H + "    x = " + " + ".join(["1"] * 400) + "\n"))
    assert "expression nested too deeply" in m
    ln, cl, m = where(err(H + "    x = " + "-" * 400 + "1\n"))
    assert "expression nested too deeply" in m


# ------------------------------------------------------------------ evaluation errors
@pytest.mark.parametrize("body,line,col,msg", [
    ("    x = y\n", 2, 9, "name 'y' is not defined"),
    ("    for n in range(4):\n        for r in range(2):\n            x = 5 // (n - 3)\n",
     4, 19, "division by zero (n=3, r=0)"),
    ("    for n in range(4):\n        x = 5 / (2 - n)\n", 3, 15, "division by zero (n=2)"),
    ("    for i in range(4):\n        x = -7 % (i - 2)\n", 3, 16, "modulo by zero (i=2)"),
    ("    x = 1 // 0\n", 2, 11, "division by zero"),
    ("    for i in range(3):\n        for j in range(i):\n            z = j\n"
     "        transfer(z, 0, 0, 0, recv)\n", 5, 18, "name 'z' is not defined (i=0)"),
    ("    for i in range(0, 10, 0): pass\n", 2, 27, "range() step must not be zero"),
    ("    for i in range(3):\n        for j in range(0, 3, 1 - i): pass\n", 3, 30,
     "range() step must not be zero (i=1)"),
    ("    x = 4611686018427387904 * 2\n", 2, 29, "integer overflow"),
    ("    x = 4611686018427387904\n    for i in range(3):\n        y = x + i\n", 4, 15,
     "integer overflow: result of '+' exceeds 2**62 in magnitude (i=1)"),
    ("    x = 2147483648\n    for i in range(3):\n        y = (x - 1 + i) * (x - 1 + i)\n",
     4, 25, "integer overflow: result of '*' exceeds 2**62 in magnitude (i=2)"),
    ("    for i in range(10 * 10 * 10 * 10 * 10 * 10 * 10 * 10 * 10 * 10 * 10 * 10):\n"
     "        pass\n", 2, 5, "loop iteration limit exceeded"),
    ("    for i in range(1000000):\n        for j in range(1000000):\n            pass\n",
     3, 9, "loop iteration limit exceeded"),
    ("    for i in range(-4611686018427387904, 4611686018427387904):\n        pass\n",
     2, 5, "loop iteration limit exceeded"),
    ("    for i in range(1000000):\n        for j in range(1000000 - i, 0, -1):\n"
     "            pass\n", 3, 9, "loop iteration limit exceeded"),
    ("    for i in range(10000):\n        for j in range(5000):\n"
     "            transfer(i, j, 0, 0, recv)\n", 4, 13, "too many transfers"),
])
def test_evaluation_errors(body, line, col, msg):
    t0 = time.perf_counter()
    e = err(H + body)
    assert time.perf_counter() - t0 < 30  # sanity only; real numbers are in the report
    ln, cl, m = where(e)
    assert msg in m
    assert (ln, cl) == (line, col), m


def test_custom_limits():
    body = H + "    for i in range(50):\n        transfer(i, 0, 0, 0, recv)\n"
    assert parse_rccl(body, max_transfers=50).ntransfers == 50
    assert "too many transfers" in where(err(body, max_transfers=49))[2]
    assert parse_rccl(body, max_iterations=50).ntransfers == 50
    assert "iteration limit" in where(err(body, max_iterations=49))[2]
    seq = H + "    s = 0\n    for i in range(10):\n        s = s + 1\n        transfer(s, 0, 0, 0, recv)\n"
    assert parse_rccl(seq, max_transfers=10).src.tolist() == list(range(1, 11))
    assert "too many transfers" in where(err(seq, max_transfers=9))[2]


# ------------------------------------------------------------------ sequential loops
def test_counter_loops_and_table_order():
    alg = parse_rccl(H + "    step = 0\n"
                         "    for k in range(3):\n"
                         "        for r in range(4):\n"
                         "            transfer(r, (r + 1) % 4, step, (r - k) % 4, rrc)\n"
                         "        step = step + 1\n"
                         "    for a in range(2):\n"
                         "        s = 10 * a\n"
                         "        for i in range(a + 2):\n"
                         "            s = s + 1\n"
                         "            transfer(a, i, s, 0, recv)\n")
    r0 = rows_of(alg, 0)
    assert r0[:, 2].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert r0[:, 3].tolist() == [(r - k) % 4 for k in range(3) for r in range(4)]
    r1 = rows_of(alg, 1)  # sequential inner loop inside an expanded outer loop: Python order
    assert r1[:, :3].tolist() == [[0, 0, 1], [0, 1, 2], [1, 0, 11], [1, 1, 12], [1, 2, 13]]
    assert alg.loop_values[1].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]]


@settings(max_examples=60)
@given(st.integers(1, 5), st.integers(0, 4), st.integers(-3, 3).filter(lambda s: s != 0))
def test_ring_program_matches_python(n, k0, stp):
    text = (f"ResCCLAlgo(nRanks={n}, OpType='Allgather'):\n"
            f"    for k in range({k0}, {k0} + 3 * {stp}, {stp}):\n"
            f"        for r in range(nRanks):\n"
            f"            transfer(r, (r + 1) % nRanks, k, (r - k) % nRanks, recv)\n")
    expect = [(r, (r + 1) % n, k, (r - k) % n, RECV) for k in range(k0, k0 + 3 * stp, stp)
              for r in range(n)]
    assert list(parse_rccl(text).rows()) == expect


# ------------------------------------------------------------------ files
def test_load_rccl_file_and_binary_input(tmp_path):
    p = tmp_path / "ring.rccl"
    p.write_text(H + "    for i in range(8):\n        transfer(i, (i + 1) % 8, 0, i, recv)\n")
    alg = load_rccl(str(p))
    assert alg.ntransfers == 8 and alg.sites[0].location.source.name == str(p)
    b = tmp_path / "bin.rccl"
    b.write_bytes(b"ResCCLAlgo(nRanks=2, OpType='Allgather'):\n    x = \xff\xfe\n")
    e = pytest.raises(CompileError, load_rccl, str(b)).value
    assert (e.diagnostics[0].location.line, e.diagnostics[0].location.col) == (2, 9)
    z = tmp_path / "nul.rccl"
    z.write_bytes(b"\x00\x01\x02")
    e = pytest.raises(CompileError, load_rccl, str(z)).value
    assert "NUL" in e.diagnostics[0].message
    e = pytest.raises(CompileError, load_rccl, str(tmp_path / "missing.rccl")).value
    assert "cannot read" in e.diagnostics[0].message


@settings(max_examples=150)
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes(text):
    try:
        parse_rccl(text, max_iterations=10_000, max_transfers=10_000)
    except CompileError as e:
        assert e.diagnostics[0].location is not None


@settings(max_examples=150)
@given(st.lists(st.sampled_from(["ResCCLAlgo", "(", ")", "nRanks", "=", "4", ",", "OpType",
                                 "'Allgather'", ":", "\n", "    ", "for", "i", "in", "range",
                                 "transfer", "recv", "rrc", "+", "//", "%", "-", "x", "#c", "\t"]),
                max_size=40))
def test_token_soup_never_crashes(tokens):
    text = 'ResCCLAlgo(nRanks=4, OpType="Allgather"):\n    ' + " ".join(tokens)
    try:
        parse_rccl(text, max_iterations=10_000, max_transfers=10_000)
    except CompileError as e:
        assert e.diagnostics[0].location is not None


def test_parser_builds_the_written_ast():
    """The AST of a program using every form of the grammar (unary signs, folded negative
    literals, trailing commas, a parenthesis across lines, statements on one line, the op as a
    string or a name in any case), written out by hand: node kinds, values, positions, call
    sites and loop variables."""
    from hccc.compiler.frontend import rccl_parser as rp
    from hccc.util.diagnostics import SourceFile

    src = SourceFile("a.rccl", 'def ResCCLAlgo(nRanks=4, OpType="Allgather",):\n'
                               '    x = -(1 + 2) * 3 // 4 % 5 - +x; y = --7\n'
                               '    for i in range(x, 4, (\n        1)):\n'
                               '        transfer(i % 4, (i + 1) % 4, -i, i / 1, "RRC", 0,); pass\n'
                               '    for j in range(2): transfer(0, 1, j, j, Recv)\n')
    p = rp.parse_program(src)
    assert ast_dump(p.body) == [
        {"node": "Assign", "loc": (2, 5), "name": "x", "value": {
            "node": "BinOp", "loc": (2, 31), "op": "-",
            "left": {"node": "BinOp", "loc": (2, 27), "op": "%",
                     "left": {"node": "BinOp", "loc": (2, 22), "op": "//",
                              "left": {"node": "BinOp", "loc": (2, 18), "op": "*",
                                       "left": {"node": "Neg", "loc": (2, 9), "operand": {
                                           "node": "BinOp", "loc": (2, 13), "op": "+",
                                           "left": {"node": "Int", "loc": (2, 11), "value": 1},
                                           "right": {"node": "Int", "loc": (2, 15), "value": 2}}},
                                       "right": {"node": "Int", "loc": (2, 20), "value": 3}},
                              "right": {"node": "Int", "loc": (2, 25), "value": 4}},
                     "right": {"node": "Int", "loc": (2, 29), "value": 5}},
            "right": {"node": "Var", "loc": (2, 34), "name": "x"}}},
        {"node": "Assign", "loc": (2, 37), "name": "y", "value": {"node": "Int", "loc": (2, 41), "value": 7}},
        {"node": "For", "loc": (3, 5), "var": "i", "range_loc": (3, 14), "carried": False,
         "trip_known_positive": False, "direct_transfers": [],
         "args": [{"node": "Var", "loc": (3, 20), "name": "x"}, {"node": "Int", "loc": (3, 23), "value": 4},
                  {"node": "Int", "loc": (4, 9), "value": 1}],
         "body": [{"node": "Transfer", "loc": (5, 9), "op": RRC, "site": 0, "loop_vars": ("i",), "needs_key": False,
                   "args": [{"node": "BinOp", "loc": (5, 20), "op": "%",
                             "left": {"node": "Var", "loc": (5, 18), "name": "i"},
                             "right": {"node": "Int", "loc": (5, 22), "value": 4}},
                            {"node": "BinOp", "loc": (5, 33), "op": "%",
                             "left": {"node": "BinOp", "loc": (5, 28), "op": "+",
                                      "left": {"node": "Var", "loc": (5, 26), "name": "i"},
                                      "right": {"node": "Int", "loc": (5, 30), "value": 1}},
                             "right": {"node": "Int", "loc": (5, 35), "value": 4}},
                            {"node": "Neg", "loc": (5, 38), "operand": {"node": "Var", "loc": (5, 39), "name": "i"}},
                            {"node": "BinOp", "loc": (5, 44), "op": "/",
                             "left": {"node": "Var", "loc": (5, 42), "name": "i"},
                             "right": {"node": "Int", "loc": (5, 46), "value": 1}},
                            {"node": "Int", "loc": (5, 56), "value": 0}]},
                  {"node": "Pass", "loc": (5, 61)}]},
        {"node": "For", "loc": (6, 5), "var": "j", "range_loc": (6, 14), "carried": False,
         "trip_known_positive": False, "direct_transfers": [],
         "args": [{"node": "Int", "loc": (6, 20), "value": 2}],
         "body": [{"node": "Transfer", "loc": (6, 24), "op": RECV, "site": 1, "loop_vars": ("j",), "needs_key": False,
                   "args": [{"node": "Int", "loc": (6, 33), "value": 0}, {"node": "Int", "loc": (6, 36), "value": 1},
                            {"node": "Var", "loc": (6, 39), "name": "j"}, {"node": "Var", "loc": (6, 42), "name": "j"}]}]},
    ]
    assert [t.site for t in p.transfers] == [0, 1]
    assert p.transfers[0] is p.body[2].body[0] and p.transfers[1] is p.body[3].body[0]


@pytest.mark.parametrize("body, want", [
    # a syntax error anywhere comes before any static error
    ('    x = "a"\n    y = (1\n', "3:9: error: '(' was never closed"),
    # static errors in the program's order: statements top-down, a statement's parts in order
    ('    x = "a"\n    transfer(0, 1, 0, 0)\n', "2:9: error: strings are only allowed"),
    ('    transfer(0, 1, 0, 0)\n    x = "a"\n', "2:5: error: transfer() takes 5 or 6 arguments"),
    ('    transfer(0, "a", 0, 0, send)\n', "2:17: error: strings are only allowed"),
    ('    transfer(0, 1, 0, 0, send)\n', "2:26: error: unknown transfer op send"),
    ('    for i in range(1, "a"):\n        x = "b"\n', "2:23: error: strings are only allowed"),
    ('    for i in range():\n        x = "b"\n', "2:14: error: range() takes 1 to 3 arguments, got 0"),
    ('    x = "a" + 99999999999999999999\n', "2:13: error: unsupported operand for '+'"),
    ('    x = 99999999999999999999 + "a"\n', "2:30: error: unsupported operand for '+'"),
    ('    x = -"a" + 1\n', "2:10: error: strings are only allowed"),
    ('    x = +99999999999999999999\n', "2:10: error: integer literal 99999999999999999999 is too large"),
    # the expression depth: the first operand 201 operators down (a sign counts, a parenthesis not)
    ('    x = ' + '-' * 200 + '1\n', None),
    ('    x = ' + '-' * 201 + '1\n', "2:210: error: expression nested too deeply"),
    ('    x = ' + '+' * 200 + '-(1)\n', "2:211: error: expression nested too deeply"),
    ('    x = ' + '-(' * 200 + '1' + ')' * 200 + '\n', None),
    ('    x = 1' + ' + 1' * 201 + '\n', "2:9: error: expression nested too deeply"),
])
def test_errors_in_program_order(body, want):
    """The first error of a program with several is the first in the program's order, whatever
    order the parser builds the AST in (bottom-up: inner expressions before their statement)."""
    src = 'ResCCLAlgo(nRanks=4, OpType="Allgather"):\n' + body
    if want is None:
        parse_rccl(src)
        return
    with pytest.raises(CompileError) as got:
        parse_rccl(src)
    first = got.value.diagnostics[0]
    assert f"{first.location.line}:{first.location.col}: error: {first.message}".startswith(want), str(first)
