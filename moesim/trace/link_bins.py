"""Time bins of the link heat-map, on the step's true time axis.

The heat-map's columns are bins of one width, a round number of milliseconds (1, 2 or
5 × 10^k) chosen so that the step has at most ``bins`` of them (:func:`even_edges`;
the last bin ends with the step and may be shorter); each cell is the link's mean
utilization in its bin (bytes carried / (capacity × bin width)), so a column is as
wide as the time it stands for and the axis reads like the timeline's. A burst
shorter than a bin is averaged with the quiet around it: its height shows in the
link's peak utilization (:func:`peak_utilization`), which the figure prints per link.
Pure numpy.
"""

from __future__ import annotations

import math

import numpy as np

#: the bin widths tried, times a power of ten
NICE_STEPS = (1.0, 2.0, 5.0)


def nice_width(span: float, bins: int) -> float:
    """The smallest width 1, 2 or 5 × 10^k with ``span`` / width ≤ ``bins``."""
    if span <= 0 or bins < 1:
        raise ValueError(f"span {span} and bins {bins} must be positive")
    raw = span / bins
    exp = math.floor(math.log10(raw))
    for e in (exp, exp + 1):
        for m in NICE_STEPS:
            w = m * 10.0 ** e
            if w >= raw * (1 - 1e-12):
                return w
    return 10.0 ** (exp + 1)   # not reached: 1 × 10^(exp+1) ≥ raw


def even_edges(step_s: float, bins: int) -> np.ndarray:
    """Bin edges (s) from 0 to ``step_s``: multiples of :func:`nice_width` (in ms), the
    last edge ``step_s`` itself; at most ``bins`` bins. A zero-length step is one bin."""
    if step_s <= 0:
        return np.array([0.0, 0.0])
    w_ms = nice_width(step_s * 1e3, bins)
    n_full = int(math.floor(step_s * 1e3 / w_ms * (1 + 1e-12)))
    edges = [k * w_ms / 1e3 for k in range(n_full + 1)]
    if step_s - edges[-1] > 1e-9 * step_s:
        edges.append(step_s)
    else:
        edges[-1] = step_s
    return np.array(edges)


def peak_utilization(series: list[tuple[float, float]], capacity_Bps: float,
                     step_s: float) -> float:
    """Highest rate / capacity (0..) of a piecewise-constant series [(t_s, rate_Bps)]
    over [0, ``step_s``): the height of the tallest burst, however short."""
    if capacity_Bps <= 0:
        return 0.0
    rates = [r for t, r in series if t < step_s]
    return max(rates, default=0.0) / capacity_Bps


def binned_utilization(series: list[tuple[float, float]], capacity_Bps: float,
                       edges: np.ndarray) -> np.ndarray:
    """Mean utilization (0..1) in each bin between ``edges`` (s) of a piecewise-constant
    rate series [(t_s, rate_Bps), ...] (rate 0 before its first point): bytes carried in
    the bin / (capacity × bin width)."""
    pts = sorted(series)
    if not pts or capacity_Bps <= 0:
        return np.zeros(len(edges) - 1)
    t = np.array([p[0] for p in pts] + [max(edges[-1], pts[-1][0])], dtype=float)
    r = np.array([p[1] for p in pts], dtype=float)
    cum = np.concatenate([[0.0], np.cumsum(r * np.diff(t))])  # bytes carried up to t[k]
    carried = np.interp(edges, t, cum, left=0.0)
    return np.diff(carried) / (capacity_Bps * np.diff(edges))
