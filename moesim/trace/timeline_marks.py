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
from matplotlib.transforms import Affine2D, ScaledTranslation, Transform, blended_transform_factory

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
PHASE_NAMES = {"fwd": "forward", "bwd": "backward"}
#: the strip above the rows: its bottom and top in points above the axes' top edge (a
#: fixed height whatever the figure's, so a 64-rank timeline's strip is as thin as an
#: 8-rank one's and the title can be placed above it)
STRIP_PT = (3.0, 13.0)
#: the title's pad (points) above a timeline with a strip: clear of the strip's top
TITLE_PAD_PT = STRIP_PT[1] + 5.0
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


def _points_above_top(ax: Axes) -> Transform:
    """y in points above the top edge of ``ax`` (to display coordinates)."""
    return (Affine2D().scale(1.0, 1.0 / 72.0) + ax.figure.dpi_scale_trans
            + ScaledTranslation(0.0, 1.0, ax.transAxes))


def strip_transform(ax: Axes) -> Transform:
    """x in data (ms), y in points above the top edge of ``ax``."""
    return blended_transform_factory(ax.transData, _points_above_top(ax))


def mark_layers(ax: Axes, spans: list[Span], rank: int, t0_ms: float, t1_ms: float,
                segs: list[tuple[str, int, float, float]] | None = None) -> Axes:
    """A strip above the rows (:data:`STRIP_PT`): one box per layer run of ``rank``
    (forward light blue, backward orange; ``segs`` from :func:`layer_segments` if already
    at hand), labelled ``L<layer>`` where it is wide enough, and thin vertical lines at
    the layer boundaries across the rows (gid ``layers:strip``)."""
    segs = layer_segments(spans, rank) if segs is None else segs
    if not segs:
        return ax
    span_ms = max(t1_ms - t0_ms, 1e-12)
    tr = strip_transform(ax)
    y0, y1 = STRIP_PT
    boxes, colors = [], []
    for ph, layer, a, b in segs:
        x0, x1 = a * 1e3, b * 1e3
        boxes.append(Rectangle((x0, y0), max(x1 - x0, span_ms * MIN_FRAC), y1 - y0))
        colors.append(PHASE_COLORS[ph])
        if (x1 - x0) / span_ms > 0.025:
            ax.text((x0 + x1) / 2, (y0 + y1) / 2, f"L{layer}", transform=tr,
                    ha="center", va="center", fontsize=6, clip_on=False, gid=LABEL_GID)
    coll = PatchCollection(boxes, facecolors=colors, edgecolors="white", linewidths=0.3,
                           transform=tr, clip_on=False)
    coll.set_gid("layers:strip")
    ax.add_collection(coll, autolim=False)
    if len(segs) <= 200:   # boundaries as guides; more would grey the picture out
        ax.vlines([a * 1e3 for _, _, a, _ in segs], 0, 1, transform=ax.get_xaxis_transform(),
                  colors="#999999", lw=0.3, alpha=0.5, zorder=0.5)
    right = blended_transform_factory(ax.transAxes, _points_above_top(ax))
    ax.text(1.0, (y0 + y1) / 2, f"  layers of rank {rank}", transform=right,
            ha="left", va="center", fontsize=6, clip_on=False, gid=LABEL_GID)
    return ax


def phase_handles(segs: list[tuple[str, int, float, float]]) -> list[Patch]:
    """Legend entries of the layer strip drawn from ``segs`` (:func:`layer_segments`):
    one per phase it shows (a forward-only step, such as a serving step, has no
    "backward" entry), none without a strip."""
    drawn = {ph for ph, *_ in segs}
    return [Patch(color=PHASE_COLORS[ph], label=f"{PHASE_NAMES[ph]} (strip: layer)")
            for ph in PHASE_COLORS if ph in drawn]
