"""Pipeline schedules (GPipe, 1F1B, interleaved 1F1B) and a pure executor.

A schedule is, for every stage, the ordered list of :class:`PipeOp` it runs:
forward or backward of one micro-batch on one model chunk (``chunk`` is the
virtual stage, 0 unless interleaved). :func:`simulate_pipeline` runs such an
order with given per-op times and returns the busy intervals of every stage and
the step time; the engine uses it as a cross-check, the tests to prove the
published bubble formulas (GPipe arXiv:1811.06965; Megatron-LM SC'21
arXiv:2104.04473 §2.2):

- GPipe and 1F1B: bubble = (p-1)/(m+p-1) of the step;
- interleaved 1F1B with v chunks per rank: the bubble time is divided by v,
  i.e. (p-1)/v / (m + (p-1)/v) of the step;
- activations alive: GPipe m micro-batches on every stage, 1F1B p-s on stage s.

Orders follow Megatron-LM (``megatron/core/pipeline_parallel/schedules.py``):
1F1B warm-up is p-s-1 forwards; interleaved warm-up is 2(p-s-1) + (v-1)p
forward chunks, and interleaving requires m % p == 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

KINDS = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True, slots=True)
class PipeOp:
    kind: str       # "F" or "B"
    mb: int         # micro-batch index
    chunk: int = 0  # model chunk (virtual stage) on this rank

    def __str__(self) -> str:
        return f"{self.kind}{self.mb}" + (f".{self.chunk}" if self.chunk else "")


Order = list[list[PipeOp]]


def _check(p: int, m: int, v: int = 1) -> None:
    for name, x in (("stages", p), ("microbatches", m), ("virtual chunks", v)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a positive integer, got {x!r}")


def gpipe_order(p: int, m: int) -> Order:
    """All forwards, then all backwards, on every stage."""
    _check(p, m)
    return [[PipeOp("F", i) for i in range(m)] + [PipeOp("B", i) for i in range(m)]
            for _ in range(p)]


def one_f_one_b_order(p: int, m: int) -> Order:
    """Megatron's non-interleaved 1F1B: p-s-1 warm-up forwards, steady 1F1B, cool-down."""
    _check(p, m)
    order: Order = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops = [PipeOp("F", i) for i in range(warm)]
        for i in range(m - warm):
            ops += [PipeOp("F", warm + i), PipeOp("B", i)]
        ops += [PipeOp("B", i) for i in range(m - warm, m)]
        order.append(ops)
    return order


def check_interleaved(p: int, m: int) -> None:
    """The interleaved schedule's table needs m to be a multiple of p."""
    if m % p:
        raise ValueError(f"interleaved schedule needs microbatches ({m}) to be a multiple of "
                         f"pipeline stages ({p})")


def interleaved_op(p: int, v: int, kind: str, k: int) -> PipeOp:
    """The k-th forward (``kind`` F) or backward (B) of a rank in Megatron's interleaved
    table: micro-batches in groups of p, chunks in order (reversed for backwards)."""
    group, pos = divmod(k, p * v)
    chunk = pos // p
    if kind == "B":
        chunk = v - 1 - chunk
    return PipeOp(kind, group * p + pos % p, chunk)


def interleaved_order(p: int, m: int, v: int) -> Order:
    """Megatron's interleaved 1F1B with ``v`` model chunks per rank (m % p == 0)."""
    _check(p, m, v)
    if v == 1:
        return one_f_one_b_order(p, m)
    check_interleaved(p, m)
    total = m * v

    def op(kind: str, k: int) -> PipeOp:
        return interleaved_op(p, v, kind, k)

    order: Order = []
    for s in range(p):
        if m == p:  # Megatron: all warm-up when there are exactly p micro-batches
            warm = total
        else:
            warm = min((p - s - 1) * 2 + (v - 1) * p, total)
        ops = [op("F", k) for k in range(warm)]
        for i in range(total - warm):
            ops += [op("F", warm + i), op("B", i)]
        ops += [op("B", k) for k in range(total - warm, total)]
        order.append(ops)
    return order


def make_order(kind: str, p: int, m: int, v: int = 1) -> Order:
    """Order for ``kind`` in :data:`KINDS`."""
    if kind == "gpipe":
        return gpipe_order(p, m)
    if kind == "1f1b":
        return one_f_one_b_order(p, m)
    if kind == "interleaved":
        return interleaved_order(p, m, v)
    raise ValueError(f"pipeline schedule kind must be one of {KINDS}, got {kind!r}")


@dataclass(frozen=True)
class PipelineRun:
    """Result of :func:`simulate_pipeline`; times in seconds from step start."""

    busy: tuple[tuple[tuple[float, float, PipeOp], ...], ...]  # per stage (start, end, op)
    step_time_s: float

    @property
    def busy_s(self) -> list[float]:
        return [sum(e - s for s, e, _ in st) for st in self.busy]

    @property
    def bubble_fraction(self) -> float:
        """Idle share of (stages x step time)."""
        if self.step_time_s <= 0:
            return 0.0
        return 1.0 - sum(self.busy_s) / (len(self.busy) * self.step_time_s)


def _per_stage(t: float | Sequence[float], p: int, name: str) -> list[float]:
    if isinstance(t, int | float):
        return [float(t)] * p
    ts = [float(x) for x in t]
    if len(ts) != p:
        raise ValueError(f"{name} needs one time per stage ({p}), got {len(ts)}")
    return ts


def simulate_pipeline(order: Order, t_f: float | Sequence[float], t_b: float | Sequence[float],
                      p2p_s: float = 0.0) -> PipelineRun:
    """Run ``order`` with per-op times (seconds; per stage if a sequence).

    ``t_f``/``t_b`` are the time of one forward/backward op on a stage (for
    interleaved orders, of one chunk). Each stage runs its ops in order; an op
    starts when its stage is free and its input is ready: a forward needs the
    same chunk's forward on the previous stage (or, on stage 0, the previous
    chunk's forward on the last stage); a backward needs the next stage's
    backward (or, on the last stage, the next chunk's backward on stage 0, or
    its own forward). Crossing stages costs ``p2p_s``. Raises ValueError if the
    order deadlocks or is incomplete.
    """
    p = len(order)
    tf, tb = _per_stage(t_f, p, "t_f"), _per_stage(t_b, p, "t_b")
    v = 1 + max((o.chunk for ops in order for o in ops), default=0)
    end: dict[tuple[int, PipeOp], float] = {}
    ptr = [0] * p
    free = [0.0] * p
    busy: list[list[tuple[float, float, PipeOp]]] = [[] for _ in range(p)]

    def dep(s: int, o: PipeOp) -> tuple[int, PipeOp] | None:
        if o.kind == "F":
            if s > 0:
                return s - 1, o
            return (p - 1, PipeOp("F", o.mb, o.chunk - 1)) if o.chunk > 0 else None
        if s < p - 1:
            return s + 1, o
        if o.chunk < v - 1:
            return 0, PipeOp("B", o.mb, o.chunk + 1)
        return s, PipeOp("F", o.mb, o.chunk)

    remaining = sum(len(ops) for ops in order)
    while remaining:
        progressed = False
        for s in range(p):
            while ptr[s] < len(order[s]):
                o = order[s][ptr[s]]
                d = dep(s, o)
                if d is not None and d not in end:
                    break
                ready = 0.0 if d is None else end[d] + (p2p_s if d[0] != s else 0.0)
                if o.kind == "B" and (s, PipeOp("F", o.mb, o.chunk)) not in end:
                    break
                start = max(free[s], ready)
                stop = start + (tf[s] if o.kind == "F" else tb[s])
                end[(s, o)] = stop
                free[s] = stop
                busy[s].append((start, stop, o))
                ptr[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {s: str(order[s][ptr[s]]) for s in range(p) if ptr[s] < len(order[s])}
            raise ValueError(f"pipeline order deadlocks; stages wait at {stuck}")
    for s in range(p):
        for k in ("F", "B"):
            missing = {(o.mb, o.chunk) for o in order[0] if o.kind == k} ^ \
                      {(o.mb, o.chunk) for o in order[s] if o.kind == k}
            if missing:
                raise ValueError(f"stage {s} runs a different set of {k} ops than stage 0")
    return PipelineRun(tuple(tuple(b) for b in busy), max(free, default=0.0))


def inflight_microbatches(order: Order) -> list[int]:
    """Per stage, the most (micro-batch, chunk) activation sets alive at once
    (forward done, backward not yet). For v = 1 these are micro-batches; for an
    interleaved order each counts one chunk (1/v of the stage's layers)."""
    out = []
    for ops in order:
        alive = peak = 0
        for o in ops:
            alive += 1 if o.kind == "F" else -1
            peak = max(peak, alive)
        out.append(peak)
    return out
