"""Kernels of a serving step that differ from training's forward (:mod:`moesim.model.costs`).

Prefill is training's forward over the prompt tokens (causal attention, quadratic in the
prompt) plus writing the prompt's KV cache. A decode step is a forward of one token per
request in which every GEMM reads its whole weight matrix for a handful of rows (the
roofline charges ``bytes / HBM bandwidth`` when that dominates: an expert's weights are
read once per step if it has any token, whatever its count) and attention reads each
request's KV cache:

- MHA/GQA: for ``t`` new tokens against a cache of ``c`` tokens, scores and values cost
  ``4 · t · c · a · d`` FLOP on a rank's ``a`` heads and read ``t · c`` cached tokens of
  :func:`moesim.serve.kv.kv_values_per_token_layer` values;
- MLA, with the up-projections absorbed into the query and output projections
  (DeepSeek-V2, arXiv:2405.04434 §2.1.2: "W^UK can be absorbed into W^Q, and W^UV into
  W^O"): every head attends over the cached latent directly, scores over
  ``kv_lora_rank + qk_rope_dim`` and values over ``kv_lora_rank`` features:
  ``2 · t · c · a · (2 · kv_lora_rank + qk_rope_dim)`` FLOP; the cache read is the latent.
  The absorbed projections have the same weights and per-token FLOPs as the
  non-absorbed ones :func:`moesim.model.costs.attention_kernels` charges, so those are
  reused.

The query heads that share one cached KV head (GQA's group, all heads for MLA) read it
once: they are the rows of one GEMM against the cache, so the attention kernel's ``m``
(the small-GEMM efficiency dimension) is ``t`` times that group.
"""

from __future__ import annotations

import dataclasses

from moesim.compute.base import Kernel
from moesim.model import costs
from moesim.model.costs import ACT_BYTES, FP32_BYTES, memory_op
from moesim.model.spec import ModelSpec
from moesim.program import recipe
from moesim.serve import mla
from moesim.serve.kv import kv_values_per_token_layer

#: FLOP per logit of the sampler: max, exp, sum, divide and a top-k compare (~5, as the
#: training loss in moesim.model.costs.lm_head_kernels)
SAMPLER_FLOPS_PER_LOGIT = 5


def kv_write_kernel(spec: ModelSpec, tokens: int, tp: int, kv_bytes: int) -> Kernel:
    """Write ``tokens`` new tokens' KV entries of one layer into the cache."""
    return memory_op("kv_write", tokens * kv_values_per_token_layer(spec, tp) * kv_bytes, 0)


def prefill_attention_kernels(spec: ModelSpec, tokens: int, prompt: int, tp: int,
                              kv_bytes: int, mla_prefill: str = "training",
                              sp: bool = False) -> list[Kernel]:
    """Norms, causal attention over the prompt (training's forward) and the KV write;
    with ``mla_prefill="sglang"`` an MLA model's kernels as SGLang's multi-head prefill
    runs them (:func:`moesim.serve.mla.sglang_prefill`). The norms run on all ``tokens``
    on every TP rank, as a serving engine runs them, or on the sequence shard with ``sp``
    (the step plan's sequence parallelism: :func:`moesim.program.recipe.prefill_attn`)."""
    ks = recipe.prefill_attn(spec, tokens, prompt, tp,
                             kv_write_kernel(spec, tokens, tp, kv_bytes), sp=sp)
    if mla_prefill == "sglang":
        return mla.sglang_prefill(spec, ks, tokens, tp)
    return ks


def decode_core_kernel(spec: ModelSpec, tokens: int, context: int, tp: int,
                       kv_bytes: int) -> Kernel:
    """One layer's attention of ``tokens`` new tokens (one per request) over caches of
    ``context`` tokens on one rank: FLOPs of scores and values, bytes of the cache read
    plus the query and output vectors (bf16)."""
    t, c, a = tokens, context, max(spec.heads // tp, 1)
    cached = kv_values_per_token_layer(spec, tp)
    if spec.attention == "mla":
        r, rope = spec.kv_lora_rank, spec.qk_rope_dim
        flops = 2.0 * t * c * a * (2 * r + rope)
        qo = t * a * ((r + rope) + r)          # absorbed query over the latent, latent out
        group = a
        k = r + rope
    else:
        d = spec.head_dim
        kv = max(spec.kv_heads // tp, 1)
        flops = 4.0 * t * c * a * d
        qo = 2 * t * a * d
        group = max(a // kv, 1)
        k = d
    nbytes = float(t * c * cached * kv_bytes + ACT_BYTES * qo)
    return Kernel("attention_decode", flops, nbytes, m=t * group, n=c, k=k)


def decode_attention_kernels(spec: ModelSpec, tokens: int, context: int, tp: int,
                             kv_bytes: int, mla_decode: str = "gemm",
                             sp: bool = False) -> list[Kernel]:
    """Norms, the projections of the new tokens, attention over the cache, the KV write;
    with ``mla_decode="sglang"`` an MLA model's up-projections as SGLang's absorbed FP8
    path runs them (:mod:`moesim.serve.mla`). The norms run on all ``tokens`` on every TP
    rank, or on the sequence shard with ``sp`` (:func:`moesim.program.recipe.decode_attn`)."""
    core = decode_core_kernel(spec, tokens, context, tp, kv_bytes)
    ks = recipe.decode_attn(spec, tokens, tp, core,
                            kv_write_kernel(spec, tokens, tp, kv_bytes), sp=sp)
    if mla_decode == "sglang":
        return mla.sglang_decode(spec, ks, tokens, tp, core.name)
    return ks


def head_kernels(spec: ModelSpec, tokens: int, tp: int = 1, sp: bool = False) -> list[Kernel]:
    """Final norm (on all ``tokens``, or on the rank's ⌈tokens/tp⌉ sequence shard with
    ``sp``: Megatron-Core's ``final_layernorm`` under sequence parallelism), the
    vocabulary-parallel LM-head GEMM (``vocab / tp`` rows per rank) and the sampler over
    the rank's logits: read bf16 logits, write fp32 probabilities of the local top-k
    candidates (counted as the whole slice, an upper bound)."""
    if tokens <= 0:
        return []
    v = -(-spec.vocab // tp)
    rows = -(-tokens // tp) if sp else tokens
    return [
        memory_op("norm", 2 * ACT_BYTES * rows * spec.hidden, 4 * rows * spec.hidden),
        costs.gemm("lm_head", tokens, v, spec.hidden),
        memory_op("sampler", tokens * v * (ACT_BYTES + FP32_BYTES),
                  SAMPLER_FLOPS_PER_LOGIT * tokens * v),
    ]


class WeightBytes:
    """A compute model charging the weight operand of every weight GEMM (``*_gemm``
    kernels: attention projections, experts, shared and dense FFNs) at ``weight_bytes``
    per element instead of :mod:`moesim.model.costs`' bf16: a checkpoint served in FP8
    (``model.weight_bytes: 1``) reads half the bytes per decode step. Other kernels pass
    through unchanged."""

    def __init__(self, model, weight_bytes: int) -> None:
        self.model = model
        self.weight_bytes = int(weight_bytes)
        self.name = f"{model.name},weights {weight_bytes} B"

    def time_s(self, kernel: Kernel) -> float:
        if kernel.name.endswith("_gemm") and kernel.k > 0 and kernel.n > 0:
            saved = (ACT_BYTES - self.weight_bytes) * kernel.k * kernel.n * kernel.count
            kernel = dataclasses.replace(kernel, bytes=max(kernel.bytes - saved, 0.0))
        return self.model.time_s(kernel)
