"""Nothing is unpickled from a place someone else could write: the parsers keep no disk cache
(lark's is a pickle), numba's cache is held to the build cache's rule (util/trust.py) and refused
the same way, and a planted pickle's code never runs (it would create a file)."""
from __future__ import annotations

import hashlib
import os
import pickle
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from hccc.util.trust import CacheTrust, UntrustedCacheError, private_group

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ring_allgather_8.rccl"
TOPO = ROOT / "examples" / "clusters" / "a100_topo1.topo"


class _Planted:
    """A pickle whose loading creates ``marker`` (what an attacker's would run instead)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _plant(path: Path, marker: Path, mode: int = 0o666) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(_Planted(marker)))
    os.chmod(path, mode)


def _env(**extra) -> dict:
    env = dict(os.environ, HCCC_DEBUG="")
    env.update(extra)
    return env


def test_planted_grammar_pickles_never_run(tmp_path):
    """A shared, world-writable cache directory with pickles planted at every name lark's table
    cache had (hccc's former ``lark/`` files, lark's own default file in the temporary
    directory): ``hccc check`` and the ``.topo`` reader run, succeed, and the code never runs."""
    import lark
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)
    marker = tmp_path / "planted-code-ran"
    for name, grammar in (("rccl", "compiler/frontend/rccl.lark"), ("rccl-fast", "compiler/frontend/rccl.lark"),
                          ("topo", "compiler/cluster/topo.lark")):
        text = (ROOT / grammar).read_text(encoding="utf-8")
        digest = hashlib.sha256("\0".join([text, lark.__version__, str(sys.version_info[:2])]).encode()).hexdigest()
        _plant(shared / "lark" / f"{name}-{digest[:32]}.lark", marker)
        md5 = hashlib.md5(text.encode()).hexdigest()
        for user in ("root", os.environ.get("USER", "unknown")):
            _plant(tmp / f".lark_cache_{user}_{md5}_{sys.version_info[0]}.{sys.version_info[1]}.tmp", marker)
    env = _env(HCCC_CACHE_DIR=str(shared), TMPDIR=str(tmp))
    check = subprocess.run([sys.executable, "-m", "hccc.cli", "check", str(EXAMPLE)], capture_output=True,
                           text=True, env=env, timeout=300)
    assert check.returncode == 0, check.stderr
    code = ("from hccc.compiler.cluster.topo_parser import load_topology; "
            f"print(load_topology({str(TOPO)!r}).nranks)")
    topo = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert topo.returncode == 0, topo.stderr
    assert not marker.exists()


def test_parsers_unpickle_nothing(tmp_path):
    """Building every parser (the reference and fast .rccl parsers, the .topo parser) and reading
    a program and a cluster with them never calls the unpickler, whatever is on disk."""
    code = f"""
import pickle, sys
def refuse(*a, **k):
    open({str(tmp_path / 'unpickled')!r}, 'w').close()
    raise AssertionError('unpickled')
pickle.load = pickle.loads = refuse
class Refuse(pickle.Unpickler):
    def __init__(self, *a, **k):
        refuse()
pickle.Unpickler = Refuse
from hccc.compiler.frontend.load import load_rccl
from hccc.compiler.cluster.topo_parser import load_topology
from hccc.compiler.frontend import rccl_parser
load_rccl({str(EXAMPLE)!r})
rccl_parser._parser()
load_topology({str(TOPO)!r})
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(HCCC_CACHE_DIR=str(tmp_path / "c")), timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    assert not (tmp_path / "unpickled").exists()


_NUMBA_PROBE = """
import sys
sys.path.insert(0, {src!r})
from kern import f
from hccc.util.jit import cached_njit, _OneCompiler
from hccc.util.trust import UntrustedCacheError
try:
    d = _OneCompiler(cached_njit(f))      # as Kernels compiles: under the lock beside the cache
    print(d(1))
except UntrustedCacheError as exc:
    print('refused:', exc)
"""


def _numba_case(tmp_path: Path, cache_mode: int, file_mode: int) -> tuple[subprocess.CompletedProcess, Path]:
    """A kernel file, and a NUMBA_CACHE_DIR (mode ``cache_mode``) whose index for it is a planted
    pickle (mode ``file_mode``); the probe's output and the marker the pickle would create."""
    pytest.importorskip("numba")
    src = tmp_path / "src"
    src.mkdir()
    (src / "kern.py").write_text("def f(x):\n    return x + 1\n")
    cache = tmp_path / "numba"
    cache.mkdir()
    sub = f"{src.name}_{hashlib.sha1(str(src).encode()).hexdigest()}"
    marker = tmp_path / "planted-code-ran"
    index = cache / sub / f"kern.f-1.py{sys.version_info[0]}{sys.version_info[1]}.nbi"
    _plant(index, marker, file_mode)
    os.chmod(cache / sub, 0o700)
    os.chmod(cache, cache_mode)
    out = subprocess.run([sys.executable, "-c", _NUMBA_PROBE.format(src=str(src))], capture_output=True,
                         text=True, env=_env(NUMBA_CACHE_DIR=str(cache)), timeout=300)
    return out, marker


@pytest.mark.parametrize("cache_mode,file_mode,why", [
    (0o777, 0o600, "above .* is writable by others without the sticky bit"),
    (0o770, 0o600, "above .* is writable by its group without the sticky bit"),
    (0o700, 0o666, "cache directory file .* is writable by others"),
    (0o700, 0o620, "cache directory file .* is writable by its group"),
])
def test_planted_numba_cache_is_refused(tmp_path, cache_mode, file_mode, why):
    """numba's cache in a directory others can write, or an index file others can write, is
    refused with the path and the reason before numba reads it: the planted code does not run."""
    if (cache_mode | file_mode) & 0o020 and not (cache_mode | file_mode) & 0o002 and private_group(os.getegid()):
        pytest.skip("the user's private group may write (util/trust.py): needs another group")
    out, marker = _numba_case(tmp_path, cache_mode, file_mode)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused: numba's cache:"), out.stdout + out.stderr
    import re
    assert re.search(why, out.stdout), out.stdout
    assert "NUMBA_CACHE_DIR" in out.stdout
    assert not marker.exists()


def test_planted_numba_cache_would_run_where_trusted(tmp_path):
    """The control that makes the test above mean something: the same planted index in a private
    directory, as a private file (as if the user had written it), is what numba unpickles."""
    out, marker = _numba_case(tmp_path, 0o700, 0o600)
    assert marker.exists(), out.stdout + out.stderr


def test_numba_cache_written_under_a_loose_umask_is_made_private(tmp_path):
    """Under a umask of 002 numba makes its files group-writable; hccc takes those bits off, so a
    second process accepts the cache it wrote (and compiles f once)."""
    pytest.importorskip("numba")
    src = tmp_path / "src"
    src.mkdir()
    (src / "kern.py").write_text("def f(x):\n    return x + 1\n")
    cache = tmp_path / "numba"
    code = "import os; os.umask(0o002)" + _NUMBA_PROBE.format(src=str(src))
    env = _env(NUMBA_CACHE_DIR=str(cache))
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0 and out.stdout.startswith("2"), out.stdout + out.stderr
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert files and all(not os.stat(p).st_mode & 0o022 for p in files)


def test_cli_refuses_a_shared_numba_cache(tmp_path):
    """``hccc sim`` compiling with numba (``HCCC_JIT=numba``) under a NUMBA_CACHE_DIR that others
    can write: exit 1, the path and the reason, no traceback."""
    pytest.importorskip("numba")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    out = subprocess.run([sys.executable, "-m", "hccc.cli", "sim", str(EXAMPLE), "--topology", str(TOPO)],
                         capture_output=True, text=True, timeout=300,
                         env=_env(HCCC_JIT="numba", NUMBA_CACHE_DIR=str(shared / "numba"),
                                  HCCC_CACHE_DIR=str(tmp_path / "c")))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "numba's cache" in out.stderr and "writable by others" in out.stderr and str(shared) in out.stderr
    assert "Traceback" not in out.stderr


# ---------------------------------------------------------------- the rule itself, on any path

MODES = st.sampled_from([0o700, 0o711, 0o750, 0o755, 0o770, 0o775, 0o777, 0o1777, 0o1770, 0o731, 0o733])

def _renamable_by_another_user(paths: list[Path]) -> list[str]:
    """The paths a second user (uid 65534, in the directories' group) can rename: the oracle, by
    trying it in a child process that has become that user."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                       # the child: only system calls, then _exit
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(os.getegid())
            os.setuid(65534)
            done = []
            for path in map(str, paths):
                try:
                    os.rename(path, path + ".moved")
                except OSError:
                    continue
                os.rename(path + ".moved", path)
                done.append(path)
            os.write(w, "\n".join(done).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return data.split()


@pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second user needs root")
@settings(max_examples=30, deadline=None)
@given(modes=st.lists(MODES, min_size=1, max_size=4))
def test_path_above_refuses_what_another_user_can_replace(modes):
    """A chain of directories with random modes under a private one: whenever a second user can
    actually rename a directory on the way to the cache (tried, as that user), the path is refused;
    and a path with no directory writable by group or others without the sticky bit is accepted
    (the rule is conservative: a writable directory others cannot reach is refused too)."""
    trust = CacheTrust("test cache", "TEST_DIR")
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o711)
        d = Path(top)
        chain = []
        for m in modes:
            d = d / "d"
            d.mkdir()
            os.chmod(d, m)
            chain.append(d)
        leaf = d / "cache"
        leaf.mkdir(mode=0o700)
        try:
            trust.path_above(leaf)
            accepted = True
        except UntrustedCacheError:
            accepted = False
        renamable = _renamable_by_another_user(chain + [leaf])
        for p in chain:
            os.chmod(p, 0o700)
        if renamable:
            assert not accepted, renamable
        if not any((m & 0o022) and not (m & 0o1000) for m in modes):
            assert accepted


def test_symlink_in_a_cache_is_refused(tmp_path):
    trust = CacheTrust("test cache", "TEST_DIR")
    top = tmp_path / "c"
    top.mkdir(mode=0o700)
    (tmp_path / "elsewhere").write_bytes(b"x")
    (top / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UntrustedCacheError, match="not a regular file"):
        trust.directory(top, "cache directory")
    assert stat.S_ISLNK(os.lstat(top / "link").st_mode)


@pytest.mark.parametrize("gid,name,members,private", [
    (1000, "alice", [], True),              # the user-private-group scheme: umask 002 is harmless
    (1000, "alice", ["alice"], True),
    (1000, "alice", ["alice", "bob"], False),   # bob may write
    (1000, "staff", [], False),             # a shared group that happens to be alice's primary one
    (1001, "alice2", [], False),            # not her primary group
    (0, "alice", [], False),                # never root's group
])
def test_private_group(monkeypatch, gid, name, members, private):
    """Group write is someone else's unless the group is the user's private one: her primary
    group, named as she is, with no other member."""
    import grp
    import pwd
    from types import SimpleNamespace
    from hccc.util import trust
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: SimpleNamespace(pw_name="alice", pw_gid=1000 if gid else 0))
    monkeypatch.setattr(grp, "getgrgid", lambda g: SimpleNamespace(gr_name=name, gr_mem=members))
    trust.private_group.cache_clear()
    try:
        assert trust.private_group(gid) is private
        st = SimpleNamespace(st_mode=0o40770, st_gid=gid)
        assert trust.writable_by_others(st) is (not private)
        assert trust.writable_by_others(SimpleNamespace(st_mode=0o40777, st_gid=gid))
    finally:
        trust.private_group.cache_clear()
