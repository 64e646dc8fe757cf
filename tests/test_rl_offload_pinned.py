"""Copies into pinned host memory with a host's GPUs copying at once
(rl.train.offload_copy: pageable-concurrent, moesim.rl.offload_pinned), by hand."""

from __future__ import annotations

import pytest

from moesim.rl.offload import HostMoves, setup_moves
from moesim.rl.offload_pinned import SLEEP_LINE_SHARE, SLEEP_MEASURED_S, sleep_Bps
from moesim.rl.refit_wake import wake_Bps
from moesim.rl.run import resolve_rl
from moesim.rl.sync import PCIE_Bps
from tests.test_rl_run import RL, scenario


def test_the_measured_sleep_is_under_a_third_of_the_a100_link():
    """Qwen3-235B-A22B FP8 over TP4: 59.08375 GB a GPU out in (6.01 + 5.78 + 5.89) / 3 =
    5.89333 s: 10.0256 GB/s, 0.31330 of 32 GB/s; on a 64 GB/s host link 20.05 GB/s."""
    assert SLEEP_MEASURED_S == pytest.approx(5.893333, rel=1e-6)
    assert SLEEP_LINE_SHARE == pytest.approx(59.08375e9 / 5.893333 / 32e9, rel=1e-6)
    assert SLEEP_LINE_SHARE == pytest.approx(0.31330, abs=1e-5)
    assert sleep_Bps(64e9) == pytest.approx(20.051e9, rel=1e-4)


def test_the_sleep_and_the_weights_out_run_at_the_concurrent_rate():
    """Weights 8 GB, gradients 8 GB, optimizer states 12 GB, engine 16 GB, 64 GB/s, the
    optimizer out at 2.8 GB/s and the wake at 21.856 GB/s. With the pinned copies out at
    20.051 GB/s: vLLM's sleep 16 / 20.051 = 0.7980 s (0.25 s at line rate), the weights
    out 8 / 20.051 = 0.3990 s (0.125 s): the refit grows by 0.2740 s; the preps, the wake
    and the bytes are unchanged."""
    wake = wake_Bps(64e9)
    before = HostMoves(8e9, 8e9, 12e9, 16e9, 64e9, 2.8e9, wake)
    after = HostMoves(8e9, 8e9, 12e9, 16e9, 64e9, 2.8e9, wake, sleep_Bps(64e9))
    assert before.engine_sleep_s == 0.25
    assert after.engine_sleep_s == pytest.approx(0.7980, abs=1e-4)
    assert before.weights_out_s == 0.125
    assert after.weights_out_s == pytest.approx(0.3990, abs=1e-4)
    assert after.refit_s == pytest.approx(12 / 2.8 + 16e9 / wake + 8e9 / sleep_Bps(64e9))
    assert after.refit_s - before.refit_s == pytest.approx(0.2740, abs=1e-4)
    assert (after.engine_wake_s, after.logprob_prep_s, after.train_prep_s,
            after.bytes_per_step) == (before.engine_wake_s, before.logprob_prep_s,
                                      before.train_prep_s, before.bytes_per_step)
    # without the wake's rate the engine comes in at the line rate: 16 / 64 = 0.25 s
    no_wake = HostMoves(8e9, 8e9, 12e9, 16e9, 64e9, 2.8e9, None, sleep_Bps(64e9))
    assert no_wake.refit_s == pytest.approx(12 / 2.8 + 0.25 + 8e9 / sleep_Bps(64e9))
    # the summary names the rate and the weights out only with the knob on
    assert "pinned_out_Bps" not in before.as_dict()
    assert "weights_out_s" not in before.as_dict()
    assert after.as_dict()["weights_out_s"] == after.weights_out_s
    assert after.as_dict()["engine_sleep_s"] == after.engine_sleep_s


def test_the_knob_is_a_value_of_offload_copy(tmp_path):
    """The toy colocated on 8 GPUs with ``offload: nemo`` and no v0.3 calls:
    ``pageable-concurrent`` keeps the pageable optimizer copy, sets the pinned copies out
    to 0.3133 x 64 GB/s and the wake-up in to 0.3415 x 64 GB/s; ``pageable`` leaves both
    at the line rate."""
    from moesim.rl.offload import PAGEABLE_D2H_Bps

    colo = {"colocated": True, "rollout": {"gpus": 8, "tp": 1, "ep": 1},
            "train": {**RL["train"], "offload": "nemo",
                      "offload_copy": "pageable-concurrent"},
            "weight_sync": {"method": "ipc"}}
    m = setup_moves(resolve_rl(scenario(tmp_path, **colo)), PCIE_Bps)
    assert m.pageable_Bps == PAGEABLE_D2H_Bps
    assert m.pinned_out_Bps == sleep_Bps(PCIE_Bps)
    pageable = {**colo, "train": {**colo["train"], "offload_copy": "pageable"}}
    m0 = setup_moves(resolve_rl(scenario(tmp_path, **pageable)), PCIE_Bps)
    assert m0.pinned_out_Bps is None
    assert m.wake_Bps == wake_Bps(PCIE_Bps) == pytest.approx(0.34150 * 64e9, rel=1e-4)
    assert m0.wake_Bps is None
    assert m.refit_s - m0.refit_s == pytest.approx(
        m.weights_bytes / sleep_Bps(PCIE_Bps) - m.weights_bytes / PCIE_Bps
        + m.engine_bytes / wake_Bps(PCIE_Bps) - m.engine_bytes / PCIE_Bps)
    assert m.engine_sleep_s == pytest.approx(m.engine_bytes / (0.31330 * 64e9), rel=1e-4)


def test_the_reference_swap_copies_at_the_concurrent_rates():
    """The toy model on one GPU (120,083,456 bytes in bf16): at line rate the swap is three
    copies at 64 GB/s; with ``pageable-concurrent`` the copy out runs at 0.3133 x 64 GB/s
    and the two in at 0.3415 x 64 GB/s."""
    from moesim.model.presets import PRESETS
    from moesim.rl.memory import reference_swap_s
    from moesim.rl.offload_pinned import concurrent_rates
    from moesim.scenario.sections.rl import TrainPool

    toy, w = PRESETS["toy"], 2 * 60_041_728
    line = TrainPool(gpus=1, reference_weights="host")
    assert concurrent_rates(line, 64e9) == (None, None)
    assert reference_swap_s(toy, line, 64e9) == pytest.approx(3 * w / 64e9)
    conc = TrainPool(gpus=1, reference_weights="host", offload_copy="pageable-concurrent")
    out, into = concurrent_rates(conc, 64e9)
    assert (out, into) == (sleep_Bps(64e9), wake_Bps(64e9))
    assert reference_swap_s(toy, conc, 64e9, out, into) == pytest.approx(
        w / (0.313298 * 64e9) + 2 * w / (0.341498 * 64e9), rel=1e-5)
    # nothing moves with the reference on the GPU
    gpu = TrainPool(gpus=1, reference_weights="gpu", offload_copy="pageable-concurrent")
    assert reference_swap_s(toy, gpu, 64e9, out, into) == 0.0
