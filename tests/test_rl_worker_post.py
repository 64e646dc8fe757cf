"""NeMo RL v0.3's generation worker loop after vLLM returns (moesim.rl.worker_post,
rl.rollout.post_process): per-token price, added once per replica to the generation,
off by default, echoed only when on, bad values refused in one line."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.cli import main
from moesim.rl import worker_post as wp
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.summary import summarize
from tests.test_rl_run import ROLL, TRAIN, hand_generate, scenario


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_per_token_price():
    # pytorch PR 32841's v[0] = 1 (7.04 us) + issue 41383's one-element op (5 us)
    assert wp.SETITEM_S == 7.04e-6 and wp.SCALAR_OP_S == 5e-6
    assert wp.post_s(1000) == pytest.approx(1000 * 12.04e-6, rel=1e-12)
    assert wp.post_s(1000, "none") == 0.0 and wp.post_s(-3) == 0.0


def _on(setup, value="nemo-v03"):
    cfg = dataclasses.replace(setup.cfg, rollout=dataclasses.replace(
        setup.cfg.rollout, post_process=value))
    return dataclasses.replace(setup, cfg=cfg)


def test_the_generation_gains_each_replicas_loop_only_with_the_knob(tmp_path):
    setup = resolve_rl(scenario(tmp_path))
    assert setup.cfg.rollout.post_process == "none"
    off = summarize(simulate_rl(setup, 1, rollout_costs=ROLL, trainer_costs=TRAIN))
    on = summarize(simulate_rl(_on(setup), 1, rollout_costs=ROLL, trainer_costs=TRAIN))
    assert off["phases_s"]["generate"] == pytest.approx(hand_generate(), rel=1e-12)
    # 16 samples of 128 tokens on 8 replicas: every replica copies 2 x 128 log-probs after
    # its last step, and they all end together
    assert on["phases_s"]["generate"] == pytest.approx(hand_generate() + 256 * 12.04e-6,
                                                       rel=1e-12)
    assert on["phases_s"]["train"] == off["phases_s"]["train"]
    assert on["long_tail_s"] == off["long_tail_s"]


def test_the_rl_summary_echoes_the_knob_only_when_on(tmp_path):
    from moesim.scenario.sections.rl import summary_dict
    cfg = resolve_rl(scenario(tmp_path)).scenario.rl
    assert "post_process" not in summary_dict(cfg)["rollout"]
    on = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout,
                                                              post_process="nemo-v03"))
    assert summary_dict(on)["rollout"]["post_process"] == "nemo-v03"


def test_a_bad_value_is_one_line_exit_2(tmp_path, capsys):
    p = scenario(tmp_path)
    assert main(["rl", str(p), "--quiet", "--set", "rl.rollout.post_process=nemo"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "rl.rollout.post_process" in err and "Traceback" not in err
