"""Shared test helpers of the refit tests: a tiny MoE model and its weight sync on one
DGX H100 node (TP2 EP2 trainer, one engine of 8 GPUs), by ``rl.weight_sync.calls``."""

from __future__ import annotations

from moesim.model.spec import ModelSpec
from moesim.rl.sync import weight_sync
from moesim.topology import load_topology

# layers 2, MHA, 4 experts (SwiGLU), untied head: 198,272 bytes in bf16 (test_rl_refit.py)
SPEC = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=4, head_dim=16, vocab=128,
                 n_experts=4, top_k=1, expert_ffn=32, dense_ffn=0)


def one_node_sync(calls: str):
    """:func:`moesim.rl.sync.weight_sync` of :data:`SPEC` per GPU over CUDA IPC on one
    DGX H100 node, the trainer TP2 EP2 on the 8 GPUs, one engine of all 8 (40 us per
    tensor, 3.35 TB/s HBM, 1 GB free, 4 us launches), with ``calls``."""
    topo = load_topology("dgx-h100", nodes=1)
    gpus = topo.gpus
    return weight_sync(topo, SPEC, gpus, gpus, tp=2, pp=1, ep=2, replica_gpus=8,
                       per_tensor_s=40e-6, ipc=True, hbm_Bps=3.35e12, per_gpu=True,
                       calls=calls, hbm_bytes=1e9, launch_s=4e-6)
