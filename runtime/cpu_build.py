"""Building the CPU emulation's shared library: the emitted kernel sources compiled with g++ and
``hccc_cpu_emu.h`` (:class:`CpuToolchain`, which :class:`hccc.runtime.cpu.CpuPlatform` builds with).

One shared library per (generated sources, ranks, instance): each rank's own source is compiled
(``.cu`` for a CUDA rank, ``.hip`` for a HIP rank: both are the same kernels behind
``hccc_platform.h``, which selects the emulation under ``HCCC_PLATFORM_CPU``), so the CPU stands in
for either platform; a mixed-vendor program gets one library per platform, built from that
platform's ranks only (see :mod:`hccc.runtime.launcher`). The rank sources are split into
translation units of at least four ranks, at most one per CPU core, compiled in parallel (the
shared headers are parsed once per unit, not once per rank) with ``-DHCCC_FOR_EACH_INSTANCE(X)=
X(dtype, ctype, op, HCCC_OP)`` so only the requested instantiation is compiled, and linked with
``cpu_launcher.cpp`` (this package; its object is cached separately, it does not depend on the
program), each unit starting from ``hccc_prims.h`` precompiled once per flags (g++; cached too:
the headers are the same for every program and instance, and parsing them was most of a unit's
compile; with them the instance is a macro the unit defines first, :data:`INSTANCE_SELECTOR`);
the module is linked by gold where the compiler driver has it (:data:`FAST_LINKER`). Libraries are
cached by content hash (:mod:`hccc.runtime.cache`). C++17 suffices.
Environment: ``HCCC_CXX`` (compiler, default ``g++``), ``HCCC_CPU_OPT`` (default ``-O1``).

The AddressSanitizer build (``sanitize="address"``) compiles the kernels and the launcher with
``-fsanitize=address`` (:data:`ASAN_FLAGS`); see :mod:`hccc.runtime.cpu` for how it runs.
"""
from __future__ import annotations

import concurrent.futures
import functools
import os
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

from hccc.runtime import cache
from hccc.util import dtypes as dtypes_table
from hccc.runtime.platform import CTYPES, RED_CONSTS, Instance, PlatformError, build_switches, instance_expansion

#: the emitted header every rank source includes first, precompiled for the units (``_prims_pch``)
PCH_HEADER = "hccc_prims.h"
_FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
ASAN_FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-g",
              # instrumented frames are larger: give every emulated GPU thread 1 MiB of stack
              "-DHCCC_CPU_STACK_BYTES=(1024*1024)"]
#: -ffp-contract=off: avg's scaling ``x * (1/n)`` is rounded once and never fused into the add after
#: it, as on the GPUs (``hccc_mul_rn``) and in the numpy reference
_CXX_FLAGS = ["-std=c++17", "-fPIC", "-pthread", "-fvisibility=hidden", "-fno-gnu-unique",
              "-fno-strict-aliasing", "-ffp-contract=off", "-DHCCC_PLATFORM_CPU=1", "-Wall"]

#: the linker a module is linked with where the compiler driver has it: gold links a program's
#: module (its units, the launcher and the engine objects) in about a quarter of the CPU time of
#: the default BFD linker (0.02 s against 0.08 s for an 8-rank program, most of what a build
#: costs once the shared objects are cached; a cold test run links some 340 modules). Not for the
#: AddressSanitizer build, which keeps the toolchain's own linker.
FAST_LINKER = "-fuse-ld=gold"
#: the most ranks' sources one translation unit is given below one per CPU core: a unit of fewer
#: would parse the shared headers again for little code (:meth:`CpuToolchain.build`)
RANKS_PER_UNIT = 4
#: how much of a failing compiler's or linker's error output an error message quotes (its end)
ERROR_TAIL_CHARS = 4000


@functools.lru_cache(maxsize=None)
def links_with(exe: str, flag: str) -> bool:
    """The compiler driver ``exe`` can link with ``flag`` (its linker is installed): probed once
    per process by asking that linker for its version."""
    try:
        res = subprocess.run([exe, flag, "-Wl,--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return res.returncode == 0


@functools.lru_cache(maxsize=None)
def compiler_version(exe: str, mtime_ns: int, size: int) -> str:
    """The version line of the compiler driver ``exe`` (as its file is now: ``mtime_ns``,
    ``size``): asked once per process and compiler, not once per platform object (a single-process
    job makes one per rank, and the suite one per runner)."""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PlatformError(f"cannot run {exe}: {exc}") from None
    return out.stdout.splitlines()[0] if out.stdout else ""


#: the engine over a specialised rank program (``hccc_program``, an AllToAll program's
#: ``hccc_vprogram``, and those whose blocks decode their primitives into a table at launch: every
#: such program's type is ``HCCC_TPROGRAM(N)`` / ``HCCC_TVPROGRAM(N)``, on the CPU the one table
#: size), instantiated for the build's instance (dtype and op: ``HCCC_FOR_EACH_INSTANCE`` names
#: one) in an object of its own (``CpuToolchain._engine_object``)
ENGINE_SOURCE = """#define HCCC_ENGINE_(DT, T, OPN, RED) \\
  template void hccc_run<T, RED, hccc_program>(const hccc_args*, const hccc_program, int); \\
  template void hccc_run<T, RED, hccc_vprogram>(const hccc_args*, const hccc_vprogram, int); \\
  template void hccc_run<T, RED, HCCC_TPROGRAM(0)>(const hccc_args*, const HCCC_TPROGRAM(0), int); \\
  template void hccc_run<T, RED, HCCC_TVPROGRAM(0)>(const hccc_args*, const HCCC_TVPROGRAM(0), int);
HCCC_FOR_EACH_INSTANCE(HCCC_ENGINE_)
"""
#: what each unit says first (after the prims header, which every unit and the engine take with
#: ``-include``): the engine is instantiated elsewhere, not in this unit
ENGINE_EXTERN = """#define HCCC_ENGINE_(DT, T, OPN, RED) \\
  extern template void hccc_run<T, RED, hccc_program>(const hccc_args*, const hccc_program, int); \\
  extern template void hccc_run<T, RED, hccc_vprogram>(const hccc_args*, const hccc_vprogram, int); \\
  extern template void hccc_run<T, RED, HCCC_TPROGRAM(0)>(const hccc_args*, const HCCC_TPROGRAM(0), int); \\
  extern template void hccc_run<T, RED, HCCC_TVPROGRAM(0)>(const hccc_args*, const HCCC_TVPROGRAM(0), int);
HCCC_FOR_EACH_INSTANCE(HCCC_ENGINE_)
#undef HCCC_ENGINE_
"""


def instance_define(instance: Instance) -> str:
    """The ``-D`` that compiles only ``instance``'s kernels (dtype, C type, op, reduction constant)."""
    return f"-DHCCC_FOR_EACH_INSTANCE(X)={instance_expansion(instance)}"


#: the macro that names a build's instance where the units start from the precompiled headers:
#: the headers are precompiled with ``HCCC_FOR_EACH_INSTANCE(X)`` defined as it (:data:`PCH_DEFINE`,
#: the same for every instance, so one precompiled header serves them all) and each unit defines
#: it first (:func:`instance_selector`). On the command line it would make g++ refuse the
#: precompiled header (a macro it names defined at use, not when precompiled).
INSTANCE_SELECTOR = "HCCC_CPU_INSTANCE_"
PCH_DEFINE = f"-DHCCC_FOR_EACH_INSTANCE(X)={INSTANCE_SELECTOR}(X)"


def instance_selector(instance: Instance) -> str:
    """The first line of a unit compiled with the precompiled headers: the build's instance."""
    return f"#define {INSTANCE_SELECTOR}(X) {instance_expansion(instance)}\n"


def _copy_headers(outdir: Path, headers: list[str], dest: Path) -> None:
    """The emitted headers, copied into a cache entry's build directory."""
    for h in headers:
        shutil.copyfile(outdir / h, dest / h)


def _launcher_source() -> str:
    return resources.files("hccc.runtime").joinpath("cpu_launcher.cpp").read_text()


def check_instance(instance: Instance) -> None:
    """A PlatformError unless the emulation has kernels for ``instance`` (dtype and op)."""
    if instance.dtype not in CTYPES or instance.op not in RED_CONSTS:
        raise PlatformError(f"no kernels for {instance.dtype}/{instance.op}")
    why = dtypes_table.instance_error(instance.dtype, instance.op)
    if why:
        raise PlatformError(why)


def module_sources(manifest: dict, ranks: list[int] | None) -> tuple[list[str], list[str]]:
    """The sources a module of ``ranks`` (None: every rank) compiles and the headers they include,
    as the manifest names them (plain file names, or a PlatformError)."""
    entries = manifest["ranks"]
    if ranks is not None:
        wanted = set(ranks)
        entries = [e for e in entries if e["rank"] in wanted]
    sources = []
    for e in entries:
        # the rank's own platform's source (the one the emitted build files compile for it)
        srcs = e.get("sources") or {}
        sources.append(srcs.get(e.get("platform")) or e["source"])
    # with every rank of one platform: the one-grid entry too (it calls their block functions)
    if ranks is None or sorted(set(ranks)) == list(range(len(manifest["ranks"]))):
        plats = {e.get("platform") for e in entries}
        grid = (manifest.get("grid") or {}).get(next(iter(plats))) if len(plats) == 1 else None
        if isinstance(grid, dict):
            sources.append(grid.get("source"))
    sources = list(dict.fromkeys(sources))     # table mode: one generic source for every rank
    headers = list(manifest.get("headers", []))
    for name in sources + headers:
        if not isinstance(name, str) or not _FILENAME.fullmatch(name):
            raise PlatformError(f"manifest.json: {name!r} is not a plain file name")
    return sources, headers


class CpuToolchain:
    """The C++ compiler a CPU module is built with, the flags it is given, and the objects every
    program's build shares (the launcher, the precompiled headers, the engine), each cached."""

    def __init__(self, cxx: str, opt: str, jobs: int, sanitize: str | None):
        self.cxx = cxx
        self.opt = opt
        #: translation units compiled at once
        self.jobs = jobs
        #: ``"address"`` for the AddressSanitizer build, else None
        self.sanitize = sanitize
        self._cxx_id: str | None = None
        self._cxx_exe: str | None = None

    def compiler_id(self) -> str:
        """The compiler's path and its version line (part of every cache key); found and asked once."""
        if self._cxx_id is None:
            exe = shutil.which(self.cxx)
            if exe is None:
                raise PlatformError(f"the CPU backend needs a C++ compiler: '{self.cxx}' not found "
                                    "(install g++, or set HCCC_CXX)")
            try:
                st = os.stat(exe)
            except OSError as exc:
                raise PlatformError(f"cannot run {exe}: {exc}") from None
            version = compiler_version(exe, st.st_mtime_ns, st.st_size)
            self._cxx_exe = exe
            self._cxx_id = exe + " " + version
        return self._cxx_id

    def build(self, outdir: Path, manifest: dict, instance: Instance, ranks: list[int] | None = None,
              *, single_gpu: bool = False, cache_dir: str | os.PathLike | None = None) -> Path:
        """The shared library of ``ranks``' kernels (None: every rank) for ``instance``, from the
        sources generated in ``outdir``: built, or found in the cache."""
        outdir = Path(outdir)
        check_instance(instance)
        sources, headers = module_sources(manifest, ranks)
        compiler = self.compiler_id()
        exe = self._cxx_exe
        define = instance_define(instance)
        flags = ([*_CXX_FLAGS, self.opt, *(ASAN_FLAGS if self.sanitize else [])]
                 + (["-DHCCC_SINGLE_GPU=1"] if single_gpu else []) + build_switches(manifest))
        # the launcher and the precompiled headers depend on the headers, not on the program
        headers_digest = cache.files_digest([outdir / h for h in headers], outdir)
        launcher_obj = self._launcher_object(outdir, headers, headers_digest, flags, cache_dir)
        pch = self._prims_pch(outdir, headers, headers_digest, flags, cache_dir)
        engine_obj = self._engine_object(outdir, headers, headers_digest, flags, instance, pch, cache_dir)
        link = [FAST_LINKER] if not self.sanitize and links_with(exe, FAST_LINKER) else []
        key = cache.content_key(
            "cpu-module", compiler, " ".join(flags + link), define, launcher_obj.read_bytes(),
            engine_obj.read_bytes() if engine_obj is not None else b"",
            cache.files_digest([outdir / f for f in sources + headers], outdir))
        # translation units: a few ranks each (the headers are parsed once per unit), in parallel
        ngroups = max(1, min(self.jobs, len(sources) // RANKS_PER_UNIT))
        groups = [sources[i::ngroups] for i in range(ngroups)] if sources else []
        unit_flags = [*flags, PCH_DEFINE if pch is not None else define]
        prelude = ((instance_selector(instance) if pch is not None else "")
                   + (ENGINE_EXTERN if engine_obj is not None else ""))
        objects = [launcher_obj] + ([engine_obj] if engine_obj is not None else [])

        def make(tmp: Path) -> None:
            units = _write_units(tmp, groups, prelude)
            self._compile_units(tmp, units, outdir, unit_flags, pch, engine_obj is not None)
            self._link(tmp, units, objects, link)

        return cache.entry("cpu", key, make, root=cache_dir) / "module.so"

    def _compile_units(self, tmp: Path, units: list[Path], outdir: Path, flags: list[str],
                       pch: Path | None, has_engine: bool) -> None:
        """Each unit compiled to its object (``unit<i>.o`` beside it), :attr:`jobs` at once."""
        exe = self._cxx_exe

        def compile_unit(tu: Path):
            # with the precompiled shared headers: found through the first -I, in front of the
            # unit (the sources' own #include of it is then a no-op); run in the unit's
            # directory, which -include searches first and which holds no header
            pre = (["-I", str(pch), "-include", PCH_HEADER] if pch is not None
                   else ["-include", PCH_HEADER] if has_engine else [])
            cmd = [exe, *flags, *pre, "-I", str(outdir), "-c", str(tu), "-o", str(tu.with_suffix(".o"))]
            return subprocess.run(cmd, capture_output=True, text=True, cwd=str(tmp))

        with concurrent.futures.ThreadPoolExecutor(max_workers=self.jobs) as ex:
            results = list(ex.map(compile_unit, units))
        for tu, res in zip(units, results):
            if res.returncode != 0:
                raise PlatformError(f"g++ failed on the emitted sources ({tu.name}):\n"
                                    + res.stderr[-ERROR_TAIL_CHARS:])

    def _link(self, tmp: Path, units: list[Path], objects: list[Path], link: list[str]) -> None:
        """The units' objects and the shared ``objects`` linked into ``tmp/module.so``; the units'
        objects removed after."""
        objs = [str(tu.with_suffix(".o")) for tu in units] + [str(o) for o in objects]
        san = ["-fsanitize=address"] if self.sanitize else []
        res = subprocess.run([self._cxx_exe, "-shared", "-pthread", *san, *link, *objs, "-o", str(tmp / "module.so")],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise PlatformError("linking the CPU module failed:\n" + res.stderr[-ERROR_TAIL_CHARS:])
        for tu in units:
            os.unlink(tu.with_suffix(".o"))

    def _prims_pch(self, outdir: Path, headers: list[str], headers_digest: str, flags: list[str],
                   cache_dir: str | os.PathLike | None) -> Path | None:
        """The directory holding ``hccc_prims.h.gch``: the emitted headers precompiled by g++ with
        the build's flags (cached: like the launcher, it depends on the headers and the flags only,
        so every program and every instance of one hccc version shares it: the instance is
        :data:`INSTANCE_SELECTOR`, which the units define after it; one per instance cost a cold
        test run some 30 s of g++). Parsing the
        headers is most of what a unit of a few ranks costs g++; the object code is the same with
        and without it. None (units parse the headers themselves) for the AddressSanitizer build
        (its debug information would name the headers where they were precompiled), for a
        compiler that is not GCC (``HCCC_CXX=clang++``: its precompiled headers work otherwise), and
        when g++ cannot precompile them (the units' own compile then reports what is wrong). g++
        checks that a precompiled header matches the flags it is used with and falls back to the
        header itself where not."""
        if self.sanitize or PCH_HEADER not in headers or "clang" in self.compiler_id().lower():
            return None
        exe = self._cxx_exe
        key = cache.content_key("cpu-pch", self.compiler_id(), " ".join(flags), PCH_DEFINE, headers_digest)

        def make(tmp: Path) -> None:
            src = tmp / "src"
            src.mkdir()
            _copy_headers(outdir, headers, src)
            res = subprocess.run([exe, *flags, PCH_DEFINE, "-x", "c++-header", str(src / PCH_HEADER),
                                  "-o", str(tmp / f"{PCH_HEADER}.gch")], capture_output=True, text=True)
            shutil.rmtree(src)
            if res.returncode != 0:
                raise PlatformError("g++ could not precompile the headers:\n" + res.stderr[-ERROR_TAIL_CHARS:])

        try:
            return cache.entry("cpu_pch", key, make, root=cache_dir)
        except PlatformError:
            return None

    def _engine_object(self, outdir: Path, headers: list[str], headers_digest: str, flags: list[str],
                       instance: Instance, pch: Path | None, cache_dir: str | os.PathLike | None) -> Path | None:
        """The engine (``hccc_run`` for the instance's dtype and op over a rank program) compiled
        once into an object (cached: it depends on the headers, the flags and the instance only,
        so every program of one hccc version shares it). The units declare it ``extern template``
        (:data:`ENGINE_EXTERN`), so a program's build compiles its ranks' tables and kernel entries
        only: the engine was most of what a unit cost g++ (each unit instantiated it again). None
        where the emitted headers have no engine (not hccc's prims header)."""
        if PCH_HEADER not in headers:
            return None
        exe = self._cxx_exe
        define = instance_define(instance)
        key = cache.content_key("cpu-engine", self.compiler_id(), " ".join(flags), define, headers_digest,
                                ENGINE_SOURCE)

        def make(tmp: Path) -> None:
            src = tmp / "src"
            src.mkdir()
            _copy_headers(outdir, headers, src)
            if pch is not None:     # the instance named after the precompiled headers (_prims_pch)
                (src / "engine.cpp").write_text(instance_selector(instance) + ENGINE_SOURCE)
                pre = [PCH_DEFINE, "-I", str(pch), "-include", PCH_HEADER]
            else:
                (src / "engine.cpp").write_text(ENGINE_SOURCE)
                pre = [define, "-include", PCH_HEADER]
            res = subprocess.run([exe, *flags, *pre, "-I", str(src), "-c", str(src / "engine.cpp"),
                                  "-o", str(tmp / "engine.o")], capture_output=True, text=True, cwd=str(src))
            shutil.rmtree(src)
            if res.returncode != 0:
                raise PlatformError("g++ failed on the engine:\n" + res.stderr[-ERROR_TAIL_CHARS:])

        return cache.entry("cpu_engine", key, make, root=cache_dir) / "engine.o"

    def _launcher_object(self, outdir: Path, headers: list[str], headers_digest: str,
                         flags: list[str], cache_dir: str | os.PathLike | None) -> Path:
        """``cpu_launcher.cpp`` compiled against the emitted headers (cached: it depends on the
        headers and flags only, not on the program)."""
        exe = self._cxx_exe
        launcher = _launcher_source()
        key = cache.content_key("cpu-launcher", self.compiler_id(), " ".join(flags), launcher, headers_digest)

        def make(tmp: Path) -> None:
            _copy_headers(outdir, headers, tmp)
            (tmp / "launcher.cpp").write_text(launcher)
            res = subprocess.run([exe, *flags, "-I", str(tmp), "-c", str(tmp / "launcher.cpp"), "-o",
                                  str(tmp / "launcher.o")], capture_output=True, text=True)
            if res.returncode != 0:
                raise PlatformError("g++ failed on the CPU launcher:\n" + res.stderr[-ERROR_TAIL_CHARS:])

        return cache.entry("cpu_launcher", key, make, root=cache_dir) / "launcher.o"


def _write_units(tmp: Path, groups: list[list[str]], prelude: str) -> list[Path]:
    """One translation unit ``unit<i>.cpp`` in ``tmp`` per group of sources: ``prelude``, then an
    ``#include`` of each source."""
    units = []
    for i, grp in enumerate(groups):
        tu = tmp / f"unit{i}.cpp"
        tu.write_text(prelude + "".join(f'#include "{f}"\n' for f in grp))
        units.append(tu)
    return units


__all__ = ["CpuToolchain", "links_with", "instance_define", "instance_selector", "module_sources",
           "check_instance", "ENGINE_SOURCE", "ENGINE_EXTERN", "PCH_HEADER", "PCH_DEFINE",
           "INSTANCE_SELECTOR", "FAST_LINKER", "ASAN_FLAGS"]
