"""moesim rl's honest summaries, output folder and bad input: "steady state" only when
there is one, the output convention (summary.md and summary.json, a claimed folder,
another scenario's outputs kept without --force), the trainer's layout from parallel (rl.train over it), every numeric
field of rl: fuzzed (NaN, inf, 0, -1, 1e-320, 10^12) to one line or a bounded run."""

from __future__ import annotations

import json
import math

import pytest

from moesim.cli import main
from moesim.errors import InputError
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.summary import FILL_AND_DRAIN, STEADY, step_window, summarize, text_summary
from tests.test_rl_run import ROLL, TRAIN, scenario


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """moesim rl writes out/<name> by default; keep the step-cost cache here too."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MOESIM_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("n, lag, want", [
    (2, 1, (FILL_AND_DRAIN, 0, 1)),     # the issue's --steps 2 with max_lag 1
    (3, 1, (STEADY, 1, 1)),             # one step between the fill and the drain
    (6, 2, (STEADY, 2, 3)),
    (4, 2, (FILL_AND_DRAIN, 0, 3)),
    (1, 0, (STEADY, 0, 0)),             # synchronous: every step is the steady state
    (5, 0, (STEADY, 0, 4)),
])
def test_step_window_by_hand(n, lag, want):
    assert step_window(n, lag) == want


def _run(tmp_path, steps, **rl):
    setup = resolve_rl(scenario(tmp_path, steps=steps, **rl))
    run = simulate_rl(setup, steps, rollout_costs=ROLL, trainer_costs=TRAIN)
    return run, summarize(run)


def test_two_steps_with_max_lag_1_are_fill_and_drain(tmp_path):
    from moesim.rl.summary import details

    run, s = _run(tmp_path, 2, max_lag=1)
    times = [r["time_s"] for r in s["steps"]]
    assert s["step_time_kind"] == FILL_AND_DRAIN and s["steps_averaged"] == [0, 1]
    assert s["step_time_s"] == pytest.approx((times[0] + times[1]) / 2, rel=1e-12)
    text = text_summary(s, details(run))
    assert "steady" not in text and "fill and drain, mean of steps 0-1" in text
    assert "--steps 3 or more" in text
    # three steps: step 1 lies between the fill and the drain, and is the figure
    run, s = _run(tmp_path, 3, max_lag=1)
    assert s["step_time_kind"] == STEADY and s["steps_averaged"] == [1, 1]
    assert s["step_time_s"] == s["steps"][1]["time_s"]
    assert "(steady state, mean of step 1)" in text_summary(s, details(run))


def test_cli_two_steps_max_lag_1_does_not_say_steady_state(tmp_path, capsys):
    p = scenario(tmp_path, steps=2, max_lag=1)
    assert main(["rl", str(p), "--quiet", "--no-files"]) == 0
    out = capsys.readouterr().out
    assert "steady" not in out and "fill and drain" in out
    assert not (tmp_path / "out").exists()          # --no-files: nothing written


def test_default_folder_is_runs_and_holds_summary_md_and_json(tmp_path, capsys):
    p = scenario(tmp_path, steps=1)
    assert main(["rl", str(p), "--quiet"]) == 0
    out = tmp_path / "out" / "rl-toy"
    names = {f.name for f in out.iterdir()}
    assert {"summary.md", "summary.json", "details.json", "trace.json", "gantt.png"} <= names
    assert main(["rl", str(p), "--quiet", "--set", "seed=6"]) == 0     # a folder of its own
    assert (tmp_path / "out" / "rl-toy--seed=6" / "summary.json").exists()
    before = (out / "summary.json").read_bytes()
    assert main(["rl", str(p), "--quiet"]) == 0       # the same command reruns into it
    assert (out / "summary.json").read_bytes() == before
    assert main(["rl", str(p), "-o", str(out), "--no-files"]) == 2   # -o with --no-files
    capsys.readouterr()


def test_another_scenario_is_not_replaced_without_force(tmp_path, capsys):
    p = scenario(tmp_path, steps=1)
    out = tmp_path / "o"
    assert main(["rl", str(p), "-o", str(out), "--quiet"]) == 0
    before = (out / "summary.json").read_bytes()
    capsys.readouterr()
    assert main(["rl", str(p), "-o", str(out), "--quiet", "--set", "rl.steps=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--force" in err
    assert (out / "summary.json").read_bytes() == before
    assert main(["rl", "grpo-qwen3-30b-a3b", "-o", str(out), "--quiet", "--strict"]) == 2
    assert (out / "summary.json").read_bytes() == before
    capsys.readouterr()


def test_concurrent_loser_fails_in_one_line_naming_the_other_run(tmp_path, capsys):
    from moesim.outputs import claim

    p = scenario(tmp_path, steps=1)
    out = tmp_path / "o"
    assert main(["rl", str(p), "-o", str(out), "--quiet"]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    capsys.readouterr()
    with claim(out):            # another run holds the folder (its lock)
        assert main(["rl", str(p), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "another moesim run" in err
    assert "not moesim" not in err and "did not write" not in err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before    # nothing lost


def _trainer(tmp_path, overrides=(), **rl):
    """The trainer phase (s) of one step priced by the engines, and the setup."""
    setup = resolve_rl(scenario(tmp_path, steps=1, **rl), list(overrides))
    run = simulate_rl(setup, 1, rollout_costs=ROLL)
    return summarize(run)["phases_s"]["train"], setup


@pytest.mark.parametrize("item", ["parallel.cp=2", "rl.train.cp=2"])
def test_context_parallel_reaches_the_trainer(tmp_path, item):
    """The trainer's layout is the scenario's parallel section, rl.train over it: cp 2 on
    the 8 trainer GPUs halves data parallelism (8 -> 4), so each replica trains twice the
    rows, and the run changes."""
    from moesim.rl.engine_costs import trainer_scenario_of

    base, setup0 = _trainer(tmp_path)
    cp, setup = _trainer(tmp_path, [item])
    assert (setup0.cfg.train.cp, setup0.cfg.train.dp) == (1, 8)
    assert (setup.cfg.train.cp, setup.cfg.train.dp) == (2, 4)
    assert trainer_scenario_of(setup).parallel.cp == 2
    assert cp != base


def test_rl_train_overrides_parallel_only_where_written(tmp_path):
    """ZeRO 1 and sequence parallelism reach the trainer (rl.train writes no zero);
    parallel.tp 4 and ep 4 do not (rl.train writes tp 2 and ep 8)."""
    from moesim.rl.engine_costs import trainer_scenario_of

    setup = resolve_rl(scenario(tmp_path), ["rl.train.tp=2", "parallel.tp=4", "parallel.ep=4",
                                            "parallel.zero=1",
                                            "parallel.sequence_parallel=true"])
    tr = setup.cfg.train
    assert (tr.tp, tr.ep, tr.zero, tr.dp) == (2, 8, 1, 4)
    par = trainer_scenario_of(setup).parallel
    assert (par.tp, par.ep, par.zero, par.sequence_parallel) == (2, 8, 1, True)


@pytest.mark.parametrize("item, field", [("parallel.dp=3", "parallel.dp"),
                                         ("schedule.microbatches=4", "schedule.microbatches"),
                                         ("schedule.micro_batch_size=2",
                                          "schedule.micro_batch_size"),
                                         ("parallel.cp=3", "rl.train.gpus")])
def test_what_rl_cannot_use_is_refused_in_one_line(tmp_path, capsys, item, field):
    p = scenario(tmp_path)
    assert main(["rl", str(p), "--set", item, "--no-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and field in err and "Traceback" not in err
    assert "command line" in err or field == "rl.train.gpus"    # tp x cp x pp = 3


def test_a_layout_in_the_files_parallel_section_reaches_the_trainer(tmp_path):
    import yaml

    p = scenario(tmp_path, train={"gpus": 8, "mini_batches": 2, "seq_len": 512})
    data = yaml.safe_load(p.read_text())
    data["parallel"] = {"tp": 2, "pp": 2, "ep": 2}
    p.write_text(yaml.safe_dump(data))
    tr = resolve_rl(p).cfg.train
    assert (tr.tp, tr.pp, tr.ep, tr.dp) == (2, 2, 2, 2)
    data["parallel"] = {"tp": 3}
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as e:
        resolve_rl(p)
    assert e.value.field == "rl.train.gpus" and e.value.source == str(p)


def test_the_exchange_backend_is_read_for_the_trainer(tmp_path):
    """parallel.ep_backend is the one parallel key rl reads: the trainer's exchange."""
    from moesim.rl.engine_costs import trainer_scenario

    p = scenario(tmp_path)
    setup = resolve_rl(p, ["parallel.ep_backend.kind=deepep"])
    assert setup.scenario.parallel.ep_backend.kind == "deepep"
    tr = setup.cfg.train
    scn = trainer_scenario(setup.scenario, tr.gpus, 8, tp=tr.tp, pp=tr.pp, ep=tr.ep,
                           seq_len=setup.seq_len, zero=1)
    assert scn.parallel.ep_backend.kind == "deepep"
    assert (scn.parallel.ep, scn.parallel.zero) == (8, 1)
    assert resolve_rl("grpo-deepseek-v3").scenario.parallel.ep_backend.kind == "deepep"


def test_reward_models_field_is_blamed_on_the_reward_model(tmp_path, capsys):
    p = scenario(tmp_path, reward={"kind": "model", "model": {"preset": "toy",
                                                              "hidden": -3}})
    with pytest.raises(InputError) as e:
        resolve_rl(p)
    assert e.value.field.startswith("rl.reward.model") and "hidden" in e.value.field
    assert main(["rl", str(p), "--no-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert "rl.reward.model.hidden" in err and "\n" not in err


@pytest.mark.parametrize("target, word", [("/dev/null", "no such file"),
                                          (".", "no such file")])
def test_not_a_scenario_file_is_not_called_missing(tmp_path, capsys, target, word):
    assert main(["rl", target, "--no-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and word not in err.lower() and "Traceback" not in err


# every numeric field of rl:, with the values that broke it before
FIELDS = [
    "steps", "prompts_per_step", "samples_per_prompt", "max_lag",
    "prompt_tokens.mean", "prompt_tokens.max", "prompt_tokens.min", "prompt_tokens.sigma",
    "response_tokens.mean", "response_tokens.max", "response_tokens.min",
    "response_tokens.sigma", "rollout.gpus", "rollout.tp", "rollout.ep",
    "rollout.kv_fraction", "rollout.max_batch", "train.gpus", "train.tp", "train.pp",
    "train.ep", "train.mini_batches", "train.epochs", "train.seq_len", "train.zero",
    "reward.cpu_s_per_sample", "reward.workers", "weight_sync.per_tensor_s",
]
VALUES = [".nan", ".inf", "-.inf", "0", "-1", "1.0e-320", "1000000000000", "1.0e+12"]


@pytest.mark.parametrize("field", FIELDS)
def test_fuzz_every_numeric_rl_field(tmp_path, field):
    """Each value is refused in one line naming the field (or a field it conflicts with),
    or runs to a bounded, finite summary (linear costs: the engines are not the point)."""
    p = scenario(tmp_path)
    for v in VALUES:
        try:
            setup = resolve_rl(p, [f"rl.{field}={v}"])
            run = simulate_rl(setup, min(setup.cfg.steps, 3), rollout_costs=ROLL,
                              trainer_costs=TRAIN)
        except InputError as err:
            line = str(err)
            assert "\n" not in line and err.field.startswith(("--set rl.", "rl.")), (v, line)
            if err.field == f"rl.{field}" or err.field.startswith(f"--set rl.{field}"):
                assert err.source == "command line", (v, line)   # the value set, not the file
            continue
        s = summarize(run)
        text = json.dumps(s, allow_nan=False)       # no NaN or Infinity in the JSON
        assert "Infinity" not in text and "NaN" not in text, (field, v)
        assert math.isfinite(s["step_time_s"]) and s["step_time_s"] > 0, (field, v)


def test_fuzz_cli_one_line_exit_2(tmp_path, capsys):
    p = scenario(tmp_path)
    for field in ("steps", "rollout.max_batch", "prompts_per_step", "train.seq_len",
                  "weight_sync.per_tensor_s", "response_tokens.sigma"):
        assert main(["rl", str(p), "--set", f"rl.{field}=1000000000000", "--no-files"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and f"rl.{field}" in err and "at most" in err, err


def test_bounds_name_the_limit(tmp_path):
    from moesim.scenario.sections.rl import MAX_SAMPLES, MAX_STEPS, MAX_TOKENS

    p = scenario(tmp_path)
    with pytest.raises(InputError, match=f"{MAX_STEPS:,}"):
        resolve_rl(p, ["rl.steps=1000000"])
    with pytest.raises(InputError, match=f"{MAX_SAMPLES:,}"):
        resolve_rl(p, ["rl.prompts_per_step=100000", "rl.samples_per_prompt=64"])
    with pytest.raises(InputError, match=f"{MAX_TOKENS:,}"):
        resolve_rl(p, ["rl.response_tokens.mean=1.0e+9"])


def test_steps_on_the_command_line_are_bounded(tmp_path, capsys):
    from moesim.scenario.sections.rl import MAX_STEPS

    p = scenario(tmp_path)
    assert main(["rl", str(p), "--steps", "1000000000", "--no-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--steps" in err and f"{MAX_STEPS}" in err


def test_gantt_is_titled_with_units(tmp_path):
    from moesim.rl.plot import plot_gantt
    from moesim.trace.plots import new_figure

    run, s = _run(tmp_path, 2, max_lag=1)
    ax = plot_gantt(run, new_figure(12, 4.5).add_subplot())
    assert "(s)" in ax.get_xlabel() and "(s)" in ax.get_title()
    end = max(sp.end_s for sp in run.timeline.spans)
    assert f"over {end:,.1f} s" in ax.get_title()
