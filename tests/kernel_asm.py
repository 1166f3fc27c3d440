"""The sm_90 machine code of the kernels, read: nvdisasm (the ``nvidia-cuda-nvdisasm`` wheel or a
CUDA installation), its output by function, and what the engine may call."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

#: the only functions the engine calls: once a block, once a primitive (or, in an AllToAll
#: program's engine, once a unit round of an AllToAllv primitive over HCCC_UNIT_PIECES chunks: its
#: hccc_v_round is called from hccc_sprim_load), on a timeout
CALLEES = ("hccc_launch_init", "hccc_sprim_load", "hccc_report_stuck")
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
