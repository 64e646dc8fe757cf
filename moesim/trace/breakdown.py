"""Per-rank time breakdown of a step, computed from spans alone.

For each rank: seconds spent in spans of each kind (:data:`KINDS`), and ``idle``,
the time in ``[0, step_time_s]`` covered by none of the rank's spans. Compute and
communication streams overlap, so the kinds of one rank can add up to more than
the step time; ``busy_s`` is the union (``busy_s + idle = step_time_s``).
The step-level ``breakdown_s`` is the mean over ranks.
"""

from __future__ import annotations

from collections.abc import Iterable

from moesim.trace.spans import KINDS, Span

BREAKDOWN_KEYS = (*KINDS, "idle")


def _union_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    total = 0.0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def rank_breakdown(spans: Iterable[Span], n_ranks: int, step_time_s: float) -> list[dict]:
    """One dict per rank: ``{"rank", "breakdown_s": {kind: s, ..., "idle": s}, "busy_s"}``."""
    by_kind = [dict.fromkeys(KINDS, 0.0) for _ in range(n_ranks)]
    intervals: list[list[tuple[float, float]]] = [[] for _ in range(n_ranks)]
    for sp in spans:
        if not 0 <= sp.rank < n_ranks:
            continue
        by_kind[sp.rank][sp.kind] = by_kind[sp.rank].get(sp.kind, 0.0) + sp.dur_s
        intervals[sp.rank].append((sp.start_s, sp.end_s))
    out = []
    for r in range(n_ranks):
        busy = _union_length(intervals[r], 0.0, step_time_s)
        bd = dict(by_kind[r])
        bd["idle"] = max(0.0, step_time_s - busy)
        out.append({"rank": r, "breakdown_s": bd, "busy_s": busy})
    return out


def step_breakdown(per_rank: list[dict]) -> dict[str, float]:
    """Mean over ranks of each key of the per-rank breakdowns."""
    if not per_rank:
        return dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    keys = list(dict.fromkeys(k for pr in per_rank for k in pr["breakdown_s"]))
    return {k: sum(pr["breakdown_s"].get(k, 0.0) for pr in per_rank) / len(per_rank) for k in keys}
