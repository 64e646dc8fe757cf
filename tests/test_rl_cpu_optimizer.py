"""The trainer's optimizer on the host (rl.train.optimizer: cpu, moesim.rl.cpu_optimizer):
the shard, its copies per optimizer step, the phase and the memory it frees, by hand."""

from __future__ import annotations

import pytest

from moesim.errors import InputError
from moesim.model.presets import PRESETS
from moesim.rl.cpu_optimizer import host_adamw_bytes, shard_params, step_copy_s
from moesim.rl.memory import trainer_fit
from moesim.rl.run import draw_batches, resolve_rl
from moesim.scenario.sections.rl import TrainPool
from tests.test_rl_run import RL, hand_summary, scenario

TOY = PRESETS["toy"]
DENSE, EXPERTS_PER_RANK = 34_875_904, 25_165_824 // 8   # the toy on one EP8 rank


def test_the_shard_and_its_copies_by_hand():
    """The toy on 8 GPUs with EP8 and the distributed optimizer: the dense parameters over
    the 8-way data-parallel group, the rank's experts over its 1-way expert data-parallel
    group: 4,359,488 + 3,145,728 = 7,505,216 parameters. Each step moves 8 bytes of each
    (fp32 gradient out, fp32 value back): 60,041,728 B at 64 GB/s = 0.938152 ms. The
    host's AdamW touches 28 bytes a parameter for each of its 8 GPUs."""
    tr = TrainPool(gpus=8, ep=8, zero=1)
    assert shard_params(TOY, tr) == DENSE / 8 + EXPERTS_PER_RANK == 7_505_216
    assert step_copy_s(TOY, tr, 64e9) == pytest.approx(7_505_216 * 8 / 64e9)
    assert host_adamw_bytes(TOY, tr, 8) == 7_505_216 * 28 * 8
    # without the distributed optimizer every GPU's optimizer holds all its parameters
    assert shard_params(TOY, TrainPool(gpus=8, ep=8, zero=0)) == DENSE + EXPERTS_PER_RANK


def test_the_phase_is_one_copy_per_optimizer_step(tmp_path):
    """Two mini-batches, one epoch: the cpu_optimizer phase is two steps' copies; the
    other phases do not move."""
    train = {**RL["train"], "zero": 1}
    gpu = hand_summary(resolve_rl(scenario(tmp_path, train=train)))
    cpu = hand_summary(resolve_rl(scenario(tmp_path, train={**train, "optimizer": "cpu"})))
    step = step_copy_s(TOY, TrainPool(gpus=8, ep=8, zero=1), 64e9)
    assert cpu["phases_s"]["cpu_optimizer"] == pytest.approx(2 * step)
    assert gpu["phases_s"].get("cpu_optimizer", 0.0) == 0.0
    for k, v in gpu["phases_s"].items():
        if k != "cpu_optimizer":
            assert cpu["phases_s"][k] == pytest.approx(v)


def test_the_trainer_fit_leaves_the_optimizer_states_on_the_host(tmp_path):
    """The same layout needs exactly the optimizer states' bytes less (12 bytes a
    parameter of the shard), and the verdict says where they are."""
    from moesim.rl.memory import max_microbatches, trainer_table

    train = {**RL["train"], "zero": 1}
    gpu = resolve_rl(scenario(tmp_path, train=train))
    cpu = resolve_rl(scenario(tmp_path, train={**train, "optimizer": "cpu"}))
    b = draw_batches(gpu, 1)
    row = trainer_table(gpu, max_microbatches(gpu, b))["stages"][0]
    assert row["optimizer"] == pytest.approx(12 * (DENSE / 8 + EXPERTS_PER_RANK))
    f_gpu, f_cpu = trainer_fit(gpu, b), trainer_fit(cpu, draw_batches(cpu, 1))
    assert f_cpu.need_bytes == pytest.approx(f_gpu.need_bytes - row["optimizer"])
    assert "optimizer on the host" in f_cpu.what and "host" not in f_gpu.what


def test_an_unknown_optimizer_place_is_one_line(tmp_path):
    with pytest.raises(InputError) as e:
        resolve_rl(scenario(tmp_path, train={**RL["train"], "optimizer": "nvme"}))
    assert e.value.field == "rl.train.optimizer" and "gpu" in str(e.value)
