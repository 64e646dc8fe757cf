"""Rollout generation on the engine replicas of the rollout pool, priced by a
:class:`moesim.load.costs.StepCosts` (the one module to swap for the serving issue's
replica scheduler).

Each replica runs continuous batching (vLLM's scheduler, simplified):

- samples are dealt to replicas round robin and wait in order;
- a waiting sample is admitted while the replica runs fewer than ``max_batch`` sequences
  and its KV cache has room for the sample's whole sequence (prompt + response tokens),
  so the cache never overflows and nothing is preempted (vLLM allocates blocks as tokens
  arrive and preempts when full: it admits more, earlier);
- the samples admitted at one point run one prefill step over their prompts
  (``prefill_s(tokens, prompts)``), which yields each one's first token;
- then decode steps, one token per running sample (``decode_s(batch, context)``, context
  the running samples' mean prompt + generated tokens), until the next sample finishes;
  steps between two finishes are priced in chunks of at most ``CHUNK`` steps at the
  chunk's mean context (exact for costs linear in the context);
- a finished sample frees its KV and the waiting ones are admitted.

The step's generation ends with its longest replica; ``long_tail_s`` is the time from
90 % of the samples done to the last.
"""

from __future__ import annotations

import math
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
    steps = 0
    for r in range(replicas):
        idx = np.flatnonzero(rep == r)
        t, st, ser = _replica(prompt[idx], response[idx], costs, kv_tokens, max_batch)
        finish[idx] = t
        steps += st
        series.append(ser)
    return Generation(float(finish.max()) if n else 0.0, finish, rep, long_tail(finish),
                      steps, series)


def _replica(prompt, response, costs: StepCosts, cap: int, max_batch: int):
    n = len(prompt)
    need = prompt + response
    finish = np.zeros(n)
    waiting = 0                       # samples are admitted in order
    run: list[int] = []
    gen = np.zeros(n, dtype=np.int64)  # tokens generated so far
    used = 0
    t = 0.0
    steps = 0
    series = [(0.0, 0, 0)]
    while waiting < n or run:
        new = []
        while waiting < n and len(run) + len(new) < max_batch and used + need[waiting] <= cap:
            new.append(waiting)
            used += int(need[waiting])
            waiting += 1
        if new:
            t += costs.prefill_s(int(prompt[new].sum()), len(new))
            gen[new] = 1
            run.extend(new)
        done = [i for i in run if gen[i] >= response[i]]
        if done:
            finish[done] = t
            used -= int(need[done].sum())
            run = [i for i in run if gen[i] < response[i]]
            series.append((t, len(run), used))
            continue
        if not run:
            raise ValueError("a sample does not fit the KV cache")   # checked by the caller
        series.append((t, len(run), used))
        ids = np.asarray(run)
        k = int(min((response[ids] - gen[ids]).min(), CHUNK))
        ctx = float((prompt[ids] + gen[ids]).mean()) + (k - 1) / 2
        t += k * costs.decode_s(len(ids), ctx)
        gen[ids] += k
        steps += k
    series.append((t, 0, 0))
    return finish, steps, series
