"""Rollout generation on the engine replicas of the rollout pool, priced by a
:class:`moesim.load.costs.StepCosts` (the one module to swap for the serving issue's
replica scheduler).

Each replica runs continuous batching as vLLM's scheduler does (vllm/v1/core/sched/
scheduler.py), in chunks of steps between events:

- samples are dealt to replicas round robin and wait in order;
- the KV cache is allocated as tokens arrive: a running sample holds its prompt and the
  tokens sampled so far; a waiting one is admitted while fewer than ``max_batch`` run and
  the cache has room for its prompt (and, after a preemption, the tokens it had);
- the samples admitted at one point run one prefill step over those tokens
  (``prefill_s(tokens, prompts)``), which samples each one's next token;
- then decode steps, one token per running sample (``decode_s(batch, context)``, context
  the running samples' mean prompt + sampled tokens), until the next sample finishes or
  the cache is full; steps between two events are priced in chunks of at most ``CHUNK``
  steps at the chunk's mean context (exact for costs linear in the context);
- when the next step's tokens do not fit, the last admitted sample is preempted (its KV
  freed, back at the front of the queue, recomputed by a prefill of its prompt and
  tokens when readmitted: vLLM's default, recompute) and nothing is admitted in that
  round; a finished sample frees its KV and the waiting ones are admitted.

The step's generation ends with its longest replica; ``long_tail_s`` is the time from
90 % of the samples done to the last.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from moesim.load.costs import StepCosts

#: decode steps priced at one mean context (bounds the error of a cost curved in context)
CHUNK = 32


@dataclass
class Generation:
    time_s: float                       # start to the last sample's last token
    finish_s: np.ndarray                # per sample, from the start
    replica: np.ndarray                 # replica of each sample
    long_tail_s: float                  # 90 % of samples done -> last
    decode_steps: int                   # decode steps summed over replicas
    preemptions: int = 0                # samples evicted for recompute, summed
    #: per replica: (t_s, running samples, KV tokens in use) at every change
    series: list[list[tuple[float, int, int]]] = field(default_factory=list)


def long_tail(finish_s: np.ndarray, fraction: float = 0.9) -> float:
    if not len(finish_s):
        return 0.0
    done = np.sort(finish_s)
    k = max(1, math.ceil(fraction * len(done)))
    return float(done[-1] - done[k - 1])


def generate(prompt: np.ndarray, response: np.ndarray, costs: StepCosts, replicas: int,
             kv_tokens: int, max_batch: int) -> Generation:
    """Generate ``response[i]`` tokens after ``prompt[i]`` for every sample on
    ``replicas`` engine replicas of ``kv_tokens`` KV-cache tokens each."""
    prompt = np.asarray(prompt, dtype=np.int64)
    response = np.asarray(response, dtype=np.int64)
    n = len(prompt)
    finish = np.zeros(n)
    rep = np.arange(n) % max(replicas, 1)
    series = []
    steps = evicted = 0
    for r in range(replicas):
        idx = np.flatnonzero(rep == r)
        t, st, ser, ev = _replica(prompt[idx], response[idx], costs, kv_tokens, max_batch)
        finish[idx] = t
        steps += st
        evicted += ev
        series.append(ser)
    return Generation(float(finish.max()) if n else 0.0, finish, rep, long_tail(finish),
                      steps, evicted, series)


def _replica(prompt, response, costs: StepCosts, cap: int, max_batch: int):
    n = len(prompt)
    finish = np.zeros(n)
    waiting = deque(range(n))           # admitted front first; a preempted sample rejoins
    run: list[int] = []                 # in admission order (the last is preempted first)
    gen = np.zeros(n, dtype=np.int64)   # tokens sampled so far
    used = 0                            # KV tokens held: prompt + sampled, per running sample
    t = 0.0
    steps = preempted = 0
    series = [(0.0, 0, 0)]
    while waiting or run:
        done = [i for i in run if gen[i] >= response[i]]
        if done:
            finish[done] = t
            used -= int((prompt[done] + gen[done]).sum())
            run = [i for i in run if gen[i] < response[i]]
            series.append((t, len(run), used))
        evicted = False
        while run and cap - used < len(run):    # no room for this step's tokens
            i = run.pop()
            used -= int(prompt[i] + gen[i])
            waiting.appendleft(i)
            preempted += 1
            evicted = True
        new = []
        while (waiting and not evicted and len(run) + len(new) < max_batch
               and used + int(prompt[waiting[0]] + gen[waiting[0]]) + 1 <= cap):
            i = waiting.popleft()
            new.append(i)
            used += int(prompt[i] + gen[i]) + 1
        if new:
            ids = np.asarray(new)
            t += costs.prefill_s(int((prompt[ids] + gen[ids]).sum()), len(new))
            gen[ids] += 1                       # the prefill samples the next token
            run.extend(new)
            series.append((t, len(run), used))
            continue
        if not run:
            if waiting:
                raise ValueError("a sample does not fit the KV cache")   # checked by caller
            break
        ids = np.asarray(run)
        k = int(min((response[ids] - gen[ids]).min(), CHUNK, (cap - used) // len(ids)))
        ctx = float((prompt[ids] + gen[ids]).mean()) + (k - 1) / 2
        t += k * costs.decode_s(len(ids), ctx)
        gen[ids] += k
        used += k * len(ids)
        steps += k
        series.append((t, len(run), used))
    series.append((t, 0, 0))
    return finish, steps, series, preempted
