"""Where hccc's CMake package lives: ``find_package(hccc)`` loads ``cmake/hccc-config.cmake``,
shipped as package data of ``hccc``. ``hccc --cmake-dir`` (or ``python -m hccc --cmake-dir``)
prints the folder, for ``-Dhccc_DIR=...`` or ``CMAKE_PREFIX_PATH``."""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def cmake_dir() -> Path:
    return Path(str(resources.files("hccc").joinpath("cmake")))


__all__ = ["cmake_dir"]
