"""The sm_90 machine code of the kernels, read: nvdisasm (the ``nvidia-cuda-nvdisasm`` wheel or a
CUDA installation), its output by function and as control flow (the most instructions of a kind on
a path), and what the engine may call."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import networkx as nx

#: the only functions the engine calls: once a block (the launch's set-up; the decode of the block's
#: primitives into its table, where the program has one), once a primitive where it has none (or,
#: in an AllToAll program's engine, once a unit round of an AllToAllv primitive over
#: HCCC_UNIT_PIECES chunks: hccc_v_round, from hccc_sprim_load or, with a table, the engine), once
#: a fused LL chain where the cursor reaches one (hccc_chain_enter: its links read from the table,
#: shared memory only), on a timeout
CALLEES = ("hccc_launch_init", "hccc_ptable_decode", "hccc_sprim_load", "hccc_v_round", "hccc_chain_enter",
           "hccc_report_stuck")
#: SASS: local memory (the stack)
SASS_LOCAL = re.compile(r"\b(?:LDL|STL)\b")


def nvdisasm() -> str | None:
    """The nvdisasm executable: on PATH, else the wheel's."""
    exe = shutil.which("nvdisasm")
    if exe:
        return exe
    try:
        import nvidia
        for root in nvidia.__path__:
            for cand in Path(root).glob("*/bin/nvdisasm"):
                return str(cand)
    except ImportError:
        pass
    return None


def sass_functions(text: str) -> dict[str, list[str]]:
    """nvdisasm output -> function (entry or ``$entry$callee``) -> its instruction lines."""
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^\s*(?:\.text\.)?(\$?[\w$]+):\s*$", line)
        if m and not m.group(1).startswith(".L"):
            name = m.group(1)
            out.setdefault(name, [])
        elif name is not None and re.search(r"/\*[0-9a-f]{4,}\*/", line):
            out[name].append(line)
    return out


def sass_cfg(text: str, part: str) -> tuple[list[str], dict[str, int]]:
    """nvdisasm output -> the instructions of the first function whose name holds ``part`` (their
    text, predicate included) and where each of its labels (``.L_x_N``) points."""
    ins: list[str] = []
    labels: dict[str, int] = {}
    take = False
    for line in text.splitlines():
        m = re.match(r"^\s*(?:\.text\.)?(\$?[\w$]+):\s*$", line)
        if m and not m.group(1).startswith(".L"):
            if ins:
                break
            take = part in m.group(1)
            continue
        if not take:
            continue
        m = re.match(r"^\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(ins)
        elif re.search(r"/\*[0-9a-f]{4,}\*/", line):
            ins.append(line.split("*/", 1)[1].split(";")[0].strip())
    return ins, labels


def sass_successors(ins: list[str], labels: dict[str, int], i: int) -> list[int]:
    """Where control goes after instruction i: a branch's target (and the next instruction where
    it is predicated, or a divergence test), nowhere after an unpredicated EXIT / RET."""
    x = ins[i]
    if re.search(r"\b(?:EXIT|RET)\b", x) and not x.startswith("@"):
        return []
    m = re.search(r"\bBRA(?:\.\w+)*\s+(?:\w+,\s*)?`\((\.L_x_\d+)\)", x)
    if m:
        t = labels[m.group(1)]
        return [t, i + 1] if x.startswith("@") or ".DIV" in x else [t]
    return [i + 1] if i + 1 < len(ins) else []


def most_on_a_path(ins: list[str], labels: dict[str, int], start: int, stop, count, dead=lambda x: False):
    """The most instructions ``count`` matches on a path of the control flow from ``start``
    (exclusive) to an instruction ``stop`` matches, through none ``dead`` matches: inf where a
    loop on such a path holds one, None where no path gets there."""
    g = nx.DiGraph()
    todo, seen = [start], {start}
    while todo:
        i = todo.pop()
        for j in sass_successors(ins, labels, i):
            if stop(ins[j]):
                g.add_edge(i, "end")
            elif not dead(ins[j]):
                g.add_edge(i, j)
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
    if "end" not in g:
        return None
    g = g.subgraph(nx.ancestors(g, "end") | {"end"})
    dag = nx.condensation(g)
    most: dict[int, float] = {}
    for k in reversed(list(nx.topological_sort(dag))):
        members = dag.nodes[k]["members"]
        n = sum(1 for v in members if v not in ("end", start) and count(ins[v]))
        looped = len(members) > 1 or any(g.has_edge(v, v) for v in members)
        here = float("inf") if looped and n else n
        most[k] = here + max((most[s] for s in dag.successors(k)), default=0)
    return most[dag.graph["mapping"][start]]
