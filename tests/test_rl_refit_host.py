"""NeMo RL v0.3's IPC handle transfer on the host (rl.weight_sync.calls: nemo-v03,
moesim.rl.refit_host): Ray calls and pickled metadata entries of a tiny refit by hand."""

from __future__ import annotations

import pytest

from moesim.rl import refit_host
from moesim.rl.refit_host import (
    PACKED_RECOVER_S,
    PICKLE_DUMPS_S,
    PICKLE_LOADS_S,
    RAY_CALL_S,
    ipc_handle_transfer,
)
from moesim.rl.sync import IPC_REBUILD_S
from tests._refit import one_node_sync

# the tiny MoE of test_rl_refit_calls.py: 41 HF tensors, 21 Megatron keys at EP2


def test_published_rates():
    assert RAY_CALL_S == pytest.approx(124.41e-6, rel=1e-4)   # 8,038 calls/s
    assert PICKLE_DUMPS_S == pytest.approx(59.2e-9)           # 59.2 us / 1,000 entries
    assert PICKLE_LOADS_S == pytest.approx(264e-9)            # 264 us / 1,000 entries
    assert PACKED_RECOVER_S == 12e-3


def test_ray_executors_by_hand():
    """8 policy workers, 2 engines of 4 executors (Ray), 10 HF tensors, 4 keys, 2 buckets.
    Driver calls: 3 x 8 + 2 x 2 fixed + 2 x (8 + 2) per bucket = 48; one engine calls its
    executors 2 x 4 = 8 times. Pickled: the keys to 8 workers 32, one worker's 10 entries,
    the driver's 80 to the engines, one engine's 40 to its executors = 162. Unpickled:
    the driver's 32 keys and 80 entries, one worker's 4 keys, one engine's 40, one
    executor's 10 = 166."""
    t = ipc_handle_transfer(hf_tensors=10, megatron_keys=4, buckets=2, policy_workers=8,
                            engines=2, engine_gpus=4)
    assert (t.driver_calls, t.executor_calls) == (48, 8)
    assert (t.pickled_entries, t.unpickled_entries) == (162, 166)
    assert t.calls_s == pytest.approx(56 / 8038.166251679982)
    assert t.pickle_s == pytest.approx(162 * 59.2e-9 + 166 * 264e-9)
    assert t.recover_s == pytest.approx(0.024)
    assert t.time_s == pytest.approx(56 / 8038.166251679982 + 53.4144e-6 + 0.024)


def test_in_process_executor_by_hand():
    """8 engines of one GPU each (vLLM's UniProcExecutor in the engine's process): no
    executor calls, nothing pickled past the engine. Driver calls 24 + 16 + 2 x 16 = 72;
    pickled 32 + 10 + 80 = 122; unpickled 32 + 4 + 80 + 10 (one engine's own dict) = 126."""
    t = ipc_handle_transfer(hf_tensors=10, megatron_keys=4, buckets=2, policy_workers=8,
                            engines=8, engine_gpus=1)
    assert (t.driver_calls, t.executor_calls) == (72, 0)
    assert (t.pickled_entries, t.unpickled_entries) == (122, 126)


def test_refit_transfer_adds_the_host_chain():
    """One DGX node, TP2 EP2 trainer, one engine of 8 GPUs: the nemo-v03 transfer is the
    nemo one with its bucket's rebuild replaced by the host chain (41 tensors, 21 keys,
    one bucket, 8 workers, 1 engine of 8): calls 3 x 8 + 2 + (8 + 1) = 35 plus 8."""
    nemo, v03 = one_node_sync("nemo"), one_node_sync("nemo-v03")
    host = v03.phases["handle_transfer"]
    assert (host["driver_calls"], host["executor_calls"], host["buckets"]) == (35, 8, 1)
    expect = refit_host.ipc_handle_transfer(hf_tensors=41, megatron_keys=21, buckets=1,
                                            policy_workers=8, engines=1, engine_gpus=8)
    assert host["time_s"] == pytest.approx(expect.time_s)
    assert v03.phases["transfer_s"] == pytest.approx(
        nemo.phases["transfer_s"] - IPC_REBUILD_S + expect.time_s)
    assert v03.phases["gather_s"] == nemo.phases["gather_s"]
    assert v03.phases["load_s"] == nemo.phases["load_s"]
    assert "handle_transfer" not in nemo.phases
