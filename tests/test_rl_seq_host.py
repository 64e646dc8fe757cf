"""NeMo RL's per-sequence host loops (moesim.rl.seq_host, rl.train.seq_host): the counted
calls priced by hand, what a step's phases gain, the knob off by default."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.rl import seq_host as sh
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.summary import summarize
from tests.test_rl_run import ROLL, TRAIN, scenario

US = 1e-6


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_each_loop_priced_by_hand():
    # the loss: 17 ops + 18 device-to-host reads at 16.1 us, 32 views at 3.3 us
    assert sh.parts_s(sh.TRAIN_LOSS, True) == pytest.approx((35 * 16.1 + 32 * 3.3) * US)
    assert sh.parts_s(sh.TRAIN_LOSS, True) == pytest.approx(669.1 * US)
    # packing one sequence: a read and two views; padded, one more read, two views, F.pad
    assert sh.parts_s(sh.PACK, False) == pytest.approx(22.7 * US)
    assert sh.parts_s(sh.PACK, True) == pytest.approx(61.5 * US)
    # collecting one sequence's log-probs: 3 ops, 4 reads, 6 views
    assert sh.parts_s(sh.COLLECT, True) == pytest.approx(132.5 * US)
    # each micro-batch: 10 ops + 1 read + 3 views; 2 more ops when padded
    assert sh.parts_s(sh.PER_MICRO_BATCH, False) == pytest.approx(187.0 * US)
    assert sh.parts_s(sh.PER_MICRO_BATCH, True) == pytest.approx(219.2 * US)


def test_padding_runs_with_tp_cp_or_pp():
    assert not sh.is_padded(1, 1, 1)
    assert sh.is_padded(2, 1, 1) and sh.is_padded(1, 2, 1) and sh.is_padded(1, 1, 2)


def test_a_tiny_batch_by_hand():
    # 10 samples in 2 mini-batches of 5 (3 and 2 rows) over DP2 at TP2 PP2 (padded):
    # per mini-batch ceil(5/2) = 3 sequences x (669.1 + 61.5) us, and ceil(3/2) = 2 then
    # ceil(2/2) = 1 micro-batches x 219.2 us
    got = sh.train_s(10, [3, 2], dp=2, tp=2, cp=1, pp=2)
    assert got == pytest.approx((2 * 3 * 730.6 + 3 * 219.2) * US)
    # one log-prob pass, unpadded (TP1 PP1): 5 sequences x (132.5 + 22.7), 2 micro-batches
    assert sh.logprob_s(10, 3, dp=2, tp=1, cp=1, pp=1) == pytest.approx(
        (5 * 155.2 + 2 * 187.0) * US)
    assert sh.train_s(0, [], 2, 1, 1, 1) == 0.0 and sh.logprob_s(0, 0, 2, 1, 1, 1) == 0.0


def _phases(tmp_path, mode):
    setup = resolve_rl(scenario(tmp_path))
    cfg = setup.cfg
    if mode != "none":
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_host=mode))
        setup = dataclasses.replace(setup, cfg=cfg)
    run = simulate_rl(setup, 2, rollout_costs=ROLL, trainer_costs=TRAIN)
    return cfg, summarize(run)["phases_s"]


def test_a_step_gains_the_loops_only_with_nemo(tmp_path):
    cfg, off = _phases(tmp_path, "none")
    assert cfg.train.seq_host == "none" and cfg.train.dp == 8
    _, on = _phases(tmp_path, "nemo")
    # the toy: 16 samples of 64 + 128 tokens, rows of 512 (2 samples a row), DP8, TP1 PP1
    # training: 2 mini-batches of 8 samples (4 rows): 1 sequence and 1 micro-batch each
    assert on["loss_logprob"] - off["loss_logprob"] == pytest.approx(
        2 * (669.1 + 22.7 + 187.0) * US)
    # each log-prob pass: 8 rows, ceil(16/8) = 2 sequences, 1 micro-batch
    for phase in ("old_logprob", "reference"):
        assert on[phase] - off[phase] == pytest.approx((2 * 155.2 + 187.0) * US)
    assert on["train"] == off["train"] and on["generate"] == off["generate"]

    # without sequence packing NeMo RL runs no per-sequence loop
    setup = resolve_rl(scenario(tmp_path))
    cfg = setup.cfg
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_host="nemo",
                                                             packing="none"))
    unpacked = summarize(simulate_rl(dataclasses.replace(setup, cfg=cfg), 2,
                                     rollout_costs=ROLL, trainer_costs=TRAIN))["phases_s"]
    cfg0 = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_host="none"))
    base = summarize(simulate_rl(dataclasses.replace(setup, cfg=cfg0), 2,
                                 rollout_costs=ROLL, trainer_costs=TRAIN))["phases_s"]
    assert unpacked == base


def test_the_rl_summary_echoes_the_knob_only_when_on(tmp_path):
    from moesim.scenario.sections.rl import summary_dict
    cfg = resolve_rl(scenario(tmp_path)).scenario.rl
    assert "seq_host" not in summary_dict(cfg)["train"]
    on = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seq_host="nemo"))
    assert summary_dict(on)["train"]["seq_host"] == "nemo"


def test_a_bad_value_is_one_line(tmp_path):
    from moesim.errors import InputError
    with pytest.raises(InputError, match="seq_host"):
        resolve_rl(scenario(tmp_path), ["rl.train.seq_host=eager"])
