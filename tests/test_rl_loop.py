"""The RL step loop (moesim.rl.loop): phase order, versions and lags, worked out by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from moesim.rl.loop import StepDurations, schedule


def _d(gen, train, sync, old=0.0, ref=0.0, reward=0.0):
    """GRPO's trainer phases in their order (moesim.rl.algorithms)."""
    return StepDurations(generate=gen, weight_sync=sync, trainer={
        "reward": reward, "old_logprob": old, "reference": ref, "train": train})


def test_synchronous_step_is_the_sum_of_its_phases():
    d = _d(10.0, 7.0, 1.5, old=2.0, ref=2.5, reward=0.25)
    tl = schedule([d] * 4, max_lag=0, colocated=False)
    one = 10.0 + 0.25 + 2.0 + 2.5 + 7.0 + 1.5
    assert tl.step_end_s == pytest.approx([one, 2 * one, 3 * one, 4 * one], abs=1e-12)
    assert tl.lags() == [0, 0, 0, 0]
    # by phase, in order: generate, reward, old log-probs, reference, train, sync
    s1 = [(sp.pool, sp.phase, sp.start_s, sp.end_s) for sp in tl.spans if sp.step == 1]
    t = one
    expect = []
    for pool, phase, dur in (("rollout", "generate", 10.0), ("train", "reward", 0.25),
                             ("train", "old_logprob", 2.0), ("train", "reference", 2.5),
                             ("train", "train", 7.0)):
        expect.append((pool, phase, t, t + dur))
        t += dur
    expect += [("rollout", "weight_sync", t, t + 1.5), ("train", "weight_sync", t, t + 1.5)]
    got, want = sorted(s1), sorted(expect)
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [g[2:] for g in got] == [pytest.approx(w[2:], abs=1e-12) for w in want]


def test_one_step_off_overlaps_generation_with_training():
    # generate T, train T, sync S: the first step is 2T + S (nothing to overlap), then
    # every step is max(T, T) + S: batch s+1 is generated with version s while step s trains
    T, S = 10.0, 1.0
    tl = schedule([_d(T, T, S)] * 5, max_lag=1, colocated=False)
    assert tl.step_end_s[0] == pytest.approx(2 * T + S)
    assert np.diff(tl.step_end_s) == pytest.approx([T + S] * 4)
    assert tl.lags() == [0, 1, 1, 1, 1]


def test_one_step_off_with_unequal_phases():
    # generation 4, scoring + training 10, sync 1: the trainer is the bottleneck
    tl = schedule([_d(4.0, 8.0, 1.0, old=2.0)] * 4, max_lag=1, colocated=False)
    assert tl.step_end_s[0] == pytest.approx(4 + 10 + 1)
    assert np.diff(tl.step_end_s) == pytest.approx([11.0] * 3)
    # generation 10, training 3: the rollout pool is; the last step has nothing left to
    # generate (train 3 + sync 1 after its batch)
    tl = schedule([_d(10.0, 3.0, 1.0)] * 4, max_lag=1, colocated=False)
    assert np.diff(tl.step_end_s) == pytest.approx([11.0, 11.0, 4.0])


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_lag_never_exceeds_max_lag(k):
    rng = np.random.default_rng(k)
    durs = [_d(*rng.uniform(0.5, 5.0, 3), old=rng.uniform(0, 1)) for _ in range(12)]
    tl = schedule(durs, max_lag=k, colocated=False)
    lags = tl.lags()
    assert all(0 <= lag <= k for lag in lags)
    # every batch generated once and trained once, in order; a pool does one thing at a time
    assert sorted(sp.step for sp in tl.spans if sp.phase == "generate") == list(range(12))
    assert sorted(sp.step for sp in tl.spans if sp.phase == "train") == list(range(12))
    for pool in ("rollout", "train"):
        sps = sorted((sp.start_s, sp.end_s) for sp in tl.spans if sp.pool == pool)
        for (_, e0), (s1, _) in itertools.pairwise(sps):
            assert s1 >= e0 - 1e-12
    # a batch is scored only after it is generated, with a version published before it ran
    gen = {sp.step: sp for sp in tl.spans if sp.phase == "generate"}
    sync_end = {sp.version: sp.end_s for sp in tl.spans if sp.phase == "weight_sync"}
    for sp in tl.spans:
        if sp.pool == "train" and sp.phase != "weight_sync":
            assert sp.start_s >= gen[sp.step].end_s - 1e-12
    for _s, g in gen.items():
        if g.version:
            assert sync_end[g.version] <= g.start_s + 1e-12


def test_colocated_runs_phases_in_turn():
    d = StepDurations(generate=5.0, weight_sync=0.5, switch_in=0.25, switch_out=0.75,
                      trainer={"reward": 0.0, "old_logprob": 1.0, "reference": 0.0,
                               "train": 3.0})
    tl = schedule([d] * 2, max_lag=0, colocated=True)
    assert tl.step_end_s == pytest.approx([10.5, 21.0])
    phases = [sp.phase for sp in tl.spans if sp.step == 0]
    assert phases == ["generate", "switch", "old_logprob", "train", "switch", "weight_sync"]
    with pytest.raises(ValueError):
        schedule([d], max_lag=1, colocated=True)
