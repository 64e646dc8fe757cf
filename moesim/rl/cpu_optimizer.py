"""The trainer's optimizer steps on the host (``rl.train.optimizer: cpu``), as verl's H20
scripts run Megatron-Core's HybridDeviceOptimizer with offload fraction 1
(volcengine/verl e2e4c35ec, ``examples/grpo_trainer/run_deepseek671b_math_megatron_96gb.sh``:
``optimizer_offload_fraction=1``, ``optimizer_cpu_offload=True``,
``overlap_cpu_optimizer_d2h_h2d=True``, ``use_precision_aware_optimizer=True``).

What NVIDIA/Megatron-LM's code does (d98e8a64dd ``megatron/core/optimizer/__init__.py``,
``optimizer_cpu_offload``: ``HybridDeviceOptimizer(..., offload_fraction,
cpu_optimizer_cls=torch.optim.AdamW, param_update_in_fp32=True, fused=True)``;
``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``):

- The optimizer states and an fp32 copy of every parameter of the rank's optimizer shard
  live in host memory: none of the distributed optimizer's state stays on the GPU.
- Each ``step()``: every gradient of the shard is copied out into a host buffer of the fp32
  copy's dtype (``_set_sub_optimizer_grads``: ``cpu_copy_map_grad[param].copy_(grad)``,
  4 bytes a parameter), PyTorch's fused AdamW runs on the host, and a post-step hook copies
  each fp32 parameter back to the GPU (``param_copy_back_gpu_hook``, 4 bytes a parameter).

moesim prices the two copies at the GPU's host link rate, one after the other, per
optimizer step. The host's AdamW itself (it reads a parameter, its gradient and two moments
and writes three of them back: 28 bytes a parameter of host memory traffic, every GPU of
the host at once) is not priced: no published rate of PyTorch's fused CPU AdamW on these
hosts was found (:func:`host_adamw_bytes` gives its traffic for reports). The gradients'
reduction and the GPU's own cast of the parameters stay priced as on the GPU.
"""

from __future__ import annotations

from moesim.rl.memory import stage_params

#: bytes a parameter crosses the host link per step: its fp32 gradient out, fp32 value back
COPY_BYTES_PER_PARAM = 4 + 4
#: host memory traffic of one fused AdamW update a parameter (fp32): reads of the
#: parameter, gradient, exp_avg and exp_avg_sq; writes of the parameter and both moments
ADAMW_HOST_BYTES_PER_PARAM = 4 * 4 + 3 * 4


def shard_params(spec, tr) -> float:
    """Parameters of the busiest trainer GPU's optimizer shard (Megatron's distributed
    optimizer: dense parameters over the data-parallel x context-parallel group, experts
    over the expert data-parallel group), the layers split evenly over ``tr.pp`` stages."""
    dpc = max(tr.dp * tr.cp, 1) if tr.zero >= 1 else 1
    edp = max(tr.tp * tr.cp * tr.dp // tr.ep, 1) if tr.zero >= 1 else 1
    return max(dense / dpc + expert / edp for dense, expert in stage_params(spec, tr))


def step_copy_s(spec, tr, host_Bps: float) -> float:
    """Seconds one optimizer step's copies take on the busiest GPU: the shard's fp32
    gradients out and its fp32 parameters back over the host link (``host_Bps``)."""
    return shard_params(spec, tr) * COPY_BYTES_PER_PARAM / host_Bps


def host_adamw_bytes(spec, tr, gpus_per_host: int) -> float:
    """Host memory bytes one optimizer step's AdamW moves on a host of ``gpus_per_host``
    trainer GPUs, each with the busiest GPU's shard (not priced: see the module's note)."""
    return shard_params(spec, tr) * ADAMW_HOST_BYTES_PER_PARAM * gpus_per_host
