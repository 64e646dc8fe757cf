"""The log-prob passes as Megatron's forward-only pipeline runs them (moesim.rl.
logprob_pipeline, rl.train.logprob_pipeline): the pass, the stage-to-stage transfer and
the hidden states' bytes by hand; the knob off by default."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import yaml

from moesim.rl import logprob_pipeline as lp
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.summary import summarize
from moesim.wiring import resolve_path
from tests.test_rl_run import ROLL, TRAIN, scenario


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_hidden_states_bytes():
    assert lp.hidden_bytes(16384, 8192, 4, 1, False) == 16384 * 8192 * 2     # 70B, no SP
    assert lp.hidden_bytes(16384, 5120, 4, 1, True) == 4096 * 5120 * 2       # SP: seq / tp
    assert lp.hidden_bytes(16384, 8192, 4, 4, False) == 4096 * 8192 * 2      # CP4


def test_a_pass_by_hand():
    # 84 rows over DP4: 21 micro-batches; PP4: 24 cycles of 1.2 / 4 s and two transfers
    assert lp.pass_s(84, 4, 4, 1.2, 0.005) == pytest.approx(24 * (0.3 + 2 * 0.005))
    # PP2: one transfer a cycle (the first stage sends, the second receives)
    assert lp.pass_s(84, 4, 2, 1.2, 0.005) == pytest.approx(22 * (0.6 + 0.005))
    # one stage: the folded pass, m rows of the whole model
    assert lp.pass_s(84, 4, 1, 1.2, 0.005) == pytest.approx(21 * 1.2)
    assert lp.pass_s(0, 4, 4, 1.2, 0.005) == 0.0
    # CP4: each stage's ranks hold a quarter of the row's tokens
    assert lp.pass_s(84, 4, 4, 1.2, 0.005, cp=4) == pytest.approx(24 * (0.075 + 2 * 0.005))


def test_stage_to_stage_transfer_crosses_the_nic(tmp_path):
    # two DGX H100 nodes, PP2 over 16 GPUs: stage 1 is 8 ranks on, on the other node; the
    # path's bottleneck is the NIC (50 GB/s x 0.95), its latency 2.8 us (IB, same leaf)
    f = tmp_path / "pp2.yaml"
    f.write_text(yaml.safe_dump({
        "name": "pp2", "cluster": {"topology": "dgx-h100", "nodes": 2, "device": "H100"},
        "model": {"preset": "toy"}, "routing": {"kind": "uniform"},
        "compute": {"kind": "roofline"}, "parallel": {"pp": 2}, "schedule": {"seq_len": 512}}))
    res = resolve_path(f)
    assert res.layout.pipeline_neighbours(0) == (None, 8)
    got = lp.stage_transfer_s(res, 95e6)
    assert got == pytest.approx(2.8e-6 + 95e6 / 47.5e9)


def _phases(tmp_path, mode, pp):
    setup = resolve_rl(scenario(tmp_path, train={"gpus": 8, "tp": 1, "pp": pp, "ep": 1,
                                                 "mini_batches": 2, "seq_len": 512}))
    cfg = setup.cfg
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, logprob_pipeline=mode))
    run = simulate_rl(dataclasses.replace(setup, cfg=cfg), 1, rollout_costs=ROLL,
                      trainer_costs=TRAIN)
    return cfg, summarize(run)["phases_s"]


def test_the_knob_changes_only_pipelined_log_prob_passes(tmp_path):
    cfg, folded = _phases(tmp_path, "folded", 2)
    _, piped = _phases(tmp_path, "megatron", 2)
    assert cfg.train.dp == 4
    # the toy: 16 samples of 192 tokens, 2 a row of 512: 8 rows over DP4, 2 micro-batches;
    # the linear costs' row is 0.05 s and carry no scenario (no transfer): 3 cycles of 0.025
    assert piped["old_logprob"] == pytest.approx(3 * 0.025)
    assert piped["reference"] == pytest.approx(3 * 0.025)
    assert folded["old_logprob"] == pytest.approx(8 * 0.05)      # the linear costs' total
    assert piped["train"] == folded["train"]
    # one stage: unchanged
    _, one_f = _phases(tmp_path, "folded", 1)
    _, one_p = _phases(tmp_path, "megatron", 1)
    assert one_p == one_f


def test_the_rl_summary_echoes_the_knob_only_when_on(tmp_path):
    from moesim.scenario.sections.rl import summary_dict
    cfg = resolve_rl(scenario(tmp_path)).scenario.rl
    assert "logprob_pipeline" not in summary_dict(cfg)["train"]
    on = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train,
                                                            logprob_pipeline="megatron"))
    assert summary_dict(on)["train"]["logprob_pipeline"] == "megatron"


def test_blocking_transfers_of_the_training_steps_by_hand():
    from moesim.rl import pp_p2p
    assert [pp_p2p.exchanges_per_slot(p) for p in (1, 2, 4)] == [0, 1, 2]
    # two optimizer steps of 21 and 22 micro-batches, PP4: 24 and 25 slots, two 5 ms
    # exchanges each
    assert pp_p2p.train_s([21, 22], 4, 0.005) == pytest.approx((24 + 25) * 2 * 0.005)
    assert pp_p2p.train_s([21, 22], 2, 0.005) == pytest.approx((22 + 23) * 0.005)
    assert pp_p2p.train_s([0], 4, 0.005) == 0.0


def test_the_training_transfers_only_with_blocking(tmp_path):
    from moesim.rl.pp_p2p import step_train_s
    setup = resolve_rl(scenario(tmp_path, train={"gpus": 8, "tp": 1, "pp": 2, "ep": 1,
                                                 "mini_batches": 2, "seq_len": 512}))
    cfg = setup.cfg

    class Costs:            # a scenario-backed trainer stand-in: its memo holds the transfer
        scn = SimpleNamespace(schedule=SimpleNamespace(seq_len=512))
        memo = {("logprob_pipeline.transfer", 512): 0.004}

        def micro_batches(self, rows):
            return -(-rows // 4)

    from moesim.rl.algorithms import StepInputs
    x = StepInputs(cfg, Costs(), 16, 8, [4, 4])
    assert step_train_s(x) == 0.0                       # overlapped: the default
    on = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, pp_p2p="blocking"))
    # two mini-batches of 4 rows over DP4: 1 micro-batch each, 2 slots, one exchange
    assert step_train_s(StepInputs(on, Costs(), 16, 8, [4, 4])) == pytest.approx(
        2 * 2 * 0.004)
