"""Ctrl-C during ``hccc run`` or ``hccc synth`` ends with exit status 130 and one line, never with
SIGSEGV: the workers (the emulated kernel threads, the simulator's engine) are stopped before
anything they use is freed."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hccc.runtime.interrupts import deferred_interrupts
from hccc.runtime.launcher import Runner

ROOT = Path(__file__).resolve().parents[1]
HCCC = [sys.executable, "-m", "hccc.cli"]
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
#: an interrupted command must be gone within this (the kernels' abort grace included)
GONE_S = 60


@needs_gxx
def test_an_interrupt_stops_the_kernels_before_their_buffers_are_freed(monkeypatch):
    """Ctrl-C (a real SIGINT) arriving while the kernels run (here: a deadlock whose kernels would
    spin for a minute): the run ends at once with the KeyboardInterrupt, nothing is freed while a
    launch is still pending (the stream has nothing pending at every free, through to close), and
    the runner is still usable."""
    from codegen_irs import stuck_ir
    from hccc.runtime.cpu import CpuPlatform
    pf = CpuPlatform()
    frees, real_free = [], pf.free

    def free(ptr):
        frees.append(any(s.pending for s in pf._streams))
        return real_free(ptr)
    monkeypatch.setattr(pf, "free", free)
    with Runner(stuck_ir(), pf, "float32", "sum", nthreads=2, timeout_s=60, watchdog_s=120) as runner:
        assert runner.run(count=16, timeout_s=0.2).stuck is not None      # built and warm

        def press_ctrl_c():
            deadline = time.monotonic() + 30
            while not any(s.pending for s in pf._streams) and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.2)                              # the kernels spin: the host waits for them
            os.kill(os.getpid(), signal.SIGINT)
        presser = threading.Thread(target=press_ctrl_c)
        t0 = time.monotonic()
        presser.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                runner.run(count=16, iters=3)
        finally:
            presser.join()
        assert time.monotonic() - t0 < 30, "the kernels were not stopped"
        assert not any(frees), "a buffer was freed while a launch was still pending"
        assert runner.run(count=16, timeout_s=0.2).stuck is not None      # the runner is still usable
    assert frees and not any(frees), "memory was freed while a launch was still pending"


def test_deferred_interrupts_hold_ctrl_c_until_the_block_ends():
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done = True                                # reached: the interrupt waited
    assert done
    # an exception leaving the block is not replaced by the held interrupt
    with pytest.raises(ValueError):
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            raise ValueError("kept")


def _interrupt(args: list[str], after_line: str | None, delay: float) -> tuple[int, str]:
    """Start hccc, wait for a line of its stderr (when given), then ``delay`` seconds, send SIGINT;
    (exit status, stderr)."""
    p = subprocess.Popen([*HCCC, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, env=dict(os.environ, HCCC_DEBUG=""))
    seen = []
    try:
        if after_line is not None:
            for line in p.stderr:
                seen.append(line)
                if after_line in line:
                    break
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        rest = p.communicate(timeout=GONE_S)[1]
    except BaseException:
        p.kill()
        p.communicate()
        raise
    return p.returncode, "".join(seen) + rest


@needs_gxx
@pytest.mark.parametrize("delay", [0.05, 0.4, pytest.param(0.9, marks=pytest.mark.slow),
                                   pytest.param(1.6, marks=pytest.mark.slow)])
def test_ctrl_c_during_hccc_run_exits_130(delay):
    """Interrupts while the kernels run (after the run's first line), at several points."""
    code, err = _interrupt(["run", str(ROOT / "examples" / "direct_allgather_8.rccl"), "-b", "16M", "-e", "16M",
                            "-n", "200", "-w", "0"], "running", delay)
    assert code == 130, f"exit {code}: {err[-2000:]}"
    assert err.rstrip().splitlines()[-1] == "hccc: interrupted"


@pytest.mark.parametrize("delay", [1.0, pytest.param(2.0, marks=pytest.mark.slow),
                                   pytest.param(3.0, marks=pytest.mark.slow)])
def test_ctrl_c_during_hccc_synth_exits_130(tmp_path, delay):
    code, err = _interrupt(["synth", str(ROOT / "examples" / "clusters" / "a100_topo1.topo"), "--collective",
                            "allgather", "-o", str(tmp_path / "x.rccl")], None, delay)
    assert code in (130, 0), f"exit {code}: {err[-2000:]}"      # 0: it finished first
    if code == 130:
        assert err.rstrip().splitlines()[-1] == "hccc: interrupted"
        assert not (tmp_path / "x.rccl").exists()


def _hard_z3_problem(z3, timeout_ms: int):
    """A nonlinear system z3 does not answer within ``timeout_ms``."""
    x = [z3.Int(f"x{i}") for i in range(40)]
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    for i in range(39):
        s.add(x[i] * x[i] + 3 * x[i + 1] * x[i + 1] * x[i] == 7 * x[(i * 7) % 40] + 11)
    return s


def test_ctrl_c_during_an_smt_check_reaches_hccc_at_once():
    """z3 takes SIGINT over during a check and only cancels it (the check answers unknown); the
    synthesis' checks turn that into the KeyboardInterrupt it was, as soon as z3 stops: well before
    the check's own timeout."""
    z3 = pytest.importorskip("z3")
    from hccc.compiler.synth.smt import solver_check
    s = _hard_z3_problem(z3, 20000)
    import threading
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    from_check = False
    t0 = time.monotonic()
    timer.start()
    try:
        try:
            solver_check(s)
        except KeyboardInterrupt:
            from_check = True
        else:
            time.sleep(5)        # a signal sent after a check that ended by itself lands here, not in pytest
    except KeyboardInterrupt:
        pass
    finally:
        timer.cancel()
    assert from_check and time.monotonic() - t0 < 10.0      # from the check, not after its 20 s timeout


def test_a_check_that_runs_out_of_time_is_no_interrupt():
    z3 = pytest.importorskip("z3")
    from hccc.compiler.synth.smt import solver_check
    assert solver_check(_hard_z3_problem(z3, 200)) == z3.unknown
