"""``hccc run ALGO --backend cpu|cuda``: compile, run the emitted kernels and check them.

ALGO is an algorithm (``.rccl``: verified, scheduled and lowered with --scheduler / --tb-alloc /
--chunk-size, like the compile command), a ProgramIR ``.json`` as written into OUTDIR (run exactly
as given, not re-verified), an MSCCL ``.xml``, or a compiled OUTDIR (or its ``manifest.json``):
its ProgramIR, each rank on the platform the manifest gives it. The kernels are built once per
(program, rank platforms, backend, dtype, op) and cached by content hash (``$HCCC_CACHE_DIR``,
default ``~/.cache/hccc``).

Mixed-vendor programs. Each rank runs on a platform: the manifest's, or with ``--topology T`` its
node's vendor (NVIDIA: CUDA, AMD: HIP), else CUDA (HIP with ``--backend hip``). ``--backend cpu`` emulates every platform on the
CPU: one library per platform present, built from exactly that platform's rank sources (``.cu``
for CUDA ranks, ``.hip`` for HIP ranks: the split the emitted build files make), every rank
launched from its platform's library. ``--backend cuda`` / ``--backend hip`` run programs whose
ranks are all of that platform; a mixed program is refused there (one process cannot give CUDA and
HIP kernels shared memory for the FIFOs), naming the ranks.

Every size runs ``--warmup`` + ``--iters`` times on fresh inputs; the outputs of the last run are
compared element by element with the reference executor (``hccc.runtime.reference``). The table
follows nccl-tests::

    #       size         count      type   redop     time   algbw   busbw  #wrong
    #        (B)    (elements)                       (us)  (GB/s)  (GB/s)

``size`` is the collective's full buffer, nccl-tests' S: the per-rank buffer of an AllReduce, the
per-rank *output* of an AllGather, the per-rank *input* of a ReduceScatter; ``count`` = size /
sizeof(type). algbw = size / time; busbw = algbw x 2(n-1)/n (AllReduce), (n-1)/n (AllGather,
ReduceScatter) or 1 (Broadcast, Reduce). Exit status 1 when an element is wrong or a run sticks (a deadlocked program is
reported as "rank R, TB T stuck in <primitive> for chunk C (micro-batch M)", never hangs: kernels
give up after --timeout seconds of waiting, and a host watchdog backs that up).

nccl-tests' options (``driver/sweep.py``): ``-d``/``-o`` take lists and ``all``, a table per
(type, operator) pair, ``all`` leaving out the pairs the kernels lack (an integer ``avg``) in one
note, a pair named outright refused before anything runs; ``-t`` x ``-g`` must be the program's
ranks; ``-N`` repeats the sweep; ``-T`` is ``--timeout``; ``-m``, ``-p``, ``-z``, ``-y``, ``-G``,
``-C``, ``-R`` change nothing and say so. On a terminal the sweep shows its time left.

AllToAllv. ``--counts FILE`` runs an AllToAll program as an AllToAllv with the per-pair counts of
FILE (the format ``hccc sim --counts`` reads, docs/alltoallv.md). Without sizes the table has one
row, the file's counts in elements as given (the same call ``hccc sim --counts FILE`` models);
with ``--sizes`` or a ``-b/-e`` sweep the file is a pattern, scaled at every size (each count
rounded down) to that mean per-rank send buffer, as rccl-tests' ``alltoallv_perf`` keeps one
pattern over its sweep. ``size`` is the mean per-rank send buffer (total bytes / nranks), algbw =
size / time, busbw = algbw x (n-1)/n (nccl-tests' alltoall convention, as ``hccc sim --counts``);
#wrong compares every receive buffer with a numpy oracle of the counts. In place runs only for
symmetric counts (MPI's in-place Alltoallv rule); ``--json`` adds ``"counts"`` (the file) and
``"counts_scaled"``.

``--json`` prints ``{"algorithm", "collective", "nranks", "backend", "emulated" (true on the CPU
emulation, whose times are not a GPU's), "nthreads", "ok",
"rank_platform": [per-rank "cuda"/"hip"], "libraries": {platform: {"ranks", "backend", "library"}},
"launch": "grid" (every rank in one launch) or "per-rank",
"results":
[{"bytes", "count", "dtype", "op", "inplace", "wrong", "time_us", "algbw_GBps", "busbw_GBps",
"stuck", "first_wrong", "collective_wrong", ...}]}`` (``time_us`` and the bandwidths are null for a
run that stuck).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from hccc.compiler.backend.abi import LL_AUTO_MAX_BYTES
from hccc.args import (add_deprecated_flag, add_direct_option, add_program_options, add_topology_option, count_at_least,
                       dtype_list, nccl_type_name, op_list, parse_size, program_options, proto_choice, proto_metavar,
                       seconds)
from hccc.util.limits import printable
from hccc.util.plural import plural
from hccc.util import dtypes as dtypes_table
from hccc.sweep import (GROUP, add_nccl_long_names, add_nccl_noop_options, add_rank_options, add_sweep_options, avg_busbw_line,
                        instance_combos, noop_notes, placements, ranks_error, say_notes, redop_column, root_column, shift_field, sizes_error,
                        sweep_is_default, sweep_sizes, table_header, table_left)

SUMMARY = "compile, run the kernels (CPU emulation, CUDA or HIP) and check every element"
INPUTS = {"algo": "algorithm", "--topology": "cluster", "--counts": "counts matrix"}
#: -d / -o values: the kernels' element types and reduction operators (hccc.util.dtypes)
DTYPES = dtypes_table.DTYPE_NAMES
OPS = dtypes_table.OP_NAMES
#: nccl-tests' names of the element types (hccc's tables spell them as the -d/--dtype option does)
TYPE_NAMES = {d.name: d.nccl for d in dtypes_table.DTYPES}
#: what the times of the CPU emulation are
EMULATED_NOTE = ("# CPU emulation: every thread block is a group of fibers, run by a few OS threads of this "
                 "machine; the times and bandwidths measure that emulation, not a GPU (--backend cuda or hip "
                 "times GPUs)")
DEFAULT_BYTES = "4K,64K,1M"
#: the FIFO protocols of hccc's kernels (--proto's values; auto chooses per size)
RUN_PROTOCOLS = {"auto": "auto", "simple": "simple", "ll": "ll"}


def load(args):
    from hccc.compiler.pipeline import load_program
    return load_program(args.algo, program_options(args))


def load_with_platforms(args):
    """(ProgramIR, per-rank platforms) for ``hccc run``'s ALGO and ``--topology``."""
    from hccc.util.diagnostics import CompileError, Diagnostic
    from hccc.compiler.pipeline import load_manifest, manifest_path

    mpath = manifest_path(args.algo)
    if mpath is not None:
        if args.topology is not None:
            raise CompileError([Diagnostic(
                f"{args.algo} is compiled output: its manifest already gives every rank's platform "
                "(drop --topology, or pass the algorithm itself)", None)])
        return load_manifest(mpath)
    if args.topology is None:
        ir = load(args)       # one platform: HIP with --backend hip, else CUDA (as the compiler)
        return ir, ["hip" if args.backend == "hip" else "cuda"] * ir.nranks
    from hccc.compiler.pipeline import platforms_for
    from hccc.runtime.compile import build, cluster_of
    # the program the compile emits on that cluster (it must fit; the simulator chooses allocation and fusion)
    cluster = cluster_of(args.topology)
    ir = build(args.algo, program_options(args), topology=cluster)
    return ir, [pls[0] for pls in platforms_for(ir.nranks, "auto", cluster.topology)]


def _slice(text: str):
    if text.strip().lower() == "auto":
        return "auto"
    v = parse_size(text)
    if v <= 0 or v % 16:
        raise argparse.ArgumentTypeError(f"slice size must be 'auto' or a positive multiple of 16 bytes: {text!r}")
    return v


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Compile ALGO, run its kernels (CPU emulation, CUDA or HIP) at each size and "
                          "check every element against the reference executor; prints an "
                          "nccl-tests-style table. Exit status 1 when an element is wrong or a run "
                          "sticks.")
    parser.add_argument("algo", metavar="ALGO",
                        help="algorithm (.rccl), ProgramIR (.json, run as given), MSCCL XML (.xml), "
                             "or a compiled OUTDIR / its manifest.json (ranks on the manifest's platforms)")
    parser.add_argument("--backend", choices=("cpu", "cuda", "hip"), default="cpu",
                        help="cpu: every rank's emitted source (.cu or .hip) compiled with g++ and "
                             "the emulation header, one library per platform of a mixed program "
                             "(every thread block is a group of fibers on a few OS threads); cuda: a CUDA program on "
                             "a GPU through CuPy; hip: a HIP program on an AMD GPU")
    add_topology_option(parser, short=False,
                        help="cluster (.topo or TACCL .json): the program must fit it, and each "
                             "rank runs on its node's vendor's platform (NVIDIA: CUDA, AMD: HIP)")
    add_sweep_options(parser, DEFAULT_BYTES, zero_ok=True)
    parser.add_argument("-d", "--dtype", type=dtype_list(DTYPES), default="float32",
                        metavar="|".join(nccl_type_name(d) for d in DTYPES) + "|all",
                        help="element type, nccl-tests' -d: its names (float, half, bfloat16, ...) or hccc's "
                             "(float32, float16, ...), a comma list, or all (each runs as a table of its own)")
    parser.add_argument("-o", "--op", type=op_list(OPS, "run"), default="sum", metavar="|".join(OPS) + "|all",
                        help="reduction operator, nccl-tests' -o: one, a comma list, or all (shown as redop "
                             "'none' for collectives that reduce nothing); hccc run writes no files")
    _add_nccl_options(parser)
    _add_placement_options(parser)
    _add_run_options(parser)
    _add_kernel_options(parser)
    parser.add_argument("--counts", metavar="FILE", default=None,
                        help="an AllToAll program run as an AllToAllv (hccc sim --counts' file: one line per "
                             "sending rank of elements to each rank, docs/alltoallv.md): without sizes, one row "
                             "of exactly those counts; with --sizes or -b/-e, the matrix scaled at each size "
                             "(size: the mean per-rank send buffer, nccl-tests' alltoall busbw factor); "
                             "#wrong against a numpy oracle")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--sanitize", action="store_true",
                        help="(cpu backend) build the emitted kernels with AddressSanitizer, every "
                             "buffer ending in a redzone: an out-of-bounds access stops the run with "
                             "ASan's report (the run restarts itself with the ASan runtime preloaded)")
    parser.add_argument("--resident-blocks", type=count_at_least(1), default=None, metavar="K",
                        help="(cpu backend) partial residency: at most K blocks of a rank's launch run at "
                             "once, admitted in block order as a GPU dispatches them "
                             "(HCCC_CPU_RESIDENT_BLOCKS); a program with a block that could wait on a "
                             "block not resident is refused before launch, naming the wait")
    add_program_options(parser, prefix="for .rccl input: ", fuse=True, chunk_default=None,
                        chunk_help="micro-batch slice (FIFO slot) size per chunk, e.g. 512K, 1.5M (default: "
                                   "1M, halved while the FIFOs would pass the run's memory limit)")
    add_nccl_long_names(parser)


def _add_nccl_options(parser: argparse.ArgumentParser) -> None:
    """nccl-tests' -c, -a, -t, -g, -N and those that change nothing here (said when given)."""
    nccl = parser.add_argument_group("nccl-tests' other options")
    nccl.add_argument("-c", "--check", type=count_at_least(0), default=1, metavar="N",
                      help="nccl-tests' -c: N checked launches per size and placement (the last timed "
                           "one, then N-1 more, each from fresh inputs; #wrong sums them); 0 checks "
                           "nothing (#wrong N/A, the exit status ignores results; a stuck run still fails)")
    nccl.add_argument("-a", "--average", type=int, choices=(0, 1, 2, 3), default=1, metavar="0|1|2|3",
                      help="nccl-tests' -a: report rank 0's time (0), the mean (1), min (2) or max (3) over "
                           "ranks; hccc run times one launch of every rank together, so all four are that time")
    add_rank_options(nccl, "run")
    nccl.add_argument("-N", "--run-cycles", type=count_at_least(1, "a cycle count"), default=1, metavar="N",
                      help="nccl-tests' -N: run the whole sweep N times, printing every cycle's rows "
                           "(nccl-tests' 0, forever, is not taken: give a count)")
    add_nccl_noop_options(nccl, "run")


def _add_placement_options(parser: argparse.ArgumentParser) -> None:
    """The root, and in place or out of place."""
    parser.add_argument("-r", "--root", type=count_at_least(0, "a rank"), default=None, metavar="R",
                        help="root of a Broadcast, Reduce, Gather or Scatter: must be the program's "
                             "own Root (it is compiled in)")
    place = parser.add_mutually_exclusive_group()
    place.add_argument("--inplace-only", dest="inplace", action="store_true",
                       help="run in place only (AllReduce input == output, AllGather input inside the "
                            "output, ReduceScatter and Scatter output inside the input); both run by "
                            "default, side by side")
    place.add_argument("--out-of-place-only", dest="out_of_place", action="store_true",
                       help="run out of place only")
    # the old spellings: --inplace also names hccc plan's option for in-place calls, so it warns
    add_deprecated_flag(place, "--inplace", "--inplace-only", "inplace",
                        " on hccc run (hccc plan's --for-inplace writes a plan for in-place calls)")
    place.add_argument("--out-of-place", dest="out_of_place", action="store_true", help=argparse.SUPPRESS)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """How each size runs: iterations, warm-up, timeout, threads, seed."""
    parser.add_argument("-n", "--iters", type=count_at_least(1), default=3, metavar="N",
                        help="timed runs per size")
    parser.add_argument("-w", "--warmup", type=count_at_least(0), default=1, metavar="N",
                        help="untimed runs per size first (nccl-tests' warmup iters)")
    parser.add_argument("-T", "--timeout", type=seconds(), default=10.0, metavar="SECONDS",
                        help="a thread block that waits this long gives up and reports where it is "
                             "stuck (0 = never, the host watchdog still applies); nccl-tests' -T: a stuck "
                             "run ends, a run that moves is not cut short")
    parser.add_argument("--threads", type=count_at_least(1), default=None, metavar="N",
                        help="threads per thread block (default: the emitted kernels' count on a "
                             "GPU, 2 on the CPU)")
    parser.add_argument("--seed", type=count_at_least(0), default=0, metavar="S", help="input data seed")


def _add_kernel_options(parser: argparse.ArgumentParser) -> None:
    """The kernels' slice, protocol, code-generation mode, launch and direct mode."""
    parser.add_argument("--slice-size", type=_slice, default="auto", metavar="BYTES|auto",
                        help="micro-batch slice per launch (auto: for each size the slice of least "
                             "modelled time, a unit's fixed cost against the pipeline's fill, within "
                             "the program's nMicroBatches and MinSliceBytes, at most the slots' share)")
    parser.add_argument("--proto", type=proto_choice("hccc's kernels", RUN_PROTOCOLS), default="simple",
                        metavar=proto_metavar(RUN_PROTOCOLS),
                        help="FIFO protocol per size (any case): simple (data in the slot, one flag per message), "
                             "ll (low latency: 4 data bytes and a flag in each 8-byte line, half-size "
                             "slots, every message through the FIFO; MSCCL imports stay simple), auto (ll up "
                             f"to {LL_AUTO_MAX_BYTES // 1024} KiB of full buffer, the model's crossover)")
    parser.add_argument("--codegen", choices=("specialized", "table"), default=None,
                        help="specialized: each rank's own kernel; table: the generic kernels run "
                             "every rank's primitive table from device memory (default: the mode "
                             "a compiled OUTDIR was written in, else specialized)")
    parser.add_argument("--launch", choices=("auto", "grid", "per-rank"), default="auto",
                        help="grid: every rank in one launch of the one-grid entry (needs every rank on "
                             "one device); per-rank: a kernel per rank, each in its own stream; auto: "
                             "grid whenever every rank is on one device (default: auto)")
    add_direct_option(parser)


#: one placement's columns: (name, unit, width)
COLUMNS = [("time", "(us)", 9), ("algbw", "(GB/s)", 7), ("busbw", "(GB/s)", 7), ("#wrong", "", 6)]


def _cells(res, checked: bool = True) -> str:
    if res.stuck is not None:
        vals = ("stuck", "-", "-", "-")
    else:
        vals = (f"{res.time_us:.1f}", f"{res.algbw_GBps:.2f}", f"{res.busbw_GBps:.2f}",
                str(res.wrong) if checked else "N/A")
    return "".join(f"  {v:>{w}}" for v, (_, _, w) in zip(vals, COLUMNS))


def _sanitized(args) -> int | None:
    """``--sanitize``: None to go on in this process (the ASan runtime is loaded), else the exit
    status of this command run again in a child with the ASan runtime preloaded."""
    from hccc.runtime.cpu import asan_loaded, asan_runtime
    if args.backend != "cpu":
        sys.stderr.write("hccc run: error: --sanitize needs --backend cpu\n")
        return 2
    if asan_loaded():
        os.environ["HCCC_CPU_SANITIZE"] = "address"
        return None
    lib = asan_runtime()
    if lib is None:
        sys.stderr.write("hccc run: error: --sanitize needs the compiler's AddressSanitizer runtime "
                         "(libasan), which was not found\n")
        return 1
    argv = getattr(args, "argv", None)
    if not argv:
        sys.stderr.write("hccc run: error: --sanitize: cannot restart this command\n")
        return 1
    env = dict(os.environ)
    env["LD_PRELOAD"] = lib + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env["HCCC_CPU_SANITIZE"] = "address"
    env["ASAN_OPTIONS"] = "detect_leaks=0" + (":" + env["ASAN_OPTIONS"] if env.get("ASAN_OPTIONS") else "")
    sys.stdout.flush()
    sys.stderr.flush()
    res = subprocess.run([sys.executable, "-c", "import sys; from hccc.cli import main; "
                          "sys.exit(main(sys.argv[1:]))", *argv], env=env)
    return res.returncode


def _device_shape(backend: str, nranks: int) -> tuple[int | None, int]:
    """(multiprocessors of the first device, ranks per device) of a GPU backend, as its runtime
    reports them; (None, nranks) on the CPU emulation or when no device answers (every rank then
    counts on one device: the single-process test mode's worst case)."""
    if backend not in ("cuda", "hip"):
        return None, nranks
    from hccc.runtime.platform import PlatformError, get_platform
    try:
        pf = get_platform(backend)
        try:
            ndev = max(1, min(int(pf.device_count()), nranks))
            return int(pf.sms(0)), -(-nranks // ndev)
        finally:
            pf.close()
    except (PlatformError, AttributeError, ValueError):
        return None, nranks


#: the smallest slot (bytes) ``hccc run`` shrinks the default one to where the FIFOs would not fit
LEAST_FIT_SLOT = 4096


def _sweep_capacity(ir, plan, args) -> int:
    """The slot capacity the FIFOs need for the run's largest call
    (:attr:`~hccc.runtime.rank_memory.LaunchCall.slot_cap`, at most the program's slot): the
    Runner allocates them so, before anything is built, and grows them only for a call that
    needs more (an AllToAllv row: its largest block piece)."""
    from hccc.runtime.rank_memory import LaunchCall
    cap = 0
    for nbytes, counts in plan.calls:
        if counts is not None:
            continue
        try:
            call = LaunchCall.plan(ir, nbytes // plan.es, plan.es, int(ir.chunk_bytes), proto=args.proto,
                                   slice_bytes=args.slice_size)
        except ValueError:          # the call refuses its slice when it runs
            continue
        cap = max(cap, call.slot_cap)
    return cap


def _runner_whose_fifos_fit(ir, fit: bool, least: int, make, capacity=lambda ir: int(ir.chunk_bytes)):
    """``make()``'s Runner and None; with ``fit``, where its FIFOs would pass the run's memory
    limit (:class:`~hccc.runtime.memory_limits.FifoMemoryError`, raised before anything is built),
    the program's slot halved until they fit, down to ``least`` bytes (:data:`LEAST_FIT_SLOT`, or
    for a program proven in the algorithm-level order the slot that holds one micro-batch of its
    largest step, which the last halving stops at): smaller slots are more micro-batches of the
    same program, never another result; and a note saying so. The FIFOs grow with the slot the
    calls use (``capacity(ir)``: at most the program's), so the halving starts from it. Without
    ``fit`` (the slot was given, or the program runs as given) the error stands."""
    from hccc.runtime.memory_limits import FifoMemoryError

    first = int(ir.chunk_bytes)
    note, first_need = None, None
    while True:
        try:
            return make(), note
        except FifoMemoryError as exc:
            used = max(1, min(int(ir.chunk_bytes), int(capacity(ir))))
            slot = max(least, used // 2)
            # the FIFOs grow with the slot: straight to the first halving that fits by that rate
            while slot // 2 >= least and exc.need * slot / used > exc.limit:
                slot //= 2
            if exc.need * slot / used > exc.limit and slot > least:
                slot = least
            if not fit or slot >= used:
                raise
            first_need = exc.need if first_need is None else first_need
            ir.chunk_bytes = slot
            from hccc.util.sizes import human_size as human
            note = (f"chunk size {slot} B instead of {first} B: the FIFOs of the run's largest call need "
                    f"{human(first_need)}, over the run's limit of {human(exc.limit)} "
                    "(--chunk-size sets it; HCCC_MAX_RUN_BYTES the limit)")


def scaled_counts(shape, nbytes: int, element_bytes: int):
    """The counts matrix of one ``hccc run --counts`` row at sweep size ``nbytes``: ``shape``'s
    entries scaled (rounded down) so that the mean per-rank send buffer is ``nbytes`` (every rank
    together sends ``nranks * nbytes / element_bytes`` elements), as rccl-tests' ``alltoallv_perf``
    keeps one pattern over its size sweep. Exact integer arithmetic (entries up to 2**48)."""
    import numpy as np

    from hccc.runtime.alltoallv import exact_sum
    n = len(shape)
    want = nbytes // element_bytes * n
    total = exact_sum(shape)            # (4096 x 4096 counts of 2**48 pass 2**63)
    if total == 0:
        return np.zeros_like(shape)
    return np.array([[int(c) * want // total for c in row] for row in shape.tolist()], dtype=np.int64)


def alltoallv_calls(args, ir, sweep, element_bytes: int, groups: list[bool]):
    """``--counts FILE``: ``(calls, groups, notes)``: the table's rows as (size, counts matrix) with
    size the mean per-rank send buffer (bytes), the placements that run, and lines for the
    header. Located errors (CompileError) for a bad file, a program that is not an AllToAll or
    cannot run with per-pair counts, a matrix of another rank count, and in-place-only with counts
    an in-place call cannot take."""
    import numpy as np

    from hccc.compiler.backend.codegen import _is_canonical, _sorted_copy
    from hccc.compiler.frontend.collectives import spec_of
    from hccc.compiler.ir.vblocks import VBlockError, vblock_map
    from hccc.runtime.alltoallv import exact_sum, read_counts_file
    from hccc.util.diagnostics import CompileError, Diagnostic

    where = printable(str(args.counts))

    def refuse(msg):
        raise CompileError([Diagnostic(f"{where}: {msg}", None)])

    spec = spec_of(ir.collective)
    if not spec.per_pair_counts:
        refuse(f"{ir.name} implements {spec.title}: per-pair counts apply to AllToAll programs only")
    # read with the program's rank count: the first line that cannot fit stops the reading
    shape = read_counts_file(args.counts, int(ir.nranks), ir.name)
    n = len(shape)
    cir = ir if _is_canonical(ir) else _sorted_copy(ir)
    asym = np.argwhere(shape != shape.T)
    run_groups, notes, whys = [], [], []
    for g in groups:
        why = None
        try:
            vblock_map(cir, g)
        except VBlockError as exc:
            why = str(exc)
        if why is None and g and len(asym):
            s, d = (int(v) for v in asym[0])
            why = (f"an in-place AllToAllv needs symmetric counts (its one buffer holds the block rank r "
                   f"sends to p where the block from p arrives): counts[{s}][{d}] = {int(shape[s, d])} but "
                   f"counts[{d}][{s}] = {int(shape[d, s])}")
        if why is None:
            run_groups.append(g)
        else:
            whys.append(why)
            notes.append(f"{GROUP[g]}: not run ({why})")
    if not run_groups:
        refuse("; ".join(whys))
    if sweep_is_default(args):
        calls = [(exact_sum(shape) * element_bytes // n, shape)]
        notes.insert(0, f"AllToAllv counts from {where}: {n} x {n}, {exact_sum(shape)} elements in all, largest "
                        "block " + f"{int(shape.max())}; size = the mean per-rank send buffer")
    else:
        if not shape.any():
            refuse("every count is 0: a matrix scaled to the sweep's sizes needs a nonzero entry")
        calls = []
        for nbytes in sweep.sizes:
            c = scaled_counts(shape, nbytes, element_bytes)
            calls.append((exact_sum(c) * element_bytes // n, c))
        notes.insert(0, f"AllToAllv counts from {where}: {n} x {n}, scaled at each size (rounded down) to a "
                        "mean per-rank send buffer of that size; size = the mean per-rank send buffer")
    return calls, run_groups, notes


def run(args) -> int:
    """Every (element type, operator) asked for, a table each; the worst exit status."""
    if getattr(args, "sanitize", False):
        code = _sanitized(args)      # once for the whole command: a child runs every pair
        if code is not None:
            return code
    resident = getattr(args, "resident_blocks", None)
    if resident is not None and args.backend != "cpu":
        sys.stderr.write("hccc run: error: --resident-blocks needs --backend cpu\n")
        return 2
    combos, left_out = instance_combos(args.dtype, args.op)
    why = sizes_error(sweep_sizes(args), [dtype for dtype, _ in combos])
    if why:     # before any table runs: -d all once ran four tables, then stopped at int64
        sys.stderr.write(f"hccc run: error: {why}\n")
        return 2
    say_notes("run", noop_notes(args, "run") + ([left_out] if left_out else []), json_mode=args.json)
    status = 0
    for dtype, op in combos:
        one = argparse.Namespace(**vars(args))
        one.dtype, one.op = dtype, op
        status = max(status, _run_one(one))
        if status not in (0, 1):
            break
    return status


def _run_one(args) -> int:
    from hccc.runtime.platform import PlatformError

    plan = _plan(args)
    if isinstance(plan, int):
        return plan
    resident = getattr(args, "resident_blocks", None)
    before = os.environ.get("HCCC_CPU_RESIDENT_BLOCKS")
    try:
        if resident is not None:      # the CPU platforms of this run read it
            os.environ["HCCC_CPU_RESIDENT_BLOCKS"] = str(resident)
        results, ran = _run_calls(args, plan)
    except PlatformError as exc:
        sys.stderr.write(f"hccc: error: {exc}\n")
        return 1
    except ValueError as exc:
        sys.stderr.write(f"hccc: error: {exc}\n")
        return 1
    finally:
        if resident is not None:
            if before is None:
                os.environ.pop("HCCC_CPU_RESIDENT_BLOCKS", None)
            else:
                os.environ["HCCC_CPU_RESIDENT_BLOCKS"] = before
    # -c 0 (nccl-tests): wrong elements do not fail the run; a stuck run still does
    ok = all(r.ok if args.check else r.stuck is None for r in results)
    if args.json:
        print(json.dumps(_json_report(args, plan, ran, results, ok)))
    else:
        _print_summary(results, ok)
    return 0 if ok else 1


@dataclass
class _RunPlan:
    """What ``hccc run`` runs, worked out before anything is built: the program with its channels
    and slot, its platforms, the calls (bytes, and an AllToAllv's counts) in the placements it is
    proven for (``unproven``: the placements asked for that it is not), and how far its FIFOs' slot
    may shrink."""
    ir: object
    plats: list
    sweep: object
    es: int
    root: int
    fit_slot: bool
    least_slot: int
    groups: list
    unproven: list
    calls: list
    vnotes: list


@dataclass
class _Ran:
    """How the kernels ran: threads per block, one grid or a kernel per rank, the libraries."""
    nthreads: int
    launch: str
    libraries: dict


def _plan(args):
    """The run's :class:`_RunPlan`, or the exit status of a usage error or a program whose
    buffers do not fit (said on stderr)."""
    from hccc.util.diagnostics import CompileError, Diagnostic
    from hccc.runtime.launcher import ELEMENT_BYTES, check_program_memory
    from hccc.runtime.platform import PlatformError
    from hccc.compiler.passes.slicing import DEFAULT_SLOT_BYTES
    from hccc.compiler.pipeline import apply_channels, manifest_codegen, manifest_path
    from hccc.compiler.pipeline.readers import reader_for

    sweep = sweep_sizes(args)
    es = ELEMENT_BYTES[args.dtype]
    why = sizes_error(sweep, [args.dtype])
    if why:
        sys.stderr.write(f"hccc run: error: {why}\n")
        return 2
    # a slot of the default size, smaller where the FIFOs would not fit (programs lowered here:
    # .rccl, MSCCL XML, MSCCL++ plans; a ProgramIR or compiled output runs as given)
    fit_slot = args.chunk_size is None and manifest_path(args.algo) is None and \
        not reader_for(args.algo).as_written
    if args.chunk_size is None:
        args.chunk_size = DEFAULT_SLOT_BYTES
    ir, plats = load_with_platforms(args)
    why = ranks_error(args, ir.name, ir.nranks)
    if why:
        sys.stderr.write(f"hccc run: error: {why}\n")
        return 2
    # --channels (auto: the program's own count, else 1 on the CPU emulation, else the GPU rule for
    # the device the run uses: its multiprocessors and the ranks placed on each)
    sms, per_device = _device_shape(args.backend, ir.nranks)
    ir = apply_channels(ir, program_options(args), ["cpu"] if args.backend == "cpu" else plats,
                        ranks_per_device=per_device, device_sms=sms)
    if args.codegen is None:
        mpath = manifest_path(args.algo)
        args.codegen = manifest_codegen(mpath) if mpath is not None else "specialized"
    root = root_column(ir.collective, ir.root)
    if args.root is not None and root >= 0 and args.root != root:
        raise CompileError([Diagnostic(
            f"-r {args.root}: {ir.name} is compiled for root {root} (its Root); compile the program "
            f"for root {args.root} to run it there", None)])
    least_slot = _least_slot(ir, sweep, es)
    groups = placements(args)
    unproven = [g for g in groups if g not in ir.placements]
    if unproven and len(groups) == 1:
        raise CompileError([Diagnostic(
            f"--{'inplace-only' if unproven[0] else 'out-of-place-only'}: {ir.name} is proven "
            f"{'out of place' if unproven[0] else 'in place'} only (its MSCCL XML declares inplace="
            f"\"{int(True in ir.placements)}\" outofplace=\"{int(False in ir.placements)}\")", None)])
    groups = [g for g in groups if g in ir.placements]
    calls, vnotes = [(nbytes, None) for nbytes in sweep.sizes], []
    if args.counts is not None:
        # an AllToAllv per row: every call checks its own buffers (Runner.run_v) before it runs
        calls, groups, vnotes = alltoallv_calls(args, ir, sweep, es, groups)
    try:
        for nbytes, counts in calls:            # before building anything: the buffers must fit
            if counts is None:
                check_program_memory(ir, nbytes, args.dtype)
    except PlatformError as exc:
        sys.stderr.write(f"hccc: error: {exc}\n")
        return 1
    return _RunPlan(ir=ir, plats=plats, sweep=sweep, es=es, root=root, fit_slot=fit_slot,
                    least_slot=least_slot, groups=groups, unproven=unproven, calls=calls,
                    vnotes=vnotes)


def _least_slot(ir, sweep, es: int) -> int:
    """The least slot the program's FIFOs may shrink to."""
    if not ir.algorithm_level:
        return max(LEAST_FIT_SLOT, 16 * int(ir.max_step_chunks))
    # An MSCCL import proven only under the MSCCL runtimes' algorithm-level order (every micro-batch
    # runs the whole step list). hccc's kernels run each primitive for all micro-batches first;
    # with a single micro-batch per chunk the two orders coincide, so make the slot hold one
    # chunk of each of the chunks its largest step moves.
    # That slot is also the least one its FIFOs may shrink to. A size is the collective's full
    # buffer (nccl-tests' S, as Runner.run counts it), which the program cuts into nchunks chunks.
    most = max(sweep.sizes) // es
    per_chunk = -(-most // max(1, ir.nchunks)) * es
    least_slot = -(-per_chunk // 16) * 16 * ir.max_step_chunks
    ir.chunk_bytes = max(ir.chunk_bytes, least_slot)
    return least_slot


def _run_calls(args, plan: _RunPlan):
    """Build the kernels and run every call in every placement, printing the table as it goes;
    returns the results and how the kernels ran (:class:`_Ran`)."""
    from hccc.runtime.launcher import Runner
    from hccc.progress import Progress
    ir, results = plan.ir, []
    with Progress("hccc run", enabled=not args.json) as progress:
        with progress.phase(f"building {ir.name} for {args.backend} ({args.dtype}, {args.op})"):
            runner, slot_note = _runner_whose_fifos_fit(
                ir, plan.fit_slot, plan.least_slot,
                lambda: Runner(ir, args.backend, args.dtype, args.op, platforms=plan.plats, nthreads=args.threads,
                               timeout_s=args.timeout, codegen=args.codegen,
                               one_grid={"auto": None, "grid": True, "per-rank": False}[args.launch],
                               direct=args.direct, fifo_capacity=_sweep_capacity(ir, plan, args)),
                lambda ir: _sweep_capacity(ir, plan, args))
        with runner:
            ran = _Ran(runner.block, "grid" if runner.grid_fn is not None else "per-rank",
                       {pl: {"ranks": rs, "backend": runner.platforms[pl].name,
                             "library": str(runner.libraries[pl])}
                        for pl, rs in runner.library_ranks.items()})
            if not args.json:
                _print_preamble(progress.print, args, plan, runner, ran, slot_note)
            proto_notes = set()
            cycles = args.run_cycles
            task = progress.task(f"running {plural(len(plan.calls), 'size')}"
                                 + (" out of place and in place" if len(plan.groups) > 1 else "")
                                 + (f", {cycles} cycles" if cycles > 1 else ""),
                                 total=len(plan.calls) * len(plan.groups) * cycles,
                                 sizes=[nbytes for nbytes, _ in plan.calls for _ in plan.groups], cycles=cycles)
            for nbytes, counts in (call for _ in range(cycles) for call in plan.calls):
                row, broken = [], False
                for inplace in plan.groups:
                    if counts is None:
                        res = runner.run(nbytes, inplace=inplace, iters=args.iters, warmup=args.warmup,
                                         seed=args.seed, slice_bytes=args.slice_size, proto=args.proto,
                                         check=args.check > 0, checks=max(args.check, 1))
                    else:
                        res = runner.run_v(counts, inplace=inplace, iters=args.iters, warmup=args.warmup,
                                           seed=args.seed, slice_bytes=args.slice_size, proto=args.proto)
                    if runner.proto_note and runner.proto_note not in proto_notes and not args.json:
                        proto_notes.add(runner.proto_note)
                        progress.print(f"# --proto {args.proto}: {runner.proto_note}")
                    task.advance()
                    results.append(res)
                    row.append(res)
                    if res.stuck is not None and "host watchdog" in res.stuck:
                        broken = True   # the platform may be unusable now
                        break
                if not args.json:
                    _print_row(progress.print, args, plan, nbytes, row)
                if broken:
                    break
    return results, ran


def _print_preamble(out, args, plan: _RunPlan, runner, ran: _Ran, slot_note) -> None:
    """The lines above the table: what runs where, with which protocol, sizes and checks."""
    ir = plan.ir
    out(f"# hccc run: {ir.name}: {ir.collective} on {plural(ir.nranks, 'rank')}, backend {args.backend}, "
        f"{plural(runner.block, 'thread')} per thread block, chunk size {ir.chunk_bytes} B, "
        f"{args.codegen} kernels, "
        + ("one grid for every rank" if runner.grid_fn is not None else "a kernel per rank"))
    if slot_note:
        out(f"# {slot_note}")
    if runner.threads_note:
        out(f"# {runner.threads_note}")
    if args.proto != "simple":
        out(f"# protocol {args.proto}: "
            + (f"LL up to {LL_AUTO_MAX_BYTES // 1024} KiB of full buffer, Simple above"
               if args.proto == "auto" else "LL")
            + (" (direct-mode messages run Simple)" if args.direct != "off" else ""))
    for note in plan.vnotes:
        out(f"# {note}")
    sweep = plan.sweep
    if args.counts is None or len(plan.calls) > 1:
        out(f"# minBytes {sweep.min_bytes} maxBytes {sweep.max_bytes} step: {sweep.step} "
            f"warmup iters: {args.warmup} iters: {args.iters} validation: {args.check}")
    else:
        out(f"# warmup iters: {args.warmup} iters: {args.iters} validation: {args.check}")
    if args.backend == "cpu":
        out(EMULATED_NOTE)
    libraries = ran.libraries
    if len(libraries) > 1 or plan.plats[0] != "cuda":
        from hccc.runtime.rank_platforms import rank_ranges
        out("# " + "; ".join(
            f"{pl.upper()} ranks {rank_ranges(v['ranks'])} from the {pl} library "
            f"({v['backend']})" for pl, v in libraries.items()))
    for g in plan.unproven:
        out(f"# {GROUP[g]}: not run ({ir.name} is proven {GROUP[not g]} only, as its "
            f"MSCCL XML declares)")
    out("#")
    for line in table_header(plan.groups, COLUMNS):
        out(line)


def _print_row(out, args, plan: _RunPlan, nbytes: int, row) -> None:
    """One size's row of the table, and a line for each of its runs that went wrong."""
    ir, coll = plan.ir, plan.ir.collective
    out(table_left(nbytes, nbytes // plan.es, args.dtype, redop_column(coll, args.op), plan.root)
        + "".join(_cells(r, args.check > 0) for r in row))
    for r in row:
        where = GROUP[r.inplace]
        if r.stuck is not None:
            out(f"#   {where}: {r.stuck}")
        elif r.wrong:
            out(f"#   {where}: first wrong: {r.first_wrong}")
        elif r.collective_wrong > 0:
            out(f"#   {where}: {ir.name} does not implement {coll}: "
                f"{plural(r.collective_wrong, 'element')} of its reference run differ "
                f"from the definition; first: {r.first_wrong}")


def _json_report(args, plan: _RunPlan, ran: _Ran, results, ok: bool) -> dict:
    ir = plan.ir
    return {"algorithm": ir.name, "collective": ir.collective, "nranks": ir.nranks,
            "backend": args.backend, "emulated": args.backend == "cpu", "nthreads": ran.nthreads, "ok": ok,
            "root": plan.root, **shift_field(ir.collective, ir.root), "codegen": args.codegen,
            "redop": redop_column(ir.collective, args.op),
            "rank_platform": plan.plats, "libraries": ran.libraries, "launch": ran.launch,
            **({"counts": args.counts, "counts_scaled": len(plan.calls) > 1 or not sweep_is_default(args)}
               if args.counts is not None else {}),
            "results": [r.to_json() for r in results]}


def _print_summary(results, ok: bool) -> None:
    wrong = sum(max(r.wrong, 0) for r in results)
    stuck = sum(r.stuck is not None for r in results)
    notcoll = sum(r.collective_wrong > 0 for r in results)
    if stuck or notcoll:
        print(f"# {plural(stuck, 'stuck run')}"
              + (f", {plural(notcoll, 'run')} whose reference result is not the collective" if notcoll else ""))
    print(f"# Out of bounds values : {wrong} {'OK' if ok else 'FAILED'}")
    print(avg_busbw_line([r.busbw_GBps for r in results if r.stuck is None]))
