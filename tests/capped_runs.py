"""``hccc`` in a subprocess under an address-space cap (``RLIMIT_AS``, :data:`MEMORY_CAP`) and a
CPU-time cap (``RLIMIT_CPU``, :data:`CPU_CAP_S`), and the check that a run was refused cleanly: the
limits tests assert that every limit fires before the work it guards, which either cap would kill."""
from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time



#: the command line of hccc in a subprocess (this interpreter, this checkout's package)
HCCC = [sys.executable, "-m", "hccc.cli"]


#: address space a capped run may use: the interpreter and a refused input fit, the guarded work does not
MEMORY_CAP = 3 << 30


#: CPU seconds a capped run may use (CPU time does not grow with the load of a shared machine)
CPU_CAP_S = 12


def cap_memory():
    """In the child before exec: the memory and CPU caps."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_CAP_S, CPU_CAP_S + 2))


def hccc(*args, timeout=300, env=None, cwd=None, capped=True):
    """Run hccc in a subprocess under the memory and CPU caps; (returncode, stderr+stdout, seconds).
    ``timeout`` only guards against a hang (a FIFO read that blocks)."""
    e = dict(os.environ, HCCC_DEBUG="")
    e.update(env or {})
    t0 = time.perf_counter()
    r = subprocess.run([*HCCC, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       preexec_fn=cap_memory if capped else None, env=e, cwd=cwd, stdin=subprocess.DEVNULL)
    return r.returncode, r.stderr + r.stdout, time.perf_counter() - t0


def assert_fires(result, rc=1, pattern=None):
    """Refused with exit ``rc`` (a process killed by the CPU or memory cap has a negative code or
    a MemoryError), no traceback, the message matching ``pattern``."""
    code, out, secs = result
    assert code == rc, f"exit {code} after {secs:.1f} s: {out[-2000:]}"
    assert "Traceback" not in out and "internal error" not in out
    if pattern:
        assert re.search(pattern, out), out


#: the child of :func:`hccc_each`: each command line through :func:`cli_runs.run_cli`, one JSON line
#: (exit status, stderr then stdout) written as each run ends
_EACH = """
import json, sys
sys.path.insert(0, sys.argv[1])
from cli_runs import run_cli
for argv in json.loads(sys.argv[2]):
    r = run_cli(*argv)
    print(json.dumps([r.returncode, r.stderr + r.stdout]), flush=True)
"""


def hccc_each(argvs: list[list[str]], timeout=300) -> list[tuple[int, str, float]]:
    """Each command line of ``argvs`` run by hccc, one after the other in one subprocess under the
    memory and CPU caps (together: each refusal costs milliseconds, and a run whose limit did not
    fire would exceed either cap alone); a result like :func:`hccc`'s for each. Runs after one
    that took the process down have none: the test fails naming the first of them."""
    import json
    e = dict(os.environ, HCCC_DEBUG="")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _EACH, os.path.dirname(os.path.abspath(__file__)),
                        json.dumps([[str(a) for a in argv] for argv in argvs])],
                       capture_output=True, text=True, timeout=timeout, preexec_fn=cap_memory, env=e,
                       stdin=subprocess.DEVNULL)
    secs = time.perf_counter() - t0
    done = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(done) == len(argvs), (f"exit {r.returncode} after {secs:.1f} s in the run of "
                                     f"{argvs[len(done)]}: {r.stderr[-2000:]}")
    return [(rc, out, secs) for rc, out in done]
