"""vLLM 0.9.0's V1 sampler in the rollout steps (moesim.rl.sampler_v1,
rl.rollout.sampler): bytes per logit, the steps it is added to, off by default."""

from __future__ import annotations

import pytest

from moesim.rl import sampler_v1 as sv
from moesim.rl.run import resolve_rl
from moesim.traffic.step_costs import LinearStepCosts
from tests.test_rl_run import ROLL, hand_generate, hand_summary, scenario, with_rollout


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


class PerByte:
    """A compute model of 1 ns a byte (hand-computable)."""

    def time_s(self, kernel):
        return kernel.bytes * 1e-9


def test_bytes_per_logit():
    # log_softmax 6, to(fp32) 6, temperature 8, softmax 8, exponential 4, div 12,
    # argmax 4, the sampled token's rank 6 = 54; the serving step priced 6
    assert sv.V1_BYTES_PER_LOGIT == 54 and sv.PRICED_BYTES_PER_LOGIT == 6
    assert sv.extra_bytes(2, 1000, 1) == 2 * (1000 * 54 - 1000 * 6)
    # TP4: the serving step's pass is over a quarter of the vocabulary, the sampler over
    # all of it (V1 gathers the logits on every rank)
    assert sv.extra_bytes(2, 1000, 4) == 2 * (1000 * 54 - 250 * 6)


def test_each_step_gains_the_sampler_of_its_tokens():
    inner = LinearStepCosts(prefill_base_s=0.01, decode_base_s=0.02, decode_per_seq_s=1e-3)
    c = sv.SamplerStepCosts(inner, PerByte(), vocab=1000, tp=1)
    # decode at batch 4: 4 tokens x 48,000 bytes at 1 ns
    assert c.decode_s(4, 100) == pytest.approx(0.02 + 4e-3 + 4 * 48e-6)
    # a prefill samples one token a prompt
    assert c.prefill_s(640, 3) == pytest.approx(0.01 + 3 * 48e-6)
    assert c.prefill_s(0, 0) == pytest.approx(0.01)
    many = c.decode_s_many(4, [100, 200])
    assert list(many) == [c.decode_s(4, 100), c.decode_s(4, 200)]


def test_the_rollout_gains_the_sampler_only_with_the_knob(tmp_path):
    setup = resolve_rl(scenario(tmp_path))
    off = hand_summary(setup)
    assert setup.cfg.rollout.sampler == "none"
    on = hand_summary(with_rollout(setup, sampler="vllm-v1"))
    assert off["phases_s"]["generate"] == pytest.approx(hand_generate())
    # each replica: one prefill of 2 prompts, then 127 decode steps at batch 2: 128 steps
    # sampling 2 tokens each, priced on the cluster's compute model
    res = setup.res
    step = sv.SamplerStepCosts(ROLL, res.compute, res.model.vocab, 1).sampler_s(2)
    assert step > 0
    assert on["phases_s"]["generate"] == pytest.approx(hand_generate() + 128 * step)
    assert on["phases_s"]["train"] == off["phases_s"]["train"]

