"""Stall attribution and the critical path of a step.

The engine fills every stall span's ``waited_on`` (the late peer) and ``expert``
(the expert on it that made it late). Here they become a table (``stalls.csv``),
totals per blocking rank and per expert, a top list, and a critical-path walk
that says which ops and experts the step time is made of.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from moesim.trace.chrome import EndIndex, blocking_span, index_by_rank
from moesim.trace.result import SimResult
from moesim.trace.spans import Span

STALL_COLUMNS = ("rank", "layer", "microbatch", "phase", "seconds", "blocking_rank", "expert",
                 "tokens", "reason", "start_s", "op")
_WAIT_KINDS = ("stall", "bubble")
_TOL_S = 1e-9


def stall_table(result: SimResult) -> list[dict]:
    """One row per stall span, in (start, rank) order; ``seconds`` is its duration."""
    rows = []
    for sp in sorted((s for s in result.spans if s.kind == "stall"),
                     key=lambda s: (s.start_s, s.rank, s.layer, s.microbatch)):
        rows.append({"rank": sp.rank, "layer": sp.layer, "microbatch": sp.microbatch,
                     "phase": sp.phase, "seconds": sp.dur_s, "blocking_rank": sp.waited_on,
                     "expert": sp.expert, "tokens": sp.tokens, "reason": sp.reason,
                     "start_s": sp.start_s, "op": sp.name})
    return rows


def write_stalls_csv(rows: Iterable[dict], path: str | Path) -> Path:
    path = Path(path)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=STALL_COLUMNS, lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow({k: (repr(row[k]) if isinstance(row[k], float) else row[k])
                        for k in STALL_COLUMNS})
    return path


def stall_totals(rows: list[dict]) -> dict:
    """Seconds of stall in total, per blocking rank and per expert (keys as strings)."""
    by_rank: dict[str, float] = {}
    by_expert: dict[str, float] = {}
    for r in rows:
        by_rank[str(r["blocking_rank"])] = by_rank.get(str(r["blocking_rank"]), 0.0) + r["seconds"]
        by_expert[str(r["expert"])] = by_expert.get(str(r["expert"]), 0.0) + r["seconds"]
    order = lambda d: dict(sorted(d.items(), key=lambda kv: (-kv[1], kv[0])))  # noqa: E731
    return {"total_s": sum(r["seconds"] for r in rows), "by_blocking_rank": order(by_rank),
            "by_expert": order(by_expert), "count": len(rows)}


def stall_over_ranks(result: SimResult, rows: list[dict]) -> dict:
    """Stall seconds summed over EVERY rank: a rank with spans counts its stall spans
    (``rows``), a rank without (a mirror of identical replicas, a fast-path rank whose
    spans were not kept) its ``summary["per_rank"]`` breakdown stall, which is its
    representative's or its own exact total. So ``total_s`` >= the sum of the per-rank
    breakdown stalls, equal when no stall is hidden under compute."""
    have = {sp.rank for sp in result.spans}
    own: dict[int, float] = {}
    for r in rows:
        own[r["rank"]] = own.get(r["rank"], 0.0) + r["seconds"]
    per_rank = (result.summary or {}).get("per_rank") or []
    total = sum(own.get(r, 0.0) for r in have)
    filled = 0
    for row in per_rank:
        if row.get("rank") not in have:
            total += float((row.get("breakdown_s") or {}).get("stall", 0.0))
            filled += 1
    return {"total_s": total, "spans_total_s": sum(own.values()),
            "ranks_with_spans": len(have), "ranks_from_breakdown": filled}


def top_stalls(rows: list[dict], n: int = 10) -> list[dict]:
    """Stalls grouped by (layer, phase, blocking rank, expert), summed over waiting ranks
    and micro-batches, largest first; ``tokens`` the largest count among them and
    ``reason`` the cause text of a wait with that count (so the two agree)."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        key = (r["layer"], r["phase"], r["blocking_rank"], r["expert"])
        g = groups.setdefault(key, {"layer": r["layer"], "phase": r["phase"],
                                    "blocking_rank": r["blocking_rank"], "expert": r["expert"],
                                    "seconds": 0.0, "max_seconds": 0.0, "count": 0,
                                    "waiting_ranks": set(), "tokens": r["tokens"],
                                    "reason": r["reason"]})
        g["seconds"] += r["seconds"]
        g["max_seconds"] = max(g["max_seconds"], r["seconds"])
        g["count"] += 1
        g["waiting_ranks"].add(r["rank"])
        if r["tokens"] > g["tokens"]:
            g["tokens"], g["reason"] = r["tokens"], r["reason"]
    out = sorted(groups.values(), key=lambda g: (-g["seconds"], g["layer"], g["blocking_rank"]))
    for g in out:
        g["waiting_ranks"] = sorted(g["waiting_ranks"])
    return out[:n]


def _expert_key(sp: Span) -> str | None:
    if sp.kind != "compute":
        return None
    if sp.experts:
        return "+".join(str(e) for e in sp.experts)
    return str(sp.expert) if sp.expert >= 0 else None


def _predecessor(index: EndIndex, cur: Span, seen: set[int]) -> Span | None:
    """The latest span of ``index`` ending no later than ``cur`` starts (within tol); among
    equal ends, the same stream first, then work before waits."""
    best: Span | None = None
    for i in range(index.upto(cur.start_s + _TOL_S) - 1, -1, -1):
        sp = index.spans[i]
        if best is not None and sp.end_s < best.end_s - _TOL_S:
            break
        if id(sp) in seen or sp.start_s >= cur.start_s:
            continue
        if best is None or _pred_key(sp, cur) > _pred_key(best, cur):
            best = sp
    return best


def _pred_key(sp: Span, cur: Span) -> tuple:
    return (round(sp.end_s / _TOL_S), sp.stream == cur.stream, sp.kind not in _WAIT_KINDS)


def critical_path(result: SimResult) -> list[Span]:
    """Spans on the critical path, in time order.

    Start from the span that ends last; walk back through the same rank (the latest
    span ending no later than the current one starts, same stream preferred); at a
    stall or bubble with a known ``waited_on``, jump to the blocking rank's span that
    ended at the wait's end (the wait itself is then not on the path).
    """
    spans = [s for s in result.spans if s.end_s > s.start_s or s.kind not in _WAIT_KINDS]
    if not spans:
        return []
    by_rank = index_by_rank(spans)
    cur: Span | None = max(spans, key=lambda s: (s.end_s, s.kind not in _WAIT_KINDS, -s.rank,
                                                 s.start_s))
    path: list[Span] = []
    seen: set[int] = set()
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if cur.kind in _WAIT_KINDS and cur.waited_on in by_rank:
            blk = blocking_span(by_rank[cur.waited_on], cur.end_s, _TOL_S)
            if blk is not None and id(blk) not in seen and blk.end_s > cur.start_s:
                cur = blk
                continue
        path.append(cur)
        cur = _predecessor(by_rank[cur.rank], cur, seen)
    path.reverse()
    return path


def path_breakdown(result: SimResult, path: list[Span] | None = None) -> dict:
    """Seconds of the step on the critical path, by kind (plus ``idle`` for gaps) and by
    expert group; each span counts only the part not overlapped by its successor, so the
    kinds sum to the step time."""
    path = critical_path(result) if path is None else path
    by_kind: dict[str, float] = {}
    by_expert: dict[str, float] = {}
    ops: dict[str, float] = {}
    t = result.step_time_s
    for sp in reversed(path):
        end = min(sp.end_s, t)
        if end < t:
            by_kind["idle"] = by_kind.get("idle", 0.0) + (t - end)
        seg = max(0.0, end - sp.start_s)
        by_kind[sp.kind] = by_kind.get(sp.kind, 0.0) + seg
        key = _expert_key(sp)
        if key is not None:
            by_expert[key] = by_expert.get(key, 0.0) + seg
        label = f"rank {sp.rank} {sp.kind} {sp.name}" + (f" L{sp.layer}" if sp.layer >= 0 else "")
        ops[label] = ops.get(label, 0.0) + seg
        t = min(t, sp.start_s)
    if t > 0:
        by_kind["idle"] = by_kind.get("idle", 0.0) + t
    top_ops = sorted(ops.items(), key=lambda kv: -kv[1])[:10]
    return {"total_s": sum(by_kind.values()), "by_kind": by_kind, "by_expert": by_expert,
            "ranks": sorted({sp.rank for sp in path}),
            "top_ops": [{"op": k, "seconds": v} for k, v in top_ops], "n_spans": len(path)}
