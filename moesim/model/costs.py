"""FLOPs and HBM bytes of each op of a layer, as :class:`moesim.compute.base.Kernel`.

Conventions (all per rank, for ``tokens`` tokens entering the op on that rank):

- A GEMM Y = X·W with X (m, k), W (k, n) costs 2·m·n·k FLOP and moves
  ``elem_bytes``·(m·k + k·n + m·n) bytes (the operand sizes; docs/sources.md).
  ``m`` is always the token dimension, so small-GEMM efficiency applies to it.
- Backward rule: a GEMM's backward is two GEMMs of the same size (dX = dY·Wᵀ and
  dW = Xᵀ·dY), so 2× the forward FLOPs and bytes, with count 2. Core attention's backward
  is 2.5× its forward FLOPs (FlashAttention-2, Dao 2023, §4: "backward ... 2.5× forward").
  Memory-bound ops (norms, activations, permutation) read the upstream gradient and the
  saved input and write a gradient: 2× the forward bytes.
- Causal attention scores are counted for half of the s×s matrix (FlashAttention skips
  the masked blocks).
- Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): QKV/out projections, core
  attention (by heads), dense and shared FFN (by width), embedding and LM head (by vocab)
  are split over ``tp``; norms/residuals are split by tokens (sequence parallelism,
  Korthikanti et al. 2022); MLA down-projections, the router and routed experts are not
  split (expert tensor parallelism 1: experts are sharded by EP instead).
- Backward kernels carry the forward name with a ``_bwd`` suffix.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from moesim.compute.base import Kernel
from moesim.model.spec import ModelSpec

Phase = Literal["fwd", "bwd"]
PHASES = ("fwd", "bwd")

ACT_BYTES = 2        # bf16 activations (16-bit mixed precision: ZeRO §3.1)
FP32_BYTES = 4       # router probabilities, logits for the loss, Adam states
CAUSAL_FRACTION = 0.5
ATTENTION_BWD_FLOPS = 2.5   # FlashAttention-2 (Dao 2023) backward/forward FLOP ratio
ADAM_BYTES_PER_PARAM = 28   # read fp32 master, m, v + bf16 grad (14); write them + bf16 weight (14)
ADAM_FLOPS_PER_PARAM = 10   # moments, bias correction, sqrt, divide, update (approximate)


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")


def gemm(name: str, m: int, n: int, k: int, phase: Phase = "fwd",
         elem_bytes: int = ACT_BYTES) -> Kernel:
    """Y(m, n) = X(m, k)·W(k, n); backward = 2 GEMMs of the same size."""
    _check_phase(phase)
    flops = 2.0 * m * n * k
    nbytes = float(elem_bytes) * (m * k + k * n + m * n)
    if phase == "fwd":
        return Kernel(name, flops, nbytes, m=m, n=n, k=k)
    return Kernel(name + "_bwd", 2 * flops, 2 * nbytes, m=m, n=n, k=k, count=2)


def memory_op(name: str, nbytes: float, flops: float, phase: Phase = "fwd",
              count: int = 1) -> Kernel:
    """A memory-bound op (m = n = k = 0); backward moves 2× the bytes."""
    _check_phase(phase)
    if phase == "fwd":
        return Kernel(name, float(flops), float(nbytes), count=count)
    return Kernel(name + "_bwd", 2.0 * flops, 2.0 * nbytes, count=count)


def attention_kernels(spec: ModelSpec, tokens: int, seq_len: int, tp: int = 1,
                      phase: Phase = "fwd") -> list[Kernel]:
    """Projections (GEMMs) and core attention (QKᵀ, softmax, ·V) of one layer.

    ``tokens`` = micro-batch sequences × ``seq_len``. MHA/GQA: Q, K, V, O projections;
    MLA: its down/up projections (the latent-cache absorption trick is not modelled).
    """
    if tokens <= 0:
        return []
    h, t, a = spec.hidden, tokens, spec.heads // tp
    if spec.attention == "mla":
        qk = spec.qk_nope_dim + spec.qk_rope_dim
        v = spec.v_head_dim
        out: list[Kernel] = []
        if spec.q_lora_rank:
            out.append(gemm("attention_gemm", t, spec.q_lora_rank, h, phase))
            out.append(gemm("attention_gemm", t, a * qk, spec.q_lora_rank, phase))
        else:
            out.append(gemm("attention_gemm", t, a * qk, h, phase))
        out.append(gemm("attention_gemm", t, spec.kv_lora_rank + spec.qk_rope_dim, h, phase))
        out.append(gemm("attention_gemm", t, a * (spec.qk_nope_dim + v), spec.kv_lora_rank, phase))
        score_dim, qkvo_elems = qk + v, t * a * (2 * qk + 2 * v)
        out_k = a * v
    else:
        d = spec.head_dim
        kv = max(spec.kv_heads // tp, 1)   # fewer KV heads than tp: each rank keeps a copy
        out = [gemm("attention_gemm", t, (a + 2 * kv) * d, h, phase)]
        score_dim, qkvo_elems = 2 * d, t * d * (2 * a + 2 * kv)
        out_k = a * d
    core_flops = CAUSAL_FRACTION * 2.0 * t * seq_len * a * score_dim
    core_bytes = ACT_BYTES * qkvo_elems
    if phase == "fwd":
        out.append(Kernel("attention", core_flops, core_bytes, m=t))
    else:
        _check_phase(phase)
        out.append(Kernel("attention_bwd", ATTENTION_BWD_FLOPS * core_flops, 2 * core_bytes, m=t))
    out.append(gemm("attention_gemm", t, h, out_k, phase))
    return out


def router_kernels(spec: ModelSpec, tokens: int, phase: Phase = "fwd") -> list[Kernel]:
    """Router logits GEMM (h × experts) and the fp32 softmax/top-k over them."""
    if tokens <= 0 or not spec.moe:
        return []
    e = spec.n_experts
    return [
        gemm("router", tokens, e, spec.hidden, phase),
        # read logits, write fp32 probs; ~5 FLOP per logit (exp, sum, divide, compare)
        memory_op("router_topk", tokens * e * (ACT_BYTES + FP32_BYTES), 5 * tokens * e, phase),
    ]


def ffn_kernels(spec: ModelSpec, tokens: int, width: int, prefix: str,
                phase: Phase = "fwd") -> list[Kernel]:
    """One FFN of ``width`` for ``tokens`` tokens: up (+gate) GEMMs, activation, down GEMM.

    SwiGLU forward GEMM FLOPs = 2·3·tokens·hidden·width.
    """
    if tokens <= 0 or width <= 0:
        return []
    h, t = spec.hidden, tokens
    ups = [gemm(f"{prefix}_gemm", t, width, h, phase) for _ in range(spec.ffn_matrices - 1)]
    if spec.gated:   # read gate and up outputs, write silu(gate)·up; ~5 FLOP per element
        act = memory_op(f"{prefix}_act", ACT_BYTES * 3 * t * width, 5 * t * width, phase)
    else:            # read and write one t × width tensor; 1 FLOP per element (ReLU)
        act = memory_op(f"{prefix}_act", ACT_BYTES * 2 * t * width, t * width, phase)
    return [*ups, act, gemm(f"{prefix}_gemm", t, h, width, phase)]


def expert_kernels(spec: ModelSpec, tokens: int, phase: Phase = "fwd") -> list[Kernel]:
    """One routed expert processing ``tokens`` tokens (no TP split; empty for 0 tokens)."""
    return ffn_kernels(spec, tokens, spec.expert_ffn, "expert", phase)


def shared_expert_kernels(spec: ModelSpec, tokens: int, tp: int = 1,
                          phase: Phase = "fwd") -> list[Kernel]:
    """All shared experts of a layer, fused as one FFN of width n_shared·shared_ffn/tp."""
    return ffn_kernels(spec, tokens, spec.n_shared_experts * spec.shared_ffn // tp, "shared", phase)


def dense_ffn_kernels(spec: ModelSpec, tokens: int, tp: int = 1,
                      phase: Phase = "fwd") -> list[Kernel]:
    return ffn_kernels(spec, tokens, spec.dense_ffn // tp, "dense", phase)


def norm_kernels(spec: ModelSpec, tokens: int, tp: int = 1, phase: Phase = "fwd") -> list[Kernel]:
    """2 RMSNorms + 2 residual adds per layer, sequence-parallel over tp.

    Bytes: norm reads and writes t·h (2·2 B each), add reads 2 and writes 1 (3·2 B):
    2·4 + 2·6 = 20 bytes per token-feature; FLOPs ~ 2·4 + 2·1 = 10 per token-feature.
    """
    th = -(-tokens // tp) * spec.hidden
    if th <= 0:
        return []
    return [memory_op("norm", 20 * th, 10 * th, phase, count=4)]


def permute_kernels(spec: ModelSpec, assignments: int, phase: Phase = "fwd") -> list[Kernel]:
    """Gather tokens into expert order before dispatch: read and write assignments × h."""
    if assignments <= 0:
        return []
    return [memory_op("permute", 2 * ACT_BYTES * assignments * spec.hidden, 0, phase)]


def unpermute_kernels(spec: ModelSpec, assignments: int, phase: Phase = "fwd") -> list[Kernel]:
    """Weighted sum of the top-k expert outputs back into token order: read assignments × h
    (+ fp32 weights), write assignments / top_k × h; one multiply-add per element."""
    if assignments <= 0:
        return []
    h = spec.hidden
    out_tokens = -(-assignments // max(spec.top_k, 1))
    nbytes = ACT_BYTES * (assignments * h + out_tokens * h) + FP32_BYTES * assignments
    return [memory_op("unpermute", nbytes, 2 * assignments * h, phase)]


def embedding_kernels(spec: ModelSpec, tokens: int, tp: int = 1,
                      phase: Phase = "fwd") -> list[Kernel]:
    """Vocab-parallel embedding lookup: read and write tokens × h rows."""
    if tokens <= 0:
        return []
    return [memory_op("embedding", 2 * ACT_BYTES * tokens * spec.hidden, 0, phase)]


def lm_head_kernels(spec: ModelSpec, tokens: int, tp: int = 1,
                    phase: Phase = "fwd") -> list[Kernel]:
    """Final norm, LM-head GEMM (vocab split over tp) and softmax cross-entropy in fp32."""
    if tokens <= 0:
        return []
    v = spec.vocab // tp
    return [
        memory_op("norm", 2 * ACT_BYTES * tokens * spec.hidden, 4 * tokens * spec.hidden, phase),
        gemm("lm_head", tokens, v, spec.hidden, phase),
        # read bf16 logits, write fp32 log-probs; ~5 FLOP per logit
        memory_op("loss", tokens * v * (ACT_BYTES + FP32_BYTES), 5 * tokens * v, phase),
    ]


def optimizer_kernels(n_params: float) -> list[Kernel]:
    """Memory-bound mixed-precision Adam step over the rank's (sharded) parameters."""
    if n_params <= 0:
        return []
    return [Kernel("optimizer", ADAM_FLOPS_PER_PARAM * n_params,
                   ADAM_BYTES_PER_PARAM * float(n_params))]


def layer_kernels(spec: ModelSpec, layer: int, tokens: int, seq_len: int, tp: int = 1,
                  phase: Phase = "fwd") -> list[Kernel]:
    """Every op of layer ``layer`` except the routed experts and their permutation:
    norms, attention, then router + shared experts (MoE layer) or the dense FFN."""
    ops = [*norm_kernels(spec, tokens, tp, phase),
           *attention_kernels(spec, tokens, seq_len, tp, phase)]
    if spec.is_moe_layer(layer):
        ops += router_kernels(spec, tokens, phase)
        ops += shared_expert_kernels(spec, tokens, tp, phase)
    else:
        ops += dense_ffn_kernels(spec, tokens, tp, phase)
    return ops


def split_backward(kernels: list[Kernel]) -> tuple[list[Kernel], list[Kernel]]:
    """(B, W): a backward kernel list split into its input-gradient part ``B`` and its
    weight-gradient part ``W`` (zero-bubble pipelines, Qi et al. 2023 arXiv:2401.10241
    §2; deepseek-ai/DualPipe ``WeightGradStore``).

    A weight GEMM's backward (count 2, see :func:`gemm`) is dX = dY·Wᵀ (to ``B``, named
    ``*_dgrad``) and dW = Xᵀ·dY (to ``W``, ``*_wgrad``), each one launch with half the
    FLOPs and bytes. Everything else (core attention's backward, norms, activations,
    permutation, loss: no weights, or no GEMM) is input-gradient work and stays in ``B``
    unchanged. Halving is exact in binary floating point, so per kernel B + W equals the
    full backward's FLOPs, bytes and launches exactly."""
    b: list[Kernel] = []
    w: list[Kernel] = []
    for k in kernels:
        if not k.name.endswith("_bwd"):
            raise ValueError(f"split_backward takes backward kernels, got {k.name!r}")
        if k.n > 0 and k.k > 0 and k.count == 2:       # a weight GEMM's dgrad + wgrad
            base = k.name[:-len("_bwd")]
            half = replace(k, flops=k.flops / 2, bytes=k.bytes / 2, count=1)
            b.append(replace(half, name=base + "_dgrad"))
            w.append(replace(half, name=base + "_wgrad"))
        else:
            b.append(k)
    return b, w


def backward_part(kernels: list[Kernel], part: str) -> list[Kernel]:
    """The ``B`` or ``W`` part (:func:`split_backward`) of a kernel list; forward kernels
    (no ``_bwd`` suffix) pass through unchanged for ``B`` and are dropped for ``W``."""
    if part not in ("B", "W"):
        raise ValueError(f"part must be B or W, got {part!r}")
    fwd = [k for k in kernels if not k.name.endswith("_bwd")]
    b, w = split_backward([k for k in kernels if k.name.endswith("_bwd")])
    return fwd + b if part == "B" else w


def total_flops(kernels: list[Kernel]) -> float:
    return sum(k.flops for k in kernels)


def total_bytes(kernels: list[Kernel]) -> float:
    return sum(k.bytes for k in kernels)
