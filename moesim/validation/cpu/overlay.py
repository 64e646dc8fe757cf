"""Timeline image overlaying measured and simulated spans, two rows per rank.

Pure matplotlib on an Axes (no pyplot state): colours follow
:data:`moesim.trace.plots.KIND_COLORS`; ``stall`` (red) is time spent in an all-to-all
waiting for a peer — simulated: the executor's stall spans; measured: a collective's
duration beyond the fastest rank's duration of the same collective.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.patches import Patch

from moesim.trace.plots import KIND_COLORS
from moesim.trace.spans import Span

_ROW_H = 0.8


def plot_overlay(measured: Sequence[Span], simulated: Sequence[Span], ax: Axes,
                 world: int, title: str = "", sim_offset_s: float = 0.0) -> Axes:
    """Draw rank r's measured spans on row 2r and simulated ones on row 2r+1 (ms on x).
    ``sim_offset_s`` shifts the simulated spans (to start where the measured ops start)."""
    labels = []
    for r in range(world):
        for row, (spans, shift, what) in enumerate(((measured, 0.0, "measured"),
                                                   (simulated, sim_offset_s, "simulated"))):
            y = 2 * r + row
            labels.append(f"rank {r} {what}")
            by_kind: dict[str, list[tuple[float, float]]] = {}
            for s in spans:
                if s.rank == r and s.end_s > s.start_s:
                    by_kind.setdefault(s.kind, []).append(((s.start_s + shift) * 1e3,
                                                           s.dur_s * 1e3))
            for kind, bars in by_kind.items():
                ax.broken_barh(bars, (y - _ROW_H / 2, _ROW_H),
                               facecolors=KIND_COLORS.get(kind, "#999999"),
                               edgecolor="none")
        if r:
            ax.axhline(2 * r - 0.5, color="#888888", lw=0.6)
    ax.set_yticks(range(2 * world), labels)
    ax.set_ylim(2 * world - 0.5, -0.5)
    ax.set_xlabel("time from step start (ms)")
    kinds = [k for k in ("compute", "ep_dispatch", "ep_combine", "stall")
             if any(s.kind == k for s in (*measured, *simulated))]
    names = {"stall": "stall (waiting for a peer)", "compute": "compute (GEMM, memory-bound)"}
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=names.get(k, k.replace("ep_", "")))
                       for k in kinds],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(kinds), frameon=False)
    if title:
        ax.set_title(title)
    ax.grid(axis="x", color="#dddddd", lw=0.5)
    ax.set_axisbelow(True)
    return ax
