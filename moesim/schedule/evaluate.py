"""Stage-time evaluator: a dependency-respecting list scheduler over per-rank item
lists (pure), for DualPipe(V) orders and, converted, GPipe/1F1B orders.

Each rank runs its items in order, one at a time; an item starts when its rank is
free and every piece of work it needs is done elsewhere (communication takes no
time): the forward of (mb, s) needs the forward of (mb, s-1); the input-gradient
backward of (mb, s) needs its own forward and the input-gradient backward of
(mb, s+1); a weight gradient needs its own input-gradient backward. Durations are in
the README's units (deepseek-ai/DualPipe): ``F`` a forward chunk, ``B`` a *full*
backward chunk, ``W`` its weight-gradient part (so an input-gradient-only backward
takes ``B - W``), ``FB`` the overlapped forward-and-backward pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.schedule.dualpipe import DualOrder, Item
from moesim.schedule.pipeline import Order


@dataclass(frozen=True)
class Durations:
    F: float
    B: float          # full backward (input + weight gradient)
    W: float          # weight-gradient part of B
    FB: float         # forward and full backward of two micro-batches, overlapped

    def __post_init__(self) -> None:
        if not 0 <= self.W <= self.B:
            raise ValueError(f"need 0 <= W <= B, got W={self.W}, B={self.B}")

    def of(self, kind: str) -> float:
        return {"F": self.F, "BW": self.B, "B": self.B - self.W, "W": self.W,
                "F&B": self.FB}[kind]


@dataclass(frozen=True)
class Timeline:
    """``busy[rank]``: (start, end, item) in order; ``step``: the makespan."""

    busy: tuple[tuple[tuple[float, float, Item], ...], ...]
    step: float

    def busy_time(self, rank: int) -> float:
        return sum(e - s for s, e, _ in self.busy[rank])

    def idle(self, rank: int) -> float:
        """Time the rank does not compute within the step."""
        return self.step - self.busy_time(rank)


def from_pipeline(order: Order) -> list[list[Item]]:
    """A GPipe/1F1B order (``PipeOp``, one chunk per stage) as items: rank s runs
    stage s; a backward is a full backward."""
    if any(o.chunk for ops in order for o in ops):
        raise ValueError("only non-interleaved orders convert (one chunk per stage)")
    return [[Item("F" if o.kind == "F" else "BW", o.mb, s) for o in ops]
            for s, ops in enumerate(order)]


def evaluate(items, stages: int, t: Durations) -> Timeline:
    """Run per-rank ``items`` (a :class:`DualOrder` or a list of item lists) with
    durations ``t``; raises ValueError if the order deadlocks or a piece of work
    repeats."""
    if isinstance(items, DualOrder):
        stages, items = items.stages, items.items
    done: dict[tuple[str, int, int], float] = {}
    ptr = [0] * len(items)
    free = [0.0] * len(items)
    busy: list[list] = [[] for _ in items]

    def needs(kind: str, mb: int, s: int) -> list[tuple[str, int, int]]:
        if kind == "F":
            return [("F", mb, s - 1)] if s > 0 else []
        if kind == "B":
            return [("F", mb, s)] + ([("B", mb, s + 1)] if s < stages - 1 else [])
        return [("B", mb, s)]

    left = sum(len(x) for x in items)
    while left:
        moved = False
        for r, seq in enumerate(items):
            while ptr[r] < len(seq):
                it = seq[ptr[r]]
                own = set(it.parts())
                deps = [d for p in own for d in needs(*p) if d not in own]
                if any(d not in done for d in deps):
                    break
                start = max([free[r]] + [done[d] for d in deps])
                end = start + t.of(it.kind)
                for p in own:
                    if p in done:
                        raise ValueError(f"rank {r} repeats {p}")
                    done[p] = end
                busy[r].append((start, end, it))
                free[r] = end
                ptr[r] += 1
                left -= 1
                moved = True
        if not moved:
            stuck = {r: str(seq[ptr[r]]) for r, seq in enumerate(items) if ptr[r] < len(seq)}
            raise ValueError(f"order deadlocks; ranks wait at {stuck}")
    return Timeline(tuple(tuple(b) for b in busy), max(free, default=0.0))


def work_done(items) -> dict[tuple[str, int, int], int]:
    """How often each piece of work (F | B | W, mb, stage) appears in the order."""
    if isinstance(items, DualOrder):
        items = items.items
    out: dict[tuple[str, int, int], int] = {}
    for seq in items:
        for it in seq:
            for p in it.parts():
                out[p] = out.get(p, 0) + 1
    return out
