"""Training steps of a Kineto trace: ``ProfilerStep#N`` spans, or, in a trace without
them, steps found from the forward/backward order of the token all-to-alls.

Kept apart from :mod:`moesim.validation.kineto.events` (plain events) and
:mod:`moesim.validation.cpu.collectives` (all-to-alls), which this module uses both.
"""

from __future__ import annotations

import bisect
import re
from typing import Any

from moesim.validation.cpu.collectives import find_collectives
from moesim.validation.kineto.events import (
    MATMUL_OPS,
    Event,
    ancestors,
    complete_events,
    is_backward_name,
)

#: name of the synthetic step spans added to traces without ``ProfilerStep`` spans
SYNTHETIC_STEP_CAT = "moesim_synthetic_step"
_STEP_RE = re.compile(r"ProfilerStep#(\d+)")


def step_events(doc: dict[str, Any], source: str) -> list[Event]:
    """:func:`moesim.validation.kineto.events.complete_events`, plus one synthetic
    ``ProfilerStep#k`` span per training step when the trace has no such spans
    (:func:`_with_synthetic_steps`)."""
    out = complete_events(doc, source)
    if not any(_STEP_RE.fullmatch(ev.name) for ev in out):
        out = _with_synthetic_steps(out, len(doc["traceEvents"]), source)
    return out


def _with_synthetic_steps(events: list[Event], first_idx: int, source: str) -> list[Event]:
    """A trace without ``ProfilerStep`` spans (one plain ``with profile()`` around
    several training steps): add one span ``ProfilerStep#k`` per step found by
    :func:`training_steps` (k = 0, 1, ... in trace order),
    on a thread of its own (tid ``moesim/steps``, cat ``moesim_synthetic_step``), so
    that every reader of the events sees the same steps. One step or none found: the
    events are returned unchanged (the whole trace is one step)."""
    spans = training_steps(events, source)
    if not spans:
        return events
    extra = [Event(first_idx + k, f"ProfilerStep#{k}", SYNTHETIC_STEP_CAT, "moesim/steps",
                   a, b - a, {}) for k, (a, b) in enumerate(spans)]
    return sorted(events + extra, key=lambda ev: (ev.start_s, -ev.dur_s, ev.idx))


def training_steps(events: list[Event], source: str) -> list[tuple[float, float]]:
    """Training steps of a trace without ``ProfilerStep`` spans, as (start, end) seconds.

    A token all-to-all is a backward one when the last op that started before it, among
    autograd ops (``autograd::engine::*``, ``*Backward*``) and matmuls not run inside
    one, is an autograd op (so one issued inside the autograd engine is); else a forward
    one. Each forward all-to-all that follows a backward one starts a new step. Step
    k ≥ 1 starts at the first matmul after the end of the previous step's last autograd
    op (the router, or whatever dense op precedes it), or at that end when there is
    none before the step's first forward all-to-all; step 0 starts at the trace's first
    event, the last step ends at its last. So the optimizer and input preparation after
    a backward belong to the step before, as they do under a profiler schedule. Fewer
    than two steps found: ``[]``. ``events`` sorted as :func:`moesim.validation.kineto.events.complete_events` returns."""
    if not events:
        return []
    colls = [c for c in find_collectives(events, None, source) if c.tokens]
    if len(colls) < 3:   # forward, backward, forward at the least
        return []
    anc = ancestors(events)
    bwd_idx = {e.idx for e in events if is_backward_name(e.name)}
    marks = sorted((e.start_s, e.idx in bwd_idx) for e in events
                   if e.idx in bwd_idx or (e.name in MATMUL_OPS
                                           and not any(a in bwd_idx for a in anc[e.idx])))
    times = [t for t, _ in marks]
    firsts: list[float] = []
    prev_bwd = False
    for c in sorted(colls, key=lambda c: c.issue.start_s):
        i = bisect.bisect_left(times, c.issue.start_s) - 1
        bwd = i >= 0 and marks[i][1]
        if not bwd and (prev_bwd or not firsts):
            firsts.append(c.issue.start_s)
        prev_bwd = bwd
    if len(firsts) < 2:
        return []
    bwd_spans = [(e.start_s, e.end_s) for e in events if e.idx in bwd_idx]
    mm_starts = sorted(e.start_s for e in events if e.name in MATMUL_OPS)
    starts = [min(e.start_s for e in events)]
    for f in firsts[1:]:
        prev_end = max((b for a, b in bwd_spans if a < f and b <= f), default=starts[-1])
        mm = [t for t in mm_starts if prev_end <= t < f]
        starts.append(mm[0] if mm else prev_end)
    ends = starts[1:] + [max(e.end_s for e in events)]
    return list(zip(starts, ends, strict=True))
