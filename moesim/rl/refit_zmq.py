"""NeMo RL v0.6's colocated refit as its code runs it: every trainer GPU streams the whole
model to the vLLM worker on the same GPU through two ping-pong buffers
(``rl.weight_sync.calls: nemo-v06``; with ``per_gpu: true``, method ``ipc``).

Read from NVIDIA-NeMo/RL v0.6.0 (5fb588932). ``refit_policy_generation``
(``nemo_rl/algorithms/grpo.py`` 1129-1163), colocated with vLLM: the buffer is
``NRL_REFIT_BUFFER_MEMORY_RATIO`` (default "0.3") of the trainer GPU's free memory
(:data:`BUFFER_MEMORY_RATIO`); the driver calls ``stream_weights_via_ipc_zmq`` on every
policy worker and ``update_weights_via_ipc_zmq`` on every engine (which calls its
executors), and waits for all. Then on every GPU:

1. *gather* (the producer, ``megatron_policy_worker.py`` ``_iter_params_with_optional_kv_scales``):
   Megatron-Bridge's ``export_hf_weights`` yields every HF tensor of the whole model on
   every rank, as the non-colocated refit's does: its collectives, allocations and views
   and the list all-gathers' copies are priced as there
   (:func:`moesim.rl.refit_async.bridge_counts`, :func:`~moesim.rl.refit_async.gather_collectives`).
2. *pack* (``nemo_rl/models/policy/utils.py`` ``stream_weights_via_ipc_zmq_impl``): the
   buffer split in two (``buffer_size_bytes // 2``, ping-pong); per tensor
   ``buffer[a:b].data.copy_(tensor.data.view(-1).view(dtype=torch.uint8))``: a slice,
   two ``.data`` aliases and two views (:data:`PACK_VIEWS`) and one copy op, every byte
   read and written once at HBM bandwidth. When a half is full: the stream synchronised,
   its CUDA IPC handle taken and sent over ZMQ with the tensors' names.
3. *load* (the consumer, ``vllm_backend.py`` ``update_weights_via_ipc_zmq``): per half,
   the handle rebuilt (:data:`moesim.rl.sync.IPC_REBUILD_S`, the refit blog's 0.18 ms);
   per tensor a slice and two views (:data:`UNPACK_VIEWS`); ``model.load_weights``
   (``per_tensor_s`` each, and the worker's ``1/g`` share copied at HBM bandwidth, as
   :func:`moesim.rl.sync.refit_phases` prices every load).

Overlap: while the consumer loads one half the producer fills the other, so the refit is
a two-stage pipeline over the halves (:func:`moesim.rl.refit_async.pipeline_s`); the
producer's host work and its GPU work overlap inside a half (the stream is synchronised
once per half), so it takes the longer of the two. The driver's Ray calls come before.

Not priced (no published per-item cost): the ZMQ messages and the pickled lists of names,
``cudaIpcGetMemHandle`` on the producer, ``process_weights_after_loading`` once per refit
and the Python of Megatron-Bridge's conversion tasks per tensor.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from moesim.errors import InputError
from moesim.model.spec import ModelSpec
from moesim.program.host_dispatch import EAGER_OP_S, VIEW_OP_S
from moesim.rl import refit_async, rollout_fp8
from moesim.rl.refit_host import RAY_CALL_S

#: ``NRL_REFIT_BUFFER_MEMORY_RATIO`` default "0.3" of the trainer GPU's free memory
#: (``policy.get_free_memory_bytes()``), NeMo RL v0.6.0 grpo.py 1134-1139
BUFFER_MEMORY_RATIO = 0.3
#: the ping-pong halves (``buffer_size_bytes // 2``, utils.py)
HALVES = 2
#: aliases and views per tensor of the pack: ``buffer[a:b]``, ``.data`` twice,
#: ``.view(-1)``, ``.view(dtype=torch.uint8)``
PACK_VIEWS = 5
#: per tensor of the load: ``buffer[offset:offset + n]``, ``.view(dtype)``, ``.view(shape)``
UNPACK_VIEWS = 3


@dataclass(frozen=True)
class ZmqRefit:
    """One colocated refit on a trainer GPU and the vLLM worker beside it (seconds)."""

    buffers: int              # halves sent: ceil(model bytes / half)
    half_bytes: int
    ray_calls: int
    ray_s: float
    bridge_s: float           # Megatron-Bridge's calls, allocations and views (host)
    gather_nccl_s: float      # its collectives, NCCL's estimate each, in series (GPU)
    gather_copy_s: float      # the list all-gathers' copies out of their flat buffer
    pack_host_s: float        # per tensor one copy op and five aliases or views
    pack_copy_s: float        # the whole model read and written once at HBM bandwidth
    producer_s: float         # max(host: bridge + pack, GPU: collectives + copies)
    rebuild_s: float          # a handle rebuilt per half
    unpack_s: float           # per tensor a slice and two views
    load_s: float             # load_weights per tensor and the share's copy (and the cast)
    consumer_s: float         # rebuild + unpack + load
    time_s: float             # ray + the two-stage pipeline over the halves

    def as_dict(self) -> dict:
        return asdict(self)


def half_bytes(free_bytes: float) -> int:
    """One ping-pong half: ``int(0.3 x free memory) // 2``."""
    return max(1, int(BUFFER_MEMORY_RATIO * free_bytes) // HALVES)


def zmq_refit(topo, spec: ModelSpec, train_gpus: list, *, tp: int, pp: int, ep: int,
              replica_gpus: int, engines: int, per_tensor_s: float, hbm_Bps: float,
              free_bytes: float, nbytes: float, tensors: int, rebuild_s: float,
              precision: str = "bf16", launch_s: float = 0.0) -> ZmqRefit:
    """NeMo RL v0.6.0's colocated refit of ``spec`` (module docstring): ``nbytes`` the
    model's bf16 bytes, ``tensors`` its HF tensors, ``free_bytes`` a trainer GPU's free
    memory at the refit, ``engines`` the vLLM engines of ``replica_gpus`` GPUs each,
    ``rebuild_s`` one IPC handle's rebuild; ``precision`` fp8: the load also casts every
    FP8 weight (:mod:`moesim.rl.rollout_fp8`, ``launch_s`` the device's launch overhead)."""
    if not free_bytes > 0:
        raise InputError("rl.weight_sync", "calls",
                         "nemo-v06 with device memory left beside the policy's and the "
                         "engine's weights (the buffer is 0.3 x the free memory)",
                         f"{free_bytes / 1e9:.1f} GB free")
    half = half_bytes(free_bytes)
    n = max(1, math.ceil(nbytes / half))
    bridge = refit_async.bridge_counts(spec, tp=tp, pp=pp, ep=ep)
    coll = refit_async.gather_collectives(topo, spec, train_gpus, tp=tp, pp=pp, ep=ep)
    gather_copy = 2 * refit_async.list_gather_bytes(spec, tp=tp, ep=ep) / hbm_Bps
    pack_host = tensors * (EAGER_OP_S + PACK_VIEWS * VIEW_OP_S)
    pack_copy = 2 * nbytes / hbm_Bps
    producer = max(bridge.time_s + pack_host, coll.time_s + gather_copy + pack_copy)
    rebuild = n * rebuild_s
    unpack = tensors * UNPACK_VIEWS * VIEW_OP_S
    load = rollout_fp8.engine_load_s(spec, tensors, nbytes, replica_gpus, per_tensor_s,
                                     hbm_Bps, precision, launch_s)
    consumer = rebuild + unpack + load
    calls = len(train_gpus) + engines + replica_gpus
    ray = calls * RAY_CALL_S
    total = ray + refit_async.pipeline_s(n, producer, consumer)
    return ZmqRefit(n, half, calls, ray, bridge.time_s, coll.time_s, gather_copy, pack_host,
                    pack_copy, producer, rebuild, unpack, load, consumer, total)
