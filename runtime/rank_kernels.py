"""Where the ranks of a single-process run (:class:`~hccc.runtime.launcher.Runner`) run and what
they launch: the device of every rank (each Platform object places the ranks it runs), one library
per manifest platform built from exactly that platform's ranks (the split the emitted Makefile /
CMake files make), every rank's kernel, the one-grid entry when every rank is on one device of one
platform, and threads per block such that every block of the run is resident at once (the blocks
spin on each other).
"""
from __future__ import annotations

from pathlib import Path

from hccc.compiler.backend.codegen import WARP_SIZE
from hccc.compiler.ir.program_ir import ProgramIR
from hccc.compiler.passes.kernel_cost import least_block_threads
from hccc.runtime.generated import GeneratedProgram
from hccc.runtime.gpu import grid_symbol
from hccc.runtime.platform import Instance, Platform, PlatformError
from hccc.runtime.rank_residency import check_grid_residency, check_rank_residency, launch_residency
from hccc.util.plural import plural


def fit_block_threads(block: int, platform: str, fits, least: int | None = None) -> tuple[int, str | None]:
    """The most threads per block, from ``block`` halving down to ``least`` (default: the sync warp
    and two data warps of ``platform``, "cuda" / "hip",
    :func:`hccc.compiler.passes.kernel_cost.least_block_threads`; the running platform's
    :meth:`Platform.least_block_threads`),
    for which ``fits(threads)`` holds, and a note saying so when that is fewer than ``block``;
    ``(block, None)`` when ``block`` fits or nothing does (the caller refuses)."""
    b = int(block)
    floor = least_block_threads(WARP_SIZE.get(platform, 32)) if least is None else int(least)
    while not fits(b) and b // 2 >= floor:
        b //= 2
    if b == block or not fits(b):
        return int(block), None
    return b, (f"{plural(b, 'thread')} per thread block instead of the emitted {block}, so that every block "
               "of the kernel is resident at once")


def check_resident_together(name: str, pf, device: int, nranks: int, need: int, block: int, cap: int) -> None:
    """PlatformError unless ``need`` thread blocks of ``block`` threads, of ``nranks`` ranks of
    program ``name`` on ``device`` of ``pf``, fit the ``cap`` blocks resident at once there: they
    spin on each other, so every one must run at once (with the platform's advice)."""
    if need > cap:
        raise PlatformError(
            f"cannot run {name} on {pf.name}: its {nranks} ranks on device {device} need {need} thread "
            f"blocks of {block} threads resident at once, but at most {cap} fit; "
            f"{pf.residency_advice(need, block)}")


class RankKernels:
    """The placement, kernels and launch shape of every rank of ``program`` (a
    :class:`GeneratedProgram` of ``ir``) for ``dtype`` / ``op``. ``platforms``: manifest platform ->
    Platform object; ``library_ranks``: manifest platform -> its ranks; ``nthreads``: threads per
    block (None: each platform's choice, halved until every block is resident); ``one_grid``: see
    :class:`~hccc.runtime.launcher.Runner`.

    Attributes: :attr:`distinct` (the Platform objects, once each), :attr:`rank_pf`,
    :attr:`placement` (device per rank), :attr:`single_gpu`, :attr:`libraries` / :attr:`modules`
    (per manifest platform), :attr:`fns` and :attr:`rank_library` (per rank), :attr:`grid_fn` (the
    one-grid entry or None), :attr:`grid` (blocks per rank), :attr:`block_of` (threads per block
    per manifest platform), :attr:`blocks` (per rank), :attr:`block` (the largest) and
    :attr:`threads_note` (why fewer threads than emitted, or None)."""

    def __init__(self, ir: ProgramIR, program: GeneratedProgram, platforms: dict[str, Platform],
                 rank_platform: list[str], library_ranks: dict[str, list[int]], dtype: str, op: str,
                 nthreads: int | None = None, one_grid: bool | None = None):
        self.ir, self.program, self.platforms = ir, program, platforms
        self.rank_platform, self.library_ranks = rank_platform, library_ranks
        self.rank_pf = [platforms[p] for p in rank_platform]
        self.distinct: list[Platform] = []
        for pf in platforms.values():
            if not any(pf is q for q in self.distinct):
                self.distinct.append(pf)
        #: blocks per rank: channels x thread blocks
        self.grid = [program.blocks(r) for r in range(program.nranks)]
        self.block_of = {p: program.threads(p, pf, nthreads) for p, pf in platforms.items()}
        self._set_blocks()
        self._place()
        self._build(Instance(dtype, op), one_grid)
        self._fit_threads(nthreads is None)
        self.check_partial_residency()

    def _set_blocks(self) -> None:
        self.blocks = [self.block_of[p] for p in self.rank_platform]
        #: threads per thread block (the largest when the platforms differ)
        self.block = max(self.blocks) if self.blocks else 1

    def _place(self) -> None:
        """Devices: each Platform object places the ranks it runs (peer access among them)."""
        N = len(self.rank_pf)
        self.placement = [0] * N
        for pf in self.distinct:
            rs = [r for r in range(N) if self.rank_pf[r] is pf]
            for r, d in zip(rs, pf.placement(len(rs))):
                self.placement[r] = int(d)
            devices = sorted({self.placement[r] for r in rs})
            if len(devices) > 1:
                pf.enable_peer_access(devices)
        #: every rank on one device of one platform: the kernels order memory at GPU scope
        self.single_gpu = len(self.distinct) == 1 and len(set(self.placement)) <= 1

    def _build(self, inst: Instance, one_grid: bool | None) -> None:
        """One library per manifest platform, through its platform; every rank's kernel."""
        prog = self.program
        self.libraries: dict[str, Path] = {}
        self.modules = {}
        for p, rs in self.library_ranks.items():
            pf = self.platforms[p]
            scope = {"single_gpu": True} if self.single_gpu else {}   # system scope: the default
            self.libraries[p] = Path(pf.build(prog.gendir, prog.manifest, inst, ranks=rs, **scope))
            self.modules[p] = pf.load(self.libraries[p])
        self.fns = [self.modules[p].function(prog.kernel_symbol(r, inst.dtype, inst.op))
                    for r, p in enumerate(self.rank_platform)]
        self.rank_library = [self.libraries[p] for p in self.rank_platform]
        self.grid_fn = self._grid_function(inst, one_grid)

    def _grid_function(self, inst: Instance, one_grid: bool | None):
        """The one-grid entry to launch, or None."""
        if one_grid is False or not self.rank_pf:
            return None
        k = launch_residency(self.distinct)
        if one_grid is None and k is not None and sum(self.grid) > k:
            return None   # a partial-residency platform: a launch per rank (one grid is cooperative)
        p = self.rank_platform[0]
        sym = grid_symbol(self.program.manifest, p, inst) if self.single_gpu else None
        fn = None
        if sym is not None:
            try:
                fn = self.modules[p].function(sym)
            except PlatformError:
                fn = None
        if fn is None and one_grid:
            why = ("its ranks are not all on one device of one platform" if not self.single_gpu
                   else "the generated sources have no one-grid entry (regenerate them)")
            raise PlatformError(f"cannot run {self.ir.name} as one grid: {why}")
        return fn

    def _fit_threads(self, auto: bool) -> None:
        """Check that every block of the run can be resident at once; with ``auto`` threads (no
        ``nthreads`` given), halve the threads per block (down to the sync warp and two data
        warps on a GPU, one thread on the CPU emulation: :meth:`Platform.least_block_threads`)
        until they can, and say
        so in :attr:`threads_note` (the kernels take any block size up to the emitted one)."""
        self.threads_note = None
        first = dict(self.block_of)
        while True:
            try:
                self.check_residency()
                break
            except PlatformError as exc:
                smaller = {p: b // 2 if b // 2 >= self.platforms[p].least_block_threads(p) else b
                           for p, b in self.block_of.items()}
                if not auto or smaller == self.block_of:
                    raise
                why = str(exc)
                self.block_of = smaller
                self._set_blocks()
        if self.block_of != first:
            self.threads_note = (
                f"{plural(self.block, 'thread')} per thread block instead of the emitted {max(first.values())}, so "
                f"that every block of the run is resident at once ({why.split(': ', 1)[-1]})")

    def check_residency(self, block: int | None = None) -> None:
        """Every TB of every rank must be resident at once (they spin on each other); ``block``:
        threads per block of every rank instead of :attr:`blocks`."""
        by_dev: dict[tuple[int, int], list[int]] = {}
        for r, d in enumerate(self.placement):
            if self.grid[r] > 0:
                by_dev.setdefault((id(self.rank_pf[r]), d), []).append(r)
        for (_, d), rs in by_dev.items():
            pf = self.rank_pf[rs[0]]
            pf.set_device(d)
            blk = {r: (self.blocks[r] if block is None else block) for r in rs}
            need = sum(self.grid[r] for r in rs)
            b = max(blk.values())
            if self.grid_fn is not None:     # one launch: the entry's own occupancy counts
                cap = pf.max_resident_blocks(self.grid_fn, b)
            else:
                cap = min(pf.max_resident_blocks(self.fns[r], blk[r]) for r in rs)
            check_resident_together(self.ir.name, pf, d, len(rs), need, b, cap)

    def check_partial_residency(self) -> None:
        """Where a platform keeps only some blocks of a launch resident (``launch_residency``): a
        one-grid launch, cooperative, must fit whole, and per-rank launches must have no wait that
        a block not yet resident could leave unmet (:mod:`hccc.runtime.rank_residency`)."""
        k = launch_residency(self.distinct)
        if self.grid_fn is not None:
            check_grid_residency(self.ir.name, sum(self.grid), k)
        if self.grid_fn is None:
            check_rank_residency(self.ir, k)

    def launch(self, args: list, blocks: list, streams: list, grid_arg: bytes | None, abort_flag: int) -> None:
        """Launch every rank's kernel (``args[r]``: its packed argument, ``blocks[r]`` threads per
        block) on its stream, or with ``grid_arg`` the one-grid entry once on rank 0's stream
        (every rank, ``sum(grid)`` blocks, launched so that they are resident together)."""
        if grid_arg is not None:
            if sum(self.grid) > 0:
                pf = self.rank_pf[0]
                pf.set_device(self.placement[0])
                pf.launch_grid(self.grid_fn, sum(self.grid), blocks[0], grid_arg, streams[0],
                               abort_flag=abort_flag)
            return
        for r, pf in enumerate(self.rank_pf):
            if self.grid[r] > 0:
                pf.set_device(self.placement[r])
                pf.launch(self.fns[r], self.grid[r], blocks[r], args[r], streams[r])


__all__ = ["fit_block_threads", "RankKernels"]
