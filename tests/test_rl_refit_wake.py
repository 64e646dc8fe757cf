"""vLLM's wake_up in the refit and the driver's blocking waits (rl.weight_sync.calls:
nemo-v03-wake, moesim.rl.refit_wake), by hand."""

from __future__ import annotations

import pytest

from moesim.rl.offload import HostMoves, setup_moves
from moesim.rl.refit_host import RAY_CALL_S
from moesim.rl.refit_wake import (
    RAY_SYNC_CALL_S,
    WAKE_LINE_SHARE,
    blocking_waits,
    wake_Bps,
)
from moesim.rl.run import resolve_rl
from moesim.rl.sync import PCIE_Bps
from tests._refit import one_node_sync
from tests.test_rl_run import RL, scenario


def test_the_measured_wake_is_a_third_of_the_a100_link():
    """Qwen3-235B-A22B FP8 over TP4: (233.845 + 2.49) GB / 4 = 59.08 GB a GPU in
    (5.66 + 5.29 + 5.27) / 3 = 5.4067 s: 10.928 GB/s, 0.3415 of 32 GB/s; on a 64 GB/s
    host link 21.86 GB/s."""
    assert WAKE_LINE_SHARE == pytest.approx(59.08375e9 / 5.406667 / 32e9, rel=1e-6)
    assert WAKE_LINE_SHARE == pytest.approx(0.34150, abs=1e-5)
    assert wake_Bps(64e9) == pytest.approx(21.856e9, rel=1e-4)


def test_a_wake_of_35_gb_takes_1_6_s_where_the_line_rate_took_0_55():
    """An engine GPU holding 35 GB (Llama-3.1-70B over TP4, roughly): 35 / 64 = 0.547 s at
    the line rate, 35 / 21.856 = 1.601 s at the measured wake's rate; the refit's other
    moves (12 GB of optimizer states at 2.8 GB/s, 8 GB of weights at 64 GB/s) unchanged."""
    line = HostMoves(8e9, 8e9, 12e9, 35e9, 64e9, 2.8e9)
    wake = HostMoves(8e9, 8e9, 12e9, 35e9, 64e9, 2.8e9, wake_Bps(64e9))
    assert line.engine_wake_s == pytest.approx(0.546875)
    assert wake.engine_wake_s == pytest.approx(35e9 / 21.856e9, rel=1e-4)
    assert wake.engine_wake_s == pytest.approx(1.6014, abs=1e-3)
    assert wake.refit_s == pytest.approx(12 / 2.8 + 35e9 / wake_Bps(64e9) + 0.125)
    assert wake.refit_s - line.refit_s == pytest.approx(1.6014 - 0.5469, abs=1e-3)
    # the sleep, the preps and the bytes stay as they were
    assert (wake.engine_sleep_s, wake.logprob_prep_s, wake.train_prep_s,
            wake.bytes_per_step) == (line.engine_sleep_s, line.logprob_prep_s,
                                     line.train_prep_s, line.bytes_per_step)
    assert "wake_Bps" not in line.as_dict() and "engine_wake_s" not in line.as_dict()
    assert wake.as_dict()["engine_wake_s"] == wake.engine_wake_s


def test_blocking_waits_count_5_plus_2_per_bucket_and_the_engines():
    """18 buckets, engines of 4 executors: the driver waits 5 + 36 = 41 times, an engine
    18 times; each wait adds 1/2011.9 - 1/8038.2 s = 0.3727 ms: 59 x 0.3727 = 21.99 ms.
    Engines of one GPU (UniProcExecutor) wait for no executor."""
    assert RAY_SYNC_CALL_S - RAY_CALL_S == pytest.approx(0.37264e-3, rel=1e-4)
    w = blocking_waits(18, 4)
    assert (w.driver_waits, w.engine_waits) == (41, 18)
    assert w.time_s == pytest.approx(59 * (1 / 2011.916260420167 - 1 / 8038.166251679982))
    assert w.time_s == pytest.approx(21.99e-3, abs=0.01e-3)
    one = blocking_waits(2, 1)
    assert (one.driver_waits, one.engine_waits) == (9, 0)


def test_the_refit_adds_the_waits_to_the_transfer():
    """One DGX node, TP2 EP2, one engine of 8: nemo-v03-wake is nemo-v03-ops with the
    blocking waits in the transfer (one bucket: the driver 7, the engine 1)."""
    ops, wake = one_node_sync("nemo-v03-ops"), one_node_sync("nemo-v03-wake")
    w = blocking_waits(1, 8)
    assert (w.driver_waits, w.engine_waits) == (7, 1)
    assert wake.phases["transfer_s"] == pytest.approx(ops.phases["transfer_s"] + w.time_s)
    assert wake.time_s == pytest.approx(ops.time_s + 8 * (RAY_SYNC_CALL_S - RAY_CALL_S))
    for k in ("gather_s", "load_s", "offload_gc_s", "host_ops", "handle_transfer"):
        assert wake.phases[k] == ops.phases[k]
    assert wake.phases["blocking_waits"] == w.as_dict()
    assert "blocking_waits" not in ops.phases


def test_the_knob_sets_the_wake_rate_of_the_host_moves(tmp_path):
    """The toy colocated on 8 GPUs with ``offload: nemo``: calls nemo-v03-wake brings the
    engine's weights in at 0.3415 x 64 GB/s; nemo-v03-ops at the line rate."""
    colo = {"colocated": True, "rollout": {"gpus": 8, "tp": 1, "ep": 1},
            "train": {**RL["train"], "offload": "nemo"},
            "weight_sync": {"method": "ipc", "per_gpu": True, "calls": "nemo-v03-wake"}}
    m = setup_moves(resolve_rl(scenario(tmp_path, **colo)), PCIE_Bps)
    assert m.wake_Bps == wake_Bps(PCIE_Bps)
    assert m.engine_wake_s == pytest.approx(m.engine_bytes / (0.34150 * 64e9), rel=1e-4)
    ops = {**colo, "weight_sync": {**colo["weight_sync"], "calls": "nemo-v03-ops"}}
    m0 = setup_moves(resolve_rl(scenario(tmp_path, **ops)), PCIE_Bps)
    assert m0.wake_Bps is None
    assert m.refit_s - m0.refit_s == pytest.approx(
        m.engine_bytes / wake_Bps(PCIE_Bps) - m.engine_bytes / PCIE_Bps)


def test_moesim_rl_prints_the_wake_and_the_waits():
    """The summary's host-moves line names the wake-up's seconds and the refit line the
    waits, only with the knob on."""
    from moesim.rl.summary import moves_line, refit_line

    line = HostMoves(8e9, 8e9, 12e9, 35e9, 64e9, 2.8e9)
    wake = HostMoves(8e9, 8e9, 12e9, 35e9, 64e9, 2.8e9, wake_Bps(64e9))
    assert moves_line(wake.as_dict())[0].endswith(
        f"refit {wake.refit_s:.2f} s (vLLM wake_up 1.60 s)")
    assert "wake_up" not in moves_line(line.as_dict())[0]
    ops, on = one_node_sync("nemo-v03-ops"), one_node_sync("nemo-v03-wake")
    assert refit_line({"phases": on.phases})[0].endswith("; blocking ray.get waits 0.003 s")
    assert "ray.get" not in refit_line({"phases": ops.phases})[0]
