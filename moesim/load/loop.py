"""The request-level event loop (simpy): arrivals, the router, lockstep groups of
schedulers, and what is recorded over time.

A deployment is a list of *groups*; a group is the attention data-parallel ranks
(*members*, each with its own :class:`moesim.load.scheduler.Scheduler`) that step
together: with expert parallelism every member joins every layer's dispatch and combine,
so a step of the group lasts as long as its slowest member's (each member's batch priced
by the :class:`moesim.load.costs.StepCosts`; DeepSeek-V3 report §3.4.2 runs decode as one
EP group of attention-DP ranks). Without EP a group is one member (an independent replica).

:class:`LoadSim` is the generation engine for serving and for RL rollouts:
``submit(requests)`` (each arrives at its ``arrival_s``), ``run(until)``, ``interrupt()``
(a weight update: every unfinished request leaves with its progress, KV freed; the step
in flight is discarded), ``finished``. Deterministic: no randomness inside.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import simpy

from moesim.load.request import Request
from moesim.load.router import Router
from moesim.load.scheduler import Scheduler

#: time-between-tokens histogram: log10 bins of 1/1000 decade from 1 us
_TBT_LO, _TBT_RES, _TBT_BINS = -6.0, 1000, 12_000


class LoadSim:
    """``groups``: member indices per lockstep group; ``schedulers``: one per member;
    ``costs``: a StepCosts; ``router``: ``round_robin`` | ``least_outstanding``;
    ``on_step(group, t, batches)``: optional hook after each step;
    ``series``: record (t, running, KV used fraction, queue) per group per step."""

    def __init__(self, costs, groups: list[list[int]], schedulers: list[Scheduler], *,
                 router: str = "least_outstanding", series: bool = True,
                 on_step: Callable | None = None, entry: list[int] | None = None) -> None:
        self.env = simpy.Environment()
        self.costs = costs
        self.groups = groups
        self.members = schedulers
        self.group_of = {m: gi for gi, g in enumerate(groups) for m in g}
        self.router = Router(router, schedulers)
        self.entry = entry            # members new requests may join (None: all)
        self.requests: list[Request] = []
        self.finished: list[Request] = []
        self.on_step = on_step
        self.handoff: Callable | None = None    # (request, member): a prefilled request
                                                # leaving a prefill-only rank
        self.record = series
        self.series: list[list[tuple]] = [[] for _ in groups]
        self.tbt_hist = np.zeros(_TBT_BINS, dtype=np.int64)
        self.tbt_sum, self.tbt_n = 0.0, 0
        self.kv_peak = 0.0
        self.steps = 0
        self._in = 0                  # requests in the system
        self._area = 0.0              # ∫ requests in system dt
        self._last = 0.0
        self._epoch = 0
        self._wake = [self.env.event() for _ in groups]
        for gi in range(len(groups)):
            self.env.process(self._group(gi))

    # ------------------------------------------------------------ public
    @property
    def now(self) -> float:
        return self.env.now

    def submit(self, requests: Iterable[Request]) -> None:
        reqs = sorted(requests, key=lambda r: (r.arrival_s, r.id))
        self.requests += reqs
        self.env.process(self._arrivals(reqs))

    def run(self, until: float | None = None) -> None:
        self.env.run(until=until)
        self._tick()

    def interrupt(self) -> list[Request]:
        """Every unfinished request leaves (KV freed, progress kept on the request); the
        steps in flight are discarded."""
        self._epoch += 1
        out = []
        for m in self.members:
            out += m.remove_all()
        self._tick()
        self._in -= len(out)
        return out

    def mean_in_system(self, t_end: float | None = None) -> float:
        self._tick()
        t = self.env.now if t_end is None else t_end
        return self._area / t if t > 0 else 0.0

    # ------------------------------------------------------------ processes
    def _tick(self) -> None:
        now = self.env.now
        self._area += self._in * (now - self._last)
        self._last = now

    def _arrivals(self, reqs: list[Request]):
        for r in reqs:
            if r.arrival_s > self.env.now:
                yield self.env.timeout(r.arrival_s - self.env.now)
            self._tick()
            self._in += 1
            self.admit(r)

    def admit(self, r: Request, eligible: list[int] | None = None) -> None:
        """Hand ``r`` to a member chosen by the router and wake its group."""
        m = self.router.pick(eligible if eligible is not None else self.entry)
        r.member = m
        self.members[m].add(r)
        self.wake(self.group_of[m])

    def wake(self, gi: int) -> None:
        if not self._wake[gi].triggered:
            self._wake[gi].succeed()

    def _group(self, gi: int):
        env, g = self.env, self.groups[gi]
        while True:
            if not any(self.members[m].has_work() for m in g):
                self._wake[gi] = env.event()
                yield self._wake[gi]
                continue
            epoch = self._epoch
            batches = [(m, self.members[m].plan(env.now)) for m in g]
            self._leave([r for m in g for r in self.members[m].rejected])
            for m in g:
                self.members[m].rejected.clear()
            live = [b.seconds(self.costs) for _, b in batches if not b.empty]
            if not live:      # nothing can run until something arrives or frees blocks
                self._wake[gi] = env.event()
                yield self._wake[gi]
                continue
            self._kv_mark(g)
            yield env.timeout(max(live))
            if epoch != self._epoch:
                continue
            gaps: list[float] = []
            done = []
            for m, b in batches:
                for r in self.members[m].finish(b, env.now, gaps.append):
                    if r.done or self.handoff is None:
                        done.append(r)
                    else:
                        self.handoff(r, m)
            self.steps += 1
            self._tbt(gaps)
            self._leave(done)
            if self.record:
                self._series(gi, g)
            if self.on_step is not None:
                self.on_step(gi, env.now, batches, done)

    def _leave(self, done: list[Request]) -> None:
        if not done:
            return
        self._tick()
        self._in -= len(done)
        self.finished += done

    def _kv_mark(self, g: list[int]) -> None:
        for m in g:
            kv = self.members[m].kv
            self.kv_peak = max(self.kv_peak, kv.used / kv.blocks)

    def _series(self, gi: int, g: list[int]) -> None:
        ms = [self.members[m] for m in g]
        self.series[gi].append((self.env.now, sum(len(m.running) for m in ms),
                                max(m.kv.used / m.kv.blocks for m in ms),
                                sum(len(m.waiting) for m in ms)))

    def _tbt(self, gaps: list[float]) -> None:
        if not gaps:
            return
        a = np.asarray(gaps)
        self.tbt_sum += float(a.sum())
        self.tbt_n += a.size
        idx = np.clip(((np.log10(np.maximum(a, 1e-12)) - _TBT_LO) * _TBT_RES).astype(np.int64),
                      0, _TBT_BINS - 1)
        self.tbt_hist += np.bincount(idx, minlength=_TBT_BINS)

    def tbt_quantile(self, q: float) -> float:
        """Quantile of the time between tokens (to 0.23 % from the histogram)."""
        n = int(self.tbt_hist.sum())
        if n == 0:
            return 0.0
        i = int(np.searchsorted(np.cumsum(self.tbt_hist), math.ceil(q * n)))
        return float(10 ** (_TBT_LO + (i + 0.5) / _TBT_RES))
