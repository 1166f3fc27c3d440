"""A misspelt name in an input file names itself and the name it most likely meant, located at the
word: ResCCLang's functions, statements, keywords, transfer ops, OpTypes, header parameters and
variables; a ``.topo`` file's definitions, ``define``, connection types, vendors and ``all``; an
MSCCL XML file's attributes, step types, collectives and protocols (one matcher for all of them,
:func:`hccc.util.diagnostics.closest`)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from hccc.cli import main
from hccc.compiler.cluster.topo_parser import parse_topology
from hccc.compiler.frontend import parse_rccl
from hccc.compiler.interop.msccl_import import import_xml_text
from hccc.util.diagnostics import CompileError, closest

ROOT = Path(__file__).resolve().parent.parent
H = 'def ResCCLAlgo(nRanks=2, OpType="Allgather", nChunksPerRank=1):\n'
TOPO = (ROOT / "examples" / "clusters" / "a100_topo1.topo").read_text()
XML = (ROOT / "examples" / "msccl" / "allgather_direct_4.xml").read_text()


def levenshtein(a: str, b: str) -> int:
    """The oracle: edits (insert, delete, substitute) between two words."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=4, max_size=12)


@st.composite
def one_edit(draw, word: str) -> str:
    i = draw(st.integers(0, len(word) - 1))
    c = draw(st.sampled_from("abcdefghijklmnopqrstuvwxyz"))
    kind = draw(st.sampled_from(("insert", "delete", "substitute")))
    return {"insert": word[:i] + c + word[i:], "delete": word[:i] + word[i + 1:],
            "substitute": word[:i] + c + word[i + 1:]}[kind]


@given(st.lists(WORD, min_size=1, max_size=8, unique=True), st.data())
def test_one_edit_from_one_name_and_far_from_the_rest_suggests_it(known, data):
    meant = data.draw(st.sampled_from(known))
    typo = data.draw(one_edit(meant))
    assume(typo not in known and levenshtein(typo, meant) == 1)
    assume(all(levenshtein(typo, k) >= max(len(typo), len(k)) - 1 for k in known if k != meant))
    assert closest(typo, known) == meant


@given(st.lists(WORD, min_size=1, max_size=8, unique=True), WORD)
def test_a_suggestion_is_always_a_known_name(known, word):
    got = closest(word, known)
    assert got is None or got in known


def _error(parse, text: str) -> tuple[int, int, str]:
    with pytest.raises(CompileError) as ei:
        parse(text)
    d = ei.value.diagnostics[0]
    return d.location.line, d.location.col, d.message


RCCL_CASES = [
    # (body lines, line, col, the message starts with)
    ("    transfr(0, 1, 0, 0, recv)\n", 2, 5, "unknown function 'transfr'; did you mean 'transfer'?"),
    ("    x = 1; trnsfer(0, 1, 0, 0, recv)\n", 2, 12, "unknown function 'trnsfer'; did you mean 'transfer'?"),
    ("    foo(1)\n", 2, 5, "unknown function 'foo' (a statement is"),
    ("    for i in range(2): transfr(i, 1 - i, i, i, recv)\n", 2, 24,
     "unknown function 'transfr'; did you mean 'transfer'? (a statement is"),
    ("    x = rnge(2)\n", 2, 9, "unknown function 'rnge'; did you mean 'range'?"),
    ("    fro i in range(2):\n        pass\n", 2, 5, "unknown statement 'fro'; did you mean 'for'?"),
    ("    pas\n", 2, 5, "unknown statement 'pas'; did you mean 'pass'?"),
    ("    for i in rnge(0, 2):\n        pass\n", 2, 14, "unexpected identifier 'rnge'; did you mean 'range'?"),
    ("    for i inn range(2):\n        pass\n", 2, 11, "unexpected identifier 'inn'; did you mean 'in'?"),
    ("    transfer(0, 1, 0, 0, rcc)\n", 2, 26, "unknown transfer op rcc; did you mean 'rrc'?"),
    ("    transfer(0, 1, 0, 0, rcv)\n", 2, 26, "unknown transfer op rcv; did you mean 'recv'?"),
    ("    step = 1\n    transfer(0, stp, 0, 0, recv)\n", 3, 17, "name 'stp' is not defined; did you mean 'step'?"),
]


@pytest.mark.parametrize("body, line, col, says", RCCL_CASES)
def test_rccl_misspellings_are_named_with_what_was_meant(body, line, col, says):
    got = _error(lambda t: parse_rccl(t, "t.rccl"), H + body)
    assert got[:2] == (line, col) and got[2].startswith(says), got


@pytest.mark.parametrize("header, col, says", [
    ('def ResCCLAlg(nRanks=2, OpType="Allgather"):\n', 5,
     "expected the 'ResCCLAlgo(...)' header, found identifier 'ResCCLAlg'; did you mean 'ResCCLAlgo'?"),
    ('dfe ResCCLAlgo(nRanks=2, OpType="Allgather"):\n', 1,
     "expected the 'ResCCLAlgo(...)' header, found identifier 'dfe'; did you mean 'def'?"),
    ('def ResCCLAlgo(nRanks=2, OpType="Allgathr"):\n', 33, "unknown OpType 'Allgathr'; did you mean 'Allgather'?"),
    ('def ResCCLAlgo(nRanks=2, OpType="Allgather", nChunkPerRank=1):\n', 46,
     "unknown header parameter 'nChunkPerRank'; did you mean 'nChunksPerRank'?"),
])
def test_rccl_header_misspellings(header, col, says):
    got = _error(lambda t: parse_rccl(t, "t.rccl"), header + "    transfer(0, 1, 0, 0, recv)\n")
    assert got[:2] == (1, col) and got[2].startswith(says), got


@given(st.data())
def test_any_one_letter_typo_of_transfer_is_named(data):
    typo = data.draw(one_edit("transfer"))
    assume(typo != "transfer" and typo.isidentifier())
    line, col, msg = _error(lambda t: parse_rccl(t, "t.rccl"), H + f"    {typo}(0, 1, 0, 0, recv)\n")
    assert (line, col) == (2, 5) and msg.startswith(f"unknown function '{typo}'; did you mean 'transfer'?")


def _topo(old: str, new: str) -> str:
    assert old in TOPO
    return TOPO.replace(old, new, 1)


@pytest.mark.parametrize("old, new, says", [
    ("define vendor", "define vender", "unknown definition 'vender'; did you mean 'vendor'?"),
    ("define interbandwidth", "define interbandwith", "unknown definition 'interbandwith'; did you mean 'interbandwidth'?"),
    ("define node2", "define nod2", "unknown definition 'nod2'; did you mean 'node2'?"),
    ("define nodenum", "defne nodenum", "unexpected 'defne'; did you mean 'define'?"),
    ("{direct =>", "{drect =>", "unknown connection type 'drect' in bandwidth; did you mean 'direct'?"),
    ("vendor = nvidia", "vendor = nvdia", "unknown vendor 'nvdia'; did you mean 'nvidia'?"),
    ("internode = all", "internode = al", "internode expects (nodeX, nodeY) or 'all'; did you mean 'all'?"),
    ("interbandwidth = nic", "interbandwidth = nicc",
     "interbandwidth expects a map {direct => [...], switch => [...]} or 'nic'; did you mean 'nic'?"),
])
def test_topo_misspellings_are_named_with_what_was_meant(old, new, says):
    text = _topo(old, new)
    line, col, msg = _error(lambda t: parse_topology(t, "c.topo"), text)
    bad = next(w for w in re.findall(r"[A-Za-z_]\w*", new) if w not in re.findall(r"[A-Za-z_]\w*", old))
    at = text.splitlines()[line - 1]
    assert msg.startswith(says) and at[col - 1:].startswith(bad), (line, col, msg)


def test_a_misspelt_map_key_in_a_topo_file():
    text = ("define nodenum = 1\ndefine node1 = 2\ndefine latency = {drect => 1}\n"
            "define bandwidth = {direct => [((0,1) -> (25,1)), ((1,0) -> (25,1))]}\n")
    line, col, msg = _error(lambda t: parse_topology(t, "c.topo"), text)
    assert (line, col) == (3, 19) and msg.startswith("'drect' is not valid in latency here; did you mean 'direct'?")


def _xml(old: str, new: str) -> str:
    assert old in XML
    return XML.replace(old, new, 1)


@pytest.mark.parametrize("old, new, says", [
    (' srcbuf="o"', ' srcbuff="o"', "<step> lacks attribute(s) srcbuf; 'srcbuff': did you mean 'srcbuf'?"),
    (' deps="-1"', ' dep="-1"', "<step> lacks attribute(s) deps; 'dep': did you mean 'deps'?"),
    (' type="s"', ' type="ss"', "unknown step type 'ss'; did you mean 's'?"),
    ('coll="allgather"', 'coll="allgathr"', "unknown collective 'allgathr'; did you mean 'allgather'?"),
    ('proto="LL"', 'proto="LLL"', "unknown protocol 'LLL'; did you mean 'LL'?"),
])
def test_msccl_misspellings_are_named_with_what_was_meant(old, new, says):
    line, col, msg = _error(lambda t: import_xml_text(t, "a.xml"), _xml(old, new))
    assert msg.startswith(says) and line >= 2, (line, col, msg)


def test_the_command_line_says_it_located_and_exits_1(capsys, tmp_path):
    f = tmp_path / "a.rccl"
    f.write_text(H + "    transfr(0, 1, 0, 0, recv)\n")
    assert main(["check", str(f)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{f}:2:5: error: unknown function 'transfr'; did you mean 'transfer'?")
    assert "Traceback" not in err
