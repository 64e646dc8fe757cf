"""vLLM's Ray executor under the rollout engines (moesim.rl.executor, rl.rollout.executor):
the per-step price, added to every engine step, off by default, echoed only when on, bad
values refused in one line."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.cli import main
from moesim.rl import executor as ex
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.summary import summarize
from moesim.traffic.step_costs import LinearStepCosts
from tests.test_rl_run import ROLL, TRAIN, hand_generate, scenario


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
    off = summarize(simulate_rl(setup, 1, rollout_costs=ROLL, trainer_costs=TRAIN))
    cfg = dataclasses.replace(setup.cfg, rollout=dataclasses.replace(setup.cfg.rollout,
                                                                     executor="ray"))
    on = summarize(simulate_rl(dataclasses.replace(setup, cfg=cfg), 1, rollout_costs=ROLL,
                               trainer_costs=TRAIN))
    assert off["phases_s"]["generate"] == pytest.approx(hand_generate(), rel=1e-12)
    # each replica: one prefill of 2 prompts, then 127 decode steps: 128 engine steps
    assert on["phases_s"]["generate"] == pytest.approx(
        hand_generate() + 128 * ex.RAY_STEP_S, rel=1e-12)
    assert on["phases_s"]["train"] == off["phases_s"]["train"]


def test_the_rl_summary_echoes_the_knob_only_when_on(tmp_path):
    from moesim.scenario.sections.rl import summary_dict
    cfg = resolve_rl(scenario(tmp_path)).scenario.rl
    assert "executor" not in summary_dict(cfg)["rollout"]
    on = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, executor="ray"))
    assert summary_dict(on)["rollout"]["executor"] == "ray"


def test_a_bad_value_is_one_line_exit_2(tmp_path, capsys):
    p = scenario(tmp_path)
    assert main(["rl", str(p), "--quiet", "--set", "rl.rollout.executor=mp"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "rl.rollout.executor" in err and "Traceback" not in err
