"""The ``hccc`` command line (docs/command-line.md): argparse subcommands, one module each.

    hccc ALGO -o OUTDIR [options]          the main form: the same as ``hccc compile ALGO -o OUTDIR``
    hccc COMMAND ...                       check, run, fuzz, sim, topo, synth, gen, xml, plan, balance
    hccc help [COMMAND]                    the help of hccc or of one command

Every subcommand module ``hccc.commands.<name>`` provides ``SUMMARY`` (one line),
``configure(parser)`` (adds its arguments) and ``run(args) -> int`` (the exit status), and may
declare ``INPUTS`` (argument -> kind of file it reads, checked by :mod:`hccc.inputs`). This file only
builds the parser, dispatches, and turns errors into messages; commands never import it.

Bad input: ``FILE:LINE:COL: error: ...`` on stderr with the source line and a caret, exit status 1.
Usage errors (unknown command or option, a malformed value, contradictory options): one line
``hccc CMD: error: ...`` first, the usage after, exit status 2. Never a Python
traceback for bad input (set HCCC_DEBUG=1 to see one for an internal error).
"""
from __future__ import annotations

# numpy first, while the call stack is shallow: every command needs it (the front end is built on
# it), and under CPython 3.11 the import of numpy's typing modules ran 3x slower when it happened deep
# inside hccc's own imports under ``python -m hccc`` (0.19 s against 0.16 s for a whole 8-GPU check;
# benchmarks/startup.py times both entry points)
import signal
import sys
import time

#: when this module was imported: the start of the ``hccc`` process where the system does not say
#: (:func:`hccc.timing.process_start`)
_IMPORTED = time.perf_counter()

#: set by the first Ctrl-C; an extension module interrupted while it loads may turn the interrupt
#: into an ImportError of its own (numpy: "PyCapsule_Import could not import module datetime")
_interrupted = False


def _on_interrupt(signum, frame):
    """Python's own Ctrl-C behaviour (KeyboardInterrupt), remembered."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


try:
    signal.signal(signal.SIGINT, _on_interrupt)
except ValueError:               # imported outside the main thread: Python's handler stays
    pass

try:
    import numpy  # noqa: F401

    import argparse
    import importlib
    import json
    import os
    from pathlib import Path
    import traceback

    from hccc import __version__
    from hccc.args import CommandParser, HelpFormatter
    from hccc.util.limits import printable
except (KeyboardInterrupt, ImportError) as _exc:     # Ctrl-C while hccc starts: as later
    if isinstance(_exc, ImportError) and not _interrupted:
        raise
    sys.stderr.write("hccc: interrupted\n")
    sys.stderr.flush()
    import os
    os._exit(130)             # not SystemExit: see entry()

#: command -> module; "compile" is what ``hccc ALGO -o OUTDIR`` runs
COMMANDS = {name: f"hccc.commands.{name}" for name in
            ("compile", "check", "run", "fuzz", "sim", "topo", "synth", "gen", "xml", "plan", "balance",
             "catalog")}
#: command -> one-line summary (kept here so that ``hccc -h`` imports no command module;
#: tests/test_cli.py checks they equal each module's SUMMARY)
SUMMARIES = {
    "compile": "compile an algorithm into kernels (the default command: 'hccc ALGO -o OUTDIR')",
    "check": "verify an algorithm and print a summary",
    "run": "compile, run the kernels (CPU emulation, CUDA or HIP) and check every element",
    "fuzz": "run random sizes/dtypes/ops through the kernels and the oracle",
    "sim": "simulate an algorithm on a cluster (alpha-beta model)",
    "topo": "summarise a cluster description, or make one from the machine",
    "synth": "synthesise a schedule for a cluster (SMT + CEGIS)",
    "gen": "generate algorithms (c2c: mixed-vendor hierarchical collectives)",
    "xml": "export an algorithm as MSCCL XML",
    "plan": "export an algorithm as an MSCCL++ execution plan",
    "balance": "micro-batch sizes proportional to measured GPU speeds",
    "catalog": "list what an algorithm catalog directory covers and where the gaps are",
}
#: kept for callers of the old table: name -> (module, summary)
SUBCOMMANDS = {k: (COMMANDS[k], SUMMARIES[k]) for k in COMMANDS}
VERSION = f"hccc {__version__}"
USAGE = ("hccc ALGO -o OUTDIR [options]\n"
         f"       hccc {{{','.join(c for c in COMMANDS if c != 'compile')}}} ...\n"
         "       hccc help [COMMAND]")


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hccc", usage=USAGE, formatter_class=HelpFormatter, add_help=True,
        description="Compile collective-communication algorithms into verified, scheduled CUDA/HIP kernels.",
        epilog="commands:\n" + "\n".join(f"  {k:9s} {v}" for k, v in SUMMARIES.items())
        + "\n  help      show the help of hccc or of one command\n\n"
          "Run 'hccc help COMMAND' (or 'hccc COMMAND -h') for a command's options.")
    p.add_argument("--version", action="version", version=VERSION)
    return p


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of one command, configured by its module."""
    mod = importlib.import_module(COMMANDS[name])
    prog = "hccc" if name == "compile" else f"hccc {name}"
    summary = SUMMARIES[name]
    p = CommandParser(prog=prog, formatter_class=HelpFormatter,
                      description=summary[0].upper() + summary[1:] + ".")
    mod.configure(p)
    p.formatter_class = HelpFormatter      # one way of showing defaults, whatever the module set
    p.add_argument("--version", action="version", version=VERSION)
    return p


def did_you_mean(word: str, choices) -> str:
    """`` (did you mean 'check'?)`` for the closest choice, or empty."""
    from hccc.util.diagnostics import closest
    close = closest(word, choices)
    return f" (did you mean '{close}'?)" if close is not None else ""


def _looks_like_path(word: str) -> bool:
    return os.path.sep in word or "/" in word or "." in word or os.path.exists(word)


def _unknown_command(word: str) -> int:
    sys.stderr.write(f"hccc: error: unknown command '{word}'{did_you_mean(word, [*COMMANDS, 'help'])}\n"
                     f"usage: {USAGE}\n")
    return 2


def _help(rest: list[str]) -> int:
    if not rest:
        _top_parser().print_help()
        return 0
    if rest[0] not in COMMANDS:
        return _unknown_command(rest[0])
    command_parser(rest[0]).print_help()
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:          # also while starting up, before a command runs
        sys.stderr.write("hccc: interrupted\n")
        return INTERRUPTED


def _main(argv: list[str] | None) -> int:
    from hccc import timing
    # the command's time counts from its start: the process's own, or this call's in a caller's
    started = time.perf_counter() if argv is not None else timing.process_start() or _IMPORTED
    if argv is None:                   # the hccc process itself (not a caller's): its allocator policy
        from hccc.allocator import tune_allocator
        tune_allocator()
    argv = list(sys.argv[1:] if argv is None else argv)
    from hccc.util.diagnostics import CompileError
    from hccc.util.trust import UntrustedCacheError

    call = _Call()
    call.started = started
    from hccc.util.jit import jit_mode
    try:
        jit_mode()
    except ValueError as exc:          # a bad HCCC_JIT in the environment
        sys.stderr.write(f"hccc: error: {exc}\n")
        return 1
    try:
        status = _top_level(argv)
        return status if status is not None else _dispatch(argv, call)
    except SystemExit as exc:          # argparse: help, version, usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except CompileError as err:
        return _compile_error(err, call.json_mode)
    except KeyboardInterrupt:
        sys.stderr.write("hccc: interrupted\n")
        return INTERRUPTED
    except MemoryError:
        sys.stderr.write("hccc: error: out of memory (try a smaller program or --max-transfers)\n")
        return 1
    except UntrustedCacheError as exc:  # a cache others could write (numba's, hccc's own)
        sys.stderr.write(f"hccc: error: {exc}\n")
        return 1
    except BrokenPipeError:
        return 1
    except Exception as exc:  # an hccc bug, not bad input: say so plainly
        from hccc.runtime.memory_limits import refused_memory
        refused = refused_memory(exc)
        if refused is not None:        # the system refused memory or a thread: not a bug either
            sys.stderr.write(f"hccc: error: {refused}\n")
            return 1
        if os.environ.get("HCCC_DEBUG"):
            traceback.print_exc()
        sys.stderr.write(f"hccc: internal error: {type(exc).__name__}: {exc}\n"
                         "hccc: this is a bug in hccc; rerun with HCCC_DEBUG=1 for details\n")
        return 3


class _Call:
    """What :func:`_main`'s error handling needs to know of the command being run."""

    def __init__(self) -> None:
        #: the command was asked for JSON (``--json``): a compile error is printed as JSON too
        self.json_mode = False
        #: the ``perf_counter()`` reading at the command's start (:mod:`hccc.timing`)
        self.started: float | None = None


def _top_level(argv: list[str]) -> int | None:
    """The exit status of what the top level answers itself (no arguments, ``--table-kernels``,
    ``--cmake-dir``, help and version), or None for a command to run."""
    if not argv:
        sys.stderr.write("hccc: error: no algorithm or command given (see 'hccc help')\n")
        _top_parser().print_usage(sys.stderr)
        return 2
    head = argv[0]
    if head == "--table-kernels":
        # the algorithm-independent generic kernels of the table mode, with build files
        if len(argv) != 2:
            sys.stderr.write("usage: hccc --table-kernels DIR\n")
            return 2
        from hccc.compiler.backend.table_codegen import write_generic_kernels
        try:
            write_generic_kernels(Path(argv[1]))
        except OSError as exc:
            sys.stderr.write(f"hccc: error: cannot write {printable(argv[1])}: {exc.strerror or exc}\n")
            return 1
        return 0
    if argv == ["--cmake-dir"]:
        # where find_package(hccc) finds hccc-config.cmake: cmake -Dhccc_DIR=$(hccc --cmake-dir)
        from hccc.cmake_package import cmake_dir
        print(cmake_dir())
        return 0
    if head in ("-h", "--help", "--version"):
        _top_parser().parse_args(argv[:1])        # prints and exits
        return 0
    if head == "help":
        return _help(argv[1:])
    return None


def _dispatch(argv: list[str], call: _Call) -> int:
    """Run the command ``argv`` names (a path or an option first: ``compile``)."""
    head = argv[0]
    if head in COMMANDS:
        name, rest = head, argv[1:]
    elif head.startswith("-") or _looks_like_path(head):
        name, rest = "compile", argv
    else:
        return _unknown_command(head)
    parser = command_parser(name)
    args = parser.parse_args(rest)
    from hccc.sweep import usage_checks
    usage_checks(parser, args)
    args.argv = [name, *rest]          # the command line, for commands that re-run themselves
    call.json_mode = bool(getattr(args, "json", False))
    mod = importlib.import_module(COMMANDS[name])
    inputs = getattr(mod, "INPUTS", None)
    if inputs:
        from hccc.inputs import check_inputs
        check_inputs("hccc" if name == "compile" else f"hccc {name}", args, inputs)
    from hccc import timing
    from hccc.util.clock import compile_seconds
    before = compile_seconds()
    timing.start(call.started, compiled=before)
    status = mod.run(args)
    _compile_note(call.json_mode, compile_seconds() - before)
    return status


def _compile_error(err, json_mode: bool) -> int:
    """A compile error reported (rendered, and as JSON where asked): exit status 1."""
    from hccc.util.diagnostics import render_all
    sys.stderr.write(render_all(err) + "\n")
    if json_mode:
        print(json.dumps({"valid": False, "errors": [
            {"message": d.message,
             "file": d.location.source.name if d.location else None,
             "line": d.location.line if d.location else None,
             "col": d.location.col if d.location else None} for d in err.diagnostics]}))
    return 1


#: main()'s status after Ctrl-C
INTERRUPTED = 130


#: numba compiling hccc's kernels for this long during one command is said on a terminal
COMPILE_NOTE_SECONDS = 5.0


def _compile_note(json_mode: bool, spent: float) -> None:
    """On a terminal, a command during which numba compiled hccc's kernels for ``spent`` seconds,
    a while (the first run after an install), says so: the figures it printed (a synthesis's
    seconds, what its time limit allowed) leave the compiles out (``util/clock.py``), and the next
    run loads the kernels from numba's cache instead."""
    from hccc.progress import interactive

    if json_mode or not interactive():
        return
    if spent >= COMPILE_NOTE_SECONDS:
        sys.stderr.write(f"hccc: numba compiled hccc's kernels for {spent:.0f} s of this run, once after an "
                         "install (later runs load them from its cache)\n")


def entry() -> None:
    """The ``hccc`` process: :func:`main`, then its exit status, also under a late Ctrl-C."""
    import signal

    try:
        status = main()
        # the work is done: an interrupt from here on changes nothing, and the interpreter's own
        # shutdown must not die of one (status -2 where the caller waits for 0 or 130)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:          # between main's return and the line above
        sys.stderr.write("hccc: interrupted\n")
        status = INTERRUPTED
    if status == INTERRUPTED:
        # Ctrl-C: leave with 130 at once. Through a normal exit the interpreter sometimes ended
        # by killing itself with SIGINT instead (status -2, after hccc had handled the interrupt
        # and said so), for an interrupt about 0.1 s into start-up. Nothing is left to clean up:
        # the interrupt unwound every command (their temporary files and atomic writes included).
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(INTERRUPTED)
    sys.exit(status)


if __name__ == "__main__":
    entry()
