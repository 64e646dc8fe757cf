"""The MLP side of a layer in a pass: router, permutation around the expert exchange,
routed experts, shared experts, dense FFN.

Router (Megatron-Core ``moe/router.py`` ``TopKRouter``; DeepSeek-V3 report §2.1.2): a
BF16 GEMM to FP32 logits (``MatmulToFP32``), the score function (softmax, or sigmoid
for DeepSeek-V3), top-k selection, and the auxiliary-loss statistics (tokens per expert:
a scatter-add of the chosen indices, and the mean score per expert). Under an FP8 recipe
the tokens are cast to FP8 before the dispatch (report §3.3, FP8 dispatch).

Permutation: before the exchange the token copies are gathered in expert order
(Megatron ``moe_utils.permute``), after it the expert outputs are scaled by their
routing weights and summed back into token order (``unpermute``). Under an FP8 recipe
the gathered rows are FP8 with their scales (DeepSeek's ``expand_to_fused_with_scales``)
and the sum reads BF16 expert outputs (``reduce_fused``).

Experts (Megatron-Core ``moe/experts.py`` ``TEGroupedMLP``; DeepGEMM grouped GEMMs): the
fused gate+up projection (n = 2·ffn for SwiGLU), the activation, the down projection.
Every local expert is one group of one grouped launch; it is priced here as its share
(its rows), so a rank's experts sum. The expert weight gradient is DeepGEMM's k-grouped
layout. Under FP8 the expert tokens arrive in FP8 and the SwiGLU kernel writes its output
in FP8 (``swiglu_forward_with_weight_and_per_token_cast_to_fp8``), so neither expert GEMM
has a separate input cast.

Under ``fp8_recipe: tensorwise`` (Transformer Engine's per-tensor current scaling,
:mod:`moesim.model.kernels.tensorwise`) nothing is cast before the dispatch: the tokens
travel in BF16, Megatron's SwiGLU writes BF16, and every expert GEMM and the shared
experts quantise their own input (three kernels each).
"""

from __future__ import annotations

from dataclasses import replace

from moesim.compute.base import Kernel
from moesim.model.kernels import deepseek, reference
from moesim.model.kernels.linear import CAST_TOKEN, cast_bytes, linear
from moesim.model.kernels.make import ACT_BYTES, FP8_ACT, FP32_BYTES, mem
from moesim.model.kernels.tensorwise import TENSORWISE
from moesim.model.spec import ModelSpec

INDEX_BYTES = 8          # int64 expert indices (torch.topk)


def _recipe(spec: ModelSpec) -> str:
    return getattr(spec, "fp8_recipe", "blockwise")


def router_kernels(spec: ModelSpec, tokens: int, phase: str = "fwd",
                   fp8: bool = False) -> list[Kernel]:
    """Router GEMM (h × experts, BF16, FP32 logits), score, top-k, aux-loss statistics;
    under FP8 also the dispatch cast of the tokens."""
    if tokens <= 0 or not spec.moe:
        return []
    t, e, k, h = tokens, spec.n_experts, spec.top_k, spec.hidden
    logits = FP32_BYTES * t * e
    gemm = linear("router", t, e, h, phase, False, dtype="bf16", kclass="router")
    if phase == "fwd":
        # the GEMM writes FP32 logits (MatmulToFP32): 2 more bytes per logit than BF16
        ks = [replace(gemm[0], bytes=gemm[0].bytes + 2 * t * e),
              mem("router_score", 2 * logits, "fwd", "router", flops=4.0 * t * e),
              mem("router_topk", logits + t * k * (FP32_BYTES + INDEX_BYTES), "fwd", "router",
                  flops=float(t * e)),
              mem("router_aux_stats", t * k * INDEX_BYTES + logits + FP32_BYTES * e, "fwd",
                  "router", flops=float(t * e)),
              *deepseek.router_ops(spec)]   # DeepSeek's small eager kernels, where listed
        if fp8 and _recipe(spec) != TENSORWISE:
            ks.append(mem(CAST_TOKEN, cast_bytes(t, h), "fwd", "cast"))
        return ks
    # score backward: read scores and their gradient (scattered from the top-k), write
    # the logits' gradient; then the GEMM's dgrad and wgrad
    return [mem("router_score_bwd", 3 * logits, "dgrad", "router", flops=4.0 * t * e),
            *gemm]


def permute_kernels(spec: ModelSpec, assignments: int, phase: str = "fwd",
                    fp8: bool = False) -> list[Kernel]:
    """Gather ``assignments`` token copies into expert order: read and write
    assignments × h (FP8 with scales, or BF16), plus the int32 row map."""
    if assignments <= 0:
        return []
    elem = FP8_ACT if fp8 and phase == "fwd" else ACT_BYTES
    nbytes = 2 * elem * assignments * spec.hidden + 4 * assignments
    # Megatron's sort by local expert after the dispatch, where listed (reference.py)
    sort = reference.sort_chunks(spec, assignments, phase, probs=True)
    if phase == "fwd":   # the row map first, where the scenario lists it (reference.py)
        return [*reference.routing_map(spec, assignments), mem("permute", nbytes, "fwd",
                                                                "permute"), *sort]
    return [*sort, mem("permute_bwd", nbytes, "dgrad", "permute")]


def unpermute_kernels(spec: ModelSpec, assignments: int, phase: str = "fwd") -> list[Kernel]:
    """Weighted sum of the top-k expert outputs back into token order: read assignments
    × h BF16 and the FP32 weights, write assignments / top_k × h; the backward scatters
    the token gradient back to every copy (read tokens × h, the saved outputs for the
    weights' gradient, write assignments × h)."""
    if assignments <= 0:
        return []
    h = spec.hidden
    out_tokens = -(-assignments // max(spec.top_k, 1))
    # Megatron's unsort before the combine, where listed (reference.py)
    sort = reference.sort_chunks(spec, assignments, phase, probs=False)
    if phase == "fwd":
        nbytes = ACT_BYTES * (assignments * h + out_tokens * h) + FP32_BYTES * assignments
        return [*sort, mem("unpermute", nbytes, "fwd", "permute",
                           flops=2.0 * assignments * h)]
    fp8_grads = reference.fp8_grad_unpermute(spec, assignments, out_tokens)
    if fp8_grads is not None:
        return [*fp8_grads, *sort]
    nbytes = ACT_BYTES * (out_tokens * h + 2 * assignments * h) + 2 * FP32_BYTES * assignments
    return [mem("unpermute_bwd", nbytes, "dgrad", "permute", flops=2.0 * assignments * h),
            *sort]


def activation(prefix: str, t: int, width: int, gated: bool, phase: str, fp8: bool = False,
               fused_cast: bool = False) -> list[Kernel]:
    """SwiGLU (or one-input activation) over t × width outputs; forward writes BF16 or,
    with ``fused_cast``, FP8 with scales; backward reads the saved input(s) and dY and
    writes d(input), recomputing the forward inside the kernel."""
    ins = 2 if gated else 1
    cast = fp8 and fused_cast
    out = FP8_ACT if cast else ACT_BYTES
    if phase == "fwd":   # with the cast fused in, a cast kernel (DeepSeek's profile names
        # it swiglu_forward_with_weight_and_per_token_cast_to_fp8; validation's classes)
        return [mem(f"{prefix}_act", ACT_BYTES * ins * t * width + out * t * width, "fwd",
                    "cast" if cast else "elementwise", flops=5.0 * t * width)]
    return [mem(f"{prefix}_act_bwd", ACT_BYTES * (2 * ins + 1) * t * width, "dgrad",
                "elementwise", flops=10.0 * t * width)]


def ffn_kernels(spec: ModelSpec, tokens: int, width: int, prefix: str, phase: str = "fwd",
                fp8: bool = False, *, kind: str = "gemm", cast_input: bool = True,
                fused_cast: bool = False) -> list[Kernel]:
    """One FFN of ``width`` for ``tokens`` rows: fc1 (gate and up fused: n = 2·width for
    SwiGLU), activation, fc2. Forward GEMM FLOPs = 2·ffn_matrices·tokens·hidden·width."""
    if tokens <= 0 or width <= 0:
        return []
    h, t = spec.hidden, tokens
    up_n = (spec.ffn_matrices - 1) * width
    name = f"{prefix}_gemm"
    recipe = _recipe(spec)
    # a dense MLP's fc1 fuses the pre-MLP norm (Megatron's LayerNormLinear; an MoE layer
    # keeps its norm apart for the router): under tensorwise its amax comes from the norm
    fc1 = linear(name, t, up_n, h, phase, fp8, kind=kind, cast_input=cast_input, recipe=recipe,
                 norm_amax=prefix == "dense")
    act = activation(prefix, t, width, spec.gated, phase, fp8, fused_cast)
    if prefix == "expert":     # the SwiGLU input's FP8 cache, where listed (reference.py)
        act = [*reference.swiglu_cache(spec, t, up_n, phase, fp8), *act,
               *deepseek.routing_weight_grad(spec, t, up_n, width, phase, fp8)]
    fc2 = linear(name, t, h, width, phase, fp8, kind=kind,
                 cast_input=cast_input and not fused_cast, recipe=recipe)
    ks = [*fc1, *act, *fc2] if phase == "fwd" else [*fc2, *act, *fc1]
    if prefix == "expert":     # DeepSeek transposes the experts' FP8 weights in the forward
        ks = deepseek.expert_weight_transposes(spec, (up_n, h), (h, width), phase, fp8, ks)
    return ks


def expert_kernels(spec: ModelSpec, tokens: int, phase: str = "fwd", fp8: bool = False,
                   width: int | None = None) -> list[Kernel]:
    """One routed expert's share of the grouped launches for its ``tokens`` rows (no TP
    split; ``width`` = expert_ffn / etp under expert tensor parallelism)."""
    block = _recipe(spec) != TENSORWISE     # DeepSeek's FP8 dispatch and fused SwiGLU cast
    return ffn_kernels(spec, tokens, spec.expert_ffn if width is None else width, "expert",
                       phase, fp8, kind="grouped_gemm", cast_input=not block, fused_cast=block)


def shared_expert_kernels(spec: ModelSpec, tokens: int, tp: int = 1, phase: str = "fwd",
                          fp8: bool = False) -> list[Kernel]:
    """All shared experts of a layer as one FFN of width n_shared·shared_ffn/tp; its
    input is the tokens already cast for the dispatch (FP8), or under ``tensorwise``
    quantised by its own fc1."""
    return ffn_kernels(spec, tokens, spec.n_shared_experts * spec.shared_ffn // tp, "shared",
                       phase, fp8, cast_input=_recipe(spec) == TENSORWISE)


def dense_ffn_kernels(spec: ModelSpec, tokens: int, tp: int = 1, phase: str = "fwd",
                      fp8: bool = False) -> list[Kernel]:
    return ffn_kernels(spec, tokens, spec.dense_ffn // tp, "dense", phase, fp8)
