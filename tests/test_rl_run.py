"""RL runs end to end (moesim.rl.run, moesim rl): phases by hand with linear costs,
conservation of samples and tokens, lags, outputs, same seed same bytes, bad input."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import yaml

from moesim.cli import main
from moesim.rl.phases import LinearTrainerCosts
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.summary import KEYS, summarize
from moesim.traffic.step_costs import LinearStepCosts

RL = {
    "steps": 3, "prompts_per_step": 4, "samples_per_prompt": 4,
    "prompt_tokens": {"dist": "fixed", "mean": 64},
    "response_tokens": {"dist": "fixed", "mean": 128},
    "colocated": False,
    "rollout": {"gpus": 8, "tp": 1, "ep": 1},
    "train": {"gpus": 8, "tp": 1, "ep": 8, "mini_batches": 2, "seq_len": 512},
    "reward": {"kind": "rule", "cpu_s_per_sample": 0.001, "workers": 32},
    "max_lag": 0, "weight_sync": {"method": "nccl"},
}
ROLL = LinearStepCosts(prefill_base_s=0.01, prefill_per_token_s=1e-5, decode_base_s=0.02,
                       decode_per_seq_s=1e-3, decode_per_ctx_token_s=1e-6)
TRAIN = LinearTrainerCosts(forward_per_row_s=0.05, train_base_s=0.3, train_per_row_s=0.2)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """moesim rl writes out/<name> by default: run every test in its own folder."""
    monkeypatch.chdir(tmp_path)


def scenario(tmp_path, **rl):
    data = {"name": "rl-toy", "seed": 5,
            "cluster": {"topology": "dgx-h100", "nodes": 2, "device": "H100"},
            "model": {"preset": "toy"}, "routing": {"kind": "uniform"},
            "compute": {"kind": "roofline"}, "engine": {"mode": "fast"},
            "schedule": {"seq_len": 512},
            "rl": {**RL, **rl}}
    p = tmp_path / "rl.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def with_rollout(setup, **fields):
    """``setup`` with ``rl.rollout``'s ``fields`` set (a rollout knob on)."""
    cfg = dataclasses.replace(setup.cfg, rollout=dataclasses.replace(setup.cfg.rollout,
                                                                     **fields))
    return dataclasses.replace(setup, cfg=cfg)


def hand_summary(setup) -> dict:
    """One RL step of ``setup`` on the hand-checkable linear costs (ROLL, TRAIN)."""
    return summarize(simulate_rl(setup, 1, rollout_costs=ROLL, trainer_costs=TRAIN))


def hand_generate():
    # 16 samples over 8 replicas: 2 per replica; one prefill of 2 x 64 tokens, then 127
    # decode steps at batch 2 over contexts 65 .. 191
    pre = 0.01 + 1e-5 * 128
    dec = sum(0.02 + 1e-3 * 2 + 1e-6 * 2 * c for c in range(65, 192))
    return pre + dec


def test_synchronous_step_is_generate_score_train_sync(tmp_path):
    run = simulate_rl(resolve_rl(scenario(tmp_path)), 3, rollout_costs=ROLL,
                      trainer_costs=TRAIN)
    s = summarize(run)
    assert set(s) == set(KEYS)
    ph = s["phases_s"]
    # 16 sequences of 192 tokens pack 2 per row of 512: 8 rows, 4 per mini-batch
    assert ph["generate"] == pytest.approx(hand_generate(), rel=1e-9)
    assert ph["old_logprob"] == pytest.approx(0.05 * 8) == ph["reference"]
    assert ph["reward"] == pytest.approx(0.001)             # 16 samples on 32 workers
    assert ph["train"] == pytest.approx(2 * (0.3 + 0.2 * 4))
    assert ph["weight_sync"] == pytest.approx(run.sync.time_s) and run.sync.time_s > 0
    assert ph["switch"] == 0
    total = sum(ph.values())
    assert s["step_time_s"] == pytest.approx(total, rel=1e-12)
    for row in s["steps"]:
        assert row["time_s"] == pytest.approx(total, rel=1e-12)
        assert row["lag"] == 0
    assert s["staleness"] == {"0": 48}
    # samples and tokens conserved: generated = scored = trained; tokens trained are the
    # prompts and the responses generated
    assert all(r["samples"] == 16 and r["prompt_tokens"] == 16 * 64 and
               r["response_tokens"] == 16 * 128 for r in s["steps"])
    assert s["tokens_per_s_per_gpu"] * s["step_time_s"] * 16 == pytest.approx(16 * 192)
    assert s["samples_per_s"] == pytest.approx(16 / total)


def test_one_step_off_is_max_of_generate_and_train_plus_sync(tmp_path):
    run = simulate_rl(resolve_rl(scenario(tmp_path, max_lag=1, steps=6)), 6,
                      rollout_costs=ROLL, trainer_costs=TRAIN)
    s = summarize(run)
    ph = s["phases_s"]
    trainer = ph["reward"] + ph["old_logprob"] + ph["reference"] + ph["train"]
    steady = max(ph["generate"], trainer) + ph["weight_sync"]
    assert [r["time_s"] for r in s["steps"][1:-1]] == pytest.approx([steady] * 4, rel=1e-12)
    assert s["step_time_s"] == pytest.approx(steady, rel=1e-12)
    assert all(r["lag"] <= 1 for r in s["steps"])
    assert sum(s["staleness"].values()) == 6 * 16 and s["staleness"]["1"] == 5 * 16


def test_colocated_adds_the_switch(tmp_path):
    p = scenario(tmp_path, colocated=True, rollout={"gpus": 8}, train={
        "gpus": 8, "ep": 8, "mini_batches": 2, "seq_len": 512}, weight_sync={"method": "ipc"})
    run = simulate_rl(resolve_rl(p), 2, rollout_costs=ROLL, trainer_costs=TRAIN)
    s = summarize(run)
    assert s["phases_s"]["switch"] == pytest.approx(sum(run.switch_s)) and sum(run.switch_s) > 0
    assert s["step_time_s"] == pytest.approx(sum(s["phases_s"].values()), rel=1e-12)
    assert s["utilization"]["rollout"] + s["utilization"]["train"] < 1


def test_cli_outputs_and_same_seed_same_bytes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MOESIM_CACHE", str(tmp_path / "cache"))
    p = scenario(tmp_path, steps=2)
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert main(["rl", str(p), "-o", str(out), "--quiet", "--json"]) == 0
        s = json.loads(capsys.readouterr().out)
        assert set(s) == set(KEYS)
        outs.append(out)
    for f in ("summary.json", "trace.json", "details.json"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes()
    assert (outs[0] / "gantt.png").stat().st_size > 0
    trace = json.loads((outs[0] / "trace.json").read_text())["traceEvents"]
    procs = {e["args"]["name"] for e in trace if e.get("name") == "process_name"}
    assert len(procs) == 2
    counters = {e["name"] for e in trace if e["ph"] == "C"}
    assert counters == {"rollout batch", "KV use"}
    assert max(e["args"]["fraction"] for e in trace if e["name"] == "KV use") <= 1
    # a rerun of the same scenario replaces its own outputs; another scenario's (another
    # seed) only with --force
    assert main(["rl", str(p), "-o", str(outs[0]), "--quiet"]) == 0
    capsys.readouterr()
    other = ["rl", str(p), "-o", str(outs[0]), "--quiet", "--set", "seed=6",
             "--set", "rl.response_tokens.dist=uniform", "--set", "rl.response_tokens.max=200"]
    assert main(other) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--force" in err
    assert (outs[0] / "summary.json").read_bytes() == (outs[1] / "summary.json").read_bytes()
    assert main([*other, "--force"]) == 0


@pytest.mark.parametrize("sets, field", [
    (["rl.colocated=true", "rl.max_lag=1"], "rl.max_lag"),
    (["rl.rollout.gpus=0"], "rl.rollout.gpus"),
    (["rl.frobnicate=1"], "rl.frobnicate"),
    (["rl.train.gpus=16"], "rl.train.gpus"),
    (["rl.train.seq_len=100"], "rl.train.seq_len"),
    (["rl.train.mini_batches=3"], "rl.train.mini_batches"),
    (["rl.response_tokens.dist=zipf"], "rl.response_tokens.dist"),
    (["rl.rollout.kv_fraction=1.5"], "rl.rollout.kv_fraction"),
    (["rl.rollout.kv_fraction=0.001"], "rl.rollout.kv_fraction"),
    (["rl.rollout.cuda_graphs=2"], "rl.rollout.cuda_graphs"),
    (["rl.weight_sync.method=ipc"], "rl.weight_sync.method"),
    (["rl.colocated=true", "rl.max_lag=0", "rl.weight_sync.method=sharded"],
     "rl.weight_sync.method"),
    (["rl.max_lag=-1"], "rl.max_lag"),
    (["rl.partial_rollouts=true"], "rl.partial_rollouts"),
    (["rl.partial_rollouts=3", "rl.max_lag=1"], "rl.partial_rollouts"),
    (["rl.kv_after_sync=keep", "rl.max_lag=1"], "rl.kv_after_sync"),
    (["rl.kv_after_sync=maybe"], "rl.kv_after_sync"),
])
def test_bad_rl_values_one_line_exit_2(tmp_path, capsys, sets, field):
    p = scenario(tmp_path)
    args = ["rl", str(p), "--quiet"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and field in err and "Traceback" not in err


def test_bad_steps_and_missing_section(tmp_path, capsys):
    p = scenario(tmp_path)
    assert main(["rl", str(p), "--steps", "0"]) == 2
    assert "--steps" in capsys.readouterr().err
    assert main(["rl", "mixtral-8x7b-ep8"]) == 2
    err = capsys.readouterr().err
    assert "rl" in err and "\n" not in err.strip()


def test_hand_generate_formula_is_what_the_costs_give():
    # the hand formula above, against the generation engine for one replica of 2 samples
    import numpy as np

    from moesim.rl.generate import generate
    g = generate(np.full(2, 64), np.full(2, 128), ROLL, 1, 10_000, 1024)
    assert g.time_s == pytest.approx(hand_generate(), rel=1e-12)
    assert math.isfinite(g.long_tail_s)


def test_sweep_point_of_an_rl_scenario_is_an_rl_row(tmp_path, monkeypatch):
    from moesim.sweep.runner import run_point

    monkeypatch.setenv("MOESIM_CACHE", str(tmp_path / "cache"))
    from moesim.sweep.spec import expand, parse_sweep

    p = scenario(tmp_path, steps=4)     # max_lag 1: 1 to fill, 2 steady, 1 to drain
    spec = parse_sweep({"scenario": str(p), "set": ["rl.train.gpus=null", "rl.train.ep=4"],
                        "axes": {"rl.rollout.gpus": [4, 8], "rl.max_lag": [0, 1]}},
                       str(tmp_path / "s.yaml"), tmp_path)
    points = expand(spec)
    assert len(points) == 4
    rec = run_point(points[1].as_dict())
    assert rec["status"] == "ok", rec
    m = rec["metrics"]
    for key in ("step_time_s", "phases_s.generate", "phases_s.weight_sync",
                "utilization.rollout", "utilization.train", "samples_per_s", "long_tail_s",
                "step_time_kind", "oom"):
        assert key in m
    assert m["step_time_kind"] == "steady_state" and "stall_fraction" not in m
    # rollout 4 GPUs, the rest (12) train: the trainer's pool follows the split
    setup = resolve_rl(p, ["rl.train.gpus=null", "rl.train.ep=4", "rl.rollout.gpus=4"])
    assert setup.cfg.train.gpus == 12


def test_gantt_takes_an_axes_and_draws_every_span(tmp_path):
    from moesim.rl.plot import plot_gantt
    from moesim.trace.plots import new_figure

    run = simulate_rl(resolve_rl(scenario(tmp_path, max_lag=1)), 3, rollout_costs=ROLL,
                      trainer_costs=TRAIN)
    fig = new_figure(8, 4)
    ax = fig.add_subplot()
    assert plot_gantt(run, ax, max_steps=2) is ax
    drawn = [sp for sp in run.timeline.spans if sp.step < 2]
    assert len(ax.patches) == len(drawn)


def test_reward_model_is_a_forward_pass_over_the_rows(tmp_path):
    costs = dataclasses.replace(TRAIN, reward_per_row_s=0.125)
    p = scenario(tmp_path, reward={"kind": "model"}, old_logprob=False)
    s = summarize(simulate_rl(resolve_rl(p), 1, rollout_costs=ROLL, trainer_costs=costs))
    assert s["phases_s"]["reward"] == pytest.approx(0.125 * 8)     # 8 packed rows
    assert s["phases_s"]["old_logprob"] == 0


def test_partial_rollouts_pause_at_each_sync_hand_worked(tmp_path):
    # generation: prefill 0.1 s (one step per replica, 2 samples of 64 tokens), then 127
    # decode steps of 0.01 s: G = 1.37 s. Training 2 mini-batches x 0.1025 s = 0.205 s,
    # no scoring passes. max_lag 1 with partial rollouts:
    # - batch 0: [0, G] under version 0; version 1 published at P1 = G + 0.205
    # - batch 1 starts at G under version 0; at P1 (0.205 s in: the prefill and 10 decode
    #   steps done, 11 tokens per sample, the step in flight dropped) the sync (W s)
    #   pauses it; then one prefill (0.1 s) recomputes prompt + 11 tokens and samples the
    #   12th, and 116 decode steps finish: 0.205 + W + 0.1 + 1.16 s; every sample holds
    #   tokens of versions 0 and 1 and counts as lag 1 (its oldest)
    # - batch 2 likewise, under versions 1 and 2, paused 0.205 s after it starts
    roll = LinearStepCosts(prefill_base_s=0.1, decode_base_s=0.01)
    train = LinearTrainerCosts(train_base_s=0.1025)
    p = scenario(tmp_path, max_lag=1, partial_rollouts=True, old_logprob=False,
                 reference=False, reward={"kind": "rule", "cpu_s_per_sample": 0.0})
    run = simulate_rl(resolve_rl(p), 3, rollout_costs=roll, trainer_costs=train)
    W = run.sync.time_s
    G = 0.1 + 127 * 0.01
    g1 = 0.205 + W + 0.1 + 1.16
    tl = run.timeline
    assert tl.gen_start_s == pytest.approx([0.0, G, G + g1], rel=1e-12)
    assert tl.step_end_s == pytest.approx([G + 0.205 + W, G + g1 + 0.205 + W,
                                           G + 2 * g1 + 0.205 + W], rel=1e-12)
    assert [int(v.min()) for v in tl.first_version] == [0, 0, 1]
    assert [int(v.max()) for v in tl.last_version] == [0, 1, 2]
    s = summarize(run)
    assert s["staleness"] == {"0": 16, "1": 32}
    assert [r["two_version_samples"] for r in s["steps"]] == [0, 16, 16]
    # generate excludes the sync inside it
    assert s["phases_s"]["generate"] == pytest.approx((G + 2 * (g1 - W)) / 3, rel=1e-12)
    # engine steps per replica: batch 0 one prefill + 127 decodes; batches 1 and 2 one
    # prefill + 10 decodes, then (the dropped step not counted) one prefill + 116
    assert [w.generation.steps for w in run.works] == [8 * 128] + [8 * (1 + 10 + 1 + 116)] * 2
    # without partial rollouts the sync of version 1 waits for batch 1's generation
    q = scenario(tmp_path, max_lag=1, old_logprob=False, reference=False,
                 reward={"kind": "rule", "cpu_s_per_sample": 0.0})
    base = simulate_rl(resolve_rl(q), 3, rollout_costs=roll, trainer_costs=train)
    assert base.timeline.step_end_s[0] == pytest.approx(2 * G + W, rel=1e-12)
    assert summarize(base)["staleness"] == {"0": 16, "1": 32}


def test_partial_rollouts_keeping_kv_hand_worked(tmp_path):
    # the run above with kv_after_sync: keep. Batch 1 starts at G; version 1 is
    # published 0.205 s in, during the decode step from 0.20 to 0.21 s: the engines finish
    # it (12 tokens per sample), the sync runs from 0.21 s for W s, and the samples go on
    # with their KV caches: no prefill, 116 decode steps: 0.21 + W + 1.16 s. The trainer
    # that published at 0.205 s waits for the sync to end.
    roll = LinearStepCosts(prefill_base_s=0.1, decode_base_s=0.01)
    train = LinearTrainerCosts(train_base_s=0.1025)
    p = scenario(tmp_path, max_lag=1, partial_rollouts=True, kv_after_sync="keep",
                 old_logprob=False, reference=False,
                 reward={"kind": "rule", "cpu_s_per_sample": 0.0})
    run = simulate_rl(resolve_rl(p), 3, rollout_costs=roll, trainer_costs=train)
    W = run.sync.time_s
    G = 0.1 + 127 * 0.01
    g1 = 0.21 + W + 1.16
    tl = run.timeline
    assert tl.gen_start_s == pytest.approx([0.0, G, G + g1], rel=1e-12)
    # (the last sync follows every generation: it starts when the trainer publishes)
    assert tl.step_end_s == pytest.approx([G + 0.21 + W, G + g1 + 0.21 + W,
                                           G + 2 * g1 + 0.205 + W], rel=1e-12)
    syncs = [sp for sp in tl.spans if sp.phase == "weight_sync" and sp.pool == "rollout"]
    assert [sp.start_s for sp in syncs][:2] == pytest.approx([G + 0.21, G + g1 + 0.21],
                                                            rel=1e-12)
    s = summarize(run)
    assert s["staleness"] == {"0": 16, "1": 32}
    assert [r["two_version_samples"] for r in s["steps"]] == [0, 16, 16]
    # one prefill and 127 decode steps per replica in every batch: nothing recomputed
    assert [w.generation.steps for w in run.works] == [8 * 128] * 3
    assert s["phases_s"]["generate"] == pytest.approx((G + 2 * (g1 - W)) / 3, rel=1e-12)


@pytest.mark.parametrize("skip", [True, False])
def test_hold_finishes_the_steps_in_flight_and_keeps_kv(skip):
    # 2 samples of 64 prompt tokens, 20 output tokens, on one replica: prefill 0.1 s, then
    # decode steps of 0.01 s. A hold asked 0.155 s in waits for the step ending at 0.16 s
    # (7 tokens each); released at 0.5 s, the 13 steps left end at 0.63 s. The KV cache
    # is never freed (the same blocks all along) and nothing is prefilled again.
    from moesim.rl.generate import Rollout

    roll = LinearStepCosts(prefill_base_s=0.1, decode_base_s=0.01)
    ro = Rollout([64, 64], [20, 20], roll, 1, 10_000, 8, skip=skip)
    assert ro.pause(0.155, 0.5 - 0.16, 1, keep_kv=True) == pytest.approx(0.16, rel=1e-12)
    assert [r.generated for r in ro.reqs] == [7, 7]
    assert all(r.kv_tokens == 64 + 6 for r in ro.reqs)   # the 7th token's KV: next step
    gen = ro.finish()
    assert gen.time_s == pytest.approx(0.63, rel=1e-12)
    assert gen.steps == 1 + 19 and gen.preemptions == 0
    assert list(ro.first_version) == [0, 0] and list(ro.last_version) == [1, 1]
    # a hold asked during the last step: that step ends every sample, no sync inside
    ro = Rollout([64, 64], [20, 20], roll, 1, 10_000, 8, skip=skip)
    assert ro.pause(0.285, 1.0, 1, keep_kv=True) is None
    assert ro.finish().time_s == pytest.approx(0.29, rel=1e-12)


def test_partial_rollouts_from_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MOESIM_CACHE", str(tmp_path / "cache"))
    p = scenario(tmp_path, steps=3)
    out = tmp_path / "o"
    assert main(["rl", str(p), "-o", str(out), "--json", "--set", "rl.max_lag=1",
                 "--set", "rl.partial_rollouts=true"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert sum(s["staleness"].values()) == 3 * 16
    assert all("two_version_samples" in r for r in s["steps"])
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "weight_sync" for e in trace)
    assert "partial rollouts" in (out / "summary.md").read_text()


@pytest.mark.parametrize("keep", ["keep", "recompute"])
def test_stream_with_partial_rollouts_runs_the_stream_with_pauses(tmp_path, keep):
    """rl.generation stream with rl.partial_rollouts (verl's fully asynchronous mode): each
    step's generation is the stream's with the engines paused for every weight sync, the
    pauses left to the timeline's syncs."""
    import numpy as np

    from moesim.rl.generate import stream

    setup = resolve_rl(scenario(tmp_path, max_lag=1, generation="stream",
                                partial_rollouts=True, kv_after_sync=keep))
    run = simulate_rl(setup, 3, rollout_costs=ROLL, trainer_costs=TRAIN)
    ro = setup.cfg.rollout
    want = stream([b.prompt for b in run.batches], [b.response for b in run.batches], ROLL,
                  ro.replicas, run.kv_tokens, ro.max_batch, 1, max_lag=1,
                  trainer_s=[sum(w.durations.trainer.values()) for w in run.works],
                  sync_s=run.works[0].durations.weight_sync, partial=keep)
    for w, g in zip(run.works, want, strict=True):
        assert np.array_equal(w.generation.finish_s, g.finish_s)
        assert w.durations.generate == pytest.approx(g.time_s - g.paused_s)
    assert sum(g.paused_s for g in want) > 0        # the syncs fell inside generation
    from moesim.rl.summary import details, text_summary
    head = text_summary(summarize(run), details(run)).splitlines()[0]
    assert "generation streamed, partial rollouts" in head
