"""numba kernels with a plain-Python twin, picked by the size of the work.

hccc's inner loops (the simulator's event loop, the synthesis greedy, the list scheduler of pod
composition) are plain Python/numpy functions that numba also compiles. Compiling one takes numba
10-20 s the first time (then its cache loads in well under a second, but importing numba alone costs
about 0.3 s), while the same function as plain Python finishes small inputs in milliseconds. So each
module names its kernels once (:class:`Kernels`) and asks for the right variant per call
(:meth:`Kernels.pick`): plain Python until the process's work for the module (this call's and its
earlier plain calls') reaches the module's threshold, numba from there on (when numba is installed:
the extras ``sim``, ``synth`` and ``scale``). So a process spends at most about a second of plain
Python per module before it compiles, however its work is split into calls. A kernel whose work is
only known as it runs (the simulator's) takes the work left (:meth:`Kernels.plain_budget`), stops
when it is spent, reports it (:meth:`Kernels.spend`) and is rerun compiled. Where numba's cache of a
module's kernels is already on disk, compiling is only loading, and the threshold is ten times lower. Both run the very same source, and the
tests hold them to equal results.

``HCCC_JIT`` overrides the choice for every call: ``python`` (never compile), ``numba`` (always
compile: what the tests use to exercise the compiled path on small inputs), ``auto`` (default).

The compiled twins are made on first use, all of a module's kernels together, as copies of the
functions whose globals see each other's compiled twin (numba resolves a kernel's calls through its
globals); the module's own names stay the plain functions. numba's on-disk cache keys them by their
source file and line, as it keys decorated functions, and by the sources of the whole set: a twin
carries the code of the twins it calls, and numba checks only its own file (the twins' names carry
a digest of every file the set comes from, :func:`_sources_tag`; the entries of other digests are
removed as the set compiles). numba unpickles its cache when it loads a kernel, so its cache
directory is held to the rule of every cache hccc reads (:func:`cached_njit`, :mod:`hccc.util.trust`:
the user's own, writable by nobody else, the whole path above it too), and what numba writes there
under the user's umask is made private after each compile. A kernel named in ``parallel`` is compiled
with ``parallel=True``, and its module's ``prange`` (this module's, which is ``range`` in plain
Python) is numba's ``prange`` in the twin. A kernel named in ``borrowed`` (one that allocates no
array and returns none) is compiled without numba's reference counting, so the arrays it is
passed cost no atomic count per call where numba does not inline it.

Processes that start together (a job's ranks, a test run's workers) compile each kernel once: the
first call of a compiled twin holds a lock file beside numba's cache of it, and the others wait for
it and load what it wrote (:class:`_OneCompiler`; a cold run of the tests compiled the simulator's
event loop in both workers before:
docs/archive/measurements-log.md#the-test-suites-time-cold-pytest--n-2).

This is the only way hccc compiles with numba. Where a module keeps a second, plain-Python
formulation of an algorithm beside its kernel (a list or numpy version that plain Python runs much
faster than the kernel's array loops; each such module says why, with the measurement of
``benchmarks/twins.py``), it asks :meth:`Kernels.compiled_for` instead of :meth:`Kernels.pick`:
the compiled kernel, or ``None`` where its own plain version should run. That choice is per call
(a call of at least ``min_work``): the plain version is the faster one below the threshold
whatever the process ran before, so small calls neither add up nor follow a compiled one.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
import types
from pathlib import Path
from typing import Callable, Iterable

from hccc.util.clock import count_compiles
from hccc.util.trust import CacheTrust, UntrustedCacheError

MODES = ("auto", "python", "numba")
#: with numba's cache on disk a module's threshold is this many times lower (loading is cheap)
CACHED_DIVISOR = 10


#: what a kernel loops over in parallel: ``range`` in plain Python, numba's ``prange`` in the
#: compiled twin of a kernel named in ``Kernels(parallel=...)``
prange = range


@functools.lru_cache(maxsize=None)
def have_numba() -> bool:
    """numba is installed (without importing it; looked up once)."""
    return importlib.util.find_spec("numba") is not None


def numba_cache_dirs(source: str) -> list[Path]:
    """Where numba keeps the cache of the functions of the file ``source`` (without importing
    numba; its ``numba.core.caching`` locators, first that applies): ``$NUMBA_CACHE_DIR/<the
    file's directory name>_<SHA-1 of the directory's absolute path>`` where that variable is set,
    else the ``__pycache__`` beside the file, or (where that cannot be written) the same
    ``<name>_<SHA-1>`` under the user's cache directory for numba."""
    import hashlib
    folder = os.path.dirname(os.path.abspath(source))
    sub = f"{os.path.basename(folder)}_{hashlib.sha1(folder.encode()).hexdigest()}"
    user = os.environ.get("NUMBA_CACHE_DIR", "")
    if user:
        return [Path(user) / sub]
    import platformdirs
    return [Path(folder) / "__pycache__", Path(platformdirs.user_cache_dir("numba", appauthor=False)) / sub]


#: numba's cache is unpickled when a kernel is loaded from it: held to the rule of every cache
NUMBA_TRUST = CacheTrust("numba's cache", "NUMBA_CACHE_DIR", UntrustedCacheError)
_TRUSTED_NUMBA_DIRS: set[str] = set()
_TRUSTED_LOCK = threading.Lock()


def cached_njit(fn: Callable, **options):
    """``numba.njit(cache=True, **options)(fn)``, its cache directory held to the rule of every
    cache hccc reads (:mod:`hccc.util.trust`) before anything in it is loaded: the user's own and
    writable by nobody else, the path above it too. Where it is not, :class:`UntrustedCacheError`
    says which path and why (numba would unpickle what someone else could have planted there).
    Each directory is checked once per process (what numba writes there later is the user's)."""
    from numba import njit
    # the directories numba may make for this file's cache (with the user's umask: group-writable
    # under 002), noted before it does: those it has just made are made private below (nobody else
    # can add to them from then on, and what another user did put in them meanwhile is refused)
    made = [d for c in numba_cache_dirs(fn.__code__.co_filename)
            for d in ((c,) if c.name == "__pycache__" else (c, c.parent)) if not d.exists()]
    dispatcher = njit(cache=True, **options)(fn)
    where = getattr(getattr(dispatcher, "_cache", None), "_cache_path", None)
    if where is None:      # a numba whose cache cannot be located: compile without one
        from numba.core.caching import NullCache
        dispatcher._cache = NullCache()
        return dispatcher
    for d in made:
        NUMBA_TRUST.tighten(d, files=False)
    with _TRUSTED_LOCK:
        if where not in _TRUSTED_NUMBA_DIRS:
            NUMBA_TRUST.directory(Path(where), "cache directory")
            _TRUSTED_NUMBA_DIRS.add(where)
    return dispatcher


def _sources_tag(functions: Iterable[Callable]) -> str:
    """A digest of the source files the kernels ``functions`` come from ('' where one cannot be
    read). numba's cache checks only the file of the function it compiled, yet a twin calls the
    other twins of its set and carries their code (the simulator's event loop carries the sharing
    of ``runtime/sim_share.py``): a cache keyed by all of them is never older than one of them."""
    import hashlib
    digest = hashlib.sha1()
    for path in sorted({fn.__code__.co_filename for fn in functions}):
        try:
            digest.update(Path(path).read_bytes())
        except OSError:
            return ""
    return digest.hexdigest()[:12]


def jit_mode() -> str:
    """The ``HCCC_JIT`` override (``auto`` when unset); an unknown value is an error."""
    mode = os.environ.get("HCCC_JIT", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"HCCC_JIT={mode!r}: expected one of {', '.join(MODES)}")
    return mode


class Kernels:
    """The kernels ``names`` of a module (its ``globals()``), compiled only when the work of a call
    reaches ``min_work`` (in the module's own unit: slices simulated, rank-chunk-steps, ...).
    ``parallel``: the kernels compiled with ``parallel=True`` (their loops over ``prange``).
    ``borrowed``: kernels that allocate no array and return none, compiled without numba's
    reference counting (its ``_nrt`` flag off): they only borrow the arrays their caller keeps
    alive, so a call that numba does not inline costs no atomic count per array argument (the
    simulator's flow and sharing helpers, called per event with some thirty arrays: without it
    its event loop ran 1.7-1.9x slower on small programs). ``compiled_globals``: names the
    compiled twins see bound otherwise than the plain functions, each to what its function makes
    when they are compiled (a C function that plain Python calls through ctypes and numba by its
    symbol, ``numba.types.ExternalFunction``, which numba can cache where it cannot cache a
    ctypes pointer)."""

    def __init__(self, namespace: dict, names: Iterable[str], *, min_work: int,
                 parallel: Iterable[str] = (), nogil: bool = True, borrowed: Iterable[str] = (),
                 compiled_globals: dict[str, Callable[[], object]] | None = None,
                 cached_min_work: int | None = None):
        self._ns = namespace
        self._names = tuple(names)
        missing = [n for n in self._names if not callable(namespace.get(n))]
        if missing:
            raise NameError(f"no kernel function {', '.join(missing)} in {namespace.get('__name__')}")
        self._parallel = frozenset(parallel)
        if not self._parallel <= set(self._names):
            raise NameError(f"parallel kernels {', '.join(sorted(self._parallel - set(self._names)))} "
                            f"are not kernels of {namespace.get('__name__')}")
        self._borrowed = frozenset(borrowed)
        self._compiled_globals = dict(compiled_globals or {})
        if not self._borrowed <= set(self._names) - self._parallel:
            raise NameError(f"borrowing kernels {', '.join(sorted(self._borrowed))} must be kernels of "
                            f"{namespace.get('__name__')}, and not parallel ones")
        self.min_work = int(min_work)
        # the threshold where numba's cache of the kernels is on disk (loading them costs a fraction
        # of compiling); None: ``min_work // CACHED_DIVISOR`` for :meth:`pick` and ``min_work`` for
        # :meth:`compiled_for` (whose callers' plain versions are faster than the kernels run plain)
        self.cached_min_work = None if cached_min_work is None else int(cached_min_work)
        self._nogil = nogil
        self._tag: str | None = None         # :func:`_sources_tag` of the kernels, read on first use
        self._compiled: dict[str, Callable] | None = None
        self._plain_work = 0                 # work of the plain calls so far
        self._cache_seen: bool | None = None
        self._lock = threading.Lock()

    def plain_budget(self) -> int | None:
        """Work a plain call may still do in this process: ``None`` without limit (``HCCC_JIT=python``
        or no numba), 0 when calls run compiled (``HCCC_JIT=numba``, or the twins already made), else
        what the plain calls so far have left of the threshold."""
        mode = jit_mode()
        if mode == "python" or not have_numba():
            return None
        if mode == "numba" or self._compiled is not None:
            return 0
        return max(0, self._least(self.min_work // CACHED_DIVISOR) - self._plain_work)

    def _least(self, cached_default: int) -> int:
        """The threshold: ``min_work``, or where numba's cache of the kernels is on disk
        ``cached_min_work`` (``cached_default`` when that is not given)."""
        if not self._cached():
            return self.min_work
        return cached_default if self.cached_min_work is None else self.cached_min_work

    def _cached(self) -> bool:
        """numba's cache index of every kernel is on disk (``<file>.<twin's name>-<line>.py<version>.nbi``
        in one of the directories :func:`numba_cache_dirs` names), so compiling means loading,
        well under a second. A guess about numba's layout that only moves the threshold."""
        if self._cache_seen is None:
            tag = f"py{sys.version_info.major}{sys.version_info.minor}"
            found = True
            for n in self._names:
                code = self._ns[n].__code__
                src = Path(code.co_filename)
                name = f"{src.stem}.{self._twin_name(n)}-{code.co_firstlineno}.{tag}.nbi"
                found = found and any((d / name).is_file() for d in numba_cache_dirs(code.co_filename))
            self._cache_seen = found
        return self._cache_seen

    def _twin_name(self, name: str) -> str:
        """The qualified name of kernel ``name``'s compiled twin, which names its files in numba's
        cache: the function's, tagged with the sources of every kernel of the set
        (:func:`_sources_tag`)."""
        if self._tag is None:
            self._tag = _sources_tag(self._ns[n] for n in self._names)
        return f"{self._ns[name].__qualname__}_{self._tag}" if self._tag else self._ns[name].__qualname__

    def _drop_older_caches(self) -> None:
        """Remove numba's cache files of this set's kernels made from other sources (another
        :func:`_sources_tag`, or none): they can never load again, and an edited or upgraded tree
        would otherwise keep a set of them per version. Files that cannot be removed stay (the
        compile locks, empty files named by kernel alone, stay too: another module's kernel of
        the same name may hold one)."""
        import re
        if not self._tag:
            return
        older: dict[str, list] = {}          # cache folder -> patterns of its stale files
        other = rf"(_(?!{self._tag}[-.])[0-9a-f]{{12}})?"
        for n in self._names:
            code = self._ns[n].__code__
            stem, qual = re.escape(Path(code.co_filename).stem), re.escape(self._ns[n].__qualname__)
            pattern = re.compile(rf"{stem}\.{qual}{other}-\d+\.py\d+\.(\d+\.)?nb[ic]$")
            for folder in numba_cache_dirs(code.co_filename):
                older.setdefault(str(folder), []).append(pattern)
        for folder, patterns in older.items():
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                if any(p.match(name) for p in patterns):
                    try:
                        os.unlink(os.path.join(folder, name))
                    except OSError:
                        pass

    def spend(self, work: int) -> None:
        """Count the work a plain call did (for kernels that learn their work as they run)."""
        with self._lock:
            self._plain_work += int(work)

    def pick(self, name: str, work: int) -> Callable:
        """Kernel ``name`` for a call of ``work`` (known in advance): the plain function while the
        process's plain work, this call's included, stays below the threshold, else the compiled
        twin (many small calls add up to one large one)."""
        if name not in self._names:
            raise KeyError(f"{name} is not a kernel of {self._ns.get('__name__')}")
        budget = self.plain_budget()
        if budget is None or int(work) < budget:
            self.spend(work)
            return self._ns[name]
        return self.compiled()[name]

    def compiled_for(self, name: str, work: int) -> Callable | None:
        """For a module that keeps its own plain formulation (faster than the kernel run plain):
        the compiled kernel ``name`` for a call of ``work`` from ``min_work`` on (from
        ``cached_min_work`` where given and numba's cache of the kernels is on disk;
        ``HCCC_JIT=numba``: always), else ``None``, and the caller runs its plain version (``HCCC_JIT=python``, or
        numba missing: always). Per call: small calls do not add up."""
        if name not in self._names:
            raise KeyError(f"{name} is not a kernel of {self._ns.get('__name__')}")
        mode = jit_mode()
        if mode == "python" or not have_numba():
            return None
        if mode == "numba" or int(work) >= self._least(self.min_work):
            return self.compiled()[name]
        return None

    def require(self, name: str) -> Callable:
        """The compiled kernel ``name`` whatever the work (a caller asked for the compiled path
        explicitly); a clear error without numba."""
        if name not in self._names:
            raise KeyError(f"{name} is not a kernel of {self._ns.get('__name__')}")
        if not have_numba():
            raise RuntimeError(f"the compiled {name} of {self._ns.get('__name__')} needs numba "
                               f"(pip install 'hccc[scale]')")
        return self.compiled()[name]

    def compiled(self) -> dict[str, Callable]:
        """The compiled twins (numba dispatchers), made on first use."""
        with self._lock:
            if self._compiled is None:
                count_compiles()           # time limits leave out what numba compiles (util/clock.py)
                import numba
                glb = dict(self._ns)
                glb.update({name: make() for name, make in self._compiled_globals.items()})
                if self._parallel:
                    glb["prange"] = numba.prange
                twins = {}
                for n in self._names:
                    fn = self._ns[n]
                    twin = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
                    twin.__qualname__ = self._twin_name(n)
                    twin.__module__ = fn.__module__
                    twin.__doc__ = fn.__doc__
                    opts = {"_nrt": False} if n in self._borrowed else {}
                    twins[n] = cached_njit(twin, nogil=self._nogil, parallel=n in self._parallel, **opts)
                glb.update(twins)
                self._drop_older_caches()
                self._compiled = {n: _OneCompiler(t) for n, t in twins.items()}
            return self._compiled


class _OneCompiler:
    """A compiled twin whose first call in this process compiles it for the call's argument types
    (or loads it from numba's cache) holding a lock file beside numba's cache of it, so that
    processes starting together (the ranks of a job, the workers of a test run) compile each
    kernel once: the others wait, then load what the first one wrote (numba reads its cache index
    when it compiles). The call itself runs after the lock is released, and every later call goes
    straight to the dispatcher; without a lock (no cache directory, no ``flock``) the first
    compile runs unlocked, as numba alone would."""

    __slots__ = ("dispatcher", "_first")

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher
        self._first = True

    def __call__(self, *args, **kwargs):
        if self._first:
            if kwargs:          # numba types keyword calls itself: compiled by the call, under the lock
                with _compile_lock(self.dispatcher):
                    out = self.dispatcher(*args, **kwargs)
                self._first = False
                return out
            import numba
            # only the compile (or the load) holds the lock, not the run: threads of this process
            # simulating side by side wait for each other's load, not for each other's work
            with _compile_lock(self.dispatcher):
                self.dispatcher.compile(tuple(numba.typeof(a) for a in args))
            self._first = False
        return self.dispatcher(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.dispatcher, name)


class _compile_lock:
    """``flock`` on ``<numba's cache directory of the dispatcher>/<its name>.hccc-lock`` (a no-op
    where there is none)."""

    def __init__(self, dispatcher):
        self._dispatcher = dispatcher
        self._fd = None

    def __enter__(self):
        try:
            import fcntl
            where = Path(self._dispatcher._cache._cache_path)
            name = self._dispatcher.py_func.__qualname__
            self._fd = os.open(where / f"{name}.hccc-lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except Exception:          # no cache directory, or no locks on it: compile unlocked
            if self._fd is not None:
                os.close(self._fd)
            self._fd = None
        return self

    def __exit__(self, *exc):
        with _TRUSTED_LOCK:         # what numba wrote under the user's umask, made private
            for where in _TRUSTED_NUMBA_DIRS:
                NUMBA_TRUST.tighten(Path(where))
        if self._fd is not None:
            os.close(self._fd)      # (closing releases the lock)
        return False

