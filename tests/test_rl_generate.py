"""Rollout generation (moesim.rl.generate) with LinearStepCosts: times by hand."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.load.costs import LinearStepCosts
from moesim.rl.generate import generate, long_tail
from moesim.rl.lengths import draw
from moesim.rl.config import LengthDist

COSTS = LinearStepCosts(prefill_base_s=0.5, prefill_per_token_s=0.01, decode_base_s=1.0,
                        decode_per_seq_s=0.1, decode_per_ctx_token_s=0.001)


def test_one_wave_hand_computed():
    # 4 samples, prompt 10, response 5: one prefill of 40 tokens gives the first token,
    # then 4 decode steps at batch 4 over contexts of 11, 12, 13, 14 tokens (prompt and
    # the tokens generated so far)
    g = generate(np.full(4, 10), np.full(4, 5), COSTS, replicas=1, kv_tokens=1000,
                 max_batch=8)
    prefill = 0.5 + 0.01 * 40
    decode = sum(1.0 + 0.1 * 4 + 0.001 * 4 * c for c in (11, 12, 13, 14))
    assert g.time_s == pytest.approx(prefill + decode, rel=1e-12)
    assert g.finish_s == pytest.approx([prefill + decode] * 4)
    assert g.decode_steps == 4


def test_kv_capacity_admits_in_waves():
    # room for 2 sequences of 10 + 5 tokens: two waves of two
    g = generate(np.full(4, 10), np.full(4, 5), COSTS, replicas=1, kv_tokens=30,
                 max_batch=8)
    wave = 0.5 + 0.01 * 20 + sum(1.0 + 0.1 * 2 + 0.001 * 2 * c for c in (11, 12, 13, 14))
    assert g.time_s == pytest.approx(2 * wave, rel=1e-12)
    for ser in g.series:
        assert max(kv for _, _, kv in ser) <= 30
        assert max(b for _, b, _ in ser) <= 2


def test_max_batch_and_replicas():
    # 8 samples on 2 replicas, at most 2 running per replica: each replica runs two waves
    g = generate(np.full(8, 10), np.full(8, 5), COSTS, replicas=2, kv_tokens=10_000,
                 max_batch=2)
    wave = 0.5 + 0.01 * 20 + sum(1.0 + 0.1 * 2 + 0.001 * 2 * c for c in (11, 12, 13, 14))
    assert g.time_s == pytest.approx(2 * wave, rel=1e-12)
    assert sorted(np.bincount(g.replica)) == [4, 4]


def test_longest_sample_sets_the_pace_and_long_tail():
    # responses 2, 2, 2, ..., 9 (ten samples): the batch shrinks as samples finish
    resp = np.array([2] * 9 + [9])
    g = generate(np.full(10, 4), resp, LinearStepCosts(decode_base_s=1.0), replicas=1,
                 kv_tokens=10_000, max_batch=16)
    # prefill costs 0; 1 decode step finishes the nine, 7 more finish the last
    assert g.finish_s[:9] == pytest.approx([1.0] * 9)
    assert g.finish_s[9] == pytest.approx(8.0)
    assert g.long_tail_s == pytest.approx(7.0)    # 90 % (9 of 10) done at 1 s, last at 8 s
    assert long_tail(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])) == 1.0


def test_every_sample_finishes_with_its_tokens():
    rng = np.random.default_rng(1)
    p = draw(LengthDist(dist="uniform", min=1, max=50), 200, rng)
    r = draw(LengthDist(dist="lognormal", mean=40, max=120, sigma=0.8), 200, rng)
    g = generate(p, r, COSTS, replicas=3, kv_tokens=1500, max_batch=64)
    assert len(g.finish_s) == 200 and np.all(g.finish_s > 0)
    # the prefill gives each sample its first token; a replica runs at least as many
    # decode steps as its longest sample needs
    for rep in range(3):
        assert g.decode_steps >= int(r[g.replica == rep].max()) - 1
    for ser in g.series:
        assert max(kv for _, _, kv in ser) <= 1500


def test_lengths():
    rng = np.random.default_rng(0)
    x = draw(LengthDist(dist="lognormal", mean=2900, max=3840, sigma=0.5), 20000, rng)
    assert x.max() == 3840 and x.min() >= 1
    # the untruncated mean is 2900; truncation at max only lowers it
    assert 2500 < x.mean() < 2900
    assert np.all(draw(LengthDist(mean=256), 5, rng) == 256)
    u = draw(LengthDist(dist="uniform", min=3, max=5), 3000, rng)
    assert set(u.tolist()) == {3, 4, 5}


def test_packing_conserves_tokens():
    from moesim.rl.packing import pack, pack_rows, rows_per_replica

    rng = np.random.default_rng(3)
    x = rng.integers(1, 4000, size=500)
    fill = pack(x, 4096)
    assert fill.sum() == x.sum() and fill.max() <= 4096
    assert len(fill) >= -(-x.sum() // 4096)
    # by hand: 3000, 3000, 1000, 1000, 100 into rows of 4096 -> [3000+1000, 3000+1000, 100]
    assert pack([1000, 3000, 100, 3000, 1000], 4096).tolist() == [4000, 4000, 100]
    assert pack_rows([4096] * 3, 4096) == 3 and rows_per_replica(5, 2) == 3


def test_preemption_by_recompute_hand_computed():
    # 2 samples, prompt 10, response 5, KV room for 24 tokens: both admitted (11 + 11
    # with their first tokens); one decode step fills the cache (24); the next step has no
    # room, so the last admitted is preempted (12 tokens freed) and the first runs alone
    # to its end; then the second is readmitted: a prefill of its prompt and its 2 tokens
    g = generate(np.full(2, 10), np.full(2, 5), COSTS, replicas=1, kv_tokens=24,
                 max_batch=8)
    first = (0.5 + 0.01 * 20) + (1.0 + 0.1 * 2 + 0.001 * 2 * 11) \
        + sum(1.0 + 0.1 + 0.001 * c for c in (12, 13, 14))
    second = first + (0.5 + 0.01 * 12) + sum(1.0 + 0.1 + 0.001 * c for c in (13, 14))
    assert g.finish_s == pytest.approx([first, second], rel=1e-12)
    assert g.preemptions == 1
    assert max(kv for _, _, kv in g.series[0]) <= 24
