"""The calls NeMo RL v0.3's colocated refit makes, counted from its code
(``rl.weight_sync.calls: nemo``; with ``per_gpu: true``).

What NVIDIA-NeMo/RL v0.3.0 (b1c86a816) runs per refit, colocated (``nemo_rl/algorithms/
grpo.py`` ``refit_policy_generation``):

1. ``prepare_weights_for_ipc`` (``nemo_rl/models/policy/megatron_policy_worker.py``): the
   Megatron keys and ``0.2 x`` the GPU's free memory (NVML; ``NRL_REFIT_BUFFER_MEMORY_RATIO``
   default "0.2"): the keys are split into groups of at most that many bytes
   (:func:`buckets`).
2. Per group: ``get_weights_ipc_handles`` on every policy worker (one Ray call each) runs
   ``gather_params`` (``nemo_rl/models/megatron/refit_utils.py``): **for every key of every
   pipeline stage**, in sorted order, a ``torch.distributed.all_gather`` over the TP (or
   expert-TP) group when the key is TP-sharded, a ``torch.distributed.broadcast`` over the
   PP group (every key, every rank), and an ``all_gather`` over the EP group for expert
   weights (``mlp.experts.*.weight<i>``): :func:`gather_calls`. Each is one eager
   collective call, ``CALL_HOST_S`` of host time at least
   (:mod:`moesim.collectives.nccl.launch`). The HF tensors are then packed into one buffer
   per dtype (``NEMO_RL_MEGATRON_IPC_TENSOR_PACKING_THRESHOLD``, 32 tensors) and one IPC
   handle made per buffer: ``packed[offset:offset + size].copy_(tensor.view(-1))`` per HF
   tensor, so every byte of the model is read and written once more on each GPU, one
   copy launch per tensor (:func:`pack_s`, in the transfer step).
3. ``update_weights_from_ipc_handles`` on each vLLM engine's Ray actor, which calls each of
   its executors with its own device's handles (``nemo_rl/models/generation/vllm.py``);
   an executor rebuilds one tensor per dtype (``rebuild_cuda_tensor``, 0.18 ms:
   ``moesim.rl.sync.IPC_REBUILD_S``), takes a view per tensor and calls
   ``model.load_weights`` (``nemo_rl/models/generation/vllm_backend.py``).

Megatron-Core's keys (:func:`megatron_keys`): per layer the attention's fused
``linear_qkv`` (TP), its fused input norm, ``linear_proj`` (TP); MLA's down/up projections
(four, the up ones TP, each up one with its fused norm) and ``linear_proj``; the MLP's
``pre_mlp_layernorm``, ``router.weight``, and per local expert ``linear_fc1.weight<i>``
and ``linear_fc2.weight<i>`` (Transformer Engine's GroupedLinear: one parameter per GEMM,
``moe_grouped_gemm``), shared experts' fc1/fc2 (TP); a dense layer's fc1 (with its fused
norm, TP) and fc2 (TP); the embedding (TP), final norm and an untied output layer (TP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moesim.collectives.nccl.launch import CALL_HOST_S
from moesim.model.params import count_params
from moesim.model.spec import ModelSpec

#: NeMo RL v0.3.0 ``prepare_weights_for_ipc``: ``NRL_REFIT_BUFFER_MEMORY_RATIO`` default
#: "0.2" of the device's free memory (NVML) per group of keys
BUFFER_MEMORY_RATIO = 0.2


@dataclass(frozen=True)
class MegatronKeys:
    """Keys of one Megatron-Core model, all stages: ``total`` of them, ``tp_sharded`` split
    over the TP group, ``expert`` expert weights of one EP rank (split over expert TP)."""

    total: int
    tp_sharded: int
    expert: int


def megatron_keys(spec: ModelSpec, ep: int) -> MegatronKeys:
    """Megatron-Core's state-dict keys of ``spec`` one EP rank holds (module docstring),
    summed over the pipeline stages (``gather_params`` iterates over all of them)."""
    total = tp = expert = 0
    local = spec.n_experts // max(1, ep) if spec.n_experts else 0
    for i in range(spec.layers):
        if spec.attention == "mla":
            total, tp = total + 7, tp + 3      # q_down, q_up(+norm), kv_down, kv_up(+norm), proj
        else:
            total, tp = total + 3, tp + 2      # qkv (+ its fused norm), proj
        if spec.qk_norm:
            total += 2                          # q_layernorm, k_layernorm (not TP-sharded)
        if spec.is_moe_layer(i):
            total += 2                          # pre_mlp_layernorm, router
            expert += 2 * local
            total += 2 * local
            if spec.n_shared_experts:
                total, tp = total + 2, tp + 2
        else:
            total, tp = total + 3, tp + 2       # fc1 (+ its fused norm), fc2
    total += 2 + (0 if spec.tied_embeddings else 1)
    tp += 1 + (0 if spec.tied_embeddings else 1)
    return MegatronKeys(total, tp, expert)


def gather_calls(spec: ModelSpec, *, tp: int, pp: int, ep: int, etp: int = 1) -> int:
    """Eager collective calls ``gather_params`` makes per rank per refit: a PP broadcast per
    key (made for every key, also over a PP group of one rank), a TP all-gather per
    TP-sharded non-expert key (``tp > 1``), an expert-TP all-gather per expert key
    (``etp > 1``) and an EP all-gather per expert key (``ep > 1``)."""
    del pp  # the broadcast is called whatever the PP size
    k = megatron_keys(spec, ep)
    calls = k.total
    calls += k.tp_sharded if tp > 1 else 0
    calls += k.expert if etp > 1 else 0
    calls += k.expert if ep > 1 else 0
    return calls


def gather_calls_s(spec: ModelSpec, *, tp: int, pp: int, ep: int, etp: int = 1) -> float:
    """Host seconds of :func:`gather_calls`, ``CALL_HOST_S`` each (serial on each rank)."""
    return gather_calls(spec, tp=tp, pp=pp, ep=ep, etp=etp) * CALL_HOST_S


def pack_s(nbytes: float, tensors: int, hbm_Bps: float, launch_s: float) -> float:
    """Seconds to pack ``nbytes`` in ``tensors`` HF tensors into the IPC buffers on one
    GPU: a read and a write of every byte at HBM bandwidth, one eager copy launch per
    tensor (``launch_s``, the device's launch overhead)."""
    return 2 * nbytes / hbm_Bps + tensors * launch_s


def buckets(nbytes: float, free_bytes: float) -> int:
    """Groups of keys of at most ``BUFFER_MEMORY_RATIO x free_bytes`` bytes each."""
    cap = BUFFER_MEMORY_RATIO * free_bytes
    if cap <= 0:
        raise ValueError("no free memory for the refit buffer")
    return max(1, math.ceil(nbytes / cap))


@dataclass(frozen=True)
class GroupGather:
    """Bytes one trainer GPU receives in ``gather_params`` through each of its groups, and
    the seconds of each (``rl.weight_sync.gather: groups``)."""

    tp_bytes: float
    pp_bytes: float
    ep_bytes: float
    tp_s: float
    pp_s: float
    ep_s: float

    @property
    def time_s(self) -> float:
        return self.tp_s + self.pp_s + self.ep_s

    @property
    def received_bytes(self) -> float:
        return self.tp_bytes + self.pp_bytes + self.ep_bytes


def _group_s(topo, gpus: list, stride: int, size: int, nbytes: float, path_Bps) -> float:
    """Seconds for the first GPU's group (ranks ``0, stride, ...``) to deliver ``nbytes``
    to it: the share its peers on other hosts send, the rest over NVLink, both at once.
    NCCL's rings bring a group's data into a host once and forward it over NVLink, so the
    remote share enters through the network paths of the group's members on this host
    (one path each: the PP broadcast of a layout with one stage per host uses the GPU's
    own NIC; an EP group filling a host spreads over all of its NICs)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    peers = [gpus[k * stride] for k in range(1, size) if k * stride < len(gpus)]
    if not peers:
        return 0.0
    host = topo.host_of(gpus[0])
    remote = [g for g in peers if topo.host_of(g) != host]
    local = [g for g in peers if topo.host_of(g) == host]
    per_peer = nbytes / len(peers)
    t = 0.0
    if remote:
        t = max(t, per_peer * len(remote) / (len(local) + 1)
                / path_Bps(topo, gpus[0], remote[0]))
    if local:
        t = max(t, per_peer * len(local) / path_Bps(topo, gpus[0], local[0]))
    return t


def group_gather(topo, spec: ModelSpec, gpus: list, *, tp: int, pp: int, ep: int,
                 etp: int = 1, param_bytes: int = 2, path_Bps=None) -> GroupGather:
    """What ``gather_params`` moves into each trainer GPU, group by group, every GPU at
    once (its own groups, its own links): the TP all-gather of its stage's TP-sharded
    weights (``D/pp (1 - 1/tp)``, ``D`` the non-expert bytes; experts' expert-TP likewise),
    the PP broadcast of every other stage's full tensors (``(D + E/ep)(1 - 1/pp)``, ``E``
    the routed experts' bytes), the EP all-gather of the other EP ranks' experts
    (``E (1 - 1/ep)``). Ranks follow Megatron-Core's default order ``tp-cp-ep-dp-pp``
    (``RankGenerator``): TP neighbours, EP at a stride of the expert TP, PP at a stride of
    ``world / pp``; a group's peers on other hosts send over the network paths of its
    members on this host (:func:`_group_s`)."""
    c = count_params(spec)
    e = float(c.routed_experts * param_bytes)
    d = float(c.total * param_bytes) - e
    world = len(gpus)
    tp_b = d / pp * (1 - 1 / tp) + (e / pp / ep * (1 - 1 / etp) if etp > 1 else 0.0)
    pp_b = (d + e / ep) * (1 - 1 / pp)
    ep_b = e * (1 - 1 / ep)
    return GroupGather(
        tp_b, pp_b, ep_b,
        _group_s(topo, gpus, 1, max(tp, etp), tp_b, path_Bps),
        _group_s(topo, gpus, max(1, world // pp), pp, pp_b, path_Bps),
        _group_s(topo, gpus, max(1, etp), ep, ep_b, path_Bps))
