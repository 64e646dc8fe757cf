"""vLLM's prefix caching over a GRPO group's prompt, the samples dealt in NeMo RL's
contiguous shards (moesim.rl.prefix_cache, rl.rollout.prefix_cache): hits, shards,
dealing, a generation by hand, off by default (its echo and bad values:
test_rl_rollout_knobs.py)."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.rl import prefix_cache as pc
from moesim.rl.generate import generate
from moesim.rl.run import resolve_rl
from moesim.traffic.step_costs import LinearStepCosts
from tests.test_rl_run import hand_generate, hand_summary, scenario, with_rollout

COSTS = LinearStepCosts(prefill_base_s=0.5, prefill_per_token_s=0.01, decode_base_s=1.0,
                        decode_per_seq_s=0.1, decode_per_ctx_token_s=0.001)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_hits_are_whole_blocks_short_of_the_last_token():
    # at most prompt - 1 tokens, in blocks of 16
    assert [pc.hit(p) for p in (1, 16, 17, 33, 256, 257)] == [0, 0, 16, 32, 240, 256]


def test_contiguous_shards_dealt_round_robin():
    assert [list(r) for r in pc.shards(5, 2)] == [[0, 1, 2], [3, 4]]
    # position p goes to member p % 2: member 0 gets 0..3, member 1 gets 4..7
    assert pc.submit_order(8, 2) == [0, 4, 1, 5, 2, 6, 3, 7]
    # groups of 4 sharing a prompt of 33: the first of each group on a member prefills 33,
    # the rest 33 - 32 = 1
    order = pc.submit_order(8, 2)
    assert list(pc.prefill_tokens([33] * 8, 4, order, 2)) == [33, 1, 1, 1, 33, 1, 1, 1]
    # dealt in the samples' own order, each member sees two groups of two
    assert list(pc.prefill_tokens([33] * 8, 4, list(range(8)), 2)) == [33, 33, 1, 1,
                                                                        33, 33, 1, 1]


def test_a_generation_by_hand():
    # 2 groups of 2 samples (prompt 20), responses 5 and 3 in each; 2 replicas: replica 0
    # holds samples 0 and 1, replica 1 samples 2 and 3. Each: one prefill of 20 + (20 -
    # 16) tokens, two decodes at batch 2 (contexts 21, 22), two at batch 1 (23, 24)
    prompt, resp = np.full(4, 20), np.array([5, 3, 5, 3])
    g = generate(prompt, resp, pc.PrefixCacheCosts(COSTS, 2), replicas=2, kv_tokens=10_000,
                 max_batch=8)
    assert list(g.replica) == [0, 0, 1, 1]
    pre = 0.5 + 0.01 * 24
    two = sum(1.0 + 0.1 * 2 + 0.001 * 2 * c for c in (21, 22))
    one = sum(1.0 + 0.1 + 0.001 * c for c in (23, 24))
    assert g.time_s == pytest.approx(pre + two + one, rel=1e-12)
    assert list(g.finish_s) == pytest.approx([pre + two + one, pre + two] * 2, rel=1e-12)
    off = generate(prompt, resp, COSTS, replicas=2, kv_tokens=10_000, max_batch=8)
    assert list(off.replica) == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="group"):
        pc.PrefixCacheCosts(COSTS, 0)


def test_the_rollout_prefills_less_only_with_the_knob(tmp_path):
    setup = resolve_rl(scenario(tmp_path))
    assert setup.cfg.rollout.prefix_cache == "none"
    off, on = hand_summary(setup), hand_summary(with_rollout(setup, prefix_cache="vllm"))
    assert off["phases_s"]["generate"] == pytest.approx(hand_generate(), rel=1e-12)
    # 4 groups of 4 over 8 replicas in shards of 2: each replica holds two samples of one
    # group; the second prefills 64 - 48 = 16 tokens, 48 fewer at 1e-5 s a token
    assert on["phases_s"]["generate"] == pytest.approx(hand_generate() - 48 * 1e-5,
                                                       rel=1e-12)

