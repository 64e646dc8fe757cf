"""The trainer calls' data as NeMo RL v0.3.0 hands it to every worker (moesim.rl.call_data,
rl.train.call_data): bytes and seconds by hand, what a step gains, off by default."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.rl import call_data as cd
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.summary import summarize
from tests.test_rl_run import ROLL, TRAIN, scenario


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_bytes_per_position():
    # int64 input_ids and token_mask, fp32 advantages and generation log-probs; training
    # adds the fp32 old-policy and reference log-probs
    assert cd.LOGPROB_BYTES == 24 and cd.TRAIN_BYTES == 32


def test_widths_and_workers_off_the_drivers_node():
    assert cd.padded_width(16129, 4) == 16132 and cd.padded_width(16384, 4) == 16384
    assert cd.off_node(128, 0, 8) == 120          # colocated: node 0 holds 8 of them
    assert cd.off_node(8, 8, 8) == 8              # a trainer pool on node 1
    assert cd.off_node(4, 6, 8) == 2              # GPUs 6, 7 on node 0; 8, 9 not


def test_the_16k_rows_log_prob_call_by_hand():
    # 2,048 samples padded to 16,384 over DP2: a shard of 1,024 x 16,384 x 24 bytes, put
    # 128 times, 120 copies leaving node 0
    c = cd.call(2048, 2, 16384, cd.LOGPROB_BYTES, 128, 120)
    assert c.shard_bytes == 402_653_184
    assert c.put_s == pytest.approx(128 * 402_653_184 / 19.856e9)
    assert c.send_s == pytest.approx(120 * 402_653_184 * 8 / 44.93e9)
    assert c.seconds == pytest.approx(8.6034, abs=1e-4)      # the sends: the longer


def _phases(tmp_path, mode):
    setup = resolve_rl(scenario(tmp_path))
    if mode != "none":
        cfg = dataclasses.replace(setup.cfg, train=dataclasses.replace(setup.cfg.train,
                                                                       call_data=mode))
        setup = dataclasses.replace(setup, cfg=cfg)
    return summarize(simulate_rl(setup, 2, rollout_costs=ROLL,
                                 trainer_costs=TRAIN))["phases_s"]


def test_a_step_gains_the_calls_data_only_with_nemo(tmp_path):
    off, on = _phases(tmp_path, "none"), _phases(tmp_path, "nemo")
    # the toy: 16 samples of 192 tokens (TP1: width 192) over DP8, the trainer on GPUs
    # 8..15 (node 1): each of 8 workers gets ceil(16/8) = 2 rows, all sent off node 0
    lp = 8 * (2 * 192 * 24) / cd.SEND_Bps
    for phase in ("old_logprob", "reference"):
        assert on[phase] - off[phase] == pytest.approx(lp)
    assert on["train"] - off["train"] == pytest.approx(8 * (2 * 192 * 32) / cd.SEND_Bps)
    assert on["generate"] == off["generate"]


def test_the_knob_is_off_by_default_and_checked(tmp_path):
    from moesim.errors import InputError
    assert resolve_rl(scenario(tmp_path)).cfg.train.call_data == "none"
    with pytest.raises(InputError, match="call_data"):
        resolve_rl(scenario(tmp_path), ["rl.train.call_data=ray"])


def test_a_steps_bytes_by_hand(tmp_path):
    from types import SimpleNamespace
    setup = resolve_rl(scenario(tmp_path))
    cfg = dataclasses.replace(setup.cfg, train=dataclasses.replace(setup.cfg.train,
                                                                   call_data="nemo"))
    x = SimpleNamespace(cfg=cfg, trainer=TRAIN, samples=16, longest=192)
    # two log-prob calls of 2 x 192 x 24 bytes and the training call of 2 x 192 x 32, to
    # each of 8 workers, all on node 1
    assert cd.step_bytes(x) == (8 * (2 * 9216 + 12288), 8 * (2 * 9216 + 12288))
    off = SimpleNamespace(cfg=setup.cfg, trainer=TRAIN, samples=16, longest=192)
    assert cd.step_bytes(off) == (0, 0)
