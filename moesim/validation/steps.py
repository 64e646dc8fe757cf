"""Training steps of a Kineto trace: the ``ProfilerStep#k`` spans the profiler wrote, or,
in a trace without them, synthetic ones found from its all-to-alls
(:func:`moesim.validation.collectives.training_steps`)."""

from __future__ import annotations

from typing import Any

from moesim.validation.collectives import training_steps
from moesim.validation.kineto import STEP_RE, SYNTHETIC_STEP_CAT, Event, x_events


def complete_events(doc: dict[str, Any], source: str) -> list[Event]:
    """The 'X' events of ``doc`` (:func:`moesim.validation.kineto.x_events`), with one
    synthetic ``ProfilerStep#k`` span per step where the trace has none."""
    out = x_events(doc, source)
    if not any(STEP_RE.fullmatch(ev.name) for ev in out):
        out = _with_synthetic_steps(out, len(doc["traceEvents"]), source)
    return out


def _with_synthetic_steps(events: list[Event], first_idx: int, source: str) -> list[Event]:
    """A trace without ``ProfilerStep`` spans (one plain ``with profile()`` around
    several training steps): add one span ``ProfilerStep#k`` per step found by
    :func:`moesim.validation.collectives.training_steps` (k = 0, 1, ... in trace order),
    on a thread of its own (tid ``moesim/steps``, cat ``moesim_synthetic_step``), so
    that every reader of the events sees the same steps. One step or none found: the
    events are returned unchanged (the whole trace is one step)."""
    spans = training_steps(events, source)
    if not spans:
        return events
    extra = [Event(first_idx + k, f"ProfilerStep#{k}", SYNTHETIC_STEP_CAT, "moesim/steps",
                   a, b - a, {}) for k, (a, b) in enumerate(spans)]
    return sorted(events + extra, key=lambda ev: (ev.start_s, -ev.dur_s, ev.idx))
