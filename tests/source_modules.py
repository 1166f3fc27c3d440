"""Every module of the package by its import name (``hccc.compiler.synth.trees``) with its source file,
read from the source folders (``driver/`` is installed as ``hccc`` itself)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: source folder -> import name
PACKAGES = {"util": "hccc.util", "compiler": "hccc.compiler", "runtime": "hccc.runtime", "templates": "hccc.templates",
            "driver": "hccc"}


def modules() -> dict[str, Path]:
    """Import name -> source file of every module under :data:`PACKAGES`' folders."""
    mods = {}
    for folder, name in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([name, *parts])] = path
    return mods


#: every module of the package: import name -> source file
MODULES = modules()
