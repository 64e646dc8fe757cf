"""The request-level event loop (simpy): arrivals, the router, lockstep groups of
schedulers, and what is recorded over time.

A deployment is a list of *groups*; a group is the attention data-parallel ranks
(*members*, each with its own :class:`moesim.traffic.scheduler.Scheduler`) that step
together: with expert parallelism every member joins every layer's dispatch and combine,
so a step of the group lasts as long as its slowest member's (each member's batch priced
by the :class:`moesim.traffic.step_costs.StepCosts`; DeepSeek-V3 report §3.4.2 runs decode as one
EP group of attention-DP ranks). Without EP a group is one member (an independent replica).

:class:`LoadSim` is the generation engine for serving and for RL rollouts:
``submit(requests)`` (each arrives at its ``arrival_s``), ``run(until)``, ``interrupt()``
(a weight update: every unfinished request leaves with its progress, KV freed; the step
in flight is discarded), ``hold()`` / ``release(at)`` (a weight update between steps:
the steps in flight finish, the requests keep their KV caches), ``finished``.
Deterministic: no randomness inside.

Between events the loop skips (``skip=True``, the default): once a group has planned a
step in which its members only decode, the steps up to the next event (a request
finishing, a block boundary the free blocks cannot cover, an arrival at the group, a
weight update) are priced and applied in one move (:mod:`moesim.traffic.skip`) with the
stepwise loop's results: the same request times, KV blocks, peaks, series rows and
time-between-token statistics, float for float (tests/test_load_skip.py). ``skip=False``
steps one by one (and an ``on_step`` hook, which wants every step, implies it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import simpy

from moesim.traffic.balancer import make_balancer
from moesim.traffic.request import Request
from moesim.traffic.scheduler import Scheduler
from moesim.traffic.skip import DecodeRun, delay_to, plan_run

#: time-between-tokens histogram: log10 bins of 1/1000 decade from 1 us
_TBT_LO, _TBT_RES, _TBT_BINS = -6.0, 1000, 12_000


class LoadSim:
    """``groups``: member indices per lockstep group; ``schedulers``: one per member;
    ``costs``: a StepCosts; ``router``: a registered balancer's name
    (:data:`moesim.traffic.balancer.BALANCERS`);
    ``on_step(group, t, batches)``: optional hook after each step;
    ``series``: record (t, running, KV used fraction, queue) per group per step;
    ``skip``: skip between events (above); False steps one by one."""

    def __init__(self, costs, groups: list[list[int]], schedulers: list[Scheduler], *,
                 router: str = "least_outstanding", series: bool = True,
                 on_step: Callable | None = None, entry: list[int] | None = None,
                 skip: bool = True) -> None:
        self.env = simpy.Environment()
        self.costs = costs
        self.groups = groups
        self.members = schedulers
        self.group_of = {m: gi for gi, g in enumerate(groups) for m in g}
        self.router = make_balancer(router, schedulers)
        self.entry = entry            # members new requests may join (None: all)
        self.requests: list[Request] = []
        self.finished: list[Request] = []
        self.on_step = on_step
        self.handoff: Callable | None = None    # (request, member): a prefilled request
                                                # leaving a prefill-only rank
        self.record = series
        self.series: list[list[tuple]] = [[] for _ in groups]
        self.tbt_hist = np.zeros(_TBT_BINS, dtype=np.int64)
        self.tbt_sums = [0.0] * len(groups)     # per group, in its steps' order
        self.tbt_n = 0
        self.kv_peak = 0.0
        self.steps = 0
        self.skipped = 0              # of them, steps applied in a skipped run
        self._in = 0                  # requests in the system
        self._area = 0.0              # ∫ requests in system dt
        self._last = 0.0
        self._epoch = 0
        self._wake = [self.env.event() for _ in groups]
        self.skip = skip
        self._runs: list[DecodeRun | None] = [None] * len(groups)
        self._since: list[float | None] = [None] * len(groups)
        self._feeds: list[list] = []
        self._hold: simpy.Event | None = None     # a hold in progress (:meth:`hold`)
        self._parked: list[simpy.Event] = []
        for gi in range(len(groups)):
            self.env.process(self._group(gi))

    # ------------------------------------------------------------ public
    @property
    def now(self) -> float:
        return self.env.now

    @property
    def tbt_sum(self) -> float:
        """Sum of every time between tokens (s): the groups' sums, in group order."""
        return sum(self.tbt_sums)

    def submit(self, requests: Iterable[Request]) -> None:
        reqs = sorted(requests, key=lambda r: (r.arrival_s, r.id))
        self.requests += reqs
        st = [reqs, 0]                    # the requests, the next to arrive
        self._feeds.append(st)
        self.env.process(self._arrivals(st))

    def next_arrival(self) -> float:
        """When the next submitted request arrives (inf: none left)."""
        return min((rs[i].arrival_s for rs, i in self._feeds if i < len(rs)),
                   default=math.inf)

    def run(self, until: float | None = None) -> None:
        self.env.run(until=until)
        for run in self._runs:            # stopped in a skipped run: what has happened
            if run is not None:
                self._settle(run)
        self._tick()

    def interrupt(self) -> list[Request]:
        """Every unfinished request leaves (KV freed, progress kept on the request); the
        steps in flight are discarded."""
        self._epoch += 1
        for gi, run in enumerate(self._runs):
            if run is not None:
                self._settle(run)
                run.resume = float(run.T[run.in_flight(self.env.now)])
                self._runs[gi] = None
        out = []
        for m in self.members:
            out += m.remove_all()
        self._tick()
        self._in -= len(out)
        return out

    def hold(self) -> float:
        """A weight update applied between engine steps, the requests keeping their KV
        caches (NeMo RL's in-flight weight updates without KV recompute): every group
        finishes its step in flight and plans no new one. Runs to the moment the last
        group is at a step boundary and returns it; :meth:`release` lets them go on."""
        self._hold = self.env.event()
        self._parked = [self.env.event() for _ in self.groups]
        for gi in range(len(self.groups)):
            self.wake(gi)
        self.env.run(until=simpy.AllOf(self.env, self._parked))
        self._tick()
        return self.env.now

    def release(self, at: float) -> None:
        """End a :meth:`hold` at ``at`` (seconds): the groups plan their next steps then."""
        if at > self.env.now:
            self.env.run(until=at)
        held, self._hold = self._hold, None
        if held is not None:
            held.succeed()

    def mean_in_system(self, t_end: float | None = None) -> float:
        self._tick()
        t = self.env.now if t_end is None else t_end
        return self._area / t if t > 0 else 0.0

    # ------------------------------------------------------------ processes
    def _tick(self) -> None:
        now = self.env.now
        self._area += self._in * (now - self._last)
        self._last = now

    def _arrivals(self, st: list):
        reqs = st[0]
        since = -math.inf               # a process starts before the clock's other events
        for i, r in enumerate(reqs):
            if r.arrival_s > self.env.now:
                since = self.env.now
                yield self.env.timeout(r.arrival_s - self.env.now)
            self._tick()
            self._in += 1
            st[1] = i + 1
            self.admit(r, since=since)

    def admit(self, r: Request, eligible: list[int] | None = None, *,
              since: float | None = None) -> None:
        """Hand ``r`` to a member chosen by the router and wake its group (``since``:
        when the event that brought ``r`` was created, if known)."""
        m = self.router.pick(eligible if eligible is not None else self.entry)
        r.member = m
        self.members[m].add(r)
        self.wake(self.group_of[m], since)

    def wake(self, gi: int, since: float | None = None) -> None:
        if not self._wake[gi].triggered:
            self._since[gi] = since
            self._wake[gi].succeed()

    def _group(self, gi: int):
        env, g = self.env, self.groups[gi]
        scheds = self.members
        while True:
            if self._hold is not None:      # at a step boundary: wait out the hold
                if not self._parked[gi].triggered:
                    self._parked[gi].succeed()
                yield self._hold
                continue
            if not any(scheds[m].has_work() for m in g):
                self._wake[gi] = env.event()
                yield self._wake[gi]
                continue
            epoch = self._epoch
            pre = sum(scheds[m].preempted for m in g)
            batches = [(m, scheds[m].plan(env.now)) for m in g]
            self._leave([r for m in g for r in scheds[m].rejected])
            for m in g:
                scheds[m].rejected.clear()
            live = [b.seconds(self.costs) for _, b in batches if not b.empty]
            if not live:      # nothing can run until something arrives or frees blocks
                self._wake[gi] = env.event()
                yield self._wake[gi]
                continue
            self._kv_mark(g)
            run = None
            if (self.skip and self.on_step is None
                    and sum(scheds[m].preempted for m in g) == pre
                    and (len(self.groups) > 1        # (an arrival cuts a run at once:
                         or self.next_arrival() > env.now + 2 * max(live))):  # not worth it)
                run = plan_run(self.costs, batches, scheds, env.now, max(live))
            if run is None:
                yield env.timeout(max(live))
                if epoch != self._epoch:
                    continue
                self._step_done(gi, g, batches)
                continue
            # a run of identical decode steps: to its end, or to the step in flight when
            # something reaches the group (then replan there)
            # (the last step's end is an event created when that step starts, as the
            # stepwise loop creates it: same-time events keep their stepwise order)
            self._runs[gi] = run
            self._wake[gi] = woken = env.event()
            yield env.timeout(delay_to(env.now, float(run.T[-2]))) | woken
            if epoch == self._epoch:
                last = run.cut(env.now, self._since[gi]) if woken.triggered else run.K
                end = float(run.T[last])
                if end > env.now:
                    yield env.timeout(delay_to(env.now, end))
            if epoch != self._epoch:      # a weight update settled the run
                if run.resume > env.now:
                    yield env.timeout(delay_to(env.now, run.resume))
                continue
            self._runs[gi] = None
            self._apply(run, run.last - 1, run.last)
            self._step_done(gi, g, run.batches)

    def _step_done(self, gi: int, g: list[int], batches) -> None:
        """Apply a finished step's tokens (every member), record it."""
        env = self.env
        gaps: list[float] = []
        done = []
        for m, b in batches:
            for r in self.members[m].finish(b, env.now, gaps.append):
                if r.done or self.handoff is None:
                    done.append(r)
                else:
                    self.handoff(r, m)
        self.steps += 1
        self._tbt(gi, gaps)
        self._leave(done)
        if self.record:
            self._series(gi, g)
        if self.on_step is not None:
            self.on_step(gi, env.now, batches, done)

    # ------------------------------------------------------------ skipped runs
    def _settle(self, run: DecodeRun) -> None:
        """Bring a skipped run to the clock: steps ending before now applied, the step in
        flight planned (its blocks held), as the stepwise loop would have them."""
        j = run.in_flight(self.env.now)
        self._apply(run, j - 1, j)

    def _apply(self, run: DecodeRun, upto: int, planned: int) -> None:
        """Steps ``run.applied + 1 .. upto`` (none finishes a request) applied at once;
        blocks for the plans up to step ``planned``."""
        run.grow(planned)
        self.kv_peak = max(self.kv_peak, run.kv_fraction())
        a = run.applied
        if upto <= a:
            return
        gi = self.group_of[run.batches[0][0]]
        T = run.T
        n = upto - a
        reqs = [r for mb in run.members for r in mb.reqs]
        first = a + 1
        if a == 0:                      # step 1: each request's own gap
            t1 = float(T[1])
            self._tbt(gi, [t1 - r.last_token_s for r in reqs])
            first = 2
        if upto >= first:               # steps 2..: every gap the step's length
            g = T[first:upto + 1] - T[first - 1:upto]
            B = len(reqs)
            sums = np.full((len(g), B), g[:, None]).sum(axis=1)
            acc = self.tbt_sums[gi]
            for x in sums.tolist():
                acc += x
            self.tbt_sums[gi] = acc
            self.tbt_n += len(g) * B
            self.tbt_hist += np.bincount(_tbt_bins(g), minlength=_TBT_BINS) * B
        t = float(T[upto])
        for mb in run.members:
            for r, k, g0 in zip(mb.reqs, mb.k0.tolist(), mb.gen0.tolist(), strict=True):
                r.kv_tokens = k + upto
                r.generated = g0 + upto
                r.last_token_s = t
        self.steps += n
        self.skipped += n
        if self.record:
            steps = np.arange(a + 1, upto + 1)
            kv = np.full(n, run.others_kv)
            for mb in run.members:
                kv = np.maximum(kv, run.used_at(mb, steps) / mb.sched.kv.blocks)
            self.series[gi] += zip(T[a + 1:upto + 1].tolist(), [run.running0] * n,
                                   kv.tolist(), [run.waiting0] * n, strict=True)
        run.applied = upto

    # ------------------------------------------------------------ records
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

    def _tbt(self, gi: int, gaps: list[float]) -> None:
        if not gaps:
            return
        a = np.asarray(gaps)
        self.tbt_sums[gi] += float(a.sum())
        self.tbt_n += a.size
        self.tbt_hist += np.bincount(_tbt_bins(a), minlength=_TBT_BINS)

    def tbt_quantile(self, q: float) -> float:
        """Quantile of the time between tokens (to 0.23 % from the histogram)."""
        n = int(self.tbt_hist.sum())
        if n == 0:
            return 0.0
        i = int(np.searchsorted(np.cumsum(self.tbt_hist), math.ceil(q * n)))
        return float(10 ** (_TBT_LO + (i + 0.5) / _TBT_RES))


def _tbt_bins(a: np.ndarray) -> np.ndarray:
    return np.clip(((np.log10(np.maximum(a, 1e-12)) - _TBT_LO) * _TBT_RES).astype(np.int64),
                   0, _TBT_BINS - 1)
