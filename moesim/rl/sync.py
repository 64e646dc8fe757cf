"""Weight sync trainer → rollout engines, and the colocated switch cost.

**What moves.** Every parameter, in bf16 (the trainer's weights; ``PARAM_BYTES``),
resharded from the training layout to the inference layout. Each engine replica needs the
whole model once: ``parameter bytes`` enter every replica, each of its ``g`` GPUs
receiving its ``1/g`` share (TP/EP shards of the inference layout).

**How (method nccl, disaggregated)**, as verl's NCCL checkpoint engine does
(verl/checkpoint_engine/README.md: "all_gather+broadcast"): the trainer's shard holders (the
``pp x lcm(tp, ep)`` GPUs of one data-parallel replica) send their shards to the trainer's
first GPU (the gather), which streams them to every replica; the replicas forward them
along a chain (NCCL's pipelined ring/chain broadcast): share ``j`` goes root → replica 0
GPU ``j`` → replica 1 GPU ``j`` → .... Every transfer is a flow on the topology's max-min
flow network (:class:`moesim.network.FlowNetwork`), all started together: the fluid limit
of a bucketed, pipelined sync (a bucket is gathered while the previous one is broadcast).

**Method sharded** (disaggregated), as NeMo RL's checkpoint-engine refit with
``shard_expert_weights`` does (NVIDIA-NeMo/RL docs/guides/checkpoint-engine-refit.md: each
vLLM rank loads only its "destination-local" tensors): no gather and no chain; every engine
GPU receives its ``1/g`` share of every parameter straight from the trainer GPUs holding
it (:func:`sharded_flows`), all flows at once on the same max-min network.

**Software cost**: the gather/convert/load calls are per tensor on the host, serial with
the copies: ``tensors x weight_sync.per_tensor_s`` (published: gather and convert are most
of a sync; verl fully-async README, Qwen3-30B-A3B 16→16 GPUs: 15.8 s, 4.4 s with the
checkpoint engine).

**Colocated (method ipc)**: the same resharding flows inside the one pool, then each GPU
copies its share into the engine's buffers handed over by CUDA IPC (read + write at HBM
bandwidth). The switch between phases (verl's hybrid engine with the engine's sleep mode):
into training, the engine's weights go to the host and the optimizer states (fp32 master
weights and Adam's two moments, 12 bytes per parameter, sharded over the pool as FSDP and
Megatron's distributed optimizer do) come back; out of training, the reverse. The KV
cache is freed and re-allocated, moving no bytes. Host copies run at PCIe Gen5 x16 line
rate (``PCIE_Bps``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

from moesim.model.params import count_params
from moesim.model.spec import ModelSpec
from moesim.network import FlowNetwork

#: bytes per parameter moved by a sync: bf16, the dtype the trainer and engine hold
PARAM_BYTES = 2
#: fp32 master weights + Adam first and second moments (Rajbhandari et al., ZeRO,
#: arXiv:1910.02054 §3.1: 12 bytes per parameter of optimizer states in mixed precision)
OPTIMIZER_BYTES = 12
#: host <-> GPU copies: PCIe Gen5 x16, 64 GB/s per direction (NVIDIA H100 datasheet:
#: "PCIe Gen5: 128 GB/s" bidirectional); line rate, an upper bound on pinned copies
PCIE_Bps = 64e9


def tensor_count(spec: ModelSpec) -> int:
    """Parameter tensors of the checkpoint: per layer the attention projections (4 for
    MHA/GQA; MLA's q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o: 7), two norms, and
    either the router, each routed and shared expert's matrices, or the dense FFN's;
    plus embedding, final norm and an untied LM head."""
    attn = 7 if spec.attention == "mla" else 4
    n = 0
    for i in range(spec.layers):
        n += attn + 2
        if spec.is_moe_layer(i):
            n += 1 + (spec.n_experts + spec.n_shared_experts) * spec.ffn_matrices
        else:
            n += spec.ffn_matrices
    return n + 2 + (0 if spec.tied_embeddings else 1)


def param_bytes(spec: ModelSpec) -> float:
    return float(count_params(spec).total * PARAM_BYTES)


def holders(train_gpus: list, tp: int, pp: int, ep: int) -> list:
    """The trainer GPUs that together hold one copy of every parameter."""
    m = pp * (tp * ep // math.gcd(tp, ep))
    return list(train_gpus[:min(m, len(train_gpus))])


def sharded_flows(nbytes: float, src_gpus: list, rollout_gpus: list, replica_gpus: int
                  ) -> list[tuple[str, str, float]]:
    """Flows of a sharded sync (method ``sharded``): every engine GPU receives its
    ``1/g`` of every parameter straight from the trainer GPUs that hold it, each holder
    sending ``nbytes / (holders · g)`` to every engine GPU of every replica (a uniform
    resharding: each holder's parameters are split evenly over the inference shards)."""
    share = nbytes / (len(src_gpus) * replica_gpus)
    return [(h, d, share) for d in rollout_gpus for h in src_gpus]


def sync_flows(nbytes: float, src_gpus: list, rollout_gpus: list, replica_gpus: int
               ) -> tuple[list[tuple[str, str, float]], list[tuple[str, str, float]]]:
    """(gather flows, broadcast-chain flows) moving ``nbytes`` to every replica."""
    root = src_gpus[0]
    share = nbytes / len(src_gpus)
    gather = [(h, root, share) for h in src_gpus[1:]]
    g = replica_gpus
    chain = []
    for j in range(g):
        prev = root
        for r in range(len(rollout_gpus) // g):
            dst = rollout_gpus[r * g + j]
            chain.append((prev, dst, nbytes / g))
            prev = dst
    return gather, chain


@dataclass
class SyncResult:
    time_s: float             # flows + copy + software
    flow_s: float             # the gather and broadcast flows
    copy_s: float             # colocated: the IPC hand-over copy
    software_s: float         # per-tensor host time
    param_bytes: float
    bytes_per_replica: float  # bytes delivered into each engine replica
    gather_bytes: float
    tensors: int
    flows: int
    link_bytes_max: float


def run_flows(topo, flows: list[tuple[str, str, float]], on_solve=None
              ) -> tuple[float, np.ndarray]:
    """Time (s) until every flow is delivered, all started at 0, and bytes per link."""
    env = simpy.Environment()
    net = FlowNetwork(env, topo, on_solve=on_solve)
    if flows:
        net.transfer_many(flows)
    env.run()
    return float(env.now), np.asarray(net.link_bytes(), dtype=float)


def weight_sync(topo, spec: ModelSpec, train_gpus: list, rollout_gpus: list, *, tp: int,
                pp: int, ep: int, replica_gpus: int, per_tensor_s: float, ipc: bool,
                hbm_Bps: float, on_solve=None, sharded: bool = False) -> SyncResult:
    """The sync of ``spec``'s weights from ``train_gpus`` to every engine replica of
    ``rollout_gpus``: gathered and chain-broadcast (``sharded`` False: verl's NCCL
    checkpoint engine) or pulled shard by shard (``sharded``: :func:`sharded_flows`)."""
    nbytes = param_bytes(spec)
    src = holders(train_gpus, tp, pp, ep)
    if sharded:
        gather, chain = [], sharded_flows(nbytes, src, rollout_gpus, replica_gpus)
    else:
        gather, chain = sync_flows(nbytes, src, rollout_gpus, replica_gpus)
    flow_s, link = run_flows(topo, gather + chain, on_solve)
    copy_s = 2 * nbytes / replica_gpus / hbm_Bps if ipc else 0.0
    tensors = tensor_count(spec)
    software = tensors * per_tensor_s
    received = {}
    for _, dst, b in chain:
        r = rollout_gpus.index(dst) // replica_gpus
        received[r] = received.get(r, 0.0) + b
    return SyncResult(flow_s + copy_s + software, flow_s, copy_s, software, nbytes,
                      max(received.values(), default=0.0), sum(b for *_, b in gather),
                      tensors, len(gather) + len(chain),
                      float(link.max()) if link.size else 0.0)


def switch_cost(spec: ModelSpec, pool_gpus: int, replica_gpus: int) -> tuple[float, float]:
    """Colocated (into training, out of training) seconds: the engine's weight share
    and the optimizer-state shard of one GPU, each across PCIe once per direction."""
    params = count_params(spec).total
    weights = params * PARAM_BYTES / replica_gpus
    optim = params * OPTIMIZER_BYTES / pool_gpus
    one_way = (weights + optim) / PCIE_Bps
    return one_way, one_way
