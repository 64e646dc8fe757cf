"""The training phase as NeMo RL runs it, by hand: one optimizer step per mini-batch, the
colocated host moves per phase (rl.train.offload: nemo) and the loss's full-vocabulary
log-probs (rl.train.loss_logprob: nemo)."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.rl.algorithms import GRPO, StepInputs
from moesim.rl.config import rl_from_dict
from moesim.rl.loss import elements, extra_bytes, loss_bytes
from moesim.rl.offload import HostMoves, host_moves
from moesim.rl.phases import Batch, LinearTrainerCosts, step_work
from moesim.rl.run import resolve_rl, simulate_rl
from moesim.rl.sync import PCIE_Bps
from tests.test_rl_run import RL, ROLL, TRAIN, scenario


class Counting(LinearTrainerCosts):
    """Linear costs that count the optimizer steps they price."""

    def __init__(self):
        super().__init__(train_base_s=0.5, train_per_row_s=0.25)
        object.__setattr__(self, "calls", [])

    def train_step_s(self, rows):
        self.calls.append(rows)
        return super().train_step_s(rows)


def test_a_rollout_batch_of_2048_with_global_batch_512_is_four_optimizer_steps():
    """64 prompts x 32 samples of 256 + 768 = 1,024 tokens, rows of 4,096: four samples a
    row. mini_batches 4 (2,048 / 512): four optimizer steps of 512 / 4 = 128 rows each,
    each priced with its own gradient reduce and optimizer: 4 x (0.5 + 0.25 x 128) = 130 s."""
    cfg = rl_from_dict({"prompts_per_step": 64, "samples_per_prompt": 32,
                        "rollout": {"gpus": 8}, "train": {"gpus": 8, "mini_batches": 4,
                                                          "seq_len": 4096}}, "s.yaml", world=16)
    batch = Batch(np.full(2048, 256), np.full(2048, 768))
    costs = Counting()
    work = StepInputs(cfg, costs, 2048, 512, [128, 128, 128, 128])
    assert GRPO.trainer_seconds(work)["train"] == 4 * (0.5 + 0.25 * 128) == 130.0
    assert costs.calls == [128, 128, 128, 128]
    w = step_work(cfg, batch, 4096, ROLL, 10**6, Counting(), 0.0, generation=False)
    assert (w.rows, w.mini_batch_rows) == (512, [128, 128, 128, 128])


def test_host_moves_are_each_timers_bytes_over_the_host_link():
    """Per GPU: weights 8 GB, gradients 8 GB, optimizer states 12 GB, engine 16 GB at
    64 GB/s. Gradient buffers are released and re-zeroed, never copied. vLLM sleep:
    16 / 64 = 0.25 s; log-prob prep (weights in): 0.125 s; training prep (optimizer states
    in): 12 / 64 = 0.1875 s; refit (optimizer out, engine in, weights out): 36 / 64 =
    0.5625 s; every copied byte moves twice a step: 2 x 36 = 72 GB."""
    m = HostMoves(8e9, 8e9, 12e9, 16e9, 64e9)
    assert (m.engine_sleep_s, m.logprob_prep_s, m.train_prep_s, m.refit_s) == (
        0.25, 0.125, 0.1875, 0.5625)
    assert m.bytes_per_step == 72e9
    row = {"weights": 8e9, "gradients": 8e9, "optimizer": 12e9, "activations": 1.0}
    assert host_moves(row, 16e9, 64e9) == m


def test_the_optimizer_states_leave_at_the_pageable_rate_in_the_refit():
    """The same GPU with ``offload_copy: pageable``: the optimizer states' 12 GB go out at
    2.8 GB/s (12 / 2.8 = 4.2857 s) and the engine's 16 GB in and the weights' 8 GB out at
    64 GB/s (0.375 s): refit 4.6607 s; the other timers and the bytes as at line rate."""
    m = HostMoves(8e9, 8e9, 12e9, 16e9, 64e9, 2.8e9)
    assert m.optimizer_out_s == pytest.approx(12 / 2.8)
    assert m.refit_s == pytest.approx(12 / 2.8 + 0.375)
    assert m.refit_s == pytest.approx(4.6607, abs=1e-4)
    assert (m.engine_sleep_s, m.logprob_prep_s, m.train_prep_s) == (0.25, 0.125, 0.1875)
    assert m.bytes_per_step == 72e9
    assert "pageable_Bps" not in HostMoves(8e9, 8e9, 12e9, 16e9, 64e9).as_dict()
    assert m.as_dict()["optimizer_out_s"] == m.optimizer_out_s


def test_pageable_copy_is_a_knob_of_the_section(tmp_path):
    """``rl.train.offload_copy: pageable`` reaches the moves (PAGEABLE_D2H_Bps); any other
    word is refused in one line naming the field."""
    from moesim.rl.offload import PAGEABLE_D2H_Bps, setup_moves

    colo = {"colocated": True, "rollout": {"gpus": 8, "tp": 1, "ep": 1},
            "train": {**RL["train"], "offload": "nemo", "offload_copy": "pageable"},
            "weight_sync": {"method": "ipc"}}
    m = setup_moves(resolve_rl(scenario(tmp_path, **colo)), PCIE_Bps)
    assert m.pageable_Bps == PAGEABLE_D2H_Bps == 2.8e9
    assert m.refit_s == 456_259_584 / 2.8e9 + (120_083_456 + 76_043_264) / 64e9
    bad = {**colo, "train": {**colo["train"], "offload_copy": "dma"}}
    with pytest.raises(InputError, match=r"offload_copy"):
        resolve_rl(scenario(tmp_path, **bad))


def test_the_loss_log_probs_are_110_extra_bytes_per_logits_element():
    """Qwen3-30B-A3B's vocabulary 151,936 over TP2: 75,968 per rank; a row of 4,096 tokens:
    311,164,928 elements; 116 - 6 = 110 bytes each beyond the fused loss; peak 16 bytes
    each (fp32 logits, saved softmax, int64 one-hot)."""
    assert elements(4096, 151936, 2) == 4096 * 75968 == 311_164_928
    assert extra_bytes(4096, 151936, 2) == 311_164_928 * 110
    assert loss_bytes(4096, 151936, 2) == 311_164_928 * 16
    assert elements(4096, 151936, 2, cp=2) == 2048 * 75968


def test_offload_nemo_replaces_the_switch_and_adds_the_preps(tmp_path):
    """The toy colocated on 8 GPUs (EP8 trainer, engines of one GPU): the switch into
    training is vLLM's sleep, the switch out the refit's moves, and the two preps are
    trainer phases of their own, all from the memory table's bytes at 64 GB/s."""
    colo = {"colocated": True, "rollout": {"gpus": 8, "tp": 1, "ep": 1},
            "train": {**RL["train"], "offload": "nemo"},
            "weight_sync": {"method": "ipc"}}
    setup = resolve_rl(scenario(tmp_path, **colo))
    run = simulate_rl(setup, 1, rollout_costs=ROLL, trainer_costs=TRAIN)
    m = run.moves
    assert m.host_Bps == PCIE_Bps
    assert run.switch_s == (m.engine_sleep_s, m.refit_s)
    d = run.works[0].durations
    assert d.trainer["logprob_prep"] == m.weights_bytes / PCIE_Bps
    assert d.trainer["train_prep"] == m.optimizer_bytes / PCIE_Bps
    # bf16 weights and gradients of the same parameters
    assert m.weights_bytes == m.grads_bytes > 0
    off = simulate_rl(resolve_rl(scenario(tmp_path, **{**colo, "train": RL["train"]})), 1,
                      rollout_costs=ROLL, trainer_costs=TRAIN)
    assert off.moves is None
    assert off.works[0].durations.trainer["logprob_prep"] == 0.0


def test_offload_on_disaggregated_pools_is_refused_in_one_line(tmp_path):
    with pytest.raises(InputError) as e:
        resolve_rl(scenario(tmp_path, train={**RL["train"], "offload": "nemo"}))
    assert str(e.value).startswith(f"{tmp_path / 'rl.yaml'}: rl.train.offload: expected none "
                                   "for disaggregated pools")


def test_the_toy_models_host_moves_by_hand(tmp_path):
    """The toy (60,041,728 parameters) colocated on 8 GPUs, trainer EP8 with ZeRO 0: a
    trainer GPU holds 38,021,632 parameters (tests/test_rl_v03.py works it out), so
    weights 2 x 38,021,632 = 76,043,264 bytes and optimizer states 12 x 38,021,632 =
    456,259,584 (no sharding); an engine GPU (TP1 EP1) holds the whole model,
    2 x 60,041,728 = 120,083,456 bytes. Refit = (456,259,584 + 120,083,456 +
    76,043,264) / 64e9 s; a step moves each twice: 1,304,772,608 bytes."""
    from moesim.rl.offload import setup_moves

    colo = {"colocated": True, "rollout": {"gpus": 8, "tp": 1, "ep": 1},
            "train": {**RL["train"], "offload": "nemo"}, "weight_sync": {"method": "ipc"}}
    m = setup_moves(resolve_rl(scenario(tmp_path, **colo)), PCIE_Bps)
    assert (m.weights_bytes, m.optimizer_bytes, m.engine_bytes) == (
        76_043_264, 456_259_584, 120_083_456)
    assert m.refit_s == (456_259_584 + 120_083_456 + 76_043_264) / 64e9
    assert m.bytes_per_step == 1_304_772_608


def test_the_loss_log_probs_hold_12_bytes_per_logits_element_on_the_last_stage(tmp_path):
    """The toy (vocab 32,000) with rows of 512 tokens on TP1: 512 x 32,000 = 16,384,000
    logits elements; NeMo RL's saved softmax (fp32) and one-hot (int64) add 12 bytes each
    beyond the fp32 logits the memory table counts: 196,608,000 bytes on the trainer's
    peak."""
    from moesim.rl.memory import loss_extra_bytes, trainer_fit

    on = resolve_rl(scenario(tmp_path, train={**RL["train"], "loss_logprob": "nemo"}))
    off = resolve_rl(scenario(tmp_path))
    assert loss_extra_bytes(on) == 12 * 512 * 32000 == 196_608_000
    assert loss_extra_bytes(off) == 0.0
    batch = Batch(np.full(16, 64), np.full(16, 128))
    assert trainer_fit(on, [batch]).need_bytes - trainer_fit(off, [batch]).need_bytes == (
        196_608_000)
