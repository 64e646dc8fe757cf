"""vLLM's ``wake_up`` inside NeMo RL v0.3's refit and the driver's blocking waits
(``rl.weight_sync.calls: nemo-v03-wake``: everything ``nemo-v03-ops`` prices, plus this;
with ``per_gpu: true`` and ``rl.train.offload: nemo``). The wake-up's rate alone also
comes with ``rl.train.offload_copy: pageable-concurrent`` (:mod:`moesim.rl.offload_pinned`),
which NeMo RL v0.6's colocated refit, waking vLLM the same way, takes without v0.3's calls.

What NVIDIA-NeMo/RL v0.3.0 (b1c86a816) runs inside the refit timer
(``nemo_rl/algorithms/grpo.py`` ``refit_policy_generation``, lines 396-455, under
``timer.time("prepare_for_generation")``), colocated:

1. ``policy.offload_before_refit()``, then
   ``policy_generation.prepare_for_generation(tags=["weights"])``
   (``nemo_rl/models/generation/vllm.py`` 1860-1882: ``wake_up`` on every engine's rank 0,
   ``ray.get`` on all): vLLM's ``LLM.wake_up(tags)`` runs ``CuMemAllocator.wake_up`` on
   each of the engine's GPUs: for every allocation of the tag, ``cuMemCreate``,
   ``cuMemMap`` and ``cuMemSetAccess`` (``create_and_map``), then, for the weights, a
   synchronous ``cudaMemcpy`` from the pinned host copy made at ``sleep(level=1)``
   (vLLM ``vllm/device_allocator/cumem.py``). Every GPU of every node wakes at once.
2. ``prepare_weights_for_ipc``, then per bucket ``get_weights_ipc_handles`` and
   ``update_weights_from_ipc_handles``: each a round of Ray calls the driver waits for
   (``ray.get``), and with a multi-GPU engine the engine waits for its executors'
   ``execute_method`` calls (:mod:`moesim.rl.refit_host`).
3. ``policy.offload_after_refit()``, then ``prepare_for_generation(tags=["kv_cache"])``:
   the KV cache's allocations are created and mapped again (no copy: level 1 discards it).

Priced here (docs/sources.md):

- **The weights' wake-up rate** (:data:`WAKE_LINE_SHARE`): vLLM's blog post on sleep mode
  (vllm-project/vllm-project.github.io ``_posts/2025-10-26-sleep-mode.md``, commit
  c3a01c4; its data ``assets/figures/2025-vllm-sleep-mode/plotly-switching-comparison.js``)
  measures a level-1 wake of Qwen3-235B-A22B-Instruct-2507-FP8 at TP4 on A100s (vLLM
  0.11.0, the same ``create_and_map`` + ``cudaMemcpy`` per allocation): 5.66, 5.29 and
  5.27 s. Its four GPUs wake at once, as every GPU of a NeMo RL node does; each restores a
  quarter of the checkpoint's bytes (:data:`WAKE_MEASURED_BYTES_PER_GPU`: the FP8 weights
  at a byte per parameter and the untied embedding and LM head, 2 x 0.622 B parameters,
  in bf16), so each GPU restored 10.9 GB/s, 0.341 of the A100's PCIe Gen4 x16 line rate
  (32 GB/s a direction; NVIDIA A100 datasheet: "PCIe Gen4: 64 GB/s"). The same share of
  the H100's host link is taken for a refit's wake-up (:func:`wake_Bps`): the map of the
  KV cache woken with those weights is inside the measured time. The same post's lone
  GPU (Qwen3-Coder-30B-A3B at TP1, 61 GB in 2.85-2.89 s) restores 21.3 GB/s, 0.665 of the
  line: the share falls when the GPUs of a host wake together.
- **The driver's blocking waits** (:func:`blocking_waits`): a ``ray.get`` on a round of
  calls costs at least one synchronous actor round trip, :data:`RAY_SYNC_CALL_S`: Ray's
  committed release microbenchmark (ray-project/ray ``release/perf_metrics/
  microbenchmark.json``, commit 08444c4) "1_1_actor_calls_sync" 2,011.9 calls/s (one
  node; NeMo RL's actors are on other nodes: a lower bound). The call's submission is
  already priced (:data:`moesim.rl.refit_host.RAY_CALL_S`), so each wait adds the
  difference.

Not priced (no published per-item cost): the KV cache's own ``cuMemCreate``/``cuMemMap``
in the second ``wake_up`` (the published wakes include it, small beside their weights);
``offload_after_refit``'s copy of the policy's weights into pinned memory with every GPU
of the host at once (at the link's line rate here; ``rl.train.offload_copy:
pageable-concurrent`` prices it at a published sleep's concurrent rate,
:mod:`moesim.rl.offload_pinned`); the remote round trips' own network latency.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moesim.rl.refit_host import RAY_CALL_S

#: bytes one A100 restored in the measured wake: Qwen3-235B-A22B-Instruct-2507-FP8 over
#: TP4, (235.09e9 - 1.245e9) FP8 bytes + 1.245e9 x 2 bf16 bytes (embedding and LM head)
WAKE_MEASURED_BYTES_PER_GPU = ((235.09e9 - 1.245e9) + 2 * 1.245e9) / 4
#: seconds of that wake: the mean of 5.66, 5.29 and 5.27 s (vLLM sleep-mode blog post)
WAKE_MEASURED_S = (5.66 + 5.29 + 5.27) / 3
#: the A100's host link a direction: PCIe Gen4 x16, 32 GB/s ("PCIe Gen4: 64 GB/s" both)
A100_LINE_Bps = 32e9
#: the share of its host link's line rate a GPU restores in a wake with its host's
#: other GPUs waking too (module docstring): 10.93 GB/s / 32 GB/s
WAKE_LINE_SHARE = WAKE_MEASURED_BYTES_PER_GPU / WAKE_MEASURED_S / A100_LINE_Bps
#: seconds per synchronous Ray actor call: 1 / 2,011.9 calls/s, "1_1_actor_calls_sync"
#: in ray-project/ray release/perf_metrics/microbenchmark.json (commit 08444c4)
RAY_SYNC_CALL_S = 1 / 2011.916260420167
#: blocking ``ray.get`` rounds of a refit outside the buckets: offload_before_refit,
#: wake_up(weights), prepare_weights_for_ipc, offload_after_refit, wake_up(kv_cache)
FIXED_WAITS = 5


def wake_Bps(host_Bps: float) -> float:
    """Bytes/s one GPU restores in a refit's ``wake_up(tags=["weights"])``: the measured
    share of its host link's line rate (:data:`WAKE_LINE_SHARE`)."""
    return host_Bps * WAKE_LINE_SHARE


@dataclass(frozen=True)
class BlockingWaits:
    """The refit's serial ``ray.get`` rounds and the seconds they add."""

    driver_waits: int           # rounds the driver waits for
    engine_waits: int           # rounds one engine waits for its executors
    time_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def blocking_waits(buckets: int, engine_gpus: int) -> BlockingWaits:
    """The driver waits ``5 + 2 b`` times (the fixed rounds and, per bucket, the workers'
    handles and the engines' updates); an engine of ``g > 1`` executors waits ``b`` times
    for them. Each wait adds ``RAY_SYNC_CALL_S - RAY_CALL_S`` to its calls' priced
    submission."""
    driver = FIXED_WAITS + 2 * buckets
    engine = buckets if engine_gpus > 1 else 0
    return BlockingWaits(driver, engine, (driver + engine) * (RAY_SYNC_CALL_S - RAY_CALL_S))
