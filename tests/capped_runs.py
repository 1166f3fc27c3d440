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
