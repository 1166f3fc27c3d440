"""Which Platform object runs each rank of a single-process run (the :class:`~hccc.runtime.launcher.Runner`).

Every rank of a program has a manifest platform ("cuda" or "hip"; a mixed-vendor program has both).
A run maps each manifest platform present to a :class:`~hccc.runtime.platform.Platform` object:
``"cpu"`` emulates every platform on the CPU (one :class:`~hccc.runtime.cpu.CpuPlatform` each),
``"cuda"`` / ``"hip"`` or a registered platform name run a program of that platform only, a
Platform object runs every platform it :meth:`~Platform.runs_sources`, and a dict names one per
manifest platform. A rank's FIFOs live in its own platform's memory and its senders write into
them, so every pair of platforms of one run must share memory; a mapping that cannot run is
refused (PlatformError naming the ranks) before any kernel is built.
"""
from __future__ import annotations

from hccc.compiler.ir.program_ir import ProgramIR
from hccc.runtime.platform import Platform, PlatformError, get_platform

#: the manifest's platform names (what the emitted sources are written for)
MANIFEST_PLATFORMS = ("cuda", "hip")


def rank_ranges(ranks) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    rs = sorted(set(int(r) for r in ranks))
    out, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(f"{rs[i]}" if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)


def platform_label(backend) -> str:
    """A backend's name for messages (a name as given, a Platform object's ``name``)."""
    return backend if isinstance(backend, str) else (getattr(backend, "name", "") or type(backend).__name__)


def rank_platforms(nranks: int, backend, platforms) -> list[str]:
    """The manifest platform of each of ``nranks`` ranks: ``platforms`` checked, or by default
    every rank on the backend's own platform (CUDA for ``"cpu"``), or a dict backend's only key."""
    if platforms is None:
        if isinstance(backend, dict):
            keys = sorted(backend)
            if len(keys) != 1:
                raise ValueError("a backend per platform needs the rank platforms "
                                 "(Runner(..., platforms=[...]))")
            default = keys[0]
        elif isinstance(backend, str):
            default = "hip" if backend == "hip" else "cuda"
        else:
            default = backend.source_platform or "cuda"
        return [default] * nranks
    out = [str(p) for p in platforms]
    if len(out) != nranks:
        raise ValueError(f"{len(out)} rank platforms for a program of {nranks} ranks")
    bad = [r for r, p in enumerate(out) if p not in MANIFEST_PLATFORMS]
    if bad:
        raise ValueError(f"rank {bad[0]}: unknown platform {out[bad[0]]!r} "
                         f"(expected {' or '.join(MANIFEST_PLATFORMS)})")
    return out


def ranks_by_platform(rank_platform: list[str]) -> dict[str, list[int]]:
    """Manifest platform -> its ranks, platforms in name order."""
    groups: dict[str, list[int]] = {}
    for r, p in enumerate(rank_platform):
        groups.setdefault(p, []).append(r)
    return dict(sorted(groups.items()))


def _backend_spec(ir: ProgramIR, backend, groups: dict[str, list[int]], owned: list) -> dict:
    """Manifest platform -> what runs it (a platform name or a Platform object), refusing a
    backend that cannot run the sources of some ranks. A platform this makes is appended to
    ``owned`` (the caller closes it)."""
    if isinstance(backend, dict):
        unknown = sorted(set(backend) - set(MANIFEST_PLATFORMS))
        if unknown:
            raise ValueError(f"backend keys are manifest platforms ({', '.join(MANIFEST_PLATFORMS)}), "
                             f"not {unknown[0]!r}")
        missing = [p for p in groups if p not in backend]
        if missing:
            raise PlatformError(f"no backend for the {missing[0]} ranks "
                                f"{rank_ranges(groups[missing[0]])} of {ir.name}")
        return {p: backend[p] for p in groups}
    if isinstance(backend, str) and backend == "cpu":
        return {p: "cpu" for p in groups}
    if isinstance(backend, str) and backend not in MANIFEST_PLATFORMS:
        backend = get_platform(backend)       # a registered platform (or: unknown backend)
        owned.append(backend)
    # one platform kind may serve several manifest platforms only if it runs their sources
    label = platform_label(backend)
    for p, rs in groups.items():
        own = backend if isinstance(backend, str) else backend.source_platform
        ok = (p == own) if isinstance(backend, str) else backend.runs_sources(p)
        if not ok:
            raise PlatformError(
                f"{ir.name}: ranks {rank_ranges(rs)} are {p.upper()} ranks and the {label} "
                f"backend runs {str(own).upper()} programs only; run a mixed program with the "
                "cpu backend (every platform emulated on the CPU) or compile it for one "
                "platform (--target cuda|hip)")
    return {p: backend for p in groups}


def check_backend(ir: ProgramIR, backend, groups: dict[str, list[int]]) -> None:
    """The refusal :func:`resolve_platforms` makes of a backend named by a manifest platform
    (``"cuda"`` / ``"hip"``) or given as a Platform object that cannot run the sources of some
    ranks of ``groups`` (:func:`ranks_by_platform`), made without starting any platform; other
    backends are checked where they are made."""
    if isinstance(backend, Platform) or (isinstance(backend, str) and backend in MANIFEST_PLATFORMS):
        _backend_spec(ir, backend, groups, [])


def resolve_platforms(ir: ProgramIR, backend, groups: dict[str, list[int]], owned: list) -> dict[str, Platform]:
    """Manifest platform -> Platform object for every platform of ``groups``
    (:func:`ranks_by_platform`); refuses mappings that cannot run (a platform that cannot run those
    sources, platforms without shared memory). Platforms this makes are appended to ``owned``."""
    spec = _backend_spec(ir, backend, groups, owned)
    # memory: FIFOs live in the receiver's memory, flags in rank 0's: every pair must share it
    # (named backends of different kinds are refused before any of them is started)
    if len({v for v in spec.values() if isinstance(v, str)}) > 1:
        refuse_unshared(ir, groups, {p: platform_label(v) for p, v in spec.items()})
    out: dict[str, Platform] = {}
    made: dict[str, Platform] = {}
    for p, v in spec.items():
        if isinstance(v, str):
            if v == "cpu":
                from hccc.runtime.cpu import CpuPlatform
                pf = CpuPlatform(source_platform=p)
                owned.append(pf)
            elif v in made:
                pf = made[v]
            else:
                pf = made[v] = get_platform(v)
                owned.append(pf)
        else:
            pf = v
        if not pf.runs_sources(p):
            raise PlatformError(f"{ir.name}: the {pf.name} platform cannot run the {p.upper()} "
                                f"ranks {rank_ranges(groups[p])}")
        out[p] = pf
    pfs = list(out.items())
    for i, (p, a) in enumerate(pfs):
        for q, b in pfs[i + 1:]:
            if not (a.shares_memory_with(b) and b.shares_memory_with(a)):
                refuse_unshared(ir, groups, {p: a.name, q: b.name})
    return out


def refuse_unshared(ir: ProgramIR, groups: dict[str, list[int]], names: dict[str, str]) -> None:
    """PlatformError naming the ranks of each platform and the connections that cross them."""
    plat = {r: p for p, rs in groups.items() for r in rs}
    p = ir.prims
    cross = sorted({(int(s), int(d)) for s, d in zip(p["rank"].tolist(), p["send_peer"].tolist())
                    if d >= 0 and s in plat and d in plat and plat[s] != plat[d]})
    sides = "; ".join(f"{pl.upper()} ranks {rank_ranges(groups[pl])} on {names[pl]}" for pl in names)
    what = ", ".join(f"rank {s} ({plat[s]}) -> rank {d} ({plat[d]})" for s, d in cross[:4])
    more = f" and {len(cross) - 4} more" if len(cross) > 4 else ""
    raise PlatformError(
        f"cannot run {ir.name} in one process with {sides}: these runtimes share no memory, "
        "and a sender writes its FIFO slots and counters into the receiver's memory"
        + (f" ({what}{more})" if cross else " (the abort flag and error record are shared too)")
        + "; use the cpu backend (every platform emulated on the CPU, host memory) or run the "
        "ranks of each platform in their own process")


__all__ = ["MANIFEST_PLATFORMS", "rank_ranges", "platform_label", "rank_platforms", "ranks_by_platform",
           "check_backend", "resolve_platforms", "refuse_unshared"]
