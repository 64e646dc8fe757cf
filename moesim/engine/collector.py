"""Python's cyclic garbage collector paused while a step is simulated.

A step builds and keeps hundreds of thousands of small objects (ops, simpy events,
collective records), and CPython's collector scans every tracked object it holds each
time a generation fills: on ``mixtral-8x7b-64gpu`` with the exact engine, 1,893
collections that scanned the growing heap again and again and freed 1,854 objects in
all, for about 15 % of the run's CPU time (docs/network.md, "Whole exact steps").
The simulation itself makes almost no reference cycles (its objects are freed by
reference counting), so :func:`paused` turns the collector off for the
duration of one step and restores it after; cycles made meanwhile are collected by
the next collection after it. Nothing a run computes depends on it. The switch is
process-wide: steps simulated in threads at once (a threaded sweep) may run with the
collector on for part of the time, which costs only time.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused(freeze: bool = False) -> Iterator[None]:
    """Turn the cyclic collector off inside the block (if it was on), on again after.

    Re-enabled, the collector's first pass scans every object made in the block that is
    still alive (all of a step's results, once: about 0.3 s on the case above).
    ``freeze=True`` skips that pass by moving every object alive at the end into the
    collector's permanent generation (``gc.freeze``), where it is never scanned again:
    for a process that exits soon after, such as ``moesim run`` from the command line
    (not when its ``main`` is called in a process that goes on); those objects are still
    freed by reference counting, only reference cycles among them would stay."""
    was_on = gc.isenabled()
    if was_on:
        gc.disable()
    try:
        yield
    finally:
        if was_on:
            if freeze:
                gc.freeze()
            gc.enable()
