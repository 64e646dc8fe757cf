"""Attention's kernels in a pass: projections, MLA latent norms, rotary embedding, the
head-layout copies, and flash attention forward/backward.

Core attention is FlashAttention (Dao 2023, FlashAttention-2 §3; Shah et al. 2024,
FlashAttention-3): causal scores counted over half the s×s matrix, the backward 2.5× the
forward FLOPs (FlashAttention-2 §4) in three kernels as the ``flash-attention`` hopper
build launches them (``FlashAttnBwdPreprocess``: dot(o, do) per row;
``FlashAttnBwd``; ``FlashAttnBwdPostprocessConvertdQ``: the FP32 dQ accumulator to
BF16). It stays in BF16 under an FP8 recipe (DeepSeek-V3 report §3.3.1).

MLA (DeepSeek-V2/V3, ``modeling_deepseek.py`` ``DeepseekV3Attention``): q_a (down),
q_a_layernorm, q_b (up), kv_a (down, with the shared RoPE key), kv_a_layernorm, kv_b
(up, keys and values per head); RoPE on q_pe and k_pe (``rotary_kernel``); the key is
assembled per head from k_nope and the broadcast k_pe (``_copy_tensor_kernel``) and
the values copied contiguous (``direct_copy_kernel``); under FP8 the attention output is
cached in FP8 for the backward (report §3.3.2; not under ``fp8_recipe: tensorwise``,
whose output projection quantises its input itself: moesim.model.kernels.tensorwise).

With ``qk_norm`` (Qwen3), an RMSNorm over every query and key head follows the QKV
projection (Megatron-Core's ``q_layernorm`` / ``k_layernorm``).

Tensor parallelism splits heads over ``tp`` (Megatron-LM); MLA down-projections are
not split. MLA's down-projections and latent norms run on every token each TP rank
holds: all of them without sequence parallelism, the rank's ``ceil(tokens/tp)`` shard
with it (``sp``), and only the up-projections (and RoPE, core attention, output
projection) on all tokens. Megatron-LM d98e8a6
``megatron/core/transformer/multi_latent_attention.py``: ``linear_q_down_proj`` /
``linear_kv_down_proj`` are duplicated ``TELinear`` s (``parallel_mode='duplicated'``,
``MLASelfAttention.__init__``) applied to the ``[s/TP, b, h]`` hidden states
(``_qkv_down_projection``: "q_compressed: [s / TP, b, q_lora_rank]"), their forward,
dgrad and wgrad GEMMs on the shard; ``q_compressed`` / ``kv_compressed`` stay
``[s/TP, b, ...]`` through the latent norms (``get_query_key_value_tensors``; with
``qk_layernorm`` Transformer Engine's fused ``LayerNormColumnParallelLinear`` of the
up-projection normalises its shard, then all-gathers it). The latents' all-gather that
replaces the hidden state's is :func:`moesim.program.folding.sp_exchange`.
"""

from __future__ import annotations

from moesim.compute.base import Kernel
from moesim.model.kernels import reference
from moesim.model.kernels.linear import CAST_TOKEN, cast_bytes
from moesim.model.kernels.linear import linear as _linear
from moesim.model.kernels.make import ACT_BYTES, FP32_BYTES, mem, rmsnorm
from moesim.model.kernels.tensorwise import TENSORWISE
from moesim.model.spec import ModelSpec

CAUSAL_FRACTION = 0.5
ATTENTION_BWD_FLOPS = 2.5   # FlashAttention-2 (Dao 2023) §4 backward/forward FLOP ratio
PROJ = "attention_gemm"


def _core(t: int, seq: int, a: int, qk: int, v: int, kv_elems: int, phase: str,
          causal: bool = True) -> list[Kernel]:
    """Flash attention over ``t`` query tokens (micro-batch × sequence), ``a`` heads of
    qk/v dims; ``kv_elems`` = t × the key and value features read (GQA shares heads)."""
    flops = (CAUSAL_FRACTION if causal else 1.0) * 2.0 * t * seq * a * (qk + v)
    q_o = ACT_BYTES * t * a * (qk + v)         # read q, write o (forward)
    kv = ACT_BYTES * kv_elems
    lse = FP32_BYTES * t * a
    shape = dict(m=t, seq=seq, heads=a, head_dim=qk, causal=causal, kclass="attention",
                 dtype="bf16")
    if phase == "fwd":
        return [Kernel("attention", flops, q_o + kv + lse, kind="attn_fwd", pass_="fwd",
                       **shape)]
    dq_acc = FP32_BYTES * t * a * qk
    return [
        mem("flash_bwd_preprocess", 2 * ACT_BYTES * t * a * v + lse, "dgrad", "attention"),
        # reads q, k, v, o, do, lse; writes dk, dv and accumulates dq in FP32
        Kernel("attention_bwd", ATTENTION_BWD_FLOPS * flops,
               q_o + ACT_BYTES * t * a * v + 2 * kv + lse + dq_acc, kind="attn_bwd",
               pass_="dgrad", **shape),
        mem("flash_bwd_convert_dq", dq_acc + ACT_BYTES * t * a * qk, "dgrad", "attention"),
    ]


def _seq(phase: str, *parts: list[Kernel]) -> list[Kernel]:
    """The parts in forward order, or last to first for the backward."""
    return [k for part in (parts if phase == "fwd" else parts[::-1]) for k in part]


def attention_kernels(spec: ModelSpec, tokens: int, seq_len: int, tp: int = 1,
                      phase: str = "fwd", fp8: bool = False, sp: bool = False) -> list[Kernel]:
    """One layer's attention for ``tokens`` = micro-batch sequences × ``seq_len`` on one
    rank, in execution order (the backward's from the output projection back); ``sp``:
    MLA's latent norms on the rank's sequence shard."""
    if tokens <= 0:
        return []
    h, t, a = spec.hidden, tokens, max(spec.heads // tp, 1)
    p = "fwd" if phase == "fwd" else "dgrad"
    recipe = getattr(spec, "fp8_recipe", "blockwise")

    def linear(name: str, m: int, n: int, k: int, ph: str, f8: bool,
               norm_amax: bool = False) -> list[Kernel]:
        # norm_amax: Transformer Engine's LayerNormLinear (the norm in front fused in)
        return _linear(name, m, n, k, ph, f8, recipe=recipe, norm_amax=norm_amax)
    if spec.attention == "mla":
        qk, v = spec.qk_nope_dim + spec.qk_rope_dim, spec.v_head_dim
        rope, nope, kvl, ql = spec.qk_rope_dim, spec.qk_nope_dim, spec.kv_lora_rank, \
            spec.q_lora_rank
        rows = -(-t // tp) if sp else t          # the down-projections' and latent norms' rows
        if ql:
            q = _seq(phase, linear(PROJ, rows, ql, h, phase, fp8), [rmsnorm(rows, ql, phase)],
                     linear(PROJ, t, a * qk, ql, phase, fp8, True))
        else:
            q = linear(PROJ, t, a * qk, h, phase, fp8)
        kv = _seq(phase, linear(PROJ, rows, kvl + rope, h, phase, fp8),
                  [rmsnorm(rows, kvl, phase)],
                  linear(PROJ, t, a * (nope + v), kvl, phase, fp8, True))
        layout = [
            mem("rotary_kernel", 2 * ACT_BYTES * t * (a + 1) * rope, p, "elementwise"),
            mem("_copy_tensor_kernel", ACT_BYTES * t * (a * nope + rope + a * qk), p,
                "elementwise"),
            mem("direct_copy_kernel", 2 * ACT_BYTES * t * a * v, p, "elementwise"),
        ]
        core = _core(t, seq_len, a, qk, v, t * a * (qk + v), phase)
        out_k = a * v
    else:
        d = spec.head_dim
        kvh = max(spec.kv_heads // tp, 1)   # fewer KV heads than tp: each rank keeps a copy
        q = linear(PROJ, t, (a + 2 * kvh) * d, h, phase, fp8, True)   # the input norm fused
        # Qwen3's QK-norm: an RMSNorm over each query head and each key head after the
        # projection, before RoPE (Megatron-LM 2ff0f099 megatron/core/transformer/
        # attention.py: q_layernorm / k_layernorm built with hidden_size =
        # hidden_size_per_attention_head, applied to query and key when qk_layernorm)
        kv = (_seq(phase, [rmsnorm(t * a, d, phase)], [rmsnorm(t * kvh, d, phase)])
              if spec.qk_norm else [])
        layout = [mem("rotary_kernel", 2 * ACT_BYTES * t * (a + kvh) * d, p, "elementwise")]
        core = _core(t, seq_len, a, d, d, 2 * t * kvh * d, phase)
        out_k = a * d
    out = linear(PROJ, t, h, out_k, phase, fp8)
    if phase == "fwd":
        cached = fp8 and recipe != TENSORWISE
        cache = [mem(CAST_TOKEN, cast_bytes(t, out_k), "fwd", "cast")] if cached else []
        return [*q, *kv, *layout, *core, *cache, *out]
    back = reference.attention_cast_back(spec, t, out_k, fp8)   # where listed
    return [*out, *back, *core, *layout, *kv, *q]
