"""NeMo RL v0.6's colocated refit through two ping-pong halves (rl.weight_sync.calls:
nemo-v06, moesim.rl.refit_zmq): the halves, the producer and consumer and the pipeline,
on the tiny model by hand."""

from __future__ import annotations

import pytest

from moesim.collectives.nccl.graphs import facts_from_params
from moesim.collectives.nccl.model import estimate
from moesim.errors import InputError
from moesim.rl import refit_zmq
from moesim.rl.refit_async import pipeline_s
from moesim.rl.refit_host import RAY_CALL_S
from moesim.rl.sync import IPC_REBUILD_S, weight_sync
from moesim.topology import load_topology
from tests._refit import SPEC, one_node_sync

US = 1e-6
BYTES = 198272      # SPEC in bf16
TENSORS = 41        # its HF tensors


def test_half_is_three_tenths_of_the_free_memory_split_in_two():
    assert refit_zmq.half_bytes(1e9) == 150_000_000
    assert refit_zmq.half_bytes(20_000) == 3_000
    assert refit_zmq.half_bytes(0.0) == 1


def test_tiny_colocated_refit_by_hand():
    """SPEC from a TP2 EP2 trainer on the 8 GPUs of a DGX H100 node to the one engine of
    all 8 beside it, 1 GB of memory: one half, the stages in series."""
    r = one_node_sync("nemo-v06")
    z = r.phases["zmq_refit"]
    # free: 1 GB less the policy's share (1/2 of the model: two holders of a copy) and
    # the engine's (1/8); a half 0.3 x free / 2 = 149,981,412 B: one half
    free = 1e9 - BYTES / 2 - BYTES / 8
    assert z["half_bytes"] == int(0.3 * free) // 2 == 149_981_412
    assert z["buffers"] == 1
    # the pack: per tensor one copy op (16.1 us) and five aliases or views (3.3 us)
    assert z["pack_host_s"] == pytest.approx(TENSORS * (16.1 + 5 * 3.3) * US)
    assert z["pack_copy_s"] == pytest.approx(2 * BYTES / 3.35e12)
    # the gather as the non-colocated refit's: Megatron-Bridge's 18 calls at 14.57 us,
    # 42 allocations, 8 views; 6 TP and 12 EP all-gathers on pairs of node 0's GPUs
    assert z["bridge_s"] == pytest.approx((18 * 14.57 + 42 * 16.1 + 8 * 3.3) * US)
    topo = load_topology("dgx-h100", nodes=1)
    facts = facts_from_params(topo.params, topo.device, 1, 2)
    nccl = (6 * estimate("all_gather", 99968 / 13, 2, 1, facts)[0]
            + 12 * estimate("all_gather", 2 * 4096, 2, 1, facts)[0])
    assert z["gather_nccl_s"] == pytest.approx(nccl)
    host = z["bridge_s"] + z["pack_host_s"]
    gpu = z["gather_nccl_s"] + z["gather_copy_s"] + z["pack_copy_s"]
    assert z["producer_s"] == pytest.approx(max(host, gpu)) == pytest.approx(host)
    # the consumer: one handle rebuilt (0.18 ms), per tensor a slice and two views,
    # 41 x 40 us of load_weights and the 1/8 share read and written
    assert z["rebuild_s"] == pytest.approx(180 * US)
    assert z["unpack_s"] == pytest.approx(TENSORS * 3 * 3.3 * US)
    assert z["load_s"] == pytest.approx(TENSORS * 40 * US + 2 * BYTES / 8 / 3.35e12)
    assert z["consumer_s"] == pytest.approx(z["rebuild_s"] + z["unpack_s"] + z["load_s"])
    # Ray: 8 policy workers and 1 engine from the driver, 8 executors from the engine
    assert z["ray_calls"] == 17
    assert z["ray_s"] == pytest.approx(17 * RAY_CALL_S)
    # one half: everything in series after the Ray calls
    assert r.time_s == pytest.approx(z["ray_s"] + z["producer_s"] + z["consumer_s"])
    assert r.phases["buckets"] == 1
    assert r.phases["gather_s"] == pytest.approx(z["producer_s"])
    assert r.phases["load_s"] == pytest.approx(z["unpack_s"] + z["load_s"])


def test_many_halves_pipeline():
    """20 kB free: halves of 3,000 B, 67 of them (66 full and one of 272 B): the
    consumer of one half runs while the producer fills the next."""
    topo = load_topology("dgx-h100", nodes=1)
    z = refit_zmq.zmq_refit(topo, SPEC, topo.gpus, tp=2, pp=1, ep=2, replica_gpus=8,
                            engines=1, per_tensor_s=40e-6, hbm_Bps=3.35e12,
                            free_bytes=20_000, nbytes=BYTES, tensors=TENSORS,
                            rebuild_s=IPC_REBUILD_S)
    assert (z.half_bytes, z.buffers) == (3000, 67)
    assert z.rebuild_s == pytest.approx(67 * 180 * US)
    assert z.time_s == pytest.approx(z.ray_s + pipeline_s(67, z.producer_s, z.consumer_s))
    # a pipeline: shorter than its stages in series, longer than its slowest stage
    assert max(z.producer_s, z.consumer_s) < z.time_s - z.ray_s < z.producer_s + z.consumer_s


def test_other_levels_unchanged_and_refused_apart():
    assert "zmq_refit" not in one_node_sync("none").phases
    topo = load_topology("dgx-h100", nodes=2)
    with pytest.raises(InputError, match="nemo-v06 only with per_gpu: true and method ipc"):
        weight_sync(topo, SPEC, topo.gpus[:8], topo.gpus[8:], tp=2, pp=1, ep=2,
                    replica_gpus=8, per_tensor_s=40e-6, ipc=False, hbm_Bps=3.35e12,
                    per_gpu=True, calls="nemo-v06", hbm_bytes=1e9)


def test_no_free_memory_is_refused():
    """The policy's and the engine's weights fill the GPU: no buffer to stream through."""
    topo = load_topology("dgx-h100", nodes=1)
    with pytest.raises(InputError, match="nemo-v06 with device memory left"):
        refit_zmq.zmq_refit(topo, SPEC, topo.gpus, tp=2, pp=1, ep=2, replica_gpus=8,
                            engines=1, per_tensor_s=40e-6, hbm_Bps=3.35e12, free_bytes=0.0,
                            nbytes=BYTES, tensors=TENSORS, rebuild_s=IPC_REBUILD_S)
