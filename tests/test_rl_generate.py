"""Rollout generation (moesim.rl.generate, on moesim.traffic's vLLM scheduler) with
LinearStepCosts: times by hand."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.rl.generate import generate, long_tail
from moesim.scenario.sections.lengths import LengthDist
from moesim.traffic.lengths import draw
from moesim.traffic.step_costs import LinearStepCosts

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
    assert g.steps == 5                           # one prefill, four decode steps


def test_a_full_kv_cache_preempts_and_everything_finishes():
    # room for 64 tokens (4 blocks of 16) per rank: 4 samples of 10 + 20 tokens cannot all
    # hold their whole sequences, so some are preempted and recomputed; all finish
    g = generate(np.full(4, 10), np.full(4, 20), COSTS, replicas=1, kv_tokens=64,
                 max_batch=8)
    assert g.preemptions > 0 and np.all(g.finish_s > 0)
    assert max(kv for ser in g.series for _, _, kv in ser) <= 1.0
    # with room for all, none is preempted and the step is the one-wave time
    g = generate(np.full(4, 10), np.full(4, 20), COSTS, replicas=1, kv_tokens=1024,
                 max_batch=8)
    assert g.preemptions == 0
    assert g.time_s == pytest.approx(0.5 + 0.01 * 40 + sum(
        1.0 + 0.1 * 4 + 0.001 * 4 * c for c in range(11, 30)), rel=1e-12)


def test_max_batch_and_replicas():
    # 8 samples on 2 replicas, at most 2 running per replica: each replica runs two waves
    g = generate(np.full(8, 10), np.full(8, 5), COSTS, replicas=2, kv_tokens=10_000,
                 max_batch=2)
    assert g.preemptions == 0
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
    p = draw(LengthDist(dist="uniform", min=1, max=50), rng, 200)
    r = draw(LengthDist(dist="lognormal", mean=40, max=120, sigma=0.8), rng, 200)
    g = generate(p, r, COSTS, replicas=3, kv_tokens=1500, max_batch=64)
    assert len(g.finish_s) == 200 and np.all(g.finish_s > 0)
    assert sorted(np.bincount(g.replica).tolist()) == [66, 67, 67]
    # the prefill gives each sample its first token; the replicas run at least as many
    # steps as their longest samples need
    assert g.steps >= sum(int(r[g.replica == rep].max()) for rep in range(3))
    for ser in g.series:
        assert max(kv for _, _, kv in ser) <= 1.0


def test_lengths():
    rng = np.random.default_rng(0)
    x = draw(LengthDist(dist="lognormal", mean=2900, max=3840, sigma=0.5), rng, 20000)
    assert x.max() == 3840 and x.min() >= 1
    # the untruncated mean is 2900; truncation at max only lowers it
    assert 2500 < x.mean() < 2900
    assert np.all(draw(LengthDist(mean=256), rng, 5) == 256)
    u = draw(LengthDist(dist="uniform", min=3, max=5), rng, 3000)
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


def test_generation_skipping_between_events_equals_stepping():
    # preemptions (a small cache), several replicas of two ranks: the engine's skipped
    # runs give every sample the stepwise finish time, float for float
    rng = np.random.default_rng(4)
    p = draw(LengthDist(dist="uniform", min=5, max=60), rng, 96)
    r = draw(LengthDist(dist="lognormal", mean=80, max=300, sigma=0.7), rng, 96)
    a = generate(p, r, COSTS, replicas=3, kv_tokens=1200, max_batch=24, members=2,
                 skip=False)
    b = generate(p, r, COSTS, replicas=3, kv_tokens=1200, max_batch=24, members=2)
    assert a.preemptions > 0 and a.preemptions == b.preemptions
    assert np.array_equal(a.finish_s, b.finish_s) and a.time_s == b.time_s
    assert a.steps == b.steps and a.long_tail_s == b.long_tail_s
    assert a.series == b.series


def test_sliding_window_layers_hold_only_their_window():
    # 4 samples of 10 + 100 tokens on a 2-layer model, one full layer and one of a 16-token
    # window (vLLM's hybrid cache: a group per window, blocks of 16 tokens). At the last
    # token a sample holds ceil(110 / 16) = 7 blocks in the full group and at most 2 in
    # the windowed one (the blocks wholly before token 110 - 16 + 1 freed): 9 blocks, 36
    # for all four. 288 tokens of KV over 2 layers are 288 * 2 / 16 = 36 blocks: the
    # windowed model runs in one wave; every layer full needs 4 * 7 = 28 blocks of one
    # group and 288 tokens give 18, so it preempts. 448 tokens (28 blocks) hold it.
    from moesim.rl.run import kv_need
    one_wave = 0.5 + 0.01 * 40 + sum(1.0 + 0.1 * 4 + 0.001 * 4 * c for c in range(11, 110))
    g = generate(np.full(4, 10), np.full(4, 100), COSTS, replicas=1, kv_tokens=288,
                 max_batch=8, layer_windows=[0, 16])
    assert g.preemptions == 0
    assert g.time_s == pytest.approx(one_wave, rel=1e-12)
    full = generate(np.full(4, 10), np.full(4, 100), COSTS, replicas=1, kv_tokens=288,
                    max_batch=8)
    assert full.preemptions > 0 and full.time_s > one_wave
    full = generate(np.full(4, 10), np.full(4, 100), COSTS, replicas=1, kv_tokens=448,
                    max_batch=8)
    assert full.preemptions == 0 and full.time_s == pytest.approx(one_wave, rel=1e-12)
    # the capacity check's need: (110 + 16) / 2 layers, rounded up; every layer full: 110
    assert kv_need(110, [0, 16]) == 63 and kv_need(110, None) == 110


def test_the_workers_loop_after_vllm_ends_each_replica():
    # NeMo RL v0.3's worker copies each generated token's log-prob after vLLM returns
    # (moesim.rl.worker_post): 12.04 us a token (7.04 the assignment + 5 the index op)
    from moesim.rl import worker_post as wp
    assert wp.PER_TOKEN_S == pytest.approx(12.04e-6, rel=1e-12)
    assert list(wp.per_replica_s([10, 20, 30], [0, 1, 0], 3)) == pytest.approx(
        [40 * 12.04e-6, 20 * 12.04e-6, 0.0], rel=1e-12)
    # 4 samples dealt round robin to 2 replicas: replica 0 holds responses 5 and 5,
    # replica 1 holds 3 and 3; each: one prefill of 2 x 10 tokens, then batch-2 decodes
    prompt, resp = np.full(4, 10), np.array([5, 3, 5, 3])
    pre = 0.5 + 0.01 * 20
    t0 = pre + sum(1.0 + 0.1 * 2 + 0.001 * 2 * c for c in (11, 12, 13, 14))
    t1 = pre + sum(1.0 + 0.1 * 2 + 0.001 * 2 * c for c in (11, 12))
    off = generate(prompt, resp, COSTS, replicas=2, kv_tokens=10_000, max_batch=8)
    assert list(off.replica) == [0, 1, 0, 1]
    assert off.time_s == pytest.approx(t0, rel=1e-12) and off.post_s == 0.0
    on = generate(prompt, resp, wp.PostProcessCosts(COSTS), replicas=2,
                  kv_tokens=10_000, max_batch=8)
    # replica 0 ends last: its last token, then its 10 tokens' loop
    assert on.post_s == pytest.approx(10 * 12.04e-6, rel=1e-12)
    assert on.time_s == pytest.approx(t0 + 10 * 12.04e-6, rel=1e-12)
    assert list(on.finish_s) == list(off.finish_s)       # the samples' own finishes
    assert on.steps == off.steps and on.long_tail_s == off.long_tail_s

    class Uneven(wp.PostProcessCosts):
        def worker_post_s(self, response, replica, replicas):
            return np.array([0.0, 100.0])                # replica 1's loop outlasts
    late = generate(prompt, resp, Uneven(COSTS), replicas=2, kv_tokens=10_000,
                    max_batch=8)
    assert late.time_s == pytest.approx(t1 + 100.0, rel=1e-12) and late.post_s == 100.0
    with pytest.raises(ValueError, match="post_process"):
        wp.PostProcessCosts(COSTS, "nemo-v09")
