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

**Per GPU** (``rl.weight_sync.per_gpu: true``; off by default), the three steps of NeMo
RL's refit (NVIDIA-NeMo/.github blog/posts/nemo-rl-refit-performance/index.md, commit
2392b33, "Refit in NeMo-RL takes three steps"), each priced on its own and in series
(:func:`refit_phases`):

1. *gather*: "the policy workers gather parameters from each device in its
   model-parallelism. After this step each policy worker gets full model parameters":
   colocated, every trainer GPU receives the whole model but its own ``1/m`` (``m`` the
   holders of one copy); inside a node over NVLink, from other nodes over the node's NICs
   (``B (1 - k/m)`` into each node, ``k`` holders in it, spread over its GPUs' NICs).
   Disaggregated: the gather flows of the method (``nccl``) alone on the network.
2. *transfer*: colocated, CUDA IPC handles "no data copy happens"; each executor rebuilds
   one handle per packed bucket (``IPC_REBUILD_S`` each; buckets of
   ``REFIT_BUCKET_BYTES``). Disaggregated: the broadcast chain or the sharded pulls,
   alone on the network.
3. *load*: vLLM's ``model.load_weights`` over every tensor (``tensors x per_tensor_s``)
   plus the copy of the executor's ``1/g`` share into its weights (read + write at HBM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy

from moesim.errors import InputError
from moesim.model.params import count_params
from moesim.model.spec import ModelSpec
from moesim.network import FlowNetwork
from moesim.rl import rollout_fp8

#: bytes per parameter moved by a sync: bf16, the dtype the trainer and engine hold
PARAM_BYTES = 2
#: fp32 master weights + Adam first and second moments (Rajbhandari et al., ZeRO,
#: arXiv:1910.02054 §3.1: 12 bytes per parameter of optimizer states in mixed precision)
OPTIMIZER_BYTES = 12
#: host <-> GPU copies: PCIe Gen5 x16, 64 GB/s per direction (NVIDIA H100 datasheet:
#: "PCIe Gen5: 128 GB/s" bidirectional); line rate, an upper bound on pinned copies
PCIE_Bps = 64e9
#: seconds per ``rebuild_cuda_tensor`` call, one per IPC handle (NeMo RL refit blog,
#: NVIDIA-NeMo/.github blog/posts/nemo-rl-refit-performance/index.md, commit 2392b33:
#: "each invocation of rebuild_cuda_tensor takes about 0.18 milliseconds")
IPC_REBUILD_S = 0.18e-3
#: bytes of one packed IPC bucket: NeMo RL's ``refit_buffer_size_gb`` as its tests set it
#: (2 GiB; NVIDIA-NeMo/RL tests of nemo_rl/weight_sync/ipc_weight_synchronizer.py); unset,
#: NeMo RL takes 0.3 x the free memory, which moesim does not track here
REFIT_BUCKET_BYTES = 2 * 1024**3


def tensor_count(spec: ModelSpec) -> int:
    """Parameter tensors of the checkpoint: per layer the attention projections (4 for
    MHA/GQA; MLA's q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o: 7; Qwen3's q_norm and
    k_norm with ``qk_norm``), two norms, and
    either the router, each routed and shared expert's matrices, or the dense FFN's;
    plus embedding, final norm and an untied LM head."""
    attn = (7 if spec.attention == "mla" else 4) + (2 if spec.qk_norm else 0)
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
    #: per_gpu only (None otherwise, left out of details.json): {gather_s, transfer_s,
    #: load_s, ipc_bytes_per_gpu, load_bytes_per_gpu, buckets}
    phases: dict | None = None


def run_flows(topo, flows: list[tuple[str, str, float]], on_solve=None
              ) -> tuple[float, np.ndarray]:
    """Time (s) until every flow is delivered, all started at 0, and bytes per link."""
    env = simpy.Environment()
    net = FlowNetwork(env, topo, on_solve=on_solve)
    if flows:
        net.transfer_many(flows)
    env.run()
    return float(env.now), np.asarray(net.link_bytes(), dtype=float)


#: ``rl.weight_sync.calls`` for the colocated refit, in order: each level prices what the
#: one before it does and more (:func:`refit_phases`)
IPC_CALL_LEVELS = ("none", "nemo", "nemo-v03", "nemo-v03-ops", "nemo-v03-wake")


def weight_sync(topo, spec: ModelSpec, train_gpus: list, rollout_gpus: list, *, tp: int,
                pp: int, ep: int, replica_gpus: int, per_tensor_s: float, ipc: bool,
                hbm_Bps: float, on_solve=None, sharded: bool = False,
                per_gpu: bool = False, calls: str = "none", etp: int = 1,
                hbm_bytes: float = 0.0, launch_s: float = 0.0,
                gather: str = "node", precision: str = "bf16") -> SyncResult:
    """The sync of ``spec``'s weights from ``train_gpus`` to every engine replica of
    ``rollout_gpus``: gathered and chain-broadcast (``sharded`` False: verl's NCCL
    checkpoint engine) or pulled shard by shard (``sharded``: :func:`sharded_flows`);
    ``per_gpu``: NeMo RL's three refit steps in series (:func:`refit_phases`), where the
    engines' ``precision`` fp8 adds NeMo RL's cast (:mod:`moesim.rl.rollout_fp8`)."""
    if calls == "nemo-async" and (ipc or sharded or not per_gpu):
        raise InputError("rl.weight_sync", "calls", "nemo-async only with per_gpu: true, "
                         "method nccl and the pools apart (rl.colocated: false)", calls)
    if calls == "nemo-v06" and (not ipc or not per_gpu):
        raise InputError("rl.weight_sync", "calls", "nemo-v06 only with per_gpu: true and "
                         "method ipc (a colocated pool)", calls)
    if per_gpu:
        return refit_phases(topo, spec, train_gpus, rollout_gpus, tp=tp, pp=pp, ep=ep,
                            replica_gpus=replica_gpus, per_tensor_s=per_tensor_s, ipc=ipc,
                            hbm_Bps=hbm_Bps, on_solve=on_solve, sharded=sharded,
                            calls=calls, etp=etp, hbm_bytes=hbm_bytes, launch_s=launch_s,
                            gather=gather, precision=precision)
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


def path_Bps(topo, a: str, b: str) -> float:
    """The bottleneck capacity (bytes/s) of the route from GPU ``a`` to GPU ``b``."""
    return float(min(topo.capacity_Bps[lid] for lid in topo.route(a, b)))


def colocated_gather(topo, nbytes: float, gpus: list, m: int) -> tuple[float, float]:
    """(seconds, bytes each GPU receives) for every GPU of ``gpus`` to hold the whole
    model, ``m`` GPUs holding one copy (each ``1/m``): over NVLink each receives
    ``B (1 - 1/m)``; each node needs ``B (1 - k/m)`` from outside (``k = min(gpn, m)``
    holders in it), spread over its ``gpn`` GPUs' network paths."""
    if m <= 1 or len(gpus) < 2:
        return 0.0, 0.0
    recv = nbytes * (1 - 1 / m)
    by_host: dict[int, list] = {}
    for g in gpus:
        by_host.setdefault(topo.host_of(g), []).append(g)
    local = by_host[topo.host_of(gpus[0])]
    gpn = len(local)
    t = recv / path_Bps(topo, local[0], local[1]) if gpn > 1 else 0.0
    k = min(gpn, m)
    if len(by_host) > 1 and k < m:
        other = next(g for g in gpus if topo.host_of(g) != topo.host_of(gpus[0]))
        t = max(t, nbytes * (1 - k / m) / gpn / path_Bps(topo, gpus[0], other))
    return t, recv


def broadcast_flows(topo, nbytes: float, train_gpus: list, rollout_gpus: list,
                    replica_gpus: int) -> list[tuple[str, str, float]]:
    """The weight broadcast after a full gather (every trainer GPU holds the model):
    share ``j`` of ``g`` leaves from the first trainer node's GPU ``j mod gpn`` and runs
    down its chain of replicas, so every NIC of that node carries a share (NeMo RL's
    topology-aware broadcast, async refit post, Optimization #1: "50 GB/s x 8")."""
    host = topo.host_of(train_gpus[0])
    roots = [gp for gp in train_gpus if topo.host_of(gp) == host]
    flows = []
    for j in range(replica_gpus):
        prev = roots[j % len(roots)]
        for r in range(len(rollout_gpus) // replica_gpus):
            dst = rollout_gpus[r * replica_gpus + j]
            flows.append((prev, dst, nbytes / replica_gpus))
            prev = dst
    return flows


def refit_phases(topo, spec: ModelSpec, train_gpus: list, rollout_gpus: list, *, tp: int,
                 pp: int, ep: int, replica_gpus: int, per_tensor_s: float, ipc: bool,
                 hbm_Bps: float, on_solve=None, sharded: bool = False, calls: str = "none",
                 etp: int = 1, hbm_bytes: float = 0.0, launch_s: float = 0.0,
                 gather: str = "node", precision: str = "bf16") -> SyncResult:
    """NeMo RL's refit as three steps in series (module docstring): gather, transfer,
    load; ``time_s`` is their sum. ``gather`` "groups" (colocated): every GPU gathers
    through its own TP, PP and EP groups as ``gather_params`` does
    (:func:`moesim.rl.refit_calls.group_gather`) instead of once per node. ``calls`` "nemo" (colocated): the gather also pays
    NeMo RL v0.3's per-key collective calls, the keys go in buckets of 0.2 x the free
    memory and the transfer packs every tensor into them (:mod:`moesim.rl.refit_calls`;
    ``hbm_bytes`` the device's memory, ``launch_s`` its launch overhead); "nemo-v03"
    adds the transfer's Ray calls through the driver, the pickling of every worker's
    per-tensor metadata and each executor's recover of a packed bucket
    (:mod:`moesim.rl.refit_host`); "nemo-v03-ops" adds the eager torch ops of the
    gather, conversion, pack and unpack and the offloads' ``gc.collect`` and
    ``empty_cache`` (:mod:`moesim.rl.refit_ops`; ``offload_gc_s``, in ``time_s``);
    "nemo-v03-wake" adds the driver's and the engines' blocking ``ray.get`` waits to the
    transfer (:mod:`moesim.rl.refit_wake`; the wake-up's rate is in the host moves,
    :mod:`moesim.rl.offload`). Disaggregated (method ``nccl``), ``calls`` "nemo-async":
    NeMo RL's non-colocated refit chunk by chunk, gather and pack, the broadcast of each
    chunk to the whole model-update group, unpack and load, as a pipeline
    (:mod:`moesim.rl.refit_async`). Colocated, ``calls`` "nemo-v06": NeMo RL v0.6's
    stream of the whole model through two ping-pong halves of 0.3 x the free memory to
    the vLLM worker on the same GPU, Megatron-Bridge's gather and the pack against the
    load (:mod:`moesim.rl.refit_zmq`). ``precision`` fp8 (the engines' weights): every
    engine GPU casts the whole model's FP8 weights it receives, each comes with its scale
    into ``load_weights`` and the share is copied at one byte
    (:mod:`moesim.rl.rollout_fp8`)."""
    nbytes = param_bytes(spec)
    src = holders(train_gpus, tp, pp, ep)
    tensors = tensor_count(spec)
    load_bytes = rollout_fp8.loaded_bytes(spec, nbytes, precision) / replica_gpus
    cast = rollout_fp8.fp8_cast(spec, hbm_Bps, launch_s) if precision == "fp8" else None
    load_s = (rollout_fp8.load_entries(spec, tensors, precision) * per_tensor_s
              + 2 * load_bytes / hbm_Bps + (cast.time_s if cast else 0.0))
    link = np.zeros(0)
    groups = None
    ar = zr = None
    offload_gc_s = 0.0
    # the colocated refit's calls levels, each pricing all the one before it does
    level = IPC_CALL_LEVELS.index(calls) if calls in IPC_CALL_LEVELS else 0
    nemo, v03, v03_ops, v03_wake = (ipc and level >= k for k in (1, 2, 3, 4))
    if ipc:
        if gather == "groups":
            from moesim.rl import refit_calls
            groups = refit_calls.group_gather(topo, spec, train_gpus, tp=tp, pp=pp, ep=ep,
                                              etp=etp, param_bytes=PARAM_BYTES,
                                              path_Bps=path_Bps)
            gather_s, gathered = groups.time_s, groups.received_bytes
        else:
            gather_s, gathered = colocated_gather(topo, nbytes, train_gpus, len(src))
        buckets = math.ceil(nbytes / REFIT_BUCKET_BYTES)
        # free memory at the refit: the policy's bf16 shard and the engine's share
        # resident (optimizer states offloaded by offload_before_refit)
        free = hbm_bytes - nbytes / len(src) - nbytes / replica_gpus
        ncalls = 0
        if nemo:
            from moesim.rl import refit_calls
            ncalls = refit_calls.gather_calls(spec, tp=tp, pp=pp, ep=ep, etp=etp)
            gather_s += refit_calls.gather_calls_s(spec, tp=tp, pp=pp, ep=ep, etp=etp)
            buckets = refit_calls.buckets(nbytes, free)
        transfer_s = buckets * IPC_REBUILD_S
        if nemo:
            transfer_s += refit_calls.pack_s(nbytes, tensors, hbm_Bps, launch_s)
        if v03:
            from moesim.rl import refit_host
            host = refit_host.ipc_handle_transfer(
                hf_tensors=tensors, buckets=buckets, policy_workers=len(train_gpus),
                megatron_keys=refit_calls.megatron_keys(spec, ep).total,
                engines=len(rollout_gpus) // replica_gpus, engine_gpus=replica_gpus)
            # the executor's recover of a packed bucket includes its handle's rebuild
            transfer_s += host.time_s - buckets * IPC_REBUILD_S
        if v03_ops:
            from moesim.rl import refit_ops
            ops = refit_ops.host_ops(spec, tp=tp, pp=pp, ep=ep, etp=etp, hf_tensors=tensors,
                                     buckets=buckets)
            gather_s += ops.gather_s
            # the pack's copy_ is an op here: its launch leaves pack_s
            transfer_s += ops.transfer_s - tensors * launch_s
            offload_gc_s = ops.offload_s
        if v03_wake:
            from moesim.rl import refit_wake
            waits = refit_wake.blocking_waits(buckets, replica_gpus)
            transfer_s += waits.time_s
        if calls == "nemo-v06":
            from moesim.rl import refit_zmq
            zr = refit_zmq.zmq_refit(
                topo, spec, train_gpus, tp=tp, pp=pp, ep=ep, replica_gpus=replica_gpus,
                engines=max(1, len(rollout_gpus) // replica_gpus), per_tensor_s=per_tensor_s,
                hbm_Bps=hbm_Bps, free_bytes=free, nbytes=nbytes, tensors=tensors,
                rebuild_s=IPC_REBUILD_S, precision=precision, launch_s=launch_s)
            gather_s, transfer_s = zr.producer_s, zr.ray_s + zr.rebuild_s
            load_s, buckets = zr.unpack_s + zr.load_s, zr.buffers
        ipc_bytes, nflows, gather_bytes = nbytes, 0, gathered * len(train_gpus)
    else:
        if sharded:
            gather_s, gathered = 0.0, 0.0
            chain = sharded_flows(nbytes, src, rollout_gpus, replica_gpus)
        else:
            gather_s, gathered = colocated_gather(topo, nbytes, train_gpus, len(src))
            chain = broadcast_flows(topo, nbytes, train_gpus, rollout_gpus, replica_gpus)
        transfer_s, link = run_flows(topo, chain, on_solve)
        buckets, ipc_bytes, nflows = 0, 0.0, len(chain)
        gather_bytes = gathered * len(train_gpus)
        if calls == "nemo-async" and not sharded:
            from moesim.rl import refit_async
            ar = refit_async.async_refit(
                topo, spec, train_gpus, rollout_gpus, tp=tp, pp=pp, ep=ep, etp=etp,
                replica_gpus=replica_gpus, per_tensor_s=per_tensor_s, hbm_Bps=hbm_Bps,
                hbm_bytes=hbm_bytes, nbytes=nbytes, tensors=tensors, path_Bps=path_Bps,
                precision=precision, launch_s=launch_s)
            gather_s, transfer_s = ar.producer_s, ar.broadcast_s
            load_s = ar.unpack_s + ar.load_s
    # disaggregated: NeMo RL overlaps the gather of one chunk with the broadcast of the
    # previous one on two streams (async refit post, Optimization #3, PR 1379)
    total = gather_s + transfer_s + load_s + offload_gc_s if ipc or sharded else (
        max(gather_s, transfer_s) + load_s)
    if ar is not None:      # the chunks' three-stage pipeline (moesim.rl.refit_async)
        total = ar.time_s
    if zr is not None:      # the halves' two-stage pipeline (moesim.rl.refit_zmq)
        total = zr.time_s
    phases = {"gather_s": gather_s, "transfer_s": transfer_s, "load_s": load_s,
              "ipc_bytes_per_gpu": ipc_bytes, "load_bytes_per_gpu": load_bytes,
              "buckets": buckets}
    if nemo:
        phases["gather_calls"] = ncalls
    if v03:
        phases["handle_transfer"] = host.as_dict()
    if v03_ops:
        phases["host_ops"] = ops.as_dict()
        phases["offload_gc_s"] = offload_gc_s
    if v03_wake:
        phases["blocking_waits"] = waits.as_dict()
    if ar is not None:
        phases["async_refit"] = ar.as_dict()
    if zr is not None:
        phases["zmq_refit"] = zr.as_dict()
    if cast is not None:
        phases["fp8_cast"] = cast.as_dict()
    if groups is not None:
        phases["gather_groups_s"] = {"tp": groups.tp_s, "pp": groups.pp_s, "ep": groups.ep_s}
    return SyncResult(total, gather_s + (0.0 if ipc else transfer_s),
                      2 * load_bytes / hbm_Bps, tensors * per_tensor_s, nbytes, nbytes,
                      gather_bytes, tensors, nflows,
                      float(link.max()) if link.size else 0.0, phases)
