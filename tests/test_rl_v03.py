"""NeMo RL v0.3's Qwen3-30B-A3B row as a scenario: the trainer's layout comes from its
parallel section (rl.train writes none), the log-prob passes pack their own rows, and
the benchmark's phase sums by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moesim.rl.engine_costs import trainer_scenario_of
from moesim.rl.run import resolve_rl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import rl_v03  # noqa: E402


def test_the_v03_trainer_is_the_scenarios_parallel_section():
    setup = resolve_rl("grpo-qwen3-30b-a3b-nemo-v03")
    tr = setup.cfg.train
    # 64 GPUs, TP2 EP8 from parallel: data parallel 64 / 2 = 32; the distributed optimizer
    assert (tr.gpus, tr.tp, tr.pp, tr.ep, tr.cp, tr.zero, tr.dp) == (64, 2, 1, 8, 1, 1, 32)
    assert (setup.seq_len, tr.logprob_mb_tokens, tr.mini_batches) == (4096, 16384, 4)
    par = trainer_scenario_of(setup).parallel
    assert par.sequence_parallel and (par.tp, par.ep, par.zero) == (2, 8, 1)


def test_the_published_phases_are_summed_as_nemo_rls_timers_hold_them():
    """policy_training = train + loss_logprob; refit = weight_sync + the switch out of
    training; generation = generate + the switch into training (vLLM's sleep);
    get logprobs = old policy + reference."""
    from types import SimpleNamespace

    from moesim.rl.loop import StepDurations

    d = StepDurations(generate=40.0, trainer={}, weight_sync=1.0, switch_in=0.25,
                      switch_out=0.5)
    run = SimpleNamespace(works=[SimpleNamespace(durations=d)] * 2)
    s = {"phases_s": {"train": 10.0, "loss_logprob": 0.75, "weight_sync": 1.0,
                      "switch": 0.75, "generate": 40.0, "old_logprob": 3.0,
                      "reference": 2.0, "reward": 0.1}}
    # generation holds the rewards too (run_multi_turn_rollout's calculate_rewards)
    assert rl_v03.columns(run, s) == {"policy training": 10.75, "refit": 1.5,
                                      "generation": 40.35, "get logprobs": 5.0}


def test_the_four_rows_are_scenarios_with_the_posts_layouts():
    root = Path(__file__).resolve().parents[1] / "scenarios"
    want = {"llama-3.1-8b": (8, 1, 1, 1, 8), "llama-3.1-70b": (64, 4, 4, 1, 4),
            "qwen3-32b": (64, 4, 2, 1, 8), "qwen3-30b-a3b": (64, 2, 1, 8, 32),
            # 128 GPUs over TP4 PP4 CP4: data parallel 128 / 64 = 2
            "llama-3.3-70b-16k": (128, 4, 4, 1, 2)}
    for key, name, *_ in rl_v03.ROWS:
        tr = resolve_rl(root / f"{name}.yaml").cfg.train
        assert (tr.gpus, tr.tp, tr.pp, tr.ep, tr.dp) == want[key], key
        assert (tr.mini_batches, tr.offload, tr.loss_logprob) == (4, "nemo", "nemo")


def test_reference_weights_on_the_host_cost_three_copies_per_reference_pass(tmp_path):
    """NeMo RL's use_reference_model: the policy's weights out, the reference's in, the
    policy's back, each over PCIe at 64 GB/s. The toy model (60,041,728 parameters, 8
    of which 25,165,824 in its experts, ep 2 and 4 giving 47,458,816 and 41,167,360) with
    EP8 on one GPU
    holds all but 7/8 of the experts: 60,041,728 - 7/8 x 25,165,824 = 38,021,632
    parameters in bf16."""
    from moesim.model.params import count_params
    from moesim.model.presets import PRESETS
    from moesim.rl.memory import trainer_weight_bytes
    from moesim.rl.run import simulate_rl
    from moesim.rl.summary import summarize
    from moesim.scenario.sections.rl import TrainPool
    from tests.test_rl_run import RL, ROLL, TRAIN, scenario

    toy = PRESETS["toy"]
    assert count_params(toy).total == 60_041_728
    assert trainer_weight_bytes(toy, TrainPool(gpus=1)) == 2 * 60_041_728
    assert trainer_weight_bytes(toy, TrainPool(gpus=8, ep=8)) == 2 * 38_021_632

    def reference_s(where):
        setup = resolve_rl(scenario(tmp_path, train={**RL["train"],
                                                     "reference_weights": where}))
        run = simulate_rl(setup, 1, rollout_costs=ROLL, trainer_costs=TRAIN)
        return summarize(run)["phases_s"]

    gpu, host = reference_s("gpu"), reference_s("host")
    assert host["reference"] - gpu["reference"] == pytest.approx(
        3 * 2 * 38_021_632 / 64e9, rel=1e-12)
    assert host["old_logprob"] == gpu["old_logprob"]        # the policy's own pass: no swap


def test_the_grpo_study_shares_by_hand():
    """Generation 30 s with a 2 s vLLM sleep, log-probs 10 + 8, training 1 + 40, refit
    1 s with 1 s of host moves: 32 / 18 / 41 / 2 of 93 s; the verl row has no refit."""
    from types import SimpleNamespace

    import grpo_study

    from moesim.rl.loop import StepDurations

    d = StepDurations(generate=30.0, trainer={}, weight_sync=1.0, switch_in=2.0,
                      switch_out=1.0)
    run = SimpleNamespace(works=[SimpleNamespace(durations=d)])
    s = {"phases_s": {"generate": 30.0, "old_logprob": 10.0, "reference": 8.0,
                      "loss_logprob": 1.0, "train": 40.0, "weight_sync": 1.0},
         "step_time_s": 95.0}
    parts, step = grpo_study.shares(run, s)
    assert parts == {"generation": 32.0, "log-probs": 18.0, "training": 41.0, "refit": 2.0}
    assert grpo_study.row("p", parts, step, 3840) == (
        "| p | 95.0 | 34 % | 19 % | 44 % | 2 % | training | 3,840 |")
    assert grpo_study.row("q", {**parts, "refit": None}, step).endswith("| - | training |")


def test_every_phase_outside_its_target_has_a_named_cause():
    keys = {r[0] for r in rl_v03.ROWS}
    assert set(rl_v03.CAUSES) == set(rl_v03.COLUMNS)
    for key, causes in rl_v03.ROW_CAUSES.items():
        assert key in keys and set(causes) <= set(rl_v03.COLUMNS), key


def test_the_phase_table_prints_errors_against_the_post_and_the_rerun():
    """error = simulated / measured - 1, by hand: refit 6 s against the post's 5 (+20 %)
    and the rerun's 8 (-25 %); the rest of the step is the step less the four phases."""
    cols = {"policy training": 21.0, "refit": 6.0, "generation": 58.0, "get logprobs": 9.0}
    pub = (28.0, 5.0, 58.0, 18.0)
    rerun = ((27.0, 8.0, 56.0, 18.0), 116.0, 811)
    rows = rl_v03.phase_table(cols, 100.0, pub, 112.0, rerun)
    assert rows[0].endswith("| error | rerun s | error vs rerun |")
    assert rows[3] == "| refit | 6.0 | 5 | +20.0 % | 8 | -25.0 % |"
    assert rows[4] == "| generation | 58.0 | 58 | +0.0 % | 56 | +3.6 % |"
    # the rest: 100 - 94 simulated, 112 - 109 published, 116 - 109 rerun
    assert rows[6] == "| rest of the step (the preps' timers, data, checks) | 6.0 | 3 | - | 7 | - |"
    assert rows[7] == "| step | 100.0 | 112 | -10.7 % | 116 | -13.8 % |"
    # a row nobody reran keeps the post's four columns
    assert rl_v03.phase_table(cols, 100.0, pub, 112.0)[0] == \
        "| phase | simulated s | published s | error |"
    assert set(rl_v03.RERUNS) <= {r[0] for r in rl_v03.ROWS}
