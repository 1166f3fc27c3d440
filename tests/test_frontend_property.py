"""Property tests: the vectorised .rccl evaluator equals plain sequential semantics.

Programs are generated as a small test-owned AST, rendered to ResCCLang text for the product,
and run directly by the naive reference interpreter below (which never sees the product's
parser or AST).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import examples

from hccc.util.diagnostics import CompileError
from hccc.compiler.frontend import parse_rccl
from hccc.compiler.frontend.algorithm import RRC

LIMIT = 2 ** 62
MAX_ITER = 3000
MAX_TRANSFERS = 2000
NRANKS = 4


# ------------------------------------------------------------------ reference interpreter
class RefError(Exception):
    pass


class Reference:
    """Sequential interpreter over the test AST, with the documented bounds."""

    def __init__(self, max_iterations=MAX_ITER, max_transfers=MAX_TRANSFERS):
        self.env = {"nRanks": NRANKS, "nChannels": 1, "nWarps": 16, "GPUPerNode": 0,
                    "NICPerNode": 0}
        self.iters = 0
        self.max_iterations = max_iterations
        self.max_transfers = max_transfers
        self.out = []  # (site, src, dst, step, chunk, op, loop values)
        self.loops = []

    def ev(self, e):
        k = e[0]
        if k == "int":
            return e[1]
        if k == "var":
            if e[1] not in self.env:
                raise RefError("undefined")
            return self.env[e[1]]
        if k == "neg":
            return -self.ev(e[1])
        a, b = self.ev(e[2]), self.ev(e[3])
        op = e[1]
        if op == "+":
            r = a + b
        elif op == "-":
            r = a - b
        elif op == "*":
            r = a * b
        else:
            if b == 0:
                raise RefError("zero")
            r = a % b if op == "%" else a // b
        if abs(r) > LIMIT:
            raise RefError("overflow")
        return r

    def run(self, stmts):
        for s in stmts:
            if s[0] == "assign":
                self.env[s[1]] = self.ev(s[2])
            elif s[0] == "transfer":
                vals = [self.ev(a) for a in s[2]]
                if len(self.out) + 1 > self.max_transfers:
                    raise RefError("transfers")
                self.out.append((s[1], *vals, s[3], tuple(v for _, v in self.loops)))
            else:
                _, var, args, body = s
                vals = [self.ev(a) for a in args]
                if len(vals) == 1:
                    vals = [0, vals[0], 1]
                elif len(vals) == 2:
                    vals = vals + [1]
                if vals[2] == 0:
                    raise RefError("step")
                for v in range(*vals):
                    self.iters += 1
                    if self.iters > self.max_iterations:
                        raise RefError("iterations")
                    self.env[var] = v
                    self.loops.append((var, v))
                    self.run(body)
                    self.loops.pop()


# ------------------------------------------------------------------ program generation
NAMES = ["a", "b", "c", "i", "j", "s"]


@st.composite
def exprs(draw, depth=0):
    if depth >= 2 or draw(st.integers(0, 2)) > 0:
        if draw(st.booleans()):
            return ("int", draw(st.integers(-4, 6)))
        return ("var", draw(st.sampled_from(NAMES + ["nRanks"])))
    if draw(st.integers(0, 5)) == 0:
        return ("neg", draw(exprs(depth + 1)))
    op = draw(st.sampled_from(["+", "-", "*", "//", "/", "%"]))
    return ("bin", op, draw(exprs(depth + 1)), draw(exprs(depth + 1)))


def render_expr(e) -> str:
    k = e[0]
    if k == "int":
        return str(e[1]) if e[1] >= 0 else f"({e[1]})"
    if k == "var":
        return e[1]
    if k == "neg":
        return f"-({render_expr(e[1])})"
    return f"({render_expr(e[2])} {e[1]} {render_expr(e[3])})"


@st.composite
def range_args(draw):
    small = st.one_of(st.integers(-1, 5).map(lambda v: ("int", v)),
                      st.sampled_from(NAMES).map(lambda n: ("var", n)),
                      st.tuples(st.sampled_from(NAMES), st.integers(-2, 3)).map(
                          lambda t: ("bin", "+", ("var", t[0]), ("int", t[1]))),
                      exprs(1))
    n = draw(st.integers(1, 3))
    args = [draw(small) for _ in range(n)]
    if n == 3 and draw(st.booleans()):
        args[2] = ("int", draw(st.sampled_from([-2, -1, 1, 2, 3])))
    return args


@st.composite
def blocks(draw, depth, counter):
    stmts = []
    for _ in range(draw(st.integers(1, 3))):
        kinds = ["assign", "assign", "counter", "transfer", "transfer", "for", "for",
                 "counted_for"] if depth < 3 else ["assign", "counter", "transfer", "transfer"]
        kind = draw(st.sampled_from(kinds))
        if kind == "counted_for":  # v = e; for x in range(..): v = v + k; ... (inner carried)
            v = draw(st.sampled_from(NAMES))
            stmts.append(("assign", v, draw(exprs(1))))
            inc = ("assign", v, ("bin", "+", ("var", v), ("int", draw(st.integers(1, 3)))))
            var = draw(st.sampled_from([n for n in NAMES if n != v]))
            stmts.append(("for", var, draw(range_args()), [inc] + draw(blocks(depth + 1, counter))))
            continue
        if kind == "assign":
            stmts.append(("assign", draw(st.sampled_from(NAMES)), draw(exprs())))
        elif kind == "counter":
            v = draw(st.sampled_from(NAMES))
            stmts.append(("assign", v, ("bin", draw(st.sampled_from(["+", "-"])), ("var", v),
                                        ("int", draw(st.integers(1, 3))))))
        elif kind == "transfer":
            site = counter[0]
            counter[0] += 1
            stmts.append(("transfer", site, [draw(exprs(1)) for _ in range(4)],
                          draw(st.sampled_from([0, 1]))))
        else:
            var = draw(st.sampled_from(NAMES))
            args = draw(range_args())
            stmts.append(("for", var, args, draw(blocks(depth + 1, counter))))
    return stmts


@st.composite
def programs(draw):
    counter = [0]
    skip = draw(st.sampled_from(NAMES + [None] * 30))  # now and then one name starts undefined
    pre = [("assign", n, ("int", draw(st.integers(-1, 5)))) for n in NAMES if n != skip]
    var = draw(st.sampled_from(NAMES))
    first = ("for", var, draw(range_args()), draw(blocks(1, counter)))
    body = pre + [first] + draw(blocks(0, counter))
    return body, counter[0]


def render(stmts, indent=1) -> list[str]:
    pad = "    " * indent
    lines = []
    for s in stmts:
        if s[0] == "assign":
            lines.append(f"{pad}{s[1]} = {render_expr(s[2])}")
        elif s[0] == "transfer":
            args = ", ".join(render_expr(a) for a in s[2])
            lines.append(f"{pad}transfer({args}, {'rrc' if s[3] else 'recv'})")
        else:
            args = ", ".join(render_expr(a) for a in s[2])
            lines.append(f"{pad}for {s[1]} in range({args}):")
            lines.extend(render(s[3], indent + 1))
    return lines


def program_text(stmts) -> str:
    return "\n".join([f'ResCCLAlgo(nRanks={NRANKS}, OpType="Allgather"):'] + render(stmts)) + "\n"


def loop_vars_of(stmts, enclosing=()):
    """site -> enclosing loop variable names (independently of the product)."""
    out = {}
    for s in stmts:
        if s[0] == "transfer":
            out[s[1]] = enclosing
        elif s[0] == "for":
            out.update(loop_vars_of(s[3], enclosing + (s[1],)))
    return out


def check_equivalent(stmts, nsites):
    text = program_text(stmts)
    ref = Reference()
    ref_err = None
    try:
        ref.run(stmts)
    except RefError as exc:
        ref_err = exc
    try:
        alg = parse_rccl(text, "gen.rccl", max_transfers=MAX_TRANSFERS, max_iterations=MAX_ITER)
    except CompileError as exc:
        assert ref_err is not None, f"product failed ({exc}) where Python succeeded:\n{text}"
        assert exc.diagnostics[0].location is not None
        return "error"
    assert ref_err is None, f"product succeeded where Python failed ({ref_err}):\n{text}"
    assert len(alg.sites) == nsites
    expected = sorted(ref.out, key=lambda r: r[0])  # stable: execution order within a site
    got = list(zip(alg.site.tolist(), alg.src.tolist(), alg.dst.tolist(), alg.step.tolist(),
                   alg.chunk.tolist(), alg.op.tolist()))
    assert got == [r[:6] for r in expected], text
    lv = loop_vars_of(stmts)
    for s in range(nsites):
        assert alg.sites[s].loop_vars == lv[s]
        rows = [r[6] for r in expected if r[0] == s]
        mat = alg.loop_values[s]
        assert mat.shape == (len(rows), len(lv[s]))
        assert [tuple(x) for x in mat.tolist()] == rows, text
    return "ok"


# most of an example is hypothesis drawing the nested program; the thorough profile runs ten
# times as many
@settings(max_examples=examples(100))
@given(programs())
def test_vectorised_equals_sequential(prog):
    stmts, nsites = prog
    check_equivalent(stmts, nsites)


# A few hand-written shapes the generator hits only sometimes, through the same oracle.
SHAPES = [
    # counter across an outer expanded loop (outer becomes sequential too)
    [("assign", "s", ("int", 0)),
     ("for", "a", [("int", 3)], [
         ("for", "i", [("var", "a")], [
             ("assign", "s", ("bin", "+", ("var", "s"), ("int", 1))),
             ("transfer", 0, [("var", "a"), ("var", "i"), ("var", "s"), ("int", 0)], 1)])])],
    # counter re-initialised per outer iteration: outer expanded, inner sequential
    [("for", "a", [("int", 3)], [
        ("assign", "s", ("int", 10)),
        ("for", "i", [("int", 0), ("bin", "-", ("int", 4), ("var", "a"))], [
            ("assign", "s", ("bin", "-", ("var", "s"), ("int", 2))),
            ("transfer", 0, [("var", "a"), ("var", "i"), ("var", "s"), ("int", 1)], 0)]),
        ("transfer", 1, [("var", "s"), ("var", "i"), ("int", 0), ("int", 0)], 0)])],
    # negative steps, zero-trip inner loops, bounds depending on outer vars
    [("assign", "i", ("int", 7)),
     ("for", "a", [("int", 4), ("int", -3), ("int", -2)], [
         ("for", "b", [("var", "a"), ("int", 0), ("int", -1)], [
             ("transfer", 0, [("var", "a"), ("var", "b"), ("int", 0), ("int", 0)], 0)]),
         ("transfer", 1, [("var", "a"), ("var", "b"), ("var", "i"), ("int", 0)], 0)])],
    # a name first defined in a zero-trip loop is undefined afterwards
    [("for", "a", [("int", 0)], [("assign", "z", ("int", 1))]),
     ("transfer", 0, [("var", "z"), ("int", 0), ("int", 0), ("int", 0)], 0)],
    # loop variable reassigned in the body; value after the loop is the body's last value
    [("for", "a", [("int", 3)], [
        ("assign", "a", ("bin", "*", ("var", "a"), ("int", 10))),
        ("transfer", 0, [("var", "a"), ("int", 0), ("int", 0), ("int", 0)], 0)]),
     ("transfer", 1, [("var", "a"), ("int", 0), ("int", 0), ("int", 0)], 0)],
    # partially-defined variable: only defined where an inner loop ran (error in Python)
    [("for", "a", [("int", 3)], [
        ("for", "b", [("var", "a")], [("assign", "w", ("var", "b"))])]),
     ("transfer", 0, [("var", "w"), ("int", 0), ("int", 0), ("int", 0)], 0)],
    # ... and defined everywhere once every outer iteration ran it
    [("for", "a", [("int", 1), ("int", 4)], [
        ("for", "b", [("var", "a")], [("assign", "w", ("bin", "+", ("var", "b"), ("var", "a")))]),
        ("transfer", 0, [("var", "w"), ("var", "a"), ("int", 0), ("int", 0)], 0)]),
     ("transfer", 1, [("var", "w"), ("var", "a"), ("int", 0), ("int", 0)], 0)],
]


@pytest.mark.parametrize("idx", range(len(SHAPES)))
def test_hand_written_shapes(idx):
    stmts = SHAPES[idx]
    nsites = len(loop_vars_of(stmts))
    check_equivalent(stmts, nsites)


def test_undefined_after_zero_trip_loop_is_an_error():
    with pytest.raises(CompileError) as ei:
        check = SHAPES[3]
        parse_rccl(program_text(check))
    assert "name 'z' is not defined" in str(ei.value)


# ------------------------------------------------------------------ expression precedence
@st.composite
def prec_exprs(draw, depth=0):
    """(rccl text, python text) with minimal / random parentheses."""
    if depth >= 3 or draw(st.integers(0, 2)) == 0:
        v = draw(st.integers(-9, 9))
        return str(v), str(v)
    kind = draw(st.integers(0, 6))
    if kind == 0:
        a, pa = draw(prec_exprs(depth + 1))
        sign = draw(st.sampled_from(["-", "+"]))
        return f"{sign}{a}" if not a.startswith(("-", "+")) else f"{sign}({a})", \
            f"{sign}{pa}" if not pa.startswith(("-", "+")) else f"{sign}({pa})"
    op = draw(st.sampled_from(["+", "-", "*", "/", "//", "%"]))
    (a, pa), (b, pb) = draw(prec_exprs(depth + 1)), draw(prec_exprs(depth + 1))
    pyop = "//" if op == "/" else op
    if draw(st.booleans()):
        return f"({a}) {op} ({b})", f"({pa}) {pyop} ({pb})"
    return f"{a} {op} {b}", f"{pa} {pyop} {pb}"


@settings(max_examples=examples(120))     # the thorough profile: ten times as many
@given(prec_exprs(), st.booleans())
def test_expression_semantics_match_python(pair, in_loop):
    text, py = pair
    try:
        expected = eval(py, {"__builtins__": {}})  # test oracle on test-generated text only
    except ZeroDivisionError:
        expected = None
    if in_loop:  # array path: evaluated over 3 rows, all equal
        body = f"    for q in range(3):\n        x = {text}\n        transfer(x, 0, q, 0, recv)\n"
    else:  # scalar path
        body = f"    x = {text}\n    transfer(x, 0, 0, 0, recv)\n"
    src = f'ResCCLAlgo(nRanks=2, OpType="Allgather"):\n{body}'
    if expected is None:
        with pytest.raises(CompileError):
            parse_rccl(src)
        return
    alg = parse_rccl(src)
    assert set(alg.src.tolist()) == {expected}, (text, py)


@settings(max_examples=150)
@given(st.integers(-LIMIT, LIMIT), st.integers(-LIMIT, LIMIT),
       st.sampled_from(["+", "-", "*", "//", "%"]), st.booleans())
def test_overflow_bound_matches_big_ints(a, b, op, in_loop):
    if op in ("//", "%") and b == 0:
        return
    exact = {"+": a + b, "-": a - b, "*": a * b, "//": a // b if b else 0, "%": a % b if b else 0}[op]
    if in_loop:
        body = (f"    for q in range(2):\n        y = {b} + q * 0\n        x = ({a}) {op} y\n"
                f"        transfer(x, 0, q, 0, recv)\n")
    else:
        body = f"    y = {b}\n    x = ({a}) {op} y\n    transfer(x, 0, 0, 0, recv)\n"
    src = f'ResCCLAlgo(nRanks=2, OpType="Allgather"):\n{body}'
    if abs(exact) > LIMIT:
        with pytest.raises(CompileError, match="overflow"):
            parse_rccl(src)
    else:
        alg = parse_rccl(src)
        assert set(alg.src.tolist()) == {exact}
        assert alg.src.dtype == np.int64


@settings(max_examples=examples(50))
@given(programs(), st.integers(1, 4))
def test_chunked_expansion_equals_sequential(prog, cap):
    """Big expanded loops run in pieces of CHUNK_ROWS rows; force tiny pieces."""
    from hccc.compiler.frontend import evaluator
    old = evaluator.CHUNK_ROWS
    evaluator.CHUNK_ROWS = cap
    try:
        stmts, nsites = prog
        check_equivalent(stmts, nsites)
    finally:
        evaluator.CHUNK_ROWS = old


def _oracle_expr(e):
    """The generated expression as the parser's AST must hold it: a negated literal is one literal."""
    if e[0] == "neg":
        inner = _oracle_expr(e[1])
        return ("int", -inner[1]) if inner[0] == "int" else ("neg", inner)
    if e[0] == "bin":
        return ("bin", e[1], _oracle_expr(e[2]), _oracle_expr(e[3]))
    return e


def _oracle_stmts(stmts, loop_vars=()):
    out = []
    for s in stmts:
        if s[0] == "assign":
            out.append(("assign", s[1], _oracle_expr(s[2])))
        elif s[0] == "transfer":
            out.append(("transfer", s[1], [_oracle_expr(a) for a in s[2]], s[3], loop_vars))
        else:
            out.append(("for", s[1], [_oracle_expr(a) for a in s[2]], _oracle_stmts(s[3], loop_vars + (s[1],))))
    return out


def _parsed_expr(e):
    from hccc.compiler.frontend import rccl_parser as rp
    if isinstance(e, rp.Int):
        return ("int", e.value)
    if isinstance(e, rp.Var):
        return ("var", e.name)
    if isinstance(e, rp.Neg):
        return ("neg", _parsed_expr(e.operand))
    assert isinstance(e, rp.BinOp), e
    return ("bin", e.op, _parsed_expr(e.left), _parsed_expr(e.right))


def _parsed_stmts(stmts):
    from hccc.compiler.frontend import rccl_parser as rp
    out = []
    for s in stmts:
        if isinstance(s, rp.Assign):
            out.append(("assign", s.name, _parsed_expr(s.value)))
        elif isinstance(s, rp.Transfer):
            out.append(("transfer", s.site, [_parsed_expr(a) for a in s.args], int(s.op == RRC), s.loop_vars))
        else:
            assert isinstance(s, rp.For), s
            out.append(("for", s.var, [_parsed_expr(a) for a in s.args], _parsed_stmts(s.body)))
    return out


@settings(max_examples=examples(35))
@given(programs())
def test_parser_builds_the_generated_ast(prog):
    """The parser's AST of a generated program's text is that program (the test's own tuples:
    statements in order, transfer call sites numbered in the text's order, each transfer's
    enclosing loop variables, a negated literal folded into one literal)."""
    from hccc.compiler.frontend import rccl_parser as rp
    from hccc.util.diagnostics import SourceFile

    stmts, nsites = prog
    parsed = rp.parse_program(SourceFile("gen.rccl", program_text(stmts)))
    assert _parsed_stmts(parsed.body) == _oracle_stmts(stmts), program_text(stmts)
    assert [t.site for t in parsed.transfers] == list(range(nsites))
