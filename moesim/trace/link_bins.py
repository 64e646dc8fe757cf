"""Time bins of the link heat-map that follow the traffic.

Link traffic in a step comes in bursts (an all-to-all of microseconds, a gradient
bucket) between long quiet stretches; equal bins over the step average a burst with
the quiet around it, so a link at 100 % shows as a few percent and the heat-map is
mostly black. :func:`adaptive_edges` puts the bin edges where the rates change: every
change point of the links shown when there are at most ``bins`` intervals (the
heat-map is then exact: each cell is one constant rate), else every k-th change point
in time order, so bins are narrow where changes are dense (the bursts) and one quiet
stretch is one bin. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def adaptive_edges(series: Iterable[list[tuple[float, float]]], step_s: float,
                   bins: int) -> np.ndarray:
    """Bin edges (s, ascending, from 0 to ``step_s``, at most ``bins`` + 1) from the change
    points of piecewise-constant rate series [(t_s, rate_Bps), ...]."""
    pts = {0.0, float(step_s)}
    for s in series:
        pts.update(float(t) for t, _ in s if 0.0 < t < step_s)
    t = np.array(sorted(pts))
    if len(t) - 1 <= bins:
        return t
    idx = np.unique(np.linspace(0, len(t) - 1, bins + 1).round().astype(int))
    return t[idx]
