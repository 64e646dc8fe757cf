"""Copies into pinned host memory with every GPU of a host copying at once
(``rl.train.offload_copy: pageable-concurrent``: everything ``pageable`` prices, plus this
and the refit's wake-up at its measured rate; with ``rl.train.offload: nemo``).

Two device-to-host copies of a NeMo RL v0.3.0 (b1c86a816) colocated step go into pinned
host memory on every GPU of every node at the same time:

- **vLLM's sleep** (``generation`` timer, ``finish_generation``:
  ``nemo_rl/models/generation/vllm.py`` ``sleep``, ``self.llm.sleep(level=1)``):
  ``CuMemAllocator.sleep`` allocates a pinned host tensor per weight allocation
  (``torch.empty(..., device="cpu", pin_memory=True)``), ``cudaMemcpy``s the allocation
  into it and unmaps and releases every allocation, KV cache included
  (vllm-project/vllm ``vllm/device_allocator/cumem.py``);
- **the policy's weights out in the refit** (``prepare_for_generation`` timer,
  ``megatron_policy_worker.py`` ``offload_after_refit`` -> ``move_model(self.model,
  "cpu")``): Megatron-Core's ``_ParamAndGradBuffer.offload_to_cpu`` copies each parameter
  buffer into the pinned host buffer it made on the first offload
  (``param_data_cpu.copy_(param_data, non_blocking=True)``, terrykong/Megatron-LM
  2ff0f099f ``megatron/core/distributed/param_and_grad_buffer.py``) and frees the GPU
  storage; the ``empty_cache()`` that follows waits for the copy.

With ``line`` or ``pageable`` both run at the host link's line rate. Here both run at
:func:`sleep_Bps`: the per-GPU rate of a published level-1 sleep with four GPUs of a host
sleeping at once. vLLM's blog post on sleep mode (vllm-project/vllm-project.github.io
``_posts/2025-10-26-sleep-mode.md``, commit c3a01c4; its data
``assets/figures/2025-vllm-sleep-mode/plotly-sleep-mode.js``, "WITH Sleep Mode (L1)")
puts Qwen3-235B-A22B-Instruct-2507-FP8 at TP4 on A100s (vLLM 0.11.0) to sleep in 6.01,
5.78 and 5.89 s; each GPU copies out the same quarter of the checkpoint its wake brings
back (:data:`moesim.rl.refit_wake.WAKE_MEASURED_BYTES_PER_GPU`, 59.08 GB), so each GPU
copied 10.03 GB/s, 0.3133 of the A100's PCIe Gen4 x16 line rate (32 GB/s a direction).
The same post's lone GPU (Qwen3-Coder-30B-A3B at TP1, 61 GB) sleeps in 2.78 s: 21.9 GB/s,
0.686 of the line, so the share falls when the GPUs of a host copy together. The share is
carried to the H100's host link as the wake's is (an assumption: the post ran A100s).
The measured sleep includes the pinned allocations, the unmaps and the ``gc.collect()``
and ``empty_cache()`` at its end; Megatron's copy reuses its pinned buffer, so for the
weights out the rate is an upper bound on the time.

The reference pass's swap (``rl.train.reference_weights: host``, NeMo RL's
``use_reference_model``) copies the same way with every GPU of the host at once: the
policy's weights out with ``.to("cpu", non_blocking=True, copy=True)``, which PyTorch's
``_to_copy`` allocates pinned (``pin_out`` for a non-blocking copy from CUDA to CPU,
aten/src/ATen/native/TensorConversions.cpp) from its caching host allocator, at
:func:`sleep_Bps`; the reference's weights in and the policy's back (``load_state_dict``
from pinned tensors) at the measured wake's rate (:func:`concurrent_rates`).

The refit's copy in, vLLM's ``wake_up`` of the weights, runs at the measured wake's share
of the line (:func:`moesim.rl.refit_wake.wake_Bps`, the same post), as with
``rl.weight_sync.calls: nemo-v03-wake``. The log-prob prep's parameters and the training
prep's optimizer states stay at the line rate (no published rate with a host's GPUs
copying those together).
"""

from __future__ import annotations

from moesim.rl.refit_wake import WAKE_MEASURED_BYTES_PER_GPU, A100_LINE_Bps

#: seconds of the measured level-1 sleep of Qwen3-235B-A22B-FP8 at TP4 on four A100s: the
#: mean of 6.01, 5.78 and 5.89 s (vLLM sleep-mode blog post, plotly-sleep-mode.js)
SLEEP_MEASURED_S = (6.01 + 5.78 + 5.89) / 3
#: the share of its host link's line rate a GPU copies out at in a sleep with its host's
#: other GPUs copying too (module docstring): 10.03 GB/s / 32 GB/s
SLEEP_LINE_SHARE = WAKE_MEASURED_BYTES_PER_GPU / SLEEP_MEASURED_S / A100_LINE_Bps
#: ``rl.train.offload_copy`` value that prices the pinned copies out at that share
CONCURRENT = "pageable-concurrent"


def sleep_Bps(host_Bps: float) -> float:
    """Bytes/s one GPU copies into pinned host memory with every GPU of its host copying
    too: the measured share of its host link's line rate (:data:`SLEEP_LINE_SHARE`)."""
    return host_Bps * SLEEP_LINE_SHARE


def concurrent_rates(train, host_Bps: float) -> tuple[float | None, float | None]:
    """(out, in) bytes/s of a GPU's pinned copies with every GPU of its host copying at
    once, under ``rl.train.offload_copy: pageable-concurrent``, else (None, None: the
    link's line rate). Out at :func:`sleep_Bps`: vLLM's sleep, the refit's weights out and
    the reference swap's copy out (``use_reference_model``'s ``.to("cpu",
    non_blocking=True)``, pinned by PyTorch's ``_to_copy`` and cached by its host
    allocator). In at the measured wake's rate: vLLM's ``wake_up`` and the swap's two
    copies in (``load_state_dict`` from pinned memory)."""
    if train.offload_copy != CONCURRENT:
        return None, None
    from moesim.rl.refit_wake import wake_Bps

    return sleep_Bps(host_Bps), wake_Bps(host_Bps)
