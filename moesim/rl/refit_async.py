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
   ``broadcast_weights_for_collective``): Megatron-Bridge's ``export_hf_weights`` yields
   the HF tensors one by one, each gathered over the TP, PP and EP groups. The post:
   "This step is completely identical to that of colocated refit", so it is priced as the
   colocated one: the bytes through every GPU's own groups
   (:func:`moesim.rl.refit_calls.group_gather`) and one eager collective call per
   Megatron key and group (:func:`moesim.rl.refit_calls.gather_calls_s`).
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
``B`` broadcast, ``C`` consumer totals). The driver's Ray calls come before: one per
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

from moesim.collectives.nccl.graphs import facts_from_params
from moesim.collectives.nccl.model import estimate
from moesim.errors import InputError
from moesim.model.spec import ModelSpec
from moesim.program.host_dispatch import EAGER_OP_S, VIEW_OP_S
from moesim.rl import refit_calls
from moesim.rl.refit_host import RAY_CALL_S

#: NeMo RL 73e0c09d5 ``nemo_rl/utils/packed_tensor.py`` ``get_target_packed_tensor_size``:
#: ``NRL_REFIT_BUFFER_MEMORY_RATIO`` default "0.02" of the device's total memory ...
CHUNK_MEMORY_RATIO = 0.02
#: ... at most 5 GiB ("max size is 5GB")
CHUNK_MAX_BYTES = 5 * 1024**3
#: views per HF tensor: the producer's ``.view(torch.uint8).view(-1)``, the consumer's
#: ``.view(dtype).view(*shape)`` (packed_tensor.py)
PACK_VIEWS = 2
UNPACK_VIEWS = 2


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
    gather_s: float           # the gather's bytes and its per-key collective calls
    pack_s: float             # views, torch.cat launches and the cat's HBM copy
    broadcast_s: float        # every chunk's broadcast
    unpack_s: float           # torch.empty, split_with_sizes and views
    load_s: float             # load_weights per tensor and the share's copy
    time_s: float             # ray + the three-stage pipeline

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
                path_Bps) -> AsyncRefit:
    """NeMo RL 73e0c09d5's non-colocated refit of ``spec`` (module docstring): ``nbytes``
    the model's bf16 bytes, ``tensors`` its HF tensors, ``hbm_bytes`` the device's total
    memory (the chunk size), ``path_Bps`` :func:`moesim.rl.sync.path_Bps`."""
    size = chunk_bytes(hbm_bytes)
    n = chunks(nbytes, size)
    per_node = len([g for g in topo.gpus if topo.host_of(g) == topo.host_of(train_gpus[0])])
    hosts = {topo.host_of(g) for g in list(train_gpus) + list(rollout_gpus)}
    bcast, one, algo, proto = broadcast_s(topo, nbytes, size, len(hosts), per_node)
    groups = refit_calls.group_gather(topo, spec, train_gpus, tp=tp, pp=pp, ep=ep, etp=etp,
                                      param_bytes=2, path_Bps=path_Bps)
    gather = groups.time_s + refit_calls.gather_calls_s(spec, tp=tp, pp=pp, ep=ep, etp=etp)
    pack = tensors * PACK_VIEWS * VIEW_OP_S + n * EAGER_OP_S + 2 * nbytes / hbm_Bps
    unpack = n * (EAGER_OP_S + VIEW_OP_S) + tensors * UNPACK_VIEWS * VIEW_OP_S
    load = tensors * per_tensor_s + 2 * nbytes / replica_gpus / hbm_Bps
    engines = max(1, len(rollout_gpus) // replica_gpus)
    calls = len(train_gpus) + engines + replica_gpus
    ray = calls * RAY_CALL_S
    total = ray + pipeline_s(n, gather + pack, bcast, unpack + load)
    return AsyncRefit(n, size, len(hosts), one, algo, proto, calls, ray, gather, pack,
                      bcast, unpack, load, total)
