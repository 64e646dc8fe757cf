"""Per-GPU refit (rl.weight_sync.per_gpu, moesim.rl.sync.refit_phases): NeMo RL's three
steps worked out by hand on a small model and layout."""

from __future__ import annotations

import pytest

from moesim.model.spec import ModelSpec
from moesim.rl.sync import IPC_REBUILD_S, path_Bps, weight_sync
from moesim.topology import load_topology

# layers 2, hidden 64, MHA 4 heads of 16, vocab 128, 4 experts of FFN 32 (SwiGLU):
# per layer q, k, v, o 4 x 64 x 64 = 16,384; norms 128; router 256; experts
# 4 x 3 x 64 x 32 = 24,576 -> 41,344; x 2 layers = 82,688; embedding and LM head
# 2 x 128 x 64 = 16,384; final norm 64 -> 99,136 parameters, 198,272 bytes in bf16.
# Tensors: per layer 4 + 2 + 1 + 4 x 3 = 19, x 2 = 38, + embedding, norm, head = 41.
SPEC = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=4, head_dim=16, vocab=128,
                 n_experts=4, top_k=1, expert_ffn=32, dense_ffn=0)
B = 198_272
HBM = 3.35e12
NVLINK = 450e9 * 0.822      # dgx-h100: nvlink_GBps x nvlink_efficiency
NET = 50e9 * 0.95           # dgx-h100: the NIC, below PCIe's 63 GB/s


def _sync(nodes, *, tp, pp, ep, g, ipc=True, sharded=False, n_train=None):
    topo = load_topology("dgx-h100", nodes=nodes)
    gpus = topo.gpus
    train = gpus[:n_train or len(gpus)]
    roll = train if ipc else gpus[len(train):]
    return topo, weight_sync(topo, SPEC, train, roll, tp=tp, pp=pp, ep=ep, replica_gpus=g,
                             per_tensor_s=40e-6, ipc=ipc, hbm_Bps=HBM, sharded=sharded,
                             per_gpu=True)


def test_topology_paths():
    topo = load_topology("dgx-h100", nodes=2)
    assert path_Bps(topo, topo.gpus[0], topo.gpus[1]) == pytest.approx(NVLINK)
    assert path_Bps(topo, topo.gpus[0], topo.gpus[8]) == pytest.approx(NET)


def test_colocated_one_node_ipc_bytes_per_gpu():
    # 8 GPUs, trainer pp 2 x ep 4 = 8 holders of 1/8 each: every GPU receives 7/8 of the
    # model over NVLink (no other node); IPC hands the whole gathered model (198,272 bytes)
    # to the engine on the same GPU, zero copies, one bucket (one handle rebuilt); the
    # engine (TP 4) loads its quarter: read + write 49,568 bytes, 41 tensors x 40 us.
    _, r = _sync(1, tp=1, pp=2, ep=4, g=4)
    ph = r.phases
    assert ph["ipc_bytes_per_gpu"] == B
    assert ph["load_bytes_per_gpu"] == B / 4
    assert ph["buckets"] == 1
    assert ph["gather_s"] == pytest.approx(B * 7 / 8 / NVLINK)
    assert ph["transfer_s"] == pytest.approx(IPC_REBUILD_S)
    assert ph["load_s"] == pytest.approx(41 * 40e-6 + 2 * 49_568 / HBM)
    assert r.time_s == pytest.approx(ph["gather_s"] + ph["transfer_s"] + ph["load_s"])
    assert r.gather_bytes == pytest.approx(8 * B * 7 / 8)


def test_colocated_two_nodes_network_bound_gather():
    # 16 GPUs, pp 2 x ep 8 = 16 holders: over NVLink each GPU receives 15/16 B; each node
    # holds 8/16 and needs the other half, B/2 over its 8 NICs: B/16 per NIC at 47.5 GB/s
    # = 2.61e-7 s, below NVLink's 15/16 B / 369.9 GB/s = 5.03e-7 s, which bounds it.
    _, r = _sync(2, tp=1, pp=2, ep=8, g=8)
    nv, nic = B * 15 / 16 / NVLINK, B / 2 / 8 / NET
    assert nv > nic
    assert r.phases["gather_s"] == pytest.approx(nv)
    # one holder only (tp = pp = ep = 1): nothing to gather
    _, r1 = _sync(2, tp=1, pp=1, ep=1, g=8)
    assert r1.phases["gather_s"] == 0.0


def test_disaggregated_broadcast_from_every_nic_of_the_first_node():
    # 8 trainer GPUs (node 0), 8 engine GPUs (node 1) as one TP-8 replica. Gather as above
    # (pp 2 x ep 4); broadcast: share j (B/8) from trainer GPU j to engine GPU j, 8 flows
    # over 8 NICs at once: B/8 / 47.5 GB/s plus the path's latency. Gather and broadcast
    # overlap (NeMo RL's two streams): max of the two, then the load.
    topo, r = _sync(2, tp=1, pp=2, ep=4, g=8, ipc=False, n_train=8)
    ph = r.phases
    lat = sum(topo.latency_s[lid] for lid in topo.route(topo.gpus[0], topo.gpus[8]))
    assert ph["gather_s"] == pytest.approx(B * 7 / 8 / NVLINK)
    assert ph["transfer_s"] == pytest.approx(B / 8 / NET + lat)
    assert ph["ipc_bytes_per_gpu"] == 0.0 and ph["buckets"] == 0
    assert r.time_s == pytest.approx(max(ph["gather_s"], ph["transfer_s"]) + ph["load_s"])
    assert r.flows == 8


def test_off_by_default_leaves_the_flow_model():
    topo = load_topology("dgx-h100", nodes=1)
    r = weight_sync(topo, SPEC, topo.gpus, topo.gpus, tp=1, pp=2, ep=4, replica_gpus=4,
                    per_tensor_s=40e-6, ipc=True, hbm_Bps=HBM)
    assert r.phases is None
