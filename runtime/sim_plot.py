"""Timeline plot of a simulated run (matplotlib, Agg backend).

One row per thread block (``rank R / tb T``), time in microseconds across. A bar is an interval in
which the TB works: solid for writing a slot to a peer (send), hatched for reducing, pale for
receiving (a peer is writing into the slot the TB waits for). Colour = the primitive's
sub-pipeline, so the phases of a pipelined schedule are easy to tell apart. Gaps are idle time.
Large programs are cut to the TBs of the first ranks (``max_rows``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from hccc.runtime.sim_engine import K_RECV, K_REDUCE, K_SEND, K_UNIT
from hccc.runtime.sim_model import SimProgram
from hccc.runtime.simulator import SimResult


def timeline_tbs(prog: SimProgram, ranks=None, max_rows: int = 48) -> np.ndarray:
    """The global TB indices a timeline shows: those of ``ranks`` (all ranks when None), in rank
    order, at most ``max_rows``."""
    g = np.arange(prog.ntbs)
    if ranks is not None:
        g = g[np.isin(prog.tb_rank, np.asarray(list(ranks), dtype=np.int64))]
    return g[:max_rows]


def plot_timeline(result: SimResult, prog: SimProgram, path: str | Path, *, title: str | None = None,
                  max_rows: int = 48, ranks=None) -> Path:
    """Write the timeline of ``result`` (simulated with ``record`` covering the TBs shown) to
    ``path`` (PNG/SVG/PDF); ``ranks`` picks the ranks whose TBs are shown (default: the first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tl = result.timeline
    if tl is None:
        raise ValueError("the result has no timeline (simulate with record=True)")
    G = prog.ntbs
    tbs = timeline_tbs(prog, ranks, max_rows)
    rows = np.arange(len(tbs))
    row_of = np.full(G, -1, dtype=np.int64)
    row_of[tbs] = rows
    npipe = int(prog.p_pipeline.max()) + 1 if prog.nprims else 1
    cmap = plt.get_cmap("tab20" if npipe > 10 else "tab10")
    fig_h = max(2.5, 0.28 * len(rows) + 1.6)
    fig, ax = plt.subplots(figsize=(12, fig_h), dpi=110)
    scale = 1e6
    styles = {K_SEND: dict(alpha=0.95, hatch=None), K_REDUCE: dict(alpha=0.95, hatch="///"),
              K_RECV: dict(alpha=0.35, hatch=None), K_UNIT: dict(alpha=0.6, hatch="..")}
    keep = row_of[tl.tb] >= 0
    for kind, style in styles.items():
        m = keep & (tl.kind == kind)
        if not m.any():
            continue
        tb = row_of[tl.tb[m]]
        t0 = tl.t0[m] * scale
        w = (tl.t1[m] - tl.t0[m]) * scale
        pipe = prog.p_pipeline[tl.prim[m]]
        colors = [cmap(int(p) % cmap.N) for p in pipe]
        ax.barh(tb, w, left=t0, height=0.8, color=colors, edgecolor="none", linewidth=0,
                alpha=style["alpha"], hatch=style["hatch"])
    labels = [f"r{int(prog.tb_rank[g])}/tb{int(prog.tb_local[g])}" for g in tbs]
    ax.set_yticks(rows)
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, max(result.time_s * scale, 1e-9) * 1.01)
    ax.set_xlabel("time (us)")
    ax.set_ylabel("thread block (rank / tb)")
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    shown = sorted({int(p) for p in prog.p_pipeline[tl.prim[keep]]}) if keep.any() else []
    handles = [Patch(facecolor=cmap(p % cmap.N), label=f"sub-pipeline {p}") for p in shown[:12]]
    handles += [Patch(facecolor="grey", alpha=0.95, label="send"),
                Patch(facecolor="grey", alpha=0.95, hatch="///", label="reduce"),
                Patch(facecolor="grey", alpha=0.35, label="receive")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    cut = f" ({len(rows)} of {G} TBs)" if G > len(rows) else ""
    ax.set_title(title or (f"{result.collective} on {result.nranks} ranks, {result.nbytes} bytes, "
                           f"{result.execution}-level: {result.time_us:.1f} us, busbw "
                           f"{result.busbw_GBps:.2f} GB/s{cut}"), fontsize=9)
    fig.tight_layout()
    from hccc.compiler.backend.output_dir import save_figure
    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)


def plot_busbw(curves: dict[str, tuple[list[int], list[float]]], path: str | Path, *,
               title: str | None = None, bounds: dict[str, tuple[list[int], list[float]]] | None = None,
               cut_bound: tuple[list[int], list[float]] | None = None):
    """Bus bandwidth against size, one line per curve (``label -> (sizes in bytes, busbw GB/s)``),
    sizes on a log2 axis labelled as the command line writes them (``64K``, ``1.5M``), the y axis
    from 0; ``bounds`` (same keys) are drawn dashed in their curve's colour (the busbw each
    program's own bound on its time allows), ``cut_bound`` dotted in black (the busbw the
    cluster's cut bound allows any program of the collective). Returns (path, y-axis limits)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hccc.util.sizes import format_size

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ticks: set[int] = set()
    for label, (sizes, busbw) in curves.items():
        line, = ax.plot(sizes, busbw, marker="o", markersize=3, linewidth=1.2, label=label)
        ticks.update(int(s) for s in sizes)
        if bounds and label in bounds:
            bs, bb = bounds[label]
            ax.plot(bs, bb, linestyle="--", linewidth=0.9, color=line.get_color(), label=f"{label}: program bound")
    if cut_bound is not None and any(v == v for v in cut_bound[1]):
        ax.plot(cut_bound[0], cut_bound[1], linestyle=":", linewidth=1.1, color="black", label="cluster cut bound")
    ax.set_ylim(bottom=0)
    ax.set_xscale("log", base=2)
    shown = sorted(ticks)
    if len(shown) > 12:
        shown = shown[:: -(-len(shown) // 12)]
    ax.set_xticks(shown)
    ax.set_xticklabels([format_size(s) for s in shown], fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("size (B)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.grid(linestyle=":", linewidth=0.5)
    ax.legend(fontsize=7, frameon=False)
    ax.set_title(title or "bus bandwidth against size", fontsize=9)
    fig.tight_layout()
    ylim = ax.get_ylim()
    from hccc.compiler.backend.output_dir import save_figure
    try:
        return save_figure(fig, path), ylim
    finally:
        plt.close(fig)
