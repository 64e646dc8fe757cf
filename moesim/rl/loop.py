"""The RL step loop over time: which pool does which phase when, and with which policy
version (pure arithmetic over phase durations; no engine, no simpy).

Versions: the policy after ``v`` optimizer steps of RL steps is version ``v`` (version 0 at
the start). RL step ``s`` trains on batch ``s`` and publishes version ``s + 1``; the
rollout pool generates batch ``s`` with the version it holds, which must be at least
``s - max_lag`` (the sample's lag, ``s - version``, is at most ``max_lag``).

The trainer's phases are the algorithm's (:mod:`moesim.rl.algorithms`; GRPO: reward,
old-policy and reference log-probs, then training), in :attr:`StepDurations.trainer`.

**Disaggregated** (two pools): the trainer runs its phases on batch ``s`` once it is
generated (scoring it, then training it), publishes version ``s + 1`` and
takes part in its weight sync, which needs the rollout pool between two generations. The
rollout pool, when free, first loads a published version newer than its own (the sync),
else generates the next batch if its version is recent enough, else waits for the next
version. ``max_lag: 0`` is the synchronous loop: step = generate + score + train + sync.

**Partial rollouts** (disaggregated, ``max_lag >= 1``, :func:`schedule_partial`): a
weight sync does not wait for the generation in flight: it starts when the trainer
publishes, pausing the generation; the unfinished samples continue under the new version
afterwards (their KV cache recomputed, or with ``kv_after_sync: keep`` kept, the sync then
starting at the engines' next step boundary). A sample's lag counts its oldest version.

**Colocated** (one pool, ``max_lag`` 0): generate, switch to training (onload of the
optimizer states), the trainer's phases, switch back (offload), weight hand-over, in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepDurations:
    """Wall time of each phase of one RL step (s): ``trainer``, the algorithm's trainer
    phases in the order they run (the last, the policy update, always on the timeline;
    another of 0 s is left out)."""

    generate: float
    trainer: dict[str, float]
    weight_sync: float
    switch_in: float = 0.0      # colocated: rollout -> training (onload)
    switch_out: float = 0.0     # colocated: training -> rollout (offload)

    def of(self, phase: str) -> float:
        """A phase's wall time (``switch``: both switches; a phase the algorithm does
        not have: 0)."""
        if phase == "switch":
            return self.switch_in + self.switch_out
        if phase in ("generate", "weight_sync"):
            return getattr(self, phase)
        return self.trainer.get(phase, 0.0)

    def trainer_spans(self) -> list[tuple[str, float]]:
        """(phase, s) of the trainer phases the timeline shows, in order."""
        items = list(self.trainer.items())
        return [(p, d) for i, (p, d) in enumerate(items) if d > 0 or i == len(items) - 1]


@dataclass
class Span:
    pool: str                   # rollout | train (colocated: both are the one pool)
    phase: str                  # generate, weight_sync, switch or a trainer phase
    step: int
    start_s: float
    end_s: float
    version: int | None = None  # generate: the policy version it ran; weight_sync: loaded


@dataclass
class Timeline:
    spans: list[Span] = field(default_factory=list)
    #: per step: the policy version its batch was generated with
    gen_version: list[int] = field(default_factory=list)
    #: per step: when its weight sync (version step + 1 on the rollout pool) ended
    step_end_s: list[float] = field(default_factory=list)
    gen_start_s: list[float] = field(default_factory=list)
    #: partial rollouts: per step, each sample's version at its first and its last token
    first_version: list | None = None
    last_version: list | None = None

    @property
    def makespan_s(self) -> float:
        return max((sp.end_s for sp in self.spans), default=0.0)

    def lags(self) -> list[int]:
        return [s - v for s, v in enumerate(self.gen_version)]


def schedule(durs: list[StepDurations], max_lag: int, colocated: bool) -> Timeline:
    if colocated:
        if max_lag:
            raise ValueError("a colocated pool runs with max_lag 0")
        return _colocated(durs)
    return _disaggregated(durs, max_lag)


def _colocated(durs: list[StepDurations]) -> Timeline:
    tl = Timeline()
    t = 0.0
    for s, d in enumerate(durs):
        tl.gen_version.append(s)
        tl.gen_start_s.append(t)
        order = [("rollout", "generate", d.generate)]
        order += [("train", "switch", d.switch_in)] if d.switch_in > 0 else []
        order += [("train", p, dur) for p, dur in d.trainer_spans()]
        order += [("train", "switch", d.switch_out)] if d.switch_out > 0 else []
        order += [("rollout", "weight_sync", d.weight_sync)]
        for pool, phase, dur in order:
            ver = s if phase == "generate" else s + 1 if phase == "weight_sync" else None
            tl.spans.append(Span(pool, phase, s, t, t + dur, ver))
            t += dur
        tl.step_end_s.append(t)
    return tl


def _disaggregated(durs: list[StepDurations], k: int) -> Timeline:
    n = len(durs)
    tl = Timeline(gen_version=[0] * n, step_end_s=[0.0] * n, gen_start_s=[0.0] * n)
    t_roll = t_train = 0.0
    loaded = 0                 # version on the rollout pool
    next_gen = next_train = 0
    gen_end: dict[int, float] = {}
    waiting: tuple[int, float] | None = None   # (version, published at) awaiting its sync
    while next_train < n or waiting is not None:
        if waiting is None and next_train < n and next_train in gen_end:
            s, d = next_train, durs[next_train]
            t = max(t_train, gen_end[s])
            for phase, dur in d.trainer_spans():
                tl.spans.append(Span("train", phase, s, t, t + dur))
                t += dur
            t_train = t
            waiting = (s + 1, t)
            next_train += 1
            continue
        can_gen = next_gen < n and loaded >= next_gen - k
        if waiting is not None and (waiting[1] <= t_roll or not can_gen):
            v, pub = waiting
            t = max(t_roll, pub)
            end = t + durs[v - 1].weight_sync
            tl.spans.append(Span("rollout", "weight_sync", v - 1, t, end, v))
            tl.spans.append(Span("train", "weight_sync", v - 1, t, end, v))
            t_roll = t_train = end
            loaded = v
            tl.step_end_s[v - 1] = end
            waiting = None
            continue
        if not can_gen:    # cannot happen: the trainer is waiting for this batch
            raise RuntimeError("RL loop stalled")
        s = next_gen
        tl.gen_version[s] = loaded
        tl.gen_start_s[s] = t_roll
        end = t_roll + durs[s].generate
        tl.spans.append(Span("rollout", "generate", s, t_roll, end, loaded))
        gen_end[s] = t_roll = end
        next_gen += 1
    return tl


def schedule_partial(durs: list[StepDurations], max_lag: int, rollout,
                     keep_kv: bool = False) -> Timeline:
    """The disaggregated loop with partial rollouts. ``durs[s].generate`` is ignored:
    ``rollout(s, version)`` starts step ``s``'s generation (a
    :class:`moesim.rl.generate.Rollout`, on its own clock from 0) and this loop pauses it
    at every weight sync that starts before it ends (``keep_kv``: the sync waits for the
    engines' steps in flight, the samples keep their KV caches; the trainer, which
    published, waits with it). Returns the timeline; each step's Rollout is left in
    ``tl.rollouts``."""
    n, k = len(durs), max_lag
    tl = Timeline(gen_version=[0] * n, step_end_s=[0.0] * n, gen_start_s=[0.0] * n,
                  first_version=[None] * n, last_version=[None] * n)
    tl.rollouts = [None] * n
    pub: dict[int, tuple[float, float]] = {}     # version -> (sync start, sync end)
    t = t_train = 0.0
    loaded = 0

    def sync(v: int) -> None:
        a, b = pub[v]
        tl.spans.append(Span("rollout", "weight_sync", v - 1, a, b, v))
        tl.spans.append(Span("train", "weight_sync", v - 1, a, b, v))
        tl.step_end_s[v - 1] = b

    for s in range(n):
        while loaded + 1 in pub and (pub[loaded + 1][0] <= t or loaded < s - k):
            loaded += 1                 # a sync before this generation (or awaited)
            sync(loaded)
            t = max(t, pub[loaded][1])
        tl.gen_version[s] = loaded
        tl.gen_start_s[s] = t
        ro = tl.rollouts[s] = rollout(s, loaded)
        seg, ver = 0.0, loaded          # the generation's segments between syncs
        while loaded + 1 in pub and not ro.run_until(pub[loaded + 1][0] - t):
            a, b = pub[loaded + 1]
            start = ro.pause(a - t, b - a, loaded + 1, keep_kv)
            if start is None:           # the steps in flight finished the generation:
                done_s = t + ro.finish().time_s     # the sync follows it
                if done_s > a:
                    pub[loaded + 1] = (done_s, done_s + (b - a))
                    t_train = max(t_train, done_s + (b - a))
                break
            loaded += 1
            if t + start > a:           # the sync began at the engines' step boundary
                a, b = pub[loaded] = (t + start, t + start + (b - a))
                t_train = max(t_train, b)
            tl.spans.append(Span("rollout", "generate", s, t + seg, a, ver))
            sync(loaded)
            seg, ver = b - t, loaded
        gen = ro.finish()
        end = t + gen.time_s
        tl.spans.append(Span("rollout", "generate", s, t + seg, end, ver))
        tl.first_version[s], tl.last_version[s] = ro.first_version, ro.last_version
        t = end
        d = durs[s]                     # the trainer: score and train, then publish
        u = max(t_train, end)
        for phase, dur in d.trainer_spans():
            tl.spans.append(Span("train", phase, s, u, u + dur))
            u += dur
        pub[s + 1] = (u, u + d.weight_sync)
        t_train = u + d.weight_sync
    while loaded < n:
        loaded += 1
        sync(loaded)
    return tl
