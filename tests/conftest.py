"""Shared test configuration: hypothesis profiles and the compiler-availability policy."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

# Bytecode is cached for the suite even where the environment turns caching off
# (PYTHONDONTWRITEBYTECODE): the suite starts hundreds of Python processes (the command line,
# rank processes), each of which would otherwise compile every hccc module it imports again, and
# each pytest worker would rewrite the asserts of every test module again on every run.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import pytest
from hypothesis import HealthCheck, settings

# "ci" (default): reproducible: derandomised (the same examples on every run, no example database),
# no deadlines on a loaded 2-core machine. "dev": random exploration, new examples each run (and
# failures replayed from the local example database). "thorough": random, and many more examples
# for a soak. Pick one with `pytest --hypothesis-profile dev` or HYPOTHESIS_PROFILE=dev; the option
# wins over the variable (hypothesis' pytest plugin loads it after this file).
settings.register_profile("ci", deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
# derandomize=False stated: under a CI environment (CI=true) hypothesis' own defaults derandomise,
# and a profile asked for random exploration must explore there too
settings.register_profile("dev", deadline=None, derandomize=False, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", deadline=None, max_examples=1000, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")


#: the kernel property tests (and the LL protocol's, whose flags and data share a store) the slow
#: set runs again with the CPU emulation's default -O1 build
OPTIMISED_RERUN = ("test_kernels_property.py", "test_channels.py", "test_direct_safe.py",
                   "test_fused_channels.py", "test_one_grid.py", "test_ll_protocol.py")


def pytest_configure(config):
    """README's command (the default ``-m 'not slow and not sweep'``) and the slow set (``-m slow``, CI's second
    command) build the CPU emulation's kernels at -O0: g++ takes about half as long, and a cold run
    compiles hundreds of them. The emitted source, the emulation header and every check are the
    same; the slow set reruns the kernel property tests (:data:`OPTIMISED_RERUN`) with the
    platform's -O1 (``test_kernels_optimised.py``), so CI proves both builds. A user's own
    HCCC_CPU_OPT always wins."""
    global DEFAULT_RUN_AT_O0
    if "HCCC_CPU_OPT" not in os.environ and \
            (config.option.markexpr or "").replace(" ", "") in ("notslowandnotsweep", "notslow", "slow", "sweep"):
        os.environ["HCCC_CPU_OPT"] = "-O0"
        os.environ["HCCC_CPU_OPT_SET_BY_TESTS"] = "-O0"     # pytest-xdist's workers inherit both
        DEFAULT_RUN_AT_O0 = True
    elif os.environ.get("HCCC_CPU_OPT_SET_BY_TESTS") and \
            os.environ.get("HCCC_CPU_OPT") == os.environ["HCCC_CPU_OPT_SET_BY_TESTS"]:
        DEFAULT_RUN_AT_O0 = True        # a worker of README's command: the -O0 is this file's, not the user's
    # with pytest-xdist's workers (`-n N`) the cores are busy: a CPU-emulation build compiles its
    # units on the worker's share of them (README's `-n 2` on 2 cores: one unit a build, which
    # saves g++ a start and a load of the precompiled headers per unit); a user's own value wins
    workers = getattr(config.option, "numprocesses", None)
    if isinstance(workers, int) and workers > 1 and "HCCC_CPU_JOBS" not in os.environ:
        os.environ["HCCC_CPU_JOBS"] = str(max(1, (os.cpu_count() or 1) // workers))
    _steal_work(config)
    _prepare_workers_imports(config)


def _steal_work(config) -> None:
    """README's ``-n 2`` distributes by work stealing unless ``--dist`` is given: each worker starts
    on a contiguous half of the tests, so a module's tests (and its module-scoped fixtures: built
    kernels, packings, corpora) mostly stay on one worker instead of alternating between both
    (``load``'s round robin sets such a fixture up once per worker), and an idle worker takes tests
    from the end of the other's queue, so neither waits on the other's tail. Set before
    pytest-xdist's own ``pytest_configure`` (a conftest's runs first) reads the mode."""
    if getattr(config.option, "dist", "no") != "load" or getattr(config.option, "distload", False):
        return
    if any(a == "--dist" or a.startswith("--dist=") for a in config.invocation_params.args):
        return          # the user's own choice
    config.option.dist = "worksteal"


DEFAULT_RUN_AT_O0 = False   # set by pytest_configure


def _prepare_workers_imports(config) -> None:
    """Under ``-n N`` in a fresh checkout, before the workers start: the test modules' asserts
    rewritten (pytest's cached pyc beside each, which every process then loads) and hccc's modules
    and the tests' helpers compiled to bytecode, once, on N processes forked from this one
    (:func:`prepare_imports`). Each worker collects every test module, and without this each
    rewrote all of them itself: about 8 s of CPU per worker for the rewriting alone (45,000 lines
    of tests, 5,000 asserts), a worker's collection 16 s of CPU cold against 7.5 s warm. Where the
    pyc files are there already (any later run) this only reads their headers."""
    workers = getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput") or not isinstance(workers, int) or workers < 2 \
            or sys.dont_write_bytecode or getattr(config.option, "assertmode", None) != "rewrite":
        return
    import importlib.util
    try:
        spec = importlib.util.find_spec("hccc")
    except (ImportError, ValueError):
        spec = None
    prepare_imports(config, Path(__file__).resolve().parent,
                    [Path(p) for p in ((spec and spec.submodule_search_locations) or [])], workers)


def prepare_imports(config, tests: Path, packages: list[Path], processes: int) -> int:
    """Every ``test_*.py`` of the folder ``tests`` rewritten as pytest rewrites a test module it
    imports, and every other module there and under the folders ``packages`` compiled to
    bytecode, each written where its import looks for it, on ``processes`` forked processes;
    those whose pyc is current are left alone. Returns how many were prepared. It uses pytest's
    own rewriting functions (``_pytest.assertion.rewrite``, not public API): where they are not as
    expected nothing is prepared and each import rewrites or compiles as before."""
    try:
        from _pytest.assertion import rewrite
        _PREPARE[:] = [config, rewrite, tests]
        found = sorted(p for p in tests.glob("*.py") if p.name != "conftest.py")
        found += sorted(Path(root) / f for where in packages
                        for root, _, files in os.walk(where, followlinks=True) for f in files if f.endswith(".py"))
        todo = [p for p in found if _stale(p)]
        if todo:
            import concurrent.futures
            import multiprocessing
            with concurrent.futures.ProcessPoolExecutor(
                    min(processes, len(todo)), mp_context=multiprocessing.get_context("fork")) as pool:
                list(pool.map(_prepare_one, todo, chunksize=max(1, len(todo) // (4 * processes))))
        return len(todo)
    except Exception:           # each import compiles and rewrites what it needs, as without this
        return 0
    finally:
        _PREPARE.clear()


#: the controller's config, pytest's rewrite module and the tests' folder, for :func:`_prepare_one`
#: in the processes forked by :func:`prepare_imports`
_PREPARE: list = []


def _is_test_module(path: Path) -> bool:
    return path.name.startswith("test_") and path.parent == _PREPARE[2]


def _stale(path: Path) -> bool:
    """A test module without pytest's rewritten pyc, or another module without its bytecode."""
    import importlib.util
    if _is_test_module(path):
        rewrite = _PREPARE[1]
        return rewrite._read_pyc(path, rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)) is None
    pyc = Path(importlib.util.cache_from_source(str(path)))
    try:
        return pyc.stat().st_mtime < path.stat().st_mtime
    except OSError:
        return True


def _prepare_one(path: Path) -> None:
    """One module rewritten (a test module) or compiled (any other), written where its import
    looks for it; errors are left to the import, which reports them."""
    try:
        if _is_test_module(path):
            config, rewrite, _ = _PREPARE
            stat, code = rewrite._rewrite_test(path, config)
            cache = rewrite.get_cache_dir(path)
            if rewrite.try_makedirs(cache):
                rewrite._write_pyc(config.stash[rewrite.assertstate_key], code, stat,
                                   cache / (path.name[:-3] + rewrite.PYC_TAIL))
        else:
            import py_compile
            py_compile.compile(str(path), doraise=True)
    except Exception:
        pass


def examples(n: int) -> int:
    """``max_examples`` for a test whose explicit count should grow with the profile: ``n`` under
    the README's command (ci) and dev, ten times ``n`` under ``--hypothesis-profile thorough`` (the
    loaded profile's max_examples over hypothesis' default of 100). An explicit
    ``@settings(max_examples=...)`` otherwise wins over every profile. Decorators run when test
    modules are collected, after hypothesis' plugin has loaded the profile the user asked for."""
    return n * max(1, settings.default.max_examples // 100)


#: why a test that needs torch is skipped where it is missing: the extra that installs it
TORCH_MISSING = "torch is not installed (the 'test' extra installs it: pip install -e '.[test]')"


def benchmark_script(name: str):
    """``benchmarks/<name>.py`` as a module (a script, not part of the package), loaded once a
    process under its own name (dataclasses and the scripts' imports of each other look it up)."""
    import importlib.util
    import sys
    if name not in sys.modules:
        path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def needs_torch(module: str = "torch"):
    """``module`` (torch or one of its modules) imported, or the test (or, at a module's top, the
    module) skipped, naming the extra that installs torch (:data:`TORCH_MISSING`); a failure where
    CI requires every tool (HCCC_REQUIRE_COMPILERS=1: the torch backend and the Communicator must
    stay tested there). Test modules import torch through this only, never at their top: the suite
    collects without torch."""
    __tracebackhide__ = True          # (a skip is reported at its caller's line)
    try:
        import importlib
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("HCCC_REQUIRE_COMPILERS"):
            pytest.fail(f"{module} is required (HCCC_REQUIRE_COMPILERS is set): {TORCH_MISSING}")
        return pytest.importorskip(module, reason=TORCH_MISSING)


def require_tool(name: str) -> str:
    """Path of an external tool; skip the test when it is missing, unless CI demands it
    (HCCC_REQUIRE_COMPILERS=1: then a missing tool fails the test)."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("HCCC_REQUIRE_COMPILERS"):
            pytest.fail(f"{name} is required (HCCC_REQUIRE_COMPILERS is set) but not on PATH")
        pytest.skip(f"{name} not installed")
    return path


@pytest.fixture
def nvcc() -> str:
    return require_tool("nvcc")


@pytest.fixture
def hipcc() -> str:
    return require_tool("hipcc")


@pytest.fixture
def packing_without_classes(monkeypatch):
    """The tree packing's LP over every root, without the classes of a cluster of several kinds of
    node (:func:`hccc.compiler.synth.symmetry.class_symmetry`), whose LP often finds one tree per
    root: for tests whose premise is a packing of several chunks per rank."""
    from hccc.compiler.synth import packing_lp

    monkeypatch.setattr(packing_lp, "class_symmetry", lambda net, bw=None: None)


def _descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(children.get(p, []))
    return out


def shm_leaks(before: set) -> set:
    """hccc shared-memory segments made since ``before`` that a test owns: made by this process or
    a process below it (rank pools, programs it launched), or by a process now gone. Segments of
    live processes of another pytest worker (``-n 2``) are theirs, not this test's leak."""
    from hccc.runtime import shm

    mine = _descendants(os.getpid())
    leaks = set()
    for name in set(shm.ours()) - set(before):
        pid = int(shm._NAME.fullmatch(name).group(1))
        if pid in mine or not os.path.exists(f"/proc/{pid}"):
            leaks.add(name)
    return leaks


def harness_library(tmp_dir, source: str, name: str, *, warp: int | None = None, opt: str = "-O1",
                    defines: tuple[str, ...] = ()):
    """A C++ test harness (``source``, which includes ``hccc_prims.h``) built for the CPU emulation
    against the headers hccc emits, as a shared library loaded with ctypes: the one way the
    kernel-level tests (LL lines, the block roles, the copy engine) reach the device code.
    ``warp``: the emulated warp width (-DHCCC_WARP_SIZE); ``defines``: more build switches
    (``-DHCCC_TMA=1``)."""
    import ctypes
    import subprocess
    from pathlib import Path

    from hccc.compiler.backend.codegen import generate
    from hccc.compiler.frontend import generators as gen
    from hccc.compiler.passes.build import build_program

    d = Path(tmp_dir)
    if not (d / "hccc_prims.h").exists():
        generate(build_program(gen.ring_allgather(2), chunk_bytes=64), d, platforms=["cuda"] * 2)
    (d / f"{name}.cpp").write_text(source)
    so = d / f"{name}.so"
    flags = ["-std=c++17", opt, "-fPIC", "-shared", "-pthread", "-DHCCC_PLATFORM_CPU"]
    if warp is not None:
        flags.append(f"-DHCCC_WARP_SIZE={warp}")
    flags += list(defines)
    res = subprocess.run(["g++", *flags, "-I", str(d), str(d / f"{name}.cpp"), "-o", str(so)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return ctypes.CDLL(str(so)), so


def cuda_platform_or_skip():
    """The CUDA platform (the caller closes it), or the test skipped when there is none: failed
    instead when HCCC_REQUIRE_GPU is set (the GPU tests of a lent machine must not pass vacuously)."""
    from hccc.runtime.platform import PlatformError, get_platform
    try:
        return get_platform("cuda")
    except PlatformError as exc:
        if os.environ.get("HCCC_REQUIRE_GPU"):
            pytest.fail(f"HCCC_REQUIRE_GPU is set but: {exc}")
        pytest.skip(str(exc))


# ---------------------------------------------------------------- CPU seconds per test
# `pytest -n 2 --cpu-durations=30` lists the tests that took the most CPU (user + system of the
# test's process and of every child process it waited for: g++, the command line, rank processes),
# each test's setup, call and teardown together, and the suite's total. CPU seconds rather than
# wall time: on a shared machine a test's wall time is mostly other people's load, and the point
# is what the suite costs a 2-core machine. A session fixture's setup counts for the first test
# that asks for it; a cold cache's builds count for the first test that wants each of them; the
# rank processes of tests/rank_pool.py count in the worker's total only (their server is ended and
# waited for at the session's end).

def pytest_addoption(parser):
    parser.addoption("--cpu-durations", type=int, default=None, metavar="N",
                     help="list the N tests that took the most CPU seconds (user + system, child "
                          "processes included) and the suite's total (0: the total only)")


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its waited-for children so far."""
    import resource
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


_CPU_MARK = [0.0]


def pytest_runtest_logstart(nodeid, location):
    _CPU_MARK[0] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if item.config.getoption("cpu_durations") is None:
        return
    now = _cpu_seconds()
    outcome.get_result().user_properties.append(("cpu_s", now - _CPU_MARK[0]))
    _CPU_MARK[0] = now


_CPU_BY_TEST: dict[str, float] = {}
_CPU_BY_WORKER: dict[str, float] = {}


def pytest_runtest_logreport(report):
    for key, value in getattr(report, "user_properties", ()):
        if key == "cpu_s":
            _CPU_BY_TEST[report.nodeid] = _CPU_BY_TEST.get(report.nodeid, 0.0) + value


def pytest_sessionfinish(session):
    if "rank_pool" in sys.modules:      # its rank processes' server: ended and waited for
        sys.modules["rank_pool"].stop_rank_server()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and session.config.getoption("cpu_durations") is not None:
        workeroutput["cpu_s"] = _cpu_seconds()      # the worker's whole process: imports, collection


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    out = getattr(node, "workeroutput", None) or {}
    if "cpu_s" in out:
        _CPU_BY_WORKER[node.gateway.id] = out["cpu_s"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = config.getoption("cpu_durations")
    if n is None or hasattr(config, "workerinput"):
        return
    tr = terminalreporter
    total = sum(_CPU_BY_TEST.values())
    tr.write_sep("=", f"CPU seconds per test (user + system, child processes included)")
    for nodeid, cpu in sorted(_CPU_BY_TEST.items(), key=lambda kv: -kv[1])[:n]:
        tr.write_line(f"{cpu:8.2f}s {nodeid}")
    tr.write_line(f"{total:8.2f}s in {len(_CPU_BY_TEST)} tests")
    if _CPU_BY_WORKER:
        whole = sum(_CPU_BY_WORKER.values())
        tr.write_line(f"{whole:8.2f}s in the workers' processes in all ("
                      + ", ".join(f"{w}: {s:.2f}s" for w, s in sorted(_CPU_BY_WORKER.items())) + ")")
    else:
        tr.write_line(f"{_cpu_seconds():8.2f}s in this process in all (imports and collection included)")


@pytest.fixture
def design_target_costs(monkeypatch):
    """The slice policy and the simulator's units under the v4 kernels' design targets (0.5 us a
    unit, 0.2 us a COPY or LL unit, 100 GB/s a block) instead of the costs the kernel cost model holds (measured on the
    fifth GPU run, compiler/passes/kernel_cost.py): the tests that explain the policy's arithmetic
    on worked examples were written at these figures, and their examples' outcomes depend on them."""
    from hccc.compiler.passes import kernel_cost, slicing
    monkeypatch.setattr(slicing, "UNIT_SECONDS", 0.5e-6)
    monkeypatch.setattr(slicing, "COPY_UNIT_SECONDS", 0.2e-6)
    monkeypatch.setattr(slicing, "LL_UNIT_SECONDS", 0.2e-6)
    monkeypatch.setattr(slicing, "BLOCK_BYTES_PER_SECOND", 100e9)
    # the simulator charges the same units (kernel_cost.DESIGN_TARGETS: 0.5 us a unit, 0.2 a COPY)
    monkeypatch.setattr(kernel_cost, "SIM_COSTS", kernel_cost.DESIGN_TARGETS)
    return slicing


@pytest.fixture
def alpha_beta_costs(monkeypatch):
    """The simulator as it was before it charged the kernels' unit and hop costs: none
    (kernel_cost.SIM_COSTS None), and a block's rate on 64 KiB units with their fixed costs folded
    in (kernel_cost.FOLDED_BLOCK_GBPS, where synthesis reads the default per-block limit) instead of
    its rate beyond them. For the tests of mechanisms whose worked examples need that simulator
    (thin slices winning: with the units charged they lose on these examples).

    The simulator's functions take the default rate as a default argument, bound when their module
    is imported: they are imported here before the rate is patched, so they keep the measured rate
    whichever test imported them first (a test that compares with synthesis' simulations passes
    ``block_gbps=sim_model.DEFAULT_BLOCK_GBPS``, the rate synthesis reads, explicitly)."""
    from hccc.compiler.passes import kernel_cost
    from hccc.runtime import sim_alltoallv, sim_model, sim_periodic, simulator  # noqa: F401 (before the patch)
    monkeypatch.setattr(kernel_cost, "SIM_COSTS", None)
    monkeypatch.setattr(sim_model, "DEFAULT_BLOCK_GBPS", kernel_cost.FOLDED_BLOCK_GBPS)
