"""Where each rank's step time went: compute, exposed communication by kind,
pipeline bubble, stall and idle. Pure numpy over spans.

Rule: at each instant of ``[0, step_time]`` a rank is in exactly one category.
What its compute stream is doing wins (compute, or a blocking collective, stall or
bubble on it); when the compute stream is free, a transfer on another stream is
*exposed* communication of its kind (first in ``COMM_KINDS`` order when several
overlap); otherwise the rank is idle. So per rank the categories sum to the step
time, and communication hidden under compute counts as compute.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from moesim.trace.spans import COMM_KINDS, KINDS, Span

CATEGORIES = (*KINDS, "idle")


def _merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(starts) == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def _covered(points: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of points inside any of the (merged, sorted) intervals."""
    if len(starts) == 0:
        return np.zeros(len(points), dtype=bool)
    i = np.searchsorted(starts, points, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(points), dtype=bool)
    out[ok] = ends[i[ok]] > points[ok]
    return out


def rank_breakdown(spans: Iterable[Span], step_time_s: float) -> dict[str, float]:
    """Seconds per category for one rank's spans over ``[0, step_time_s]``."""
    spans = [s for s in spans if s.end_s > s.start_s]
    out = dict.fromkeys(CATEGORIES, 0.0)
    if step_time_s <= 0:
        return out
    bounds = {0.0, float(step_time_s)}
    for s in spans:
        bounds.add(s.start_s)
        bounds.add(s.end_s)
    b = np.array(sorted(t for t in bounds if 0.0 <= t <= step_time_s))
    seg = np.diff(b)
    mid = (b[:-1] + b[1:]) / 2
    label = np.full(len(mid), -1, dtype=np.int64)

    primary = [s for s in spans if s.stream == "compute"]
    if primary:
        ps = np.array([s.start_s for s in primary])
        pe = np.array([s.end_s for s in primary])
        pk = np.array([CATEGORIES.index(s.kind) for s in primary])
        order = np.argsort(ps, kind="stable")
        ps, pe, pk = ps[order], pe[order], pk[order]
        i = np.searchsorted(ps, mid, side="right") - 1
        ok = i >= 0
        ok[ok] = pe[i[ok]] > mid[ok]
        label[ok] = pk[i[ok]]

    by_kind: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        if s.stream != "compute":
            by_kind[s.kind].append(s)
    for kind in (*COMM_KINDS, "stall", "bubble", "compute"):
        group = by_kind.get(kind)
        if not group:
            continue
        free = label < 0
        if not free.any():
            break
        ms, me = _merge(np.array([s.start_s for s in group]), np.array([s.end_s for s in group]))
        hit = free & _covered(mid, ms, me)
        label[hit] = CATEGORIES.index(kind)
    label[label < 0] = CATEGORIES.index("idle")
    sums = np.bincount(label, weights=seg, minlength=len(CATEGORIES))
    for k, v in zip(CATEGORIES, sums, strict=True):
        out[k] = float(v)
    return out


def breakdown(spans: Iterable[Span], n_ranks: int, step_time_s: float
              ) -> tuple[dict[str, float], list[dict[str, float]]]:
    """(mean over ranks, per rank) breakdown; each sums to ``step_time_s``."""
    per: list[list[Span]] = [[] for _ in range(n_ranks)]
    for s in spans:
        per[s.rank].append(s)
    rows = [rank_breakdown(p, step_time_s) for p in per]
    mean = {k: float(np.mean([r[k] for r in rows])) if rows else 0.0 for k in CATEGORIES}
    return mean, rows
