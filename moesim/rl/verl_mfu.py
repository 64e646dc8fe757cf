"""verl's model FLOPs utilisation of the actor update (``perf/mfu/actor``), computed as verl
computes it, so that a simulated update can be set beside a published verl MFU.

volcengine/verl e2e4c35ec (the commit that published the DeepSeek-V3 H20 benchmark,
``docs/perf/dpsk.md``):

- ``verl/workers/megatron_workers.py`` ``update_actor``: ``estimated_flops * ppo_epochs /
  promised_flops / world_size``, where ``estimated_flops`` is the FLOP/s of the step's
  samples over ``update_policy``'s wall time (the optimizer steps' micro-batches and
  optimizer updates; not the parameter and optimizer loads and offloads around it) and
  ``promised_flops`` the device's peak from ``get_device_flops``.
- ``verl/utils/flops_counter.py``: ``6 x N x tokens`` over the non-attention parameters N
  (embedding and output head included, ``vocab x hidden x 2``; for MoE the routed experts
  a token uses, its top-k, plus the router) and ``12 x sum(seqlen^2) x head_dim x heads x
  layers`` for attention (every sample's full square: no causal halving); ``seqlen`` is a
  sample's valid tokens (prompt and response).

Three of verl's counters: ``_estimate_qwen2_flops`` (dense: llama, qwen2, qwen3, mistral),
``_estimate_qwen2_moe_flops`` (qwen2_moe, qwen3_moe) and ``_estimate_deepseek_v3_flops``.
"""

from __future__ import annotations

from collections.abc import Sequence

from moesim.errors import InputError

#: verl's ``get_device_flops`` (verl/utils/flops_counter.py at e2e4c35ec): the peak it
#: divides by, by device name (FLOP/s)
VERL_PEAK_FLOPS = {"H20": 148e12, "H100": 989e12, "H800": 989e12, "H200": 989e12,
                   "A100": 312e12, "B200": 2.25e15, "GB200": 2.5e15}


def _attention_square(seqlens: Sequence[int]) -> float:
    return float(sum(int(s) * int(s) for s in seqlens))


def _gqa_flops(spec, per_layer: float, tokens: float, sq: float) -> float:
    """verl's GQA counters around a layer's non-attention parameters ``per_layer``: the
    q, k, v and output projections, the embedding and head, and the attention squares."""
    q = spec.heads * spec.head_dim
    kv = spec.kv_heads * spec.head_dim
    attn = spec.hidden * (q + 2 * kv + q)
    n = (per_layer + attn) * spec.layers + spec.vocab * spec.hidden * 2
    return 6 * n * tokens + 12 * sq * spec.head_dim * spec.heads * spec.layers


def _dense_flops(spec, tokens: float, sq: float) -> float:
    """``_estimate_qwen2_flops``: a SwiGLU MLP a layer."""
    return _gqa_flops(spec, spec.hidden * spec.dense_ffn * 3, tokens, sq)


def _qwen2_moe_flops(spec, tokens: float, sq: float) -> float:
    """``_estimate_qwen2_moe_flops`` (qwen3_moe's): every layer an MoE layer, its top-k
    experts and the router, no shared experts counted."""
    moe = spec.hidden * spec.top_k * spec.expert_ffn * 3 + spec.hidden * spec.n_experts
    return _gqa_flops(spec, moe, tokens, sq)


def _deepseek_v3_flops(spec, tokens: float, sq: float) -> float:
    """``_estimate_deepseek_v3_flops``: MLA's projections, the shared experts at the
    routed experts' width (``moe_intermediate_size``), the first dense layers."""
    h, a = spec.hidden, spec.heads
    qd = spec.qk_nope_dim + spec.qk_rope_dim
    if spec.q_lora_rank:
        attn = h * spec.q_lora_rank + a * qd * spec.q_lora_rank
    else:
        attn = h * a * qd
    attn += h * (spec.kv_lora_rank + spec.qk_rope_dim)
    attn += a * (qd - spec.qk_rope_dim + spec.v_head_dim) * spec.kv_lora_rank
    attn += a * spec.v_head_dim * h
    gate = h * spec.n_experts
    experts = h * spec.expert_ffn * (spec.top_k + spec.n_shared_experts) * 3
    k = spec.first_dense_layers
    n = ((gate + experts + attn) * (spec.layers - k) + (h * spec.dense_ffn * 3 + attn) * k
         + spec.vocab * h * 2)
    return 6 * n * tokens + 12 * sq * qd * a * spec.layers


def verl_flops(spec, seqlens: Sequence[int]) -> float:
    """FLOPs verl counts for one pass of the actor update over samples of ``seqlens``
    valid tokens (its counter for the model's family: MLA models DeepSeek-V3's, other MoE
    models Qwen2-MoE's, dense models Qwen2's)."""
    tokens, sq = float(sum(int(s) for s in seqlens)), _attention_square(seqlens)
    if spec.attention == "mla":
        return _deepseek_v3_flops(spec, tokens, sq)
    if spec.n_experts:
        return _qwen2_moe_flops(spec, tokens, sq)
    return _dense_flops(spec, tokens, sq)


def verl_peak(device_name: str, source: str = "<verl_mfu>") -> float:
    """verl's peak FLOP/s for a device (an InputError naming the device if verl has none)."""
    peak = VERL_PEAK_FLOPS.get(device_name)
    if peak is None:
        raise InputError(source, "cluster.device", "a device verl's get_device_flops lists ("
                         + ", ".join(VERL_PEAK_FLOPS) + ")", device_name)
    return peak


def actor_mfu(spec, seqlens: Sequence[int], update_s: float, gpus: int, peak_flops: float,
              epochs: int = 1) -> float:
    """verl's ``perf/mfu/actor`` for an update of ``update_s`` seconds on ``gpus`` GPUs."""
    return verl_flops(spec, seqlens) * epochs / update_s / peak_flops / gpus
