"""Training campaigns (moesim.campaign, ``moesim train``): Young's and Daly's intervals on
a tiny campaign, the expected work lost with exponential failures worked out by hand and
a seeded simulation agreeing with it, the checkpoint's size from the memory model, the
same seed giving the same bytes."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from moesim.campaign.costs import checkpoint_shards
from moesim.campaign.formulas import daly_interval, expected_lost_work, young_interval
from moesim.campaign.simulate import Costs, simulate_campaign
from moesim.campaign.spec import DAY, Campaign, Cause, read_campaign
from moesim.cli import main


def tiny(tmp_path, **over):
    """8 GPUs, one job-wide cause at 8.64 per day (MTBF 10,000 s), a 50 GB checkpoint
    written at 1 GB/s (50 s, synchronous)."""
    data = {"name": "tiny", "cluster": {"gpus": 8, "gpus_per_node": 8, "dp": 8},
            "step": {"seconds": 1.0, "tokens": 1000},
            "failures": {"causes": {"crash": {"rate_per_day": 8.64, "per": "job"}}},
            "recovery": {"detect_crash_s": 0, "relaunch_s": 0, "nccl_init_s": 0,
                         "replace_s": 0},
            "checkpoint": {"bytes": "50GB", "interval_s": 600},
            "storage": {"write_GBps": 1, "read_GBps": 1000}}
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    p = tmp_path / "tiny.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_young_and_daly_intervals_by_hand():
    # sqrt(2 x 50 x 10,000) = 1,000 s; Daly: 1000 (1 + sqrt(0.0025)/3 + 0.0025/9) - 50
    assert young_interval(50.0, 10_000.0) == pytest.approx(1000.0, rel=1e-15)
    assert daly_interval(50.0, 10_000.0) == pytest.approx(1000 * (1 + 0.05 / 3 + 0.0025 / 9)
                                                          - 50, rel=1e-15)
    assert daly_interval(30_000.0, 10_000.0) == 10_000.0       # C >= 2M: M


def test_young_interval_of_a_tiny_campaign(tmp_path, capsys):
    p = tiny(tmp_path)
    assert main(["train", "--campaign", str(p), "--days", "3", "--json", "--no-files",
                 "--quiet"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["mtbf_h"] == pytest.approx(10_000 / 3600, rel=1e-12)
    assert s["costs"]["pause_s"] == pytest.approx(50.0, rel=1e-12)     # 50 GB / 1 GB/s
    assert s["sweep"]["young_s"] == pytest.approx(1000.0, rel=1e-12)
    assert s["sweep"]["daly_s"] == pytest.approx(966.9444444444, rel=1e-9)
    assert s["gpus"] == 8 and s["costs"]["checkpoint_TB"] == pytest.approx(0.05)


def test_expected_lost_work_by_hand():
    # lost work = X mod D for X ~ Exp(l): sum_k e^{-lkD} int_0^D y l e^{-ly} dy
    # = [1/l - e^{-lD}(D + 1/l)] / (1 - e^{-lD}) = 1/l - D e^{-lD}/(1 - e^{-lD});
    # l = 1/h, D = 1 h: 1 - e^-1/(1 - e^-1) = 1 - 0.36788/0.63212 = 0.41802 h
    assert expected_lost_work(1.0, 1.0) == pytest.approx(0.418023, abs=1e-6)
    assert expected_lost_work(1 / 3600, 3600.0) == pytest.approx(0.418023 * 3600, rel=1e-5)
    # a very long interval: every failure loses all since the restart, 1/l
    assert expected_lost_work(1.0, 1e3) == pytest.approx(1.0)


def test_seeded_simulation_agrees_with_the_lost_work_by_hand():
    # one job-wide cause at 1 per hour, checkpoints every hour, nothing else costs time:
    # the work between restarts is Exp(1/h), lost = its remainder mod 1 h.
    # E = 0.41802 h; E[Y^2] = int_0^1 y^2 e^-y dy / (1 - e^-1) = (2 - 5/e)/0.63212
    # = 0.25407, var = 0.25407 - 0.41802^2 = 0.07933, sd 0.28166 h per failure.
    camp = Campaign(causes=(Cause("c", 1 / 3600, "job"),), detect_crash_s=0.0,
                    relaunch_s=0.0, nccl_init_s=0.0, replace_s=0.0, interval_s=3600.0)
    costs = Costs(step_s=1.0, tokens_per_step=1.0, gpus=1, nodes=1, dp=1, ckpt_bytes=1.0,
                  ckpt_bytes_per_gpu=1.0, pause_s=0.0, lag_s=0.0, write_s=0.0, load_s=0.0,
                  peer_load_s=0.0)
    tl = simulate_campaign(camp, costs, days=200, seed=7, keep_points=False)
    n = len(tl.failures)
    assert n > 4000                     # 200 days x 24 per day = 4,800 expected
    mean_h = sum(x[2] for x in tl.failures) / n / 3600
    sd = math.sqrt((2 - 5 / math.e) / (1 - 1 / math.e) - 0.418023 ** 2)
    assert sd == pytest.approx(0.28166, abs=1e-4)
    # the mean of n draws lies within 4 standard errors but for 6e-5 of seeds
    assert abs(mean_h - 0.418023) < 4 * sd / math.sqrt(n)
    # nothing but lost work separates wall clock from training: ETTR = 1 - lost / wall
    assert tl.work_s == pytest.approx(tl.wall_s - sum(x[2] for x in tl.failures))


def test_checkpoint_is_the_memory_models_zero3_shard_of_weights_and_optimizer():
    from moesim.memory.model import memory_per_rank
    from moesim.model.params import count_params
    from moesim.wiring import resolve_path

    res = resolve_path("toy-cpu")       # 2 ranks, EP 2, DP 2, EDP 1
    total, per_rank = checkpoint_shards(res)
    m = memory_per_rank(res.model, micro_batch_tokens=128, seq_len=128, ep=2, dp=2, zero=3,
                        device=res.device)
    assert per_rank == pytest.approx(m.weights + m.optimizer, rel=1e-12)
    # dense weights split over DP 2, each rank its 4 experts of 8: the two shards hold
    # every parameter once, at 2 B (bf16) + 12 B (fp32 master, Adam m, v)
    assert total == pytest.approx(14 * count_params(res.model).total, rel=1e-12)


def test_same_seed_same_bytes(tmp_path, capsys):
    p = tiny(tmp_path)
    outs = []
    for name in ("a", "b"):
        o = tmp_path / name
        assert main(["train", "--campaign", str(p), "--days", "4", "-o", str(o),
                     "--quiet", "--seed", "3"]) == 0
        outs.append(o)
    capsys.readouterr()
    for f in ("summary.json", "summary.md", "timeline.png"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes()
    assert main(["train", "--campaign", str(p), "--days", "4", "--json", "--no-files",
                 "--seed", "4"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert other != json.loads((outs[0] / "summary.json").read_text())


def test_async_checkpoints_pause_for_the_host_copy_only(tmp_path, capsys):
    p = tiny(tmp_path, checkpoint={"mode": "async", "host_copy_GBps": 10})
    assert main(["train", "--campaign", str(p), "--days", "1", "--json", "--no-files",
                 "--no-sweep"]) == 0
    s = json.loads(capsys.readouterr().out)
    # 50 GB over 8 GPUs: 6.25 GB per GPU copied at 10 GB/s; the 50 s write runs after
    assert s["costs"]["pause_s"] == pytest.approx(0.625)
    assert s["costs"]["lag_s"] == pytest.approx(50.0)


def test_default_campaign_is_the_llama3_table():
    camp = read_campaign(None)
    by = {c.name: c for c in camp.causes}
    assert len(camp.causes) == 19
    # 148 faulty GPUs in 54 days on 16,384 GPUs, per GPU per second
    assert by["faulty_gpu"].rate == pytest.approx(148 / (54 * DAY * 16384))
    assert by["cpu"].rate == pytest.approx(2 / (54 * DAY * 2048))
    n = sum(c.rate * {"gpu": 16384, "node": 2048, "job": 1}[c.per] for c in camp.causes)
    assert n * 54 * DAY == pytest.approx(466)


def test_llama3_campaign_counts_match_the_table_over_seeds():
    from moesim.campaign.run import run_campaign

    camp = read_campaign("llama3-405b")
    runs = [run_campaign(camp, None, None, "", days=54, tokens=None, seed=s,
                         sweep=False).summary for s in range(40)]
    assert runs[0]["interruptions_expected"] == pytest.approx(466.0)
    # failures arrive over wall clock whatever the job does: each count is Poisson(466),
    # the mean of 40 within 4 standard errors, 4·sqrt(466/40) = 13.7
    mean = sum(r["interruptions"] for r in runs) / 40
    assert abs(mean - 466) < 4 * math.sqrt(466 / 40)
    gpu = sum(r["by_cause"][0]["simulated"] for r in runs) / 40       # faulty_gpu: 148
    assert runs[0]["by_cause"][0]["cause"] == "faulty_gpu"
    assert abs(gpu - 148) < 4 * math.sqrt(148 / 40)
