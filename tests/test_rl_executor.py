"""vLLM's Ray executor under the rollout engines (moesim.rl.executor, rl.rollout.executor):
the per-step price, added to every engine step, off by default (its echo and bad values:
test_rl_rollout_knobs.py)."""

from __future__ import annotations

import pytest

from moesim.rl import executor as ex
from moesim.rl.run import resolve_rl
from moesim.traffic.step_costs import LinearStepCosts
from tests.test_rl_run import ROLL, hand_generate, hand_summary, scenario, with_rollout


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_per_step_price():
    # vllm PR 11107: 9.42692 s with Ray, 9.35681 s with mp, over 1 prefill + 255 decodes
    assert ex.RAY_STEP_S == pytest.approx(0.070102216932 / 256, rel=1e-9)
    assert 273e-6 < ex.RAY_STEP_S < 274e-6
    assert ex.EXECUTORS["none"] == 0.0
    with pytest.raises(ValueError, match="executor"):
        ex.ExecutorStepCosts(ROLL, "mp")


def test_every_step_gains_the_executors_time():
    inner = LinearStepCosts(prefill_base_s=0.01, decode_base_s=0.02, decode_per_seq_s=1e-3)
    c = ex.ExecutorStepCosts(inner)
    assert c.decode_s(4, 100) == pytest.approx(0.02 + 4e-3 + ex.RAY_STEP_S, rel=1e-12)
    assert c.prefill_s(640, 3) == pytest.approx(0.01 + ex.RAY_STEP_S, rel=1e-12)
    assert list(c.decode_s_many(4, [100, 200])) == [c.decode_s(4, 100), c.decode_s(4, 200)]
    assert ex.ExecutorStepCosts(inner, "none").decode_s(4, 100) == inner.decode_s(4, 100)


def test_the_rollout_gains_it_only_with_the_knob(tmp_path):
    setup = resolve_rl(scenario(tmp_path))
    assert setup.cfg.rollout.executor == "none"
    off, on = hand_summary(setup), hand_summary(with_rollout(setup, executor="ray"))
    assert off["phases_s"]["generate"] == pytest.approx(hand_generate(), rel=1e-12)
    # each replica: one prefill of 2 prompts, then 127 decode steps: 128 engine steps
    assert on["phases_s"]["generate"] == pytest.approx(
        hand_generate() + 128 * ex.RAY_STEP_S, rel=1e-12)
    assert on["phases_s"]["train"] == off["phases_s"]["train"]

