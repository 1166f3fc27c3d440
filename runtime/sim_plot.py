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

from hccc.runtime.sim_engine import K_RECV, K_REDUCE, K_SEND
from hccc.runtime.sim_model import SimProgram
from hccc.runtime.simulator import SimResult


def plot_timeline(result: SimResult, prog: SimProgram, path: str | Path, *, title: str | None = None,
                  max_rows: int = 48) -> Path:
    """Write the timeline of ``result`` (simulated with ``record=True``) to ``path`` (PNG/SVG/PDF)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tl = result.timeline
    if tl is None:
        raise ValueError("the result has no timeline (simulate with record=True)")
    G = prog.ntbs
    rows = np.arange(min(G, max_rows))
    npipe = int(prog.p_pipeline.max()) + 1 if prog.nprims else 1
    cmap = plt.get_cmap("tab20" if npipe > 10 else "tab10")
    fig_h = max(2.5, 0.28 * len(rows) + 1.6)
    fig, ax = plt.subplots(figsize=(12, fig_h), dpi=110)
    scale = 1e6
    styles = {K_SEND: dict(alpha=0.95, hatch=None), K_REDUCE: dict(alpha=0.95, hatch="///"),
              K_RECV: dict(alpha=0.35, hatch=None)}
    keep = tl.tb < len(rows)
    for kind, style in styles.items():
        m = keep & (tl.kind == kind)
        if not m.any():
            continue
        tb = tl.tb[m]
        t0 = tl.t0[m] * scale
        w = (tl.t1[m] - tl.t0[m]) * scale
        pipe = prog.p_pipeline[tl.prim[m]]
        colors = [cmap(int(p) % cmap.N) for p in pipe]
        ax.barh(tb, w, left=t0, height=0.8, color=colors, edgecolor="none", linewidth=0,
                alpha=style["alpha"], hatch=style["hatch"])
    labels = [f"r{int(prog.tb_rank[g])}/tb{int(prog.tb_local[g])}" for g in rows]
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
    cut = f" (first {len(rows)} of {G} TBs)" if G > len(rows) else ""
    ax.set_title(title or (f"{result.collective} on {result.nranks} ranks, {result.nbytes} bytes, "
                           f"{result.execution}-level: {result.time_us:.1f} us, busbw "
                           f"{result.busbw_GBps:.2f} GB/s{cut}"), fontsize=9)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
