"""What a per-rank timeline needs besides its bars: minimum widths that keep short
communication visible at step scale (drawn pale and hatched, apart from the spans'
true widths, so a widened sliver does not read as time spent), each category's share
of the step for the legend, and a strip above the rows that marks where each layer's
forward and backward run.

Every drawing function takes a matplotlib Axes and returns it.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.collections import PatchCollection
from matplotlib.patches import Patch, Rectangle

from moesim.trace.spans import COMM_KINDS, Span

#: a bar is drawn at least this fraction of the time axis wide: ~1 pixel of a 14-inch
#: figure for compute and waits, ~4 pixels for communication, so an all-to-all of a
#: few microseconds in a step of seconds still shows as a sliver
MIN_FRAC = 1 / 1500
COMM_MIN_FRAC = 1 / 400

#: the widened part of a bar narrower than its minimum width: pale and hatched
WIDENED_ALPHA = 0.3
WIDENED_HATCH = "////"

PHASE_COLORS = {"fwd": "#9ECAE1", "bwd": "#FDAE6B"}
STRIP = (1.005, 1.045)   # the strip above the rows, in axes fractions (y)
LABEL_GID = "layers:label"   # gid of the strip's texts


def min_width_ms(kind: str, t0_ms: float, t1_ms: float) -> float:
    """Narrowest bar (ms) drawn for a span of ``kind`` on an axis from t0 to t1 ms."""
    frac = COMM_MIN_FRAC if kind in COMM_KINDS else MIN_FRAC
    return (t1_ms - t0_ms) * frac


def widened_handle(t0_ms: float, t1_ms: float) -> Patch:
    """Legend entry saying what a pale, hatched bar is."""
    comm = (t1_ms - t0_ms) * COMM_MIN_FRAC
    return Patch(facecolor=(0.5, 0.5, 0.5, WIDENED_ALPHA), edgecolor="#777777", lw=0,
                 hatch=WIDENED_HATCH,
                 label=f"pale, hatched: widened to be seen (comm.\ndrawn >= {comm:.3g} ms; "
                       "true width solid)")


def category_shares(per_rank: list[dict[str, float]], step_s: float) -> dict[str, float]:
    """Mean share (0..1) of the step per category over the rows ``per_rank`` (each a
    breakdown: seconds per category, exclusive, summing to the step)."""
    if not per_rank or step_s <= 0:
        return {}
    keys = dict.fromkeys(k for row in per_rank for k in row)
    return {k: sum(row.get(k, 0.0) for row in per_rank) / len(per_rank) / step_s
            for k in keys}


def share_label(kind: str, share: float | None) -> str:
    """``kind 12.3 %`` (``<0.1 %`` for a sliver), or ``kind`` without a share."""
    if share is None:
        return kind
    pct = share * 100
    return f"{kind} {pct:.1f} %" if pct >= 0.05 or pct == 0 else f"{kind} <0.1 %"


def layer_segments(spans: list[Span], rank: int) -> list[tuple[str, int, float, float]]:
    """(phase, layer, start_s, end_s) of the consecutive runs of ``rank``'s spans on its
    compute stream with the same (phase, layer, micro-batch), in time order; spans
    without a layer or a fwd/bwd phase end a run."""
    mine = sorted((s for s in spans if s.rank == rank and s.stream == "compute"),
                  key=lambda s: (s.start_s, s.end_s))
    out: list[tuple[str, int, float, float]] = []
    key = None
    for s in mine:
        k = (s.phase, s.layer, s.microbatch) if s.layer >= 0 and s.phase in PHASE_COLORS \
            else None
        if k is None:
            key = None
            continue
        if k == key:
            ph, layer, a, _ = out[-1]
            out[-1] = (ph, layer, a, max(out[-1][3], s.end_s))
        else:
            out.append((s.phase, s.layer, s.start_s, s.end_s))
            key = k
    return out


def mark_layers(ax: Axes, spans: list[Span], rank: int, t0_ms: float, t1_ms: float) -> Axes:
    """A strip above the rows: one box per layer run of ``rank`` (forward light blue,
    backward orange), labelled ``L<layer>`` where it is wide enough, and thin vertical
    lines at the layer boundaries across the rows (gid ``layers:strip``)."""
    segs = layer_segments(spans, rank)
    if not segs:
        return ax
    span_ms = max(t1_ms - t0_ms, 1e-12)
    tr = ax.get_xaxis_transform()
    boxes, colors = [], []
    for ph, layer, a, b in segs:
        x0, x1 = a * 1e3, b * 1e3
        boxes.append(Rectangle((x0, STRIP[0]), max(x1 - x0, span_ms * MIN_FRAC),
                               STRIP[1] - STRIP[0]))
        colors.append(PHASE_COLORS[ph])
        if (x1 - x0) / span_ms > 0.025:
            ax.text((x0 + x1) / 2, (STRIP[0] + STRIP[1]) / 2, f"L{layer}", transform=tr,
                    ha="center", va="center", fontsize=6, clip_on=False, gid=LABEL_GID)
    coll = PatchCollection(boxes, facecolors=colors, edgecolors="white", linewidths=0.3,
                           transform=tr, clip_on=False)
    coll.set_gid("layers:strip")
    ax.add_collection(coll, autolim=False)
    if len(segs) <= 200:   # boundaries as guides; more would grey the picture out
        ax.vlines([a * 1e3 for _, _, a, _ in segs], 0, 1, transform=tr, colors="#999999",
                  lw=0.3, alpha=0.5, zorder=0.5)
    ax.text(1.0, (STRIP[0] + STRIP[1]) / 2, f"  layers of rank {rank}", transform=ax.transAxes,
            ha="left", va="center", fontsize=6, clip_on=False, gid=LABEL_GID)
    return ax


def phase_handles() -> list[Patch]:
    """Legend entries of the layer strip."""
    return [Patch(color=PHASE_COLORS["fwd"], label="forward (strip: layer)"),
            Patch(color=PHASE_COLORS["bwd"], label="backward (strip: layer)")]
