"""NeMo RL v0.3's generation worker loop after vLLM returns (moesim.rl.worker_post,
rl.rollout.post_process): per-token price, added once per replica to the generation,
off by default (its echo and bad values: test_rl_rollout_knobs.py)."""

from __future__ import annotations

import pytest

from moesim.rl import worker_post as wp
from moesim.rl.run import resolve_rl
from tests.test_rl_run import hand_generate, hand_summary, scenario, with_rollout


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_per_token_price():
    # pytorch PR 32841's v[0] = 1 (7.04 us) + issue 41383's one-element op (5 us)
    assert wp.SETITEM_S == 7.04e-6 and wp.SCALAR_OP_S == 5e-6
    assert wp.post_s(1000) == pytest.approx(1000 * 12.04e-6, rel=1e-12)
    assert wp.post_s(1000, "none") == 0.0 and wp.post_s(-3) == 0.0


def test_the_generation_gains_each_replicas_loop_only_with_the_knob(tmp_path):
    setup = resolve_rl(scenario(tmp_path))
    assert setup.cfg.rollout.post_process == "none"
    off = hand_summary(setup)
    on = hand_summary(with_rollout(setup, post_process="nemo-v03"))
    assert off["phases_s"]["generate"] == pytest.approx(hand_generate(), rel=1e-12)
    # 16 samples of 128 tokens on 8 replicas: every replica copies 2 x 128 log-probs after
    # its last step, and they all end together
    assert on["phases_s"]["generate"] == pytest.approx(hand_generate() + 256 * 12.04e-6,
                                                       rel=1e-12)
    assert on["phases_s"]["train"] == off["phases_s"]["train"]
    assert on["long_tail_s"] == off["long_tail_s"]

