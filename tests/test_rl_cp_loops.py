"""NeMo RL's per-sequence context-parallel work (moesim.rl.cp_loops, under
rl.train.seq_host: nemo with CP > 1): the counted calls priced by hand, what a step's
phases gain, nothing with CP 1."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.collectives.nccl import launch
from moesim.rl import cp_loops as cl
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.summary import summarize
from tests.test_rl_run import ROLL, TRAIN, scenario

US = 1e-6


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_each_loop_priced_by_hand():
    # CP4, the loss's forward: 6 ops (cat, 4 empty_like, cat) at 16.1 us, 7 views at 3.3
    assert cl.train_forward(4).seconds == pytest.approx((6 * 16.1 + 7 * 3.3) * US)
    # its backward: 3 ops, 2 views
    assert cl.train_backward(4).seconds == pytest.approx(54.9 * US)
    # the collection: 7 ops + 2 reads, 8 views
    assert cl.collect(4).seconds == pytest.approx((9 * 16.1 + 8 * 3.3) * US)
    assert cl.collect(2).seconds == pytest.approx(132.5 * US)


def test_a_tiny_batch_by_hand():
    # 10 samples in 2 mini-batches (5 each) over DP2 at CP2, all-gather 20 us, all-reduce
    # 30 us: ceil(5/2) = 3 sequences a mini-batch x (80.9 + 20 + 54.9 + 30) us
    got = cl.train_s(10, 2, dp=2, cp=2, gather_s=20 * US, reduce_s=30 * US)
    assert got == pytest.approx(6 * 185.8 * US)
    # one log-prob pass: 5 sequences x (132.5 + 20) us, ceil(3/2) = 2 micro-batches x 16.1
    assert cl.logprob_s(10, 3, dp=2, cp=2, gather_s=20 * US) == pytest.approx(
        (5 * 152.5 + 2 * 16.1) * US)
    # CP 1: the code returns early
    assert cl.train_s(10, 2, 2, 1, 1.0, 1.0) == 0.0 and cl.logprob_s(10, 3, 2, 1, 1.0) == 0.0
    assert cl.mean_sequence(3, 100, 7) == 43


def _phases(tmp_path, seq_host, cp):
    train = {"gpus": 8, "tp": 1, "ep": 1, "cp": cp, "mini_batches": 2, "seq_len": 512}
    setup = resolve_rl(scenario(tmp_path, train=train))
    cfg = dataclasses.replace(setup.cfg, train=dataclasses.replace(setup.cfg.train,
                                                                   seq_host=seq_host))
    run = simulate_rl(dataclasses.replace(setup, cfg=cfg), 2, rollout_costs=ROLL,
                      trainer_costs=TRAIN)
    return cfg, summarize(run)["phases_s"]


def test_a_step_gains_the_cp_loops_with_seq_host(tmp_path):
    cfg, off = _phases(tmp_path, "none", 2)
    assert cfg.train.dp == 4
    _, on = _phases(tmp_path, "nemo", 2)
    # 16 samples of 192 tokens (a multiple of 2 cp tp = 4), rows of 512: 8 rows, DP4.
    # Training, each of 2 mini-batches (8 samples, 4 rows): 2 sequences x (loss 669.1 +
    # packing 61.5 + CP 80.9 + 54.9) and 1 micro-batch x 219.2 us; the linear trainer
    # costs have no scenario, so no NCCL time
    assert on["loss_logprob"] - off["loss_logprob"] == pytest.approx(
        2 * (2 * (669.1 + 61.5 + 80.9 + 54.9) + 219.2) * US)
    # each log-prob pass: 4 sequences x (132.5 + 61.5 + CP 132.5), 2 micro-batches x
    # (219.2 + 16.1)
    for phase in ("old_logprob", "reference"):
        assert on[phase] - off[phase] == pytest.approx(
            (4 * (132.5 + 61.5 + 132.5) + 2 * (219.2 + 16.1)) * US)


def test_cp_one_adds_nothing_beyond_seq_host(tmp_path):
    # the same toy at CP1 (DP8): seq_host's loops alone (test_rl_seq_host's figures)
    _, off = _phases(tmp_path, "none", 1)
    _, on = _phases(tmp_path, "nemo", 1)
    assert on["loss_logprob"] - off["loss_logprob"] == pytest.approx(
        2 * (669.1 + 22.7 + 187.0) * US)


def test_the_calls_from_nccls_model(tmp_path):
    from moesim.rl.engine_costs import EngineTrainerCosts, gpus_per_node
    train = {"gpus": 8, "tp": 1, "ep": 1, "cp": 2, "mini_batches": 2, "seq_len": 512}
    setup = resolve_rl(scenario(tmp_path, train=train))
    tr = setup.cfg.train
    costs = EngineTrainerCosts(setup.scenario, tr.gpus, gpus_per_node(setup), tp=tr.tp,
                               pp=tr.pp, ep=tr.ep, cp=tr.cp, seq_len=setup.seq_len)
    gather, reduce = cl.calls_s(costs, 1024)
    # an all-gather: its host call, then NCCL's estimate for 2 ranks on one node (a few us)
    gpu = gather - launch.CALL_HOST_S
    assert 0 < gpu < 50 * US
    # the backward's all-reduce: max(host, GPU + launch)
    assert reduce >= launch.CALL_HOST_S
    assert cl.calls_s(costs, 1024) == (gather, reduce)           # memoised
    one = EngineTrainerCosts(setup.scenario, tr.gpus, gpus_per_node(setup), tp=1, pp=1,
                             ep=1, cp=1, seq_len=setup.seq_len)
    from moesim.wiring import resolve
    assert cl.nccl_gpu_s(resolve(one.scn), "all_gather", 4096.0) == 0.0   # no CP group
