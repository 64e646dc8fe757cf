"""The RL algorithm registry (moesim.rl.algorithms): GRPO's phases, the one-line refusal of
an unknown algorithm or of a field it does not take, and a made-up algorithm (no old or
reference log-probs) registered here, run end to end with linear costs and worked out by
hand against GRPO, then unregistered."""

from __future__ import annotations

import pytest
import yaml

from moesim.errors import InputError
from moesim.rl.algorithms import ALGORITHMS, GRPO, Algorithm, Phase, algorithm
from moesim.rl.config import rl_from_dict
from moesim.rl.phases import LinearTrainerCosts
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.summary import summarize
from moesim.traffic.step_costs import LinearStepCosts

RL = {
    "steps": 2, "prompts_per_step": 4, "samples_per_prompt": 4,
    "prompt_tokens": {"dist": "fixed", "mean": 64},
    "response_tokens": {"dist": "fixed", "mean": 128},
    "rollout": {"gpus": 8, "tp": 1, "ep": 1},
    "train": {"gpus": 8, "tp": 1, "ep": 8, "mini_batches": 2, "seq_len": 512},
    "reward": {"kind": "rule", "cpu_s_per_sample": 0.001, "workers": 32},
}
ROLL = LinearStepCosts(prefill_base_s=0.01, prefill_per_token_s=1e-5, decode_base_s=0.02,
                       decode_per_seq_s=1e-3, decode_per_ctx_token_s=1e-6)
TRAIN = LinearTrainerCosts(forward_per_row_s=0.05, train_base_s=0.3, train_per_row_s=0.2)


def test_grpo_is_registered_with_its_phases():
    assert ALGORITHMS.names() == ("grpo",)
    assert algorithm("grpo") is GRPO
    assert GRPO.trainer_phases == ("reward", "logprob_prep", "old_logprob", "reference",
                                   "train_prep", "loss_logprob", "cpu_optimizer", "train")
    assert GRPO.report == ("generate", "logprob_prep", "old_logprob", "reference", "reward",
                           "train_prep", "loss_logprob", "cpu_optimizer", "train",
                           "weight_sync", "switch")
    assert dict(ALGORITHMS.get("grpo").fields) == {"old_logprob": True, "reference": True}


def test_an_unknown_algorithm_is_one_line_naming_the_field():
    with pytest.raises(InputError) as e:
        rl_from_dict({**RL, "algorithm": "ppo"}, "s.yaml", world=16)
    assert str(e.value) == "s.yaml: rl.algorithm: expected one of ['grpo'], got 'ppo'"


@pytest.fixture
def reinforce():
    """A made-up algorithm: a rule reward, then the optimizer steps (no old-policy or
    reference log-probs), so it takes neither field."""
    algo = Algorithm("reinforce", trainer=(GRPO.trainer[0], GRPO.trainer[-1]),
                     report=("generate", "reward", "train", "weight_sync", "switch"))
    ALGORITHMS.register("reinforce", algo, {}, "reward, then train")
    yield algo
    ALGORITHMS.unregister("reinforce")


def _scenario(tmp_path, **rl):
    data = {"name": "rl-toy", "seed": 5,
            "cluster": {"topology": "dgx-h100", "nodes": 2, "device": "H100"},
            "model": {"preset": "toy"}, "routing": {"kind": "uniform"},
            "compute": {"kind": "roofline"}, "engine": {"mode": "fast"},
            "schedule": {"seq_len": 512}, "rl": {**RL, **rl}}
    p = tmp_path / f"rl-{rl.get('algorithm', 'grpo')}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _summary(path):
    setup = resolve_rl(path)
    run = simulate_rl(setup, setup.cfg.steps, rollout_costs=ROLL, trainer_costs=TRAIN)
    return run, summarize(run)


def test_a_made_up_algorithm_runs_its_phases_end_to_end(tmp_path, reinforce):
    with pytest.raises(InputError) as e:
        rl_from_dict({**RL, "algorithm": "reinforce", "reference": True}, "s.yaml", world=16)
    assert e.value.field == "rl.reference" and "['grpo']" in str(e.value)
    run, s = _summary(_scenario(tmp_path, algorithm="reinforce"))
    _, g = _summary(_scenario(tmp_path))
    assert list(s["phases_s"]) == ["generate", "reward", "train", "weight_sync", "switch"]
    assert [sp.phase for sp in run.timeline.spans if sp.step == 0 and sp.pool == "train"] \
        == ["reward", "train", "weight_sync"]
    # 16 samples of 64 + 128 tokens, two to a 512-token row: 8 rows; 2 mini-batches of 4
    # rows each: train = 2 x (0.3 + 0.2 x 4); the reward: ceil(16 / 32) x 0.001
    assert s["phases_s"]["train"] == pytest.approx(2.2)
    assert s["phases_s"]["reward"] == pytest.approx(0.001)
    # GRPO adds the old-policy and the reference forward passes: 2 x 0.05 x 8 rows
    assert g["phases_s"]["old_logprob"] == pytest.approx(0.4) == g["phases_s"]["reference"]
    assert g["step_time_s"] - s["step_time_s"] == pytest.approx(0.8)
    assert s["phases_s"]["generate"] == g["phases_s"]["generate"]


def test_a_trainer_phase_of_a_made_up_algorithm_costs_what_it_says(tmp_path, reinforce):
    """A phase of its own: a critic's forward pass (0.05 s a row), before training."""
    critic = Algorithm("critic", trainer=(Phase("value", lambda x: x.trainer.forward_s(x.rows)),
                                          GRPO.trainer[-1]),
                       report=("generate", "value", "train", "weight_sync", "switch"))
    ALGORITHMS.register("critic", critic)
    try:
        run, s = _summary(_scenario(tmp_path, algorithm="critic"))
        _, r = _summary(_scenario(tmp_path, algorithm="reinforce"))
    finally:
        ALGORITHMS.unregister("critic")
    assert s["phases_s"]["value"] == pytest.approx(0.4)
    assert s["step_time_s"] - r["step_time_s"] == pytest.approx(0.4 - 0.001)
    assert "critic" not in ALGORITHMS
