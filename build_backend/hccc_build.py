"""hccc's build backend: setuptools' (:mod:`setuptools.build_meta`), with one change to the editable
wheel, so that ``import hccc`` finds the editable install wherever Python runs.

pyproject.toml maps the ``hccc`` package onto ``driver/`` (and ``hccc.compiler`` onto
``compiler/``, ...). setuptools cannot express that mapping as a plain ``sys.path`` entry, so an
editable install (``pip install -e .``) finds ``hccc`` through a meta-path finder that its ``.pth``
file *appends* to ``sys.meta_path``, behind Python's path finder. The path finder takes a folder
named ``hccc`` without an ``__init__.py`` on any ``sys.path`` entry -- the script's own directory,
the working directory of ``python -c`` / ``-m``, a ``hccc`` folder that ``pip uninstall`` left in
site-packages (numba's caches) -- for a namespace package, and returns it before the editable
finder is asked: ``import hccc`` gives an empty module (``cannot import name '__version__' from
'hccc' (unknown location)``). A regular package found on a later ``sys.path`` entry would have won;
the appended finder does not.

The editable wheel's ``.pth`` file gets one more line, run after setuptools' own: it moves hccc's
editable finder to the front of ``sys.meta_path``, where it answers for the names it maps
(``hccc``, ``hccc.compiler``, ...) and nothing else. A regular install (``pip install .``, a
wheel) puts a regular ``hccc`` package in site-packages, which beats any namespace folder: its
wheel is setuptools' own, unchanged.
"""
from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every hook but build_editable unchanged)

#: the line added to the editable wheel's ``.pth``: hccc's editable finders (setuptools names their
#: module ``__editable___hccc_<version>_finder``) moved to the front of ``sys.meta_path`` (a stable
#: sort: the other finders keep their order; site runs the line with separate globals and locals,
#: where a comprehension could not see a name the line binds) -- unless a regular ``hccc`` package
#: (one with an ``__init__.py``: a regular install, e.g. in a venv that also sees a system-wide
#: editable one) is on ``sys.path`` as site runs the line: Python's own order then finds it first,
#: as it should, and no namespace folder can shadow a regular package
FINDER_FIRST = ("import sys, importlib.machinery as m; s = m.PathFinder.find_spec('hccc'); "
                "(s is None or s.origin in (None, 'namespace')) and sys.meta_path.sort(key=lambda f: "
                "not getattr(f, '__module__', '').startswith('__editable___hccc_'))\n")


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    put_finder_first(Path(wheel_directory) / name)
    return name


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def put_finder_first(wheel: Path) -> None:
    """Add :data:`FINDER_FIRST` to the ``.pth`` of the editable ``wheel`` that installs a finder
    (rewritten in place, its RECORD updated); a wheel whose ``.pth`` is a plain path entry (a
    layout setuptools maps without a finder) is left as it is."""
    with zipfile.ZipFile(wheel) as zin:
        items = [(info, zin.read(info)) for info in zin.infolist()]
    changed = {}
    for info, data in items:
        if info.filename.endswith(".pth") and b"_finder" in data and FINDER_FIRST.encode() not in data:
            changed[info.filename] = data.rstrip(b"\n") + b"\n" + FINDER_FIRST.encode()
    if not changed:
        return
    tmp = wheel.with_name(wheel.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        for info, data in items:
            data = changed.get(info.filename, data)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = []
                for line in data.decode().splitlines():
                    path = line.split(",", 1)[0]
                    if path in changed:
                        new = changed[path]
                        line = f"{path},{_record_hash(new)},{len(new)}"
                    lines.append(line)
                data = ("\n".join(lines) + "\n").encode()
            zout.writestr(info, data)
    os.replace(tmp, wheel)
