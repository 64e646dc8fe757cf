"""Rollout generation on the engine replicas of the rollout pool: the step's samples run
on the serving issue's generation engine (:class:`moesim.traffic.loop.LoadSim` with vLLM's
continuous batching, :mod:`moesim.traffic.vllm`), all arriving at the start of generation.

An engine replica is one lockstep group of ``members`` attention-data-parallel ranks
(EP inside the replica: a step lasts as long as its slowest member's batch); each member
has ``kv_tokens`` of paged KV cache (counted over all layers; sliding-window layers
hold only their window, as vLLM's hybrid cache frees the rest) and runs at most
``max_batch`` sequences. Samples
are dealt to the members round robin. The scheduler admits while blocks are free,
allocates them as tokens arrive and preempts by recompute when the cache is full; step
times come from a :class:`moesim.traffic.step_costs.StepCosts` of one member.

The step's generation ends with its longest sample; ``long_tail_s`` is the time from
90 % of the samples done to the last. Where the step costs carry the worker's host work
after its last step (``worker_post_s``: :class:`moesim.rl.worker_post.PostProcessCosts`,
``rl.rollout.post_process``), each replica ends that much after its last sample and the
generation with the replica that ends last (the batch's ``generate()`` waits for every
worker); the samples' own finish times are the engines'. Where they carry
``prefix_group`` (:class:`moesim.rl.prefix_cache.PrefixCacheCosts`,
``rl.rollout.prefix_cache``), the samples are dealt in contiguous shards, one per member,
and a group's later samples on a member prefill only what vLLM's prefix cache does not
hold (the batch generation; not :func:`stream`).

**Streamed** (:func:`stream`; ``rl.generation: stream``): the steps' samples are one
queue in step order on the same engines, so a new prompt group starts as soon as a
sequence slot and KV blocks free up, instead of the next batch waiting for the slowest
sample of this one: NeMo RL's asynchronous trajectory collector keeps generating prompt
groups for the next target steps (up to ``max_trajectory_age_steps`` ahead) while the
trainer consumes earlier ones (NVIDIA-NeMo/RL 002cdc27
``nemo_rl/algorithms/async_utils/trajectory_collector.py``, ``AsyncTrajectoryCollector``
``_calculate_target_weights``, ``_collection_loop``). A step's generation is then the
engine time it adds: its last sample's finish minus the previous step's. With partial
rollouts (``rl.partial_rollouts``) the stream's engines pause for every weight update,
keeping their KV caches or recomputing them (``rl.kv_after_sync``): verl's fully
asynchronous rollouter (volcengine/verl ``verl/experimental/fully_async_policy``,
``partial_rollout: True``) and NeMo RL's collector with ``in_flight_weight_updates``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from moesim.traffic.deploy import build_sim
from moesim.traffic.request import Request
from moesim.traffic.step_costs import StepCosts


@dataclass
class Generation:
    time_s: float                       # start to the last sample's last token
    finish_s: np.ndarray                # per sample, from the start
    replica: np.ndarray                 # replica of each sample
    long_tail_s: float                  # 90 % of samples done -> last
    steps: int                          # engine steps (prefill and decode), all replicas
    preemptions: int = 0                # samples evicted for recompute, summed
    #: per replica: (t_s, running sequences, KV used fraction) where the batch changes
    series: list[list[tuple[float, int, float]]] = field(default_factory=list)
    #: the worker's host work after its last step on the replica that ends last
    #: (``worker_post_s``; 0 without it), included in ``time_s``
    post_s: float = 0.0
    #: a stream with in-flight weight updates: the syncs' pauses of the engines inside
    #: the time this step adds, included in ``time_s``
    paused_s: float = 0.0


def long_tail(finish_s: np.ndarray, fraction: float = 0.9) -> float:
    if not len(finish_s):
        return 0.0
    done = np.sort(finish_s)
    k = max(1, math.ceil(fraction * len(done)))
    return float(done[-1] - done[k - 1])


def _thin(series: list[tuple]) -> list[tuple[float, int, float]]:
    """LoadSim's per-step (t, running, KV fraction, queue) points where the running batch
    changes (a counter track needs no more), and the last."""
    out: list[tuple[float, int, float]] = [(0.0, 0, 0.0)]
    for t, running, kv, _ in series:
        if running != out[-1][1]:
            out.append((float(t), int(running), float(kv)))
    if series and out[-1][0] != series[-1][0]:
        t, running, kv, _ = series[-1]
        out.append((float(t), int(running), float(kv)))
    out.append((out[-1][0], 0, 0.0))
    return out


def generate(prompt: np.ndarray, response: np.ndarray, costs: StepCosts, replicas: int,
             kv_tokens: int, max_batch: int, members: int = 1, *,
             skip: bool = True, layer_windows: list[int] | None = None) -> Generation:
    """Generate ``response[i]`` tokens after ``prompt[i]`` for every sample on
    ``replicas`` engine replicas of ``members`` ranks with ``kv_tokens`` each
    (``skip``: the engine skips between events, the same results; False steps;
    ``layer_windows``: each layer's sliding window, 0 full attention, as
    :func:`moesim.traffic.deploy.windows_of` gives it: vLLM's hybrid KV cache, the blocks
    that leave a window freed)."""
    return Rollout(prompt, response, costs, replicas, kv_tokens, max_batch, members,
                   skip=skip, layer_windows=layer_windows).finish()


class Rollout:
    """A generation that weight updates may pause (partial rollouts): :meth:`pause` at
    ``t`` (seconds from the start) interrupts the engines (every unfinished sample leaves
    with its tokens, its KV cache freed, the step in flight dropped), waits ``dur_s``
    (the weight sync) and resubmits the unfinished samples, which recompute their KV
    cache (prompt and tokens so far) under the new ``version`` and continue; with
    ``keep_kv`` the engines finish their steps in flight, wait ``dur_s`` and go on with
    the KV caches they hold.
    ``first_version`` / ``last_version``: per sample, the policy version of its first
    token and of its last (a sample with no token before a pause starts under the new
    version)."""

    def __init__(self, prompt, response, costs: StepCosts, replicas: int, kv_tokens: int,
                 max_batch: int, members: int = 1, *, version: int = 0,
                 skip: bool = True, layer_windows: list[int] | None = None) -> None:
        prompt = np.asarray(prompt, dtype=np.int64)
        response = np.asarray(response, dtype=np.int64)
        self.members, self.costs, self.replicas = members, costs, replicas
        n = len(prompt)
        groups = [[r * members + i for i in range(members)] for r in range(replicas)]
        self.sim = build_sim(costs, groups, kv_tokens, scheduler="vllm", router="round_robin",
                             max_seqs=max_batch, layer_windows=layer_windows)
        self.sim.skip = skip
        self.reqs = _requests(prompt, response, getattr(costs, "prefix_group", None),
                              replicas * members)
        self.first_version = np.full(n, version, dtype=np.int64)
        self.last_version = np.full(n, version, dtype=np.int64)
        self.paused_s = 0.0
        self.pauses: list[tuple[float, float, int]] = []     # (start, end, version)
        self.result: Generation | None = None
        self.sim.submit(self.reqs)

    @property
    def done(self) -> bool:
        return all(r.done for r in self.reqs)

    def run_until(self, t: float) -> bool:
        """Generate until ``t`` (from the start) or the last sample; whether all are done."""
        if t > self.sim.now:
            self.sim.run(until=t)
        return self.done

    def pause(self, t: float, dur_s: float, version: int, keep_kv: bool = False
              ) -> float | None:
        """The weight sync of ``version`` from ``t``, ``dur_s`` long; returns when it
        started (None: every sample was done first). ``keep_kv``: the engines finish their
        steps in flight, load the weights and go on, every sample keeping its KV cache
        (computed under the old weights: no recompute); the sync starts when the last
        engine is at a step boundary."""
        if self.run_until(t):
            return None
        if keep_kv:
            start = self.sim.hold()
            left = [r for r in self.reqs if not r.done]
            if not left:                    # the steps in flight finished every sample
                self.sim.release(start)
                return None
            for r in left:
                if r.generated == 0:
                    self.first_version[r.tag] = version
                self.last_version[r.tag] = version
            self.sim.release(start + dur_s)
            self.pauses.append((start, start + dur_s, version))
            self.paused_s += dur_s
            return start
        left = self.sim.interrupt()
        if self.sim.record:                               # the batch is empty meanwhile
            for ser in self.sim.series:
                ser.append((self.sim.now, 0, 0.0, 0))
        end = self.sim.now + dur_s
        if end > self.sim.now:
            self.sim.run(until=end)
        for r in left:
            if r.generated == 0:
                self.first_version[r.tag] = version
            self.last_version[r.tag] = version
            r.arrival_s = self.sim.now
        self.pauses.append((t, end, version))
        self.paused_s += dur_s
        self.sim.submit(left)
        return t

    def finish(self) -> Generation:
        """Generate to the last sample (once; later calls return the same result)."""
        if self.result is not None:
            return self.result
        self.sim.run()
        reqs, sim, members = self.reqs, self.sim, self.members
        n = len(reqs)
        if any(r.rejected or not r.done for r in reqs):
            raise ValueError("a sample does not fit the KV cache")   # checked by the caller
        finish = np.array([r.finish_s for r in reqs], dtype=float)
        rep = np.array([r.member // members for r in reqs], dtype=np.int64)
        time_s, post_s = float(finish.max()) if n else 0.0, 0.0
        worker_post = getattr(self.costs, "worker_post_s", None)
        if worker_post is not None and n:
            time_s, post_s = _with_post(finish, rep, np.array([r.output for r in reqs]),
                                        self.replicas, worker_post)
        self.result = Generation(time_s, finish, rep, long_tail(finish), sim.steps,
                                 sum(r.preemptions for r in reqs),
                                 [_thin(s) for s in sim.series], post_s)
        return self.result


def _requests(prompt: np.ndarray, response: np.ndarray, group: int | None,
              ways: int) -> list[Request]:
    """The samples as requests (``tag``: the sample's index), in id order: the samples'
    own order, or, with ``group`` (the costs' ``prefix_group``,
    :mod:`moesim.rl.prefix_cache`), the order that deals contiguous shards round robin
    over the ``ways`` members, each sample prefilling only what its group's prompt does
    not already hold on its member."""
    n = len(prompt)
    if not group:
        return [Request(id=i, arrival_s=0.0, prompt=int(prompt[i]), output=int(response[i]),
                        tag=i) for i in range(n)]
    from moesim.rl.prefix_cache import prefill_tokens, submit_order

    order = submit_order(n, ways)
    left = prefill_tokens(prompt, group, order, ways)
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    return [Request(id=int(pos[i]), arrival_s=0.0, prompt=int(prompt[i]),
                    output=int(response[i]), prefill_left=int(left[i]), tag=i)
            for i in range(n)]


def _with_post(finish: np.ndarray, rep: np.ndarray, response: np.ndarray, replicas: int,
               worker_post) -> tuple[float, float]:
    """(the generation's end, the post work of the replica that ends it): each replica
    with samples ends at its last sample's finish plus ``worker_post(response, rep,
    replicas)[replica]``."""
    post = np.asarray(worker_post(response, rep, replicas), dtype=float)
    last = np.full(replicas, -np.inf)
    np.maximum.at(last, rep, finish)
    end = last + post
    k = int(np.argmax(end))
    return float(end[k]), float(post[k])


def stream(prompts: list, responses: list, costs: StepCosts, replicas: int, kv_tokens: int,
           max_batch: int, members: int = 1, *, skip: bool = True,
           layer_windows: list[int] | None = None, max_lag: int | None = None,
           trainer_s: list[float] | None = None, sync_s: float = 0.0,
           poll_s: float = 0.01, partial: str | None = None) -> list[Generation]:
    """Generate every step's samples as one stream (module docstring): queued in step
    order, admitted by vLLM's scheduler as capacity frees. With ``max_lag``, step ``s``'s
    samples arrive once version ``s - max_lag`` is published, as the collector targets at
    most ``max_trajectory_age_steps`` ahead of its weights: version ``v`` is published at
    ``pub[v] = max(ready[v-1], pub[v-1]) + trainer_s[v-1] + sync_s`` (``pub[0] = 0``; the
    trainer takes the steps in turn, each once generated). Per step, a
    :class:`Generation` whose ``time_s`` is the engine time the step adds (its last finish
    minus the previous steps' latest, at least 0) and whose ``finish_s`` are from the
    stream's start. ``poll_s``: how far the engines run at a time while a step's end is
    awaited (the times themselves are exact). ``partial`` (``keep`` or ``recompute``,
    with ``max_lag``): every weight update pauses the engines, as :func:`_stream_partial`
    runs them."""
    groups = [[r * members + i for i in range(members)] for r in range(replicas)]
    sim = build_sim(costs, groups, kv_tokens, scheduler="vllm", router="round_robin",
                    max_seqs=max_batch, layer_windows=layer_windows)
    sim.skip = skip
    if partial is not None:
        return _stream_partial(sim, prompts, responses, members, max_lag, trainer_s,
                               sync_s, poll_s, partial == "keep")
    steps: list[list[Request]] = []
    ready: list[float] = []
    pub = [0.0]

    def ready_of(v: int) -> float:
        while len(ready) <= v:
            rs = steps[len(ready)]
            while not all(r.done for r in rs):
                sim.run(until=sim.now + poll_s)
            ready.append(max((r.finish_s for r in rs), default=0.0))
        return ready[v]

    def published(v: int) -> float:
        while len(pub) <= v:
            u = len(pub)
            pub.append(max(ready_of(u - 1), pub[u - 1]) + trainer_s[u - 1] + sync_s)
        return pub[v]

    n = 0
    for s, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        at = 0.0 if max_lag is None or s - max_lag <= 0 else published(s - max_lag)
        rs = _arrivals(p, r, max(at, sim.now), n)
        n += len(rs)
        steps.append(rs)
        sim.submit(rs)
    sim.run()
    return _per_step(sim, steps, members)


def _arrivals(prompt, response, at: float, first: int) -> list[Request]:
    """One step's samples as requests arriving at ``at``, ids and tags from ``first``."""
    return [Request(id=first + i, arrival_s=at, prompt=int(a), output=int(b), tag=first + i)
            for i, (a, b) in enumerate(zip(np.asarray(prompt, dtype=np.int64),
                                           np.asarray(response, dtype=np.int64),
                                           strict=True))]


def _per_step(sim, steps: list[list[Request]], members: int,
              pauses: list[tuple[float, float]] = ()) -> list[Generation]:
    """Per step of a stream, its :class:`Generation` (``time_s`` the engine time it adds;
    ``paused_s`` the part of it the ``pauses``, (start, end) intervals, take)."""
    reqs = [r for rs in steps for r in rs]
    if any(r.rejected or not r.done for r in reqs):
        raise ValueError("a sample does not fit the KV cache")   # checked by the caller
    out, prev = [], 0.0
    for rs in steps:
        f = np.array([r.finish_s for r in rs], dtype=float)
        last = float(f.max()) if len(f) else prev
        rep = np.array([r.member // members for r in rs], dtype=np.int64)
        paused = sum(max(0.0, min(b, last) - max(a, prev)) for a, b in pauses)
        out.append(Generation(max(last - prev, 0.0), f, rep, long_tail(f),
                              sim.steps if not out else 0,
                              sum(r.preemptions for r in rs), [], paused_s=paused))
        prev = max(prev, last)
    return out


def _stream_partial(sim, prompts: list, responses: list, members: int, max_lag: int,
                    trainer_s: list[float], sync_s: float, poll_s: float,
                    keep_kv: bool) -> list[Generation]:
    """The stream with in-flight weight updates (partial rollouts): verl's fully
    asynchronous rollouter and NeMo RL's collector with ``in_flight_weight_updates``.
    Version ``v``'s sync starts when the trainer has trained step ``v - 1``:
    ``t[v] = max(ready[v-1], pub[v-1]) + trainer_s[v-1]``, and pauses the engines for
    ``sync_s``, as :meth:`Rollout.pause` does: ``keep_kv``, at the engines' next step
    boundary, every sample keeping its KV cache; else at once, the unfinished samples
    leaving and coming back after the sync to recompute their KV caches. Version ``v`` is
    published when its sync ends (``pub[v]``); step ``s``'s samples arrive then for
    ``v = s - max_lag``. A step is ready when its last sample is done (found within
    ``poll_s`` of it: a sync due earlier than that starts when it is found)."""
    steps: list[list[Request]] = []
    ready: list[float] = []
    pub = [0.0]
    pauses: list[tuple[float, float]] = []

    def note_ready() -> None:
        while len(ready) < len(steps) and all(r.done for r in steps[len(ready)]):
            ready.append(max((r.finish_s for r in steps[len(ready)]), default=0.0))

    def advance(until: float) -> None:
        """Run the engines to ``until``, pausing them for every sync due before it."""
        while len(pub) <= len(prompts) and len(ready) >= len(pub):
            v = len(pub)
            t = max(max(ready[v - 1], pub[v - 1]) + trainer_s[v - 1], sim.now)
            if t > until:
                break
            sim.run(until=t)
            if keep_kv:
                t = sim.hold()
                sim.release(t + sync_s)
            else:
                left = sim.interrupt()
                sim.run(until=t + sync_s)
                for r in left:
                    r.arrival_s = sim.now
                sim.submit(left)
            pub.append(t + sync_s)
            pauses.append((t, t + sync_s))
            note_ready()
        if until > sim.now:
            sim.run(until=until)
        note_ready()

    n = 0
    for s, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        v = s - max_lag
        while v > 0 and len(pub) <= v:
            advance(sim.now + poll_s)
        rs = _arrivals(p, r, max(pub[v] if v > 0 else 0.0, sim.now), n)
        n += len(rs)
        steps.append(rs)
        sim.submit(rs)
        note_ready()
    while len(ready) < len(steps):
        advance(sim.now + poll_s)
    return _per_step(sim, steps, members, pauses)
