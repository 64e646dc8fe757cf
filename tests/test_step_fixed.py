"""vLLM V1's fixed CPU time per engine step (moesim.serve.host's V1_STEP_FIXED_S,
moesim.rl.step_fixed, rl.rollout.step_fixed): the split from the published 1B row, the
scheduling side made affine with its batch-256 anchor kept, every rollout step gaining it
only with the knob, and the knob refused in one line where the engine's scheduling is not
in series with the GPU."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.cli import main
from moesim.rl import step_fixed as sf
from moesim.rl.run import resolve_rl
from moesim.scenario.sections.rl import summary_dict
from moesim.serve import host
from moesim.traffic.step_costs import LinearStepCosts
from tests.test_rl_run import hand_generate, hand_summary, scenario, with_rollout


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_the_split_from_the_1b_row():
    # 2.73 ms = GPU 1.17726 ms + F + (5.5 ms - F) / 256
    # -> F = (2.73 - 1.17726 - 5.5 / 256) / (255 / 256) ms = 1.5372605490196 ms
    assert host.SCHEDULE_PER_REQUEST_S == pytest.approx(5.5e-3 / 256, rel=1e-15)
    assert host.V1_STEP_FIXED_S == pytest.approx(1.5372605490196e-3, rel=1e-12)
    f = host.V1_STEP_FIXED_S
    assert (host.V1_GPU_1B_S + f + (5.5e-3 - f) / 256) == pytest.approx(2.73e-3, rel=1e-12)
    assert host.STEP_FIXED == {"none": 0.0, "vllm-v1": f}


def test_the_gpu_step_written_down_is_moesims():
    """V1_GPU_1B_S is what moesim prices for the row (Llama-3.2-1B, H100, CUDA graphs,
    batch 1, context 525): if the compute model moves it, the split must be redone."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from vllm_small_batch import LLAMA_32_1B, _steps
    steps, _, _ = _steps(LLAMA_32_1B, 1, "none")
    assert steps.step_s(phase="decode", batch_per_gpu=1, context=525) == pytest.approx(
        host.V1_GPU_1B_S, rel=1e-5)


def test_the_scheduling_side_keeps_its_anchor():
    f = 1e-3
    assert sf.fixed_extra_s(0, f) == pytest.approx(1e-3, rel=1e-15)
    assert sf.fixed_extra_s(1, f) == pytest.approx(1e-3 * 255 / 256, rel=1e-15)
    assert sf.fixed_extra_s(64, f) == pytest.approx(0.75e-3, rel=1e-15)
    assert sf.fixed_extra_s(256, f) == 0.0             # measured there: unchanged
    assert sf.fixed_extra_s(512, f) == pytest.approx(-1e-3, rel=1e-15)
    # the side itself, F + (5.5 ms - F) x B / 256, is the old 21.48 us x B plus the extra
    for b in (1, 16, 300):
        side = f + (5.5e-3 - f) * b / 256
        assert side == pytest.approx(host.SCHEDULE_PER_REQUEST_S * b + sf.fixed_extra_s(b, f),
                                     rel=1e-12)


def test_every_step_gains_it():
    inner = LinearStepCosts(prefill_base_s=0.01, decode_base_s=0.02, decode_per_seq_s=1e-3)
    c = sf.StepFixedCosts(inner)
    f = host.V1_STEP_FIXED_S
    assert c.decode_s(4, 100) == pytest.approx(0.02 + 4e-3 + f * 252 / 256, rel=1e-12)
    assert c.prefill_s(640, 3) == pytest.approx(0.01 + f * 253 / 256, rel=1e-12)
    assert list(c.decode_s_many(4, [100, 200])) == [c.decode_s(4, 100), c.decode_s(4, 200)]
    assert sf.StepFixedCosts(inner, "none").decode_s(4, 100) == inner.decode_s(4, 100)
    with pytest.raises(ValueError, match="step_fixed"):
        sf.StepFixedCosts(inner, "vllm-v0")


def test_the_rollout_gains_it_only_with_the_knob(tmp_path):
    setup = resolve_rl(scenario(tmp_path))
    assert setup.cfg.rollout.step_fixed == "none"
    on_setup = with_rollout(setup, step_fixed="vllm-v1", host_overhead="vllm-inproc")
    off, on = hand_summary(setup), hand_summary(on_setup)
    assert off["phases_s"]["generate"] == pytest.approx(hand_generate(), rel=1e-12)
    # each replica: one prefill of 2 prompts, then 127 decode steps at batch 2: 128 engine
    # steps, each gaining F x (1 - 2 / 256)
    assert on["phases_s"]["generate"] == pytest.approx(
        hand_generate() + 128 * host.V1_STEP_FIXED_S * 254 / 256, rel=1e-12)
    assert on["phases_s"]["train"] == off["phases_s"]["train"]


def test_the_summary_echoes_it_only_when_on(tmp_path):
    cfg = resolve_rl(scenario(tmp_path)).scenario.rl
    assert "step_fixed" not in summary_dict(cfg)["rollout"]
    turned = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout,
                                                                  step_fixed="vllm-v1"))
    assert summary_dict(turned)["rollout"]["step_fixed"] == "vllm-v1"


def test_a_bad_value_is_one_line_exit_2(tmp_path, capsys):
    p = scenario(tmp_path)
    assert main(["rl", str(p), "--quiet", "--set", "rl.rollout.step_fixed=vllm-v0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "rl.rollout.step_fixed" in err and "Traceback" not in err


@pytest.mark.parametrize("engine", ["none", "vllm-async", "sglang"])
def test_an_engine_with_scheduling_beside_the_gpu_is_refused(tmp_path, capsys, engine):
    p = scenario(tmp_path, rollout={"gpus": 8, "host_overhead": engine,
                                    "step_fixed": "vllm-v1"})
    assert main(["rl", str(p), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "rl.rollout.step_fixed" in err and "vllm-inproc" in err
