"""A time axis with the empty stretches cut out, for a timeline zoomed on some layers.

A layer runs once per micro-batch forward and once backward, spread over the whole
step: its spans alone, on the step's time axis, are a few slivers in a mostly empty
picture. :func:`squeeze_map` keeps the stretches where the filtered spans are (the
union of their intervals; gaps under :data:`KEEP_GAP_FRAC` of the extent kept) and
lays them side by side with a narrow separator; :func:`squeeze_spans` moves the spans
onto that axis; :func:`mark_cuts` draws the separators and puts the ticks at even
real times of the step (multiples of one round step, :func:`real_ticks`), labelled
with those times. Pure numpy apart from the drawing, which takes an Axes and
returns it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator

from moesim.trace.spans import Span

#: a gap shorter than this fraction of the spans' extent stays on the axis
KEEP_GAP_FRAC = 0.02
#: width of the separator between two kept stretches, as a fraction of the kept time
SEPARATOR_FRAC = 0.015
#: squeeze only where it removes at least this fraction of the extent
MIN_CUT_FRAC = 0.25
#: ticks closer than this fraction of the squeezed axis: the later one left out
MIN_TICK_GAP_FRAC = 0.04


@dataclasses.dataclass(frozen=True)
class TimeMap:
    """Piecewise-linear map of real step times (s) onto the squeezed axis (s):
    ``real[2k], real[2k+1]`` the k-th kept stretch, shown from ``shown[2k]``."""

    real: np.ndarray
    shown: np.ndarray

    def to_shown(self, t_s):
        return np.interp(t_s, self.real, self.shown)

    def to_real(self, x_s):
        return np.interp(x_s, self.shown, self.real)

    @property
    def cuts_s(self) -> list[float]:
        """Shown times of the separators' middles."""
        return [(self.shown[2 * k + 1] + self.shown[2 * k + 2]) / 2
                for k in range(len(self.real) // 2 - 1)]

    @property
    def removed_s(self) -> float:
        """Real time cut out."""
        return float(sum(self.real[2 * k + 2] - self.real[2 * k + 1]
                         for k in range(len(self.real) // 2 - 1)))


def kept_stretches(intervals: Iterable[tuple[float, float]], keep_gap_s: float
                   ) -> list[tuple[float, float]]:
    """The union of ``intervals`` (s), gaps of at most ``keep_gap_s`` closed."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1] + keep_gap_s:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def squeeze_map(spans: list[Span]) -> TimeMap | None:
    """The map that cuts the empty stretches out of ``spans``' extent, or None where
    that would remove less than :data:`MIN_CUT_FRAC` of it (nothing worth cutting)."""
    if not spans:
        return None
    t0 = min(s.start_s for s in spans)
    t1 = max(s.end_s for s in spans)
    extent = t1 - t0
    if extent <= 0:
        return None
    kept = kept_stretches(((s.start_s, s.end_s) for s in spans), KEEP_GAP_FRAC * extent)
    kept_s = sum(b - a for a, b in kept)
    if len(kept) < 2 or extent - kept_s < MIN_CUT_FRAC * extent:
        return None
    sep = SEPARATOR_FRAC * kept_s
    real, shown = [], []
    x = t0
    for a, b in kept:
        real += [a, b]
        shown += [x, x + (b - a)]
        x += (b - a) + sep
    return TimeMap(np.array(real), np.array(shown))


def squeeze_spans(spans: list[Span], m: TimeMap) -> list[Span]:
    """``spans`` with their times on the squeezed axis."""
    if not spans:
        return []
    a = m.to_shown(np.array([s.start_s for s in spans]))
    b = m.to_shown(np.array([s.end_s for s in spans]))
    return [dataclasses.replace(s, start_s=float(x), end_s=float(y))
            for s, x, y in zip(spans, a, b, strict=True)]


def real_ticks(m: TimeMap, n: int = 10) -> np.ndarray:
    """Real times (s) for the ticks of a squeezed axis: the multiples of one round step
    (1, 2, 2.5 or 5 × 10^k, about ``n`` over the kept time) that fall inside a kept
    stretch, so the labels read 0, 5, 10, ... (a tick just past a cut left out where it
    would print over the one before) however the
    stretches lie."""
    kept = float(sum(m.real[2 * k + 1] - m.real[2 * k] for k in range(len(m.real) // 2)))
    if kept <= 0:
        return np.array(m.real[:1])
    vals = MaxNLocator(nbins=n, steps=[1, 2, 2.5, 5, 10]).tick_values(0.0, kept * 1e3)
    step = float(vals[1] - vals[0]) / 1e3 if len(vals) > 1 else kept
    out: list[float] = []
    for k in range(len(m.real) // 2):
        a, b = float(m.real[2 * k]), float(m.real[2 * k + 1])
        first = np.ceil(a / step - 1e-9)
        out += [i * step for i in np.arange(first, np.floor(b / step + 1e-9) + 1)]
    ticks = np.array(sorted(set(np.round(out, 15)))) + 0.0   # no -0
    # two ticks either side of a cut would print on top of each other: keep the first
    shown = m.to_shown(ticks)
    gap = MIN_TICK_GAP_FRAC * float(m.shown[-1] - m.shown[0])
    keep: list[int] = []
    for i, x in enumerate(shown):
        if not keep or x - shown[keep[-1]] >= gap:
            keep.append(i)
    return ticks[keep]


def mark_cuts(ax: Axes, m: TimeMap) -> Axes:
    """Dashed separators where time was cut out (gid ``timeline:cut``), ticks at even
    real times of the step (:func:`real_ticks`) labelled in ms, and an x label saying
    that the axis is cut."""
    tr = ax.get_xaxis_transform()
    for x in m.cuts_s:
        ax.axvline(x * 1e3, color="#555555", lw=0.8, ls=(0, (2, 2)), zorder=3,
                   gid="timeline:cut")
        ax.text(x * 1e3, 1.0, "//", transform=tr, ha="center", va="center", fontsize=7,
                color="#555555", clip_on=False, gid="timeline:cut")
    ax.xaxis.set_major_locator(FixedLocator(m.to_shown(real_ticks(m)) * 1e3))
    ax.xaxis.set_major_formatter(FuncFormatter(
        lambda x, _pos: f"{float(m.to_real(x / 1e3)) * 1e3:.4g}"))
    ax.set_xlabel(f"time in step (ms); the {len(m.cuts_s)} stretches without these spans "
                  f"cut out at the dashed lines ({m.removed_s * 1e3:.4g} ms in all)")
    return ax
