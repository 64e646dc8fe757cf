"""NeMo RL's non-colocated (async) refit as its code runs it, chunk by chunk
(``rl.weight_sync.calls: nemo-async``; with ``per_gpu: true``, method ``nccl``).

The code is NVIDIA-NeMo/RL at 73e0c09d5 (2025-10-23, PR 1379, the last of the three PRs
the async refit post measures: NVIDIA-NeMo/.github
discussions/posts/nemo-rl-async-refit-performance/index.md, commit 72b4a40). Per refit
(``nemo_rl/algorithms/grpo.py`` ``refit_policy_generation``, non-colocated branch) the
driver calls ``broadcast_weights_for_collective`` on every policy worker and
``update_weights_from_collective`` on every vLLM engine (rank 0 of its TP and PP axes,
``vllm_generation.py``), each engine then its executors (``llm.collective_rpc``), and
waits for all. Then, per chunk (``nemo_rl/utils/packed_tensor.py``):

1. *gather* (every policy worker, ``megatron_policy_worker.py``
   ``broadcast_weights_for_collective``): Megatron-Bridge's ``export_hf_weights``
   (NVIDIA-NeMo/Megatron-Bridge 62f4704b8, the submodule NeMo RL pins; ``cpu=False``)
   runs one conversion task per Megatron key, in order, on every rank
   (``model_bridge.py`` ``stream_weights_megatron_to_hf``; ``param_mapping.py``): with
   ``pp > 1`` a ``torch.distributed.broadcast`` over the PP group from the owning stage,
   the other stages first allocating the tensor (``torch.empty``; the tensor's spec is
   exchanged once and cached); with ``tp > 1`` an all-gather over the TP group into
   ``tp`` ``empty_like`` tensors and a ``cat``; a fused ``linear_fc1`` is split into gate
   and up by ``torch.chunk`` (two views), and an expert key is all-gathered over the EP
   group into ``ep`` ``empty_like`` tensors, the fc1's gate and up separately
   (``gather_from_ep_ranks`` twice): :func:`bridge_counts`. On the host each collective
   is an eager call (``CALL_HOST_S``), each allocation an op (``EAGER_OP_S``), each chunk
   a view (``VIEW_OP_S``). On the GPU the collectives run one after another, each priced
   by NCCL's cost model for its bytes on its group's shape (:func:`gather_collectives`),
   and every list all-gather copies its outputs out of a flat buffer (PyTorch's
   ``ProcessGroupNCCL::allgather``; :func:`list_gather_bytes`) at HBM bandwidth. The
   eager calls do not block the host, so the step takes the longer of host and GPU.
2. *pack* (``packed_broadcast_producer``): per tensor ``.view(torch.uint8).view(-1)`` (two
   views, ``VIEW_OP_S``), until the list passes the target size; then one ``torch.cat``
   (every byte read and written once at HBM bandwidth, one op launch, ``EAGER_OP_S``).
   Target size ``min(0.02 x total memory, 5 GiB)`` (``get_target_packed_tensor_size``,
   ``NRL_REFIT_BUFFER_MEMORY_RATIO`` default "0.02"): :func:`chunk_bytes`.
3. *broadcast*: one ``group.broadcast(packed, src=0)`` per chunk on the model-update
   group, which holds every policy worker and every engine GPU (PR 1264's inclusive
   group: "NCCL composes multiple different rings ... to leverage all the available
   inter-node links"). Priced by NCCL's own cost model for a broadcast of the chunk's
   bytes on ``nodes x 8`` ranks (:func:`moesim.collectives.nccl.model.estimate`): every
   engine GPU receives the whole model, not its shard.
4. *unpack* (``packed_broadcast_consumer``, every engine GPU): ``torch.empty`` of the chunk
   (one op), ``split_with_sizes`` (one view op) and per tensor
   ``.view(dtype).view(*shape)`` (two views).
5. *load*: ``model_runner.model.load_weights`` over the chunk's tensors (vLLM, per
   tensor ``per_tensor_s``, and the executor's ``1/g`` share copied at HBM bandwidth,
   as :func:`moesim.rl.sync.refit_phases` prices every load).

Overlap (PR 1379, ``NRL_REFIT_NUM_BUFFERS`` default 2): producer and consumer each loop
over two buffers on two CUDA streams, so the producer's gather and pack of chunk ``i+1``
run while chunk ``i`` is broadcast, and the consumer's unpack and load of chunk ``i``
(host Python) run while the next broadcast is on the wire: a three-stage pipeline over
``n`` chunks, ``time = P/n + B/n + C/n + (n - 1)/n x max(P, B, C)`` (``P`` producer,
``B`` broadcast, ``C`` consumer totals; ``P`` the longer of the producer's host work,
gather and pack, and its GPU work, the gather's collectives and copies and the pack's
copy). The overlapped gather and broadcast share the
trainer GPUs' network paths ("This may have network resource contentions"): each NIC
carries its GPU's remote share of the gather (:func:`gather_nic_bytes`) and
``1/per_node`` of every chunk (NCCL's rings, one per NIC), so the refit also takes at
least the pipeline of that NIC's bytes at its line rate and the consumer's stage; the
larger of the two pipelines is taken. That shares each NIC at line rate, the lower bound
of the contention; ``no_overlap_s`` is the upper one, the gather and the broadcast of a
chunk in series as before PR 1379 (the load still overlapped). The driver's Ray calls come before: one per
policy worker and per engine, and one engine's calls to its executors, each
``RAY_CALL_S`` (Ray's release microbenchmark, :mod:`moesim.rl.refit_host`).

Not priced (no published per-item cost): the network contention between the gather and
the broadcast that the post names ("This may have network resource contentions"), the
Python of Megatron-Bridge's conversion tasks per tensor, vLLM's ``load_weights`` name
matching (a loop over ``expert_params_mapping``, three entries per expert, for each
expert tensor), and the collective launches' host time on the consumer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from moesim.collectives.nccl.choice import group_shape
from moesim.collectives.nccl.graphs import facts_from_params
from moesim.collectives.nccl.launch import CALL_HOST_S
from moesim.collectives.nccl.model import estimate
from moesim.errors import InputError
from moesim.model.params import count_params
from moesim.model.spec import ModelSpec
from moesim.program.host_dispatch import EAGER_OP_S, VIEW_OP_S
from moesim.rl import refit_calls, rollout_fp8
from moesim.rl.refit_host import RAY_CALL_S

#: NeMo RL 73e0c09d5 ``nemo_rl/utils/packed_tensor.py`` ``get_target_packed_tensor_size``:
#: ``NRL_REFIT_BUFFER_MEMORY_RATIO`` default "0.02" of the device's total memory ...
CHUNK_MEMORY_RATIO = 0.02
#: ... at most 5 GiB ("max size is 5GB")
CHUNK_MAX_BYTES = 5 * 1024**3
#: seconds per HF tensor of vLLM's ``model.load_weights``: NeMo RL's refit blog
#: (NVIDIA-NeMo/.github blog/posts/nemo-rl-refit-performance/index.md, commit 2392b33,
#: Table 1: DeepSeek-V3's "Generation parameter update" 1.5 s, of which 0.01 s is its
#: speed of light, the copy) over the 45,395 tensors each vLLM rank loads for
#: DeepSeek-V3 (NVIDIA-NeMo/RL docs/guides/checkpoint-engine-refit.md, aa8bfb2e8,
#: "DeepSeek-V3 Benchmark"): 32.8 us. One model's mean, set as
#: ``rl.weight_sync.per_tensor_s`` (bench_refit's nemo-async rows); how it varies with
#: the model (vLLM matches each expert tensor's name against a mapping of three entries
#: per expert) has no published figure
VLLM_LOAD_PER_TENSOR_S = (1.5 - 0.01) / 45_395
#: views per HF tensor: the producer's ``.view(torch.uint8).view(-1)``, the consumer's
#: ``.view(dtype).view(*shape)`` (packed_tensor.py)
PACK_VIEWS = 2
UNPACK_VIEWS = 2


@dataclass(frozen=True)
class BridgeCounts:
    """Per rank per refit: Megatron-Bridge's eager collective calls, the allocations
    (ops) and views of ``export_hf_weights`` (module docstring, 1.)."""

    calls: int
    ops: float      # a mean rank's (the PP non-owners' allocations are 1 - 1/pp of them)
    views: int

    @property
    def time_s(self) -> float:
        return self.calls * CALL_HOST_S + self.ops * EAGER_OP_S + self.views * VIEW_OP_S


def bridge_counts(spec: ModelSpec, *, tp: int, pp: int, ep: int) -> BridgeCounts:
    """:class:`BridgeCounts` of ``spec``: the keys of one EP rank
    (:func:`moesim.rl.refit_calls.megatron_keys`), every rank running every task. A PP
    broadcast per key (``pp > 1``) and a ``torch.empty`` on the ``pp - 1`` stages that do
    not own it (a mean rank: ``1 - 1/pp`` of the keys); a TP all-gather, ``tp``
    ``empty_like`` and a ``cat`` per TP-sharded key (``tp > 1``); per expert key (half
    fc1, half fc2) ``1.5`` EP all-gathers of ``ep`` ``empty_like`` each (``ep > 1``); two
    views per fused fc1 (its ``torch.chunk``), experts' and dense or shared ones."""
    k = refit_calls.megatron_keys(spec, ep)
    calls = ops = views = 0.0
    if pp > 1:
        calls += k.total
        ops += k.total * (1 - 1 / pp)
    if tp > 1:
        calls += k.tp_sharded
        ops += k.tp_sharded * (tp + 1)
    fc1 = k.expert // 2
    if ep > 1:
        gathers = k.expert - fc1 + 2 * fc1
        calls += gathers
        ops += gathers * ep
    dense_fc1 = sum(1 for i in range(spec.layers)
                    if not spec.is_moe_layer(i) or spec.n_shared_experts)
    views += 2 * (fc1 + dense_fc1)
    return BridgeCounts(round(calls), ops, round(views))


@dataclass(frozen=True)
class GatherCalls:
    """The gather's collectives of one trainer GPU per refit, each priced by NCCL's
    model on its group's shape (:func:`gather_collectives`)."""

    pp_calls: int
    tp_calls: int
    ep_calls: int
    pp_s: float
    tp_s: float
    ep_s: float

    @property
    def time_s(self) -> float:
        return self.pp_s + self.tp_s + self.ep_s


def _shape(topo, gpus: list, stride: int, size: int) -> tuple[int, int] | None:
    """(nodes, GPUs per node) of the group ``gpus[0], gpus[stride], ...`` of ``size``
    ranks, or None when it is not spread evenly."""
    members = [gpus[k * stride] for k in range(size) if k * stride < len(gpus)]
    if len(members) < 2:
        return None
    return group_shape(members, {g: topo.host_of(g) for g in members})


def _calls_s(topo, op: str, shape, nbytes: float, calls: float) -> float:
    """``calls`` NCCL ``op``s of ``nbytes`` (nccl-tests S) each on a group of ``shape``."""
    if shape is None or calls <= 0 or nbytes <= 0:
        return 0.0
    nodes, per = shape
    facts = facts_from_params(topo.params, topo.device, nodes, per)
    return calls * estimate(op, nbytes, per, nodes, facts)[0]


def gather_collectives(topo, spec: ModelSpec, gpus: list, *, tp: int, pp: int, ep: int
                       ) -> GatherCalls:
    """Megatron-Bridge's gather collectives (:func:`bridge_counts`), one after another on
    a trainer GPU, each priced by NCCL's cost model for its bytes on its group's shape
    (Megatron-Core's rank order ``tp-cp-ep-dp-pp``: TP neighbours, EP next, PP at a
    stride of ``world / pp``): per key a PP broadcast of the key's local bytes, per
    TP-sharded key a TP all-gather, per expert matrix (the fc1's gate and up, the fc2)
    an EP all-gather of ``ep`` experts' matrices. An expert matrix is the routed
    experts' bytes over experts, MoE layers and matrices; a non-expert key the rest's
    mean (its TP shard, ``1/tp``)."""
    c = count_params(spec)
    k = refit_calls.megatron_keys(spec, ep)
    world = len(gpus)
    moe_layers = sum(1 for i in range(spec.layers) if spec.is_moe_layer(i))
    matrix = (c.routed_experts * 2 / (spec.n_experts * moe_layers * spec.ffn_matrices)
              if spec.n_experts and moe_layers else 0.0)
    fc1 = k.expert // 2
    fc2 = k.expert - fc1
    per_fc1 = spec.ffn_matrices - 1
    dense_keys = k.total - k.expert
    dense = (c.total - c.routed_experts) * 2 / max(1, dense_keys)
    pp_shape = _shape(topo, gpus, max(1, world // pp), pp)
    tp_shape = _shape(topo, gpus, 1, tp)
    ep_shape = _shape(topo, gpus, 1 if tp == 1 else tp, ep)
    pp_calls = k.total if pp > 1 else 0
    pp_s = 0.0
    if pp > 1:
        pp_s = (_calls_s(topo, "broadcast", pp_shape, dense / tp, dense_keys)
                + _calls_s(topo, "broadcast", pp_shape, matrix * per_fc1, fc1)
                + _calls_s(topo, "broadcast", pp_shape, matrix, fc2))
    tp_calls = k.tp_sharded if tp > 1 else 0
    tp_s = _calls_s(topo, "all_gather", tp_shape, dense, tp_calls) if tp > 1 else 0.0
    ep_calls = (fc1 * per_fc1 + fc2) if ep > 1 else 0
    ep_s = _calls_s(topo, "all_gather", ep_shape, matrix * ep, ep_calls) if ep > 1 else 0.0
    return GatherCalls(pp_calls, tp_calls, ep_calls, pp_s, tp_s, ep_s)


def list_gather_bytes(spec: ModelSpec, *, tp: int, ep: int) -> float:
    """Bytes one trainer GPU's list all-gathers deliver (PyTorch's
    ``ProcessGroupNCCL::allgather`` with a list of same-size outputs gathers into one
    flat buffer, then copies each output out of it on the NCCL stream): every expert
    matrix of all ``ep`` ranks (the routed experts over ``ep``, times ``ep``) and, with
    ``tp > 1``, the TP-sharded keys whole."""
    c = count_params(spec)
    out = float(c.routed_experts * 2) if ep > 1 else 0.0
    if tp > 1:
        k = refit_calls.megatron_keys(spec, ep)
        dense_keys = max(1, k.total - k.expert)
        out += (c.total - c.routed_experts) * 2 / dense_keys * k.tp_sharded
    return out


def gather_nic_bytes(topo, spec: ModelSpec, gpus: list, *, tp: int, pp: int, ep: int,
                     etp: int = 1) -> float:
    """Bytes the first trainer GPU's network path receives in the gather: of each of
    its TP, PP and EP groups, the share of the peers on other hosts that enters through
    it, as :func:`moesim.rl.refit_calls.group_gather` prices it (the remote peers' bytes
    spread over the group's members on this host)."""
    g = refit_calls.group_gather(topo, spec, gpus, tp=tp, pp=pp, ep=ep, etp=etp,
                                 param_bytes=2, path_Bps=lambda *_: 1.0)
    world = len(gpus)
    host = topo.host_of(gpus[0])
    total = 0.0
    for stride, size, nbytes in ((1, max(tp, etp), g.tp_bytes),
                                 (max(1, world // pp), pp, g.pp_bytes),
                                 (max(1, etp), ep, g.ep_bytes)):
        peers = [gpus[k * stride] for k in range(1, size) if k * stride < world]
        if size <= 1 or nbytes <= 0 or not peers:
            continue
        remote = [p for p in peers if topo.host_of(p) != host]
        total += nbytes / len(peers) * len(remote) / (len(peers) - len(remote) + 1)
    return total


def chunk_bytes(total_memory_bytes: float) -> int:
    """The packed chunk's target size: ``min(int(0.02 x total memory), 5 GiB)``."""
    return min(int(total_memory_bytes * CHUNK_MEMORY_RATIO), CHUNK_MAX_BYTES)


def chunks(nbytes: float, chunk: float) -> int:
    """Chunks of a refit: tensors join a chunk until it passes ``chunk`` bytes, so
    ``ceil(nbytes / chunk)`` (tensors far smaller than a chunk)."""
    return max(1, math.ceil(nbytes / chunk))


def pipeline_s(n: int, *stages: float) -> float:
    """``n`` chunks through stages whose totals are ``stages``, each chunk ``1/n`` of
    each: the first chunk through every stage, then ``n - 1`` at the slowest stage."""
    return sum(stages) / n + (n - 1) / n * max(stages)


@dataclass(frozen=True)
class AsyncRefit:
    chunks: int
    chunk_bytes: int
    group_nodes: int          # nodes of the model-update group (trainer + engines)
    broadcast_chunk_s: float  # NCCL's estimate for one full chunk
    algo: str                 # NCCL's choice for it
    protocol: str
    ray_calls: int            # the driver's calls plus one engine's to its executors
    ray_s: float
    bridge_calls: int         # Megatron-Bridge's collective calls per rank
    bridge_ops: float         # its allocations (a mean rank)
    bridge_views: int         # its views
    bridge_s: float           # their host time
    gather_nccl_s: float      # the gather's collectives, NCCL's estimate each, in series
    gather_copy_s: float      # the list all-gathers' copies out of their flat buffer
    pack_host_s: float        # the pack's views and torch.cat launches
    pack_copy_s: float        # the cat's read and write of every byte at HBM bandwidth
    producer_s: float         # max(host: bridge_s + pack_host_s, GPU: the rest)
    broadcast_s: float        # every chunk's broadcast
    unpack_s: float           # torch.empty, split_with_sizes and views
    load_s: float             # load_weights per tensor and the share's copy
    nic_bytes: float          # a trainer GPU's NIC: its gather's remote share + 1/8 of all
    nic_s: float              # those bytes at the NIC's line rate
    time_s: float             # ray + the larger pipeline
    #: the bound without PR 1379's overlap of gather and broadcast (contention taking all
    #: of its gain): ray + the pipeline of (producer + broadcast) and the consumer
    no_overlap_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def broadcast_s(topo, nbytes: float, chunk: int, nodes: int, per_node: int
                ) -> tuple[float, float, str, str]:
    """(all chunks' seconds, one full chunk's, algorithm, protocol): NCCL's estimate for
    a broadcast of each chunk (full ones and the remainder) on ``nodes x per_node``
    ranks of ``topo``."""
    try:
        facts = facts_from_params(topo.params, topo.device, nodes, per_node)
    except (InputError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError("rl.weight_sync", "calls",
                         "a topology NCCL's model describes for nemo-async (dgx-h100 ...)",
                         getattr(topo, "name", "?")) from e
    full = int(nbytes // chunk)
    rest = nbytes - full * chunk
    t, algo, proto, _ = estimate("broadcast", chunk, per_node, nodes, facts)
    t_rest = estimate("broadcast", rest, per_node, nodes, facts)[0] if rest > 0 else 0.0
    return full * t + t_rest, t, algo, proto


def async_refit(topo, spec: ModelSpec, train_gpus: list, rollout_gpus: list, *, tp: int,
                pp: int, ep: int, etp: int, replica_gpus: int, per_tensor_s: float,
                hbm_Bps: float, hbm_bytes: float, nbytes: float, tensors: int,
                path_Bps, precision: str = "bf16", launch_s: float = 0.0) -> AsyncRefit:
    """NeMo RL 73e0c09d5's non-colocated refit of ``spec`` (module docstring): ``nbytes``
    the model's bf16 bytes, ``tensors`` its HF tensors, ``hbm_bytes`` the device's total
    memory (the chunk size), ``path_Bps`` :func:`moesim.rl.sync.path_Bps`; ``precision``
    fp8: the load also casts every FP8 weight (:mod:`moesim.rl.rollout_fp8`, ``launch_s``
    the device's launch overhead)."""
    size = chunk_bytes(hbm_bytes)
    n = chunks(nbytes, size)
    per_node = len([g for g in topo.gpus if topo.host_of(g) == topo.host_of(train_gpus[0])])
    hosts = {topo.host_of(g) for g in list(train_gpus) + list(rollout_gpus)}
    bcast, one, algo, proto = broadcast_s(topo, nbytes, size, len(hosts), per_node)
    bridge = bridge_counts(spec, tp=tp, pp=pp, ep=ep)
    coll = gather_collectives(topo, spec, train_gpus, tp=tp, pp=pp, ep=ep)
    gathered = list_gather_bytes(spec, tp=tp, ep=ep)
    gather_copy = 2 * gathered / hbm_Bps
    pack_host = tensors * PACK_VIEWS * VIEW_OP_S + n * EAGER_OP_S
    pack_copy = 2 * nbytes / hbm_Bps
    producer = max(bridge.time_s + pack_host, coll.time_s + gather_copy + pack_copy)
    unpack = n * (EAGER_OP_S + VIEW_OP_S) + tensors * UNPACK_VIEWS * VIEW_OP_S
    load = rollout_fp8.engine_load_s(spec, tensors, nbytes, replica_gpus, per_tensor_s,
                                     hbm_Bps, precision, launch_s)
    engines = max(1, len(rollout_gpus) // replica_gpus)
    calls = len(train_gpus) + engines + replica_gpus
    ray = calls * RAY_CALL_S
    other = next((g for g in list(rollout_gpus) + list(train_gpus)
                  if topo.host_of(g) != topo.host_of(train_gpus[0])), None)
    nic_bytes = (gather_nic_bytes(topo, spec, train_gpus, tp=tp, pp=pp, ep=ep, etp=etp)
                 + nbytes / per_node) if other is not None else 0.0
    nic = nic_bytes / path_Bps(topo, train_gpus[0], other) if other is not None else 0.0
    total = ray + max(pipeline_s(n, producer, bcast, unpack + load),
                      pipeline_s(n, nic, unpack + load))
    return AsyncRefit(n, size, len(hosts), one, algo, proto, calls, ray, bridge.calls,
                      bridge.ops, bridge.views, bridge.time_s, coll.time_s, gather_copy,
                      pack_host, pack_copy, producer, bcast, unpack, load, nic_bytes, nic,
                      total, ray + pipeline_s(n, producer + bcast, unpack + load))
