"""What the GPU measurement scripts share (``gpu_validate.py``, ``vs_nccl.py``).

* :func:`run_command`: run one command as a *step*: in a process group of its own, with a
  timeout; on the timeout the whole group (the command and every process it started) is killed,
  and what it printed so far is kept. The result records the status (``ok``, ``failed``,
  ``timeout``), the seconds, the exit status and the output, whose last lines (:func:`tail`) a
  report shows. :class:`Budget` caps a series of steps; :func:`run_parallel` runs several
  commands at once (kernel builds before anything is timed).
* The HBM bound of a collective when all its ranks share one GPU (:func:`hbm_bytes`,
  :func:`bound_us`, :func:`bound_busbw`): the fewest bytes it must read and write in the GPU's
  memory, out of place (``S`` = nccl-tests' size, the collective's full buffer; ``N`` ranks)::

      AllReduce      read N*S (every input), write N*S (every output)        H = 2*N*S
      AllGather      read S (each rank's S/N chunk once), write N*S           H = (N+1)*S
      ReduceScatter  read N*S, write S (each rank's S/N result)               H = (N+1)*S
      Broadcast      read S (the root's buffer once), write N*S               H = (N+1)*S
      Reduce         read N*S, write S (the root's output)                    H = (N+1)*S
      AllToAll       read N*S, write N*S                                      H = 2*N*S

  In place, what already lies where it belongs is not written: AllGather ``H = N*S`` (each rank's
  own chunk stays), Broadcast ``H = N*S`` (the root's buffer stays); the others are unchanged. The
  bound on the time is ``H / B``, where ``B`` is the HBM bandwidth a device-to-device copy reaches
  in the same run (bytes read + written over its time: :func:`copy_bandwidth`), and the bound's
  busbw is nccl-tests' ``S / (H / B) * factor(collective, N)``. A kernel's ratio to the bound is
  ``bound_us / time_us`` (= its busbw over the bound's busbw).
* :func:`nccl_gate`: whether the NCCL a process loads can run several ranks on one GPU (2.30 and
  later, with ``NCCL_MULTI_RANK_GPU_ENABLE=1``), from ``torch.cuda.nccl.version()``.
* Workers that print one JSON object: ``python benchmarks/gpu_common.py env`` (GPU, SMs, driver,
  nvcc, torch, NCCL) and ``python benchmarks/gpu_common.py copy --backend cuda|cpu [--bytes 1G]``
  (the device copy: a torch ``copy_`` of one buffer into another timed with CUDA events, the median
  of the iterations; on ``cpu`` a numpy copy timed with the host clock, which only checks the
  arithmetic).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------------------ steps


@dataclass
class CommandResult:
    """One command run as a step."""
    status: str            # ok | failed | timeout
    seconds: float
    returncode: int | None  # None after a timeout or when it could not start
    stdout: str
    stderr: str
    timeout_s: float

    def tail(self, lines: int = 1, width: int = 200) -> str:
        """The last ``lines`` lines of its output (stderr first, where it printed any)."""
        return tail(self.stderr if self.stderr.strip() else self.stdout, lines, width)

    def why(self) -> str:
        """One line: why it did not pass ('' when it did)."""
        if self.status == "timeout":
            last = tail(self.stdout + "\n" + self.stderr, 1, 160)
            return f"no answer in {self.timeout_s:.0f} s" + (f"; last output: {last}" if last else "")
        if self.status == "failed":
            what = f"exit {self.returncode}" if self.returncode is not None else "cannot start"
            return f"{what}: {self.tail()}"
        return ""


def tail(text: str, lines: int = 1, width: int = 200) -> str:
    """The last ``lines`` non-empty lines of ``text``, each cut to ``width`` characters, joined by
    ' / '."""
    rows = [ln.strip()[:width] for ln in (text or "").strip().splitlines() if ln.strip()]
    return " / ".join(rows[-lines:]) if rows else ""


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group of ``proc`` (a session of its own), SIGKILL after 2 s."""
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            # the leader is gone; its children may still be (they share the group): the next signal
            # is for them, and SIGKILL to an empty group is a ProcessLookupError
        except subprocess.TimeoutExpired:
            continue


def run_command(argv: list, timeout_s: float, *, cwd=None, env: dict | None = None,
                stdin_text: str | None = None) -> CommandResult:
    """Run ``argv`` in a new session (its own process group) for at most ``timeout_s`` seconds.

    On the timeout every process of the group is killed (SIGTERM, then SIGKILL), so a command that
    started workers leaves none behind; its output up to then is kept. ``env`` adds to (and
    overrides) this process's environment. Never raises for the command's own failures: a command
    that cannot start is ``failed`` with the reason in ``stderr``."""
    timeout_s = max(0.1, float(timeout_s))
    full_env = dict(os.environ, **(env or {}))
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=full_env, text=True,
                                stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                errors="replace")
    except OSError as exc:
        return CommandResult("failed", time.monotonic() - t0, None, "", f"cannot start: {exc}", timeout_s)
    try:
        out, err = proc.communicate(stdin_text, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=5.0)
        except subprocess.TimeoutExpired:     # a process that left the group keeps the pipes open
            out, err = "", ""
            for pipe in (proc.stdout, proc.stderr):
                try:
                    pipe.close()
                except OSError:
                    pass
        return CommandResult("timeout", time.monotonic() - t0, None, out or "", err or "", timeout_s)
    # the command is done; a worker it left running (same group) goes with it
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    status = "ok" if proc.returncode == 0 else "failed"
    return CommandResult(status, time.monotonic() - t0, proc.returncode, out or "", err or "", timeout_s)


def run_parallel(jobs: list, max_workers: int) -> list:
    """Run ``jobs`` (each ``(argv, timeout_s, env)``) at most ``max_workers`` at a time; their
    :class:`CommandResult` in the order given."""
    results: list = [None] * len(jobs)
    lock = threading.Lock()
    nxt = [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(jobs):
                return
            argv, timeout_s, env = jobs[i]
            results[i] = run_command(argv, timeout_s, cwd=ROOT, env=env)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(max_workers, len(jobs))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


class Budget:
    """Seconds for a series of steps: :meth:`left` never goes below 0."""

    def __init__(self, seconds: float | None):
        self.seconds = None if seconds is None else float(seconds)
        self.start = time.monotonic()

    def left(self) -> float:
        if self.seconds is None:
            return float("inf")
        return max(0.0, self.seconds - (time.monotonic() - self.start))

    def spent(self) -> bool:
        return self.left() <= 0.0

    def timeout(self, step_timeout: float) -> float:
        """A step's timeout: its own, never past what is left."""
        return max(0.0, min(float(step_timeout), self.left()))


#: a step that did not fit
NOT_RUN = "not run (budget spent)"


def json_lines(text: str) -> list:
    """Every line of ``text`` that is a JSON object."""
    out = []
    for ln in (text or "").splitlines():
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                out.append(json.loads(ln))
            except ValueError:
                pass
    return out


def last_json(text: str):
    """The JSON object ``text`` holds (the whole of it, or its last JSON line), or None."""
    s = (text or "").strip()
    if s.startswith("{"):
        try:
            return json.loads(s)
        except ValueError:
            pass
    objs = json_lines(s)
    return objs[-1] if objs else None


# ------------------------------------------------------------------------------ HBM bound
#: H / S per collective (out of place, in place) as a function of N: the module docstring's table
_HBM = {
    "allreduce": (lambda n: 2 * n, lambda n: 2 * n),
    "allgather": (lambda n: n + 1, lambda n: n),
    "reducescatter": (lambda n: n + 1, lambda n: n + 1),
    "broadcast": (lambda n: n + 1, lambda n: n),
    "reduce": (lambda n: n + 1, lambda n: n + 1),
    "alltoall": (lambda n: 2 * n, lambda n: 2 * n),
}


def _collective(name: str) -> str:
    key = name.replace("_", "").replace("-", "").lower()
    if key not in _HBM:
        raise ValueError(f"no HBM bound for collective {name!r} (known: {', '.join(_HBM)})")
    return key


def hbm_bytes(collective: str, nranks: int, nbytes: int, inplace: bool = False) -> int:
    """The fewest HBM bytes (read + written) ``collective`` moves on ``nranks`` ranks sharing one
    GPU, for nccl-tests' size ``nbytes`` (module docstring)."""
    if nranks < 1 or nbytes < 0:
        raise ValueError("nranks must be positive and nbytes non-negative")
    return int(_HBM[_collective(collective)][bool(inplace)](int(nranks))) * int(nbytes)


def bound_us(collective: str, nranks: int, nbytes: int, hbm_gbps: float, inplace: bool = False) -> float:
    """The least time (us) of the collective at an HBM bandwidth of ``hbm_gbps`` GB/s (bytes read
    + written per second, as the device copy measures it)."""
    if not hbm_gbps > 0:
        raise ValueError("the HBM bandwidth must be positive")
    return hbm_bytes(collective, nranks, nbytes, inplace) / (hbm_gbps * 1e3)


def busbw_gbps(collective: str, nranks: int, nbytes: int, time_us: float) -> float:
    """nccl-tests' busbw (GB/s) of a call of ``nbytes`` taking ``time_us``."""
    from hccc.runtime.busbw import busbw_factor
    return nbytes / (time_us * 1e3) * busbw_factor(_collective(collective), nranks)


def bound_busbw(collective: str, nranks: int, nbytes: int, hbm_gbps: float, inplace: bool = False) -> float:
    """The busbw (GB/s) of a call that takes exactly :func:`bound_us`."""
    return busbw_gbps(collective, nranks, nbytes, bound_us(collective, nranks, nbytes, hbm_gbps, inplace))


# ------------------------------------------------------------------------------ NCCL
#: the first NCCL that runs several ranks of one communicator on one GPU
NCCL_MULTI_RANK = (2, 30, 0)
NCCL_MULTI_RANK_ENV = {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}


def nccl_version(value) -> tuple | None:
    """``torch.cuda.nccl.version()`` as (major, minor, patch): a tuple, or the integer code of
    older builds (2.9 and later: major*10000 + minor*100 + patch; before: major*1000 + minor*100 +
    patch); None for None."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        nums = [int(x) for x in value[:3] if isinstance(x, int) or str(x).isdigit()]
        return tuple((nums + [0, 0, 0])[:3])
    v = int(value)
    if v >= 10000:
        return (v // 10000, v % 10000 // 100, v % 100)
    return (v // 1000, v % 1000 // 100, v % 100)


def version_text(v) -> str:
    return ".".join(str(x) for x in v) if v else "unknown"


def nccl_gate(version) -> tuple[bool, str]:
    """(whether NCCL runs, the line the output gives) for the NCCL version a worker reported
    (anything :func:`nccl_version` reads; None: torch has no NCCL)."""
    v = nccl_version(version)
    if v is None:
        return False, "torch has no NCCL: compared with the copy bound only"
    if v < NCCL_MULTI_RANK:
        return False, (f"NCCL {version_text(v)} cannot run several ranks on one GPU (needs "
                       f"{NCCL_MULTI_RANK[0]}.{NCCL_MULTI_RANK[1]}+): compared with the copy bound only")
    return True, f"NCCL {version_text(v)}: several ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1)"


# ------------------------------------------------------------------------------ workers
def _run_text(argv: list) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def environment() -> dict:
    """GPU name, SMs, memory, driver, CUDA runtime, nvcc, torch, CuPy and NCCL versions (None where
    not found)."""
    env: dict = {"python": sys.version.split()[0], "gpu": None, "sms": None, "memory_gib": None,
                 "driver": None, "cuda_runtime": None, "nvcc": None, "torch": None, "nccl": None,
                 "cupy": None, "cpus": os.cpu_count()}
    try:
        import torch
        env["torch"] = torch.__version__
        env["cuda_runtime"] = torch.version.cuda
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env.update(gpu=p.name, sms=int(p.multi_processor_count), memory_gib=round(p.total_memory / 2**30, 1))
            try:
                env["nccl"] = version_text(nccl_version(torch.cuda.nccl.version()))
            except Exception:        # a build without NCCL
                env["nccl"] = None
    except Exception as exc:         # no torch: the other fields still say something
        env["torch_error"] = str(exc)[:200]
    try:
        import cupy
        env["cupy"] = cupy.__version__
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        out = _run_text([smi, "--query-gpu=driver_version", "--format=csv,noheader"])
        env["driver"] = out.strip().splitlines()[0] if out.strip() else None
    nvcc = shutil.which("nvcc")
    if nvcc:
        m = re.search(r"release ([0-9.]+), V([0-9.]+)", _run_text([nvcc, "--version"]))
        env["nvcc"] = m.group(2) if m else "present"
    return env


def copy_bandwidth(backend: str, nbytes: int, iters: int = 10, warmup: int = 3) -> dict:
    """A device-to-device copy of ``nbytes``: {"bytes", "time_us" (median), "copy_gbps" (bytes
    copied per second), "hbm_gbps" (read + written: twice that), "backend", "timer"}."""
    times = []
    if backend == "cpu":
        import numpy as np
        src = np.ones(nbytes, np.uint8)
        dst = np.empty_like(src)
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1e6)
        timer = "host clock (CPU memory)"
    else:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU visible to torch")
        src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        for i in range(warmup + iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            if i >= warmup:
                times.append(a.elapsed_time(b) * 1e3)
        timer = "CUDA events"
    times.sort()
    med = times[len(times) // 2] if len(times) % 2 else 0.5 * (times[len(times) // 2 - 1] + times[len(times) // 2])
    return {"backend": backend, "bytes": int(nbytes), "time_us": med, "copy_gbps": nbytes / (med * 1e3),
            "hbm_gbps": 2 * nbytes / (med * 1e3), "iters": iters, "timer": timer}


def median(xs: list) -> float:
    s = sorted(xs)
    n = len(s)
    if not n:
        raise ValueError("median of nothing")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def _main(argv: list) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="workers of the GPU scripts (one JSON object on stdout)")
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("env", help="the machine: GPU, driver, nvcc, torch, NCCL")
    cp = sub.add_parser("copy", help="device-to-device copy bandwidth")
    cp.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    cp.add_argument("--bytes", default="1G")
    cp.add_argument("--iters", type=int, default=10)
    cp.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    if args.what == "env":
        print(json.dumps(environment()))
        return 0
    sys.path.insert(0, str(ROOT))
    from hccc.args import parse_size
    try:
        print(json.dumps(copy_bandwidth(args.backend, parse_size(args.bytes), args.iters, args.warmup)))
    except (RuntimeError, MemoryError) as exc:
        print(f"copy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
