"""FLOPs and HBM bytes of each op of a layer, as lists of :class:`moesim.compute.base.Kernel`.

Every function returns the kernels an op launches on one rank, in execution order, for
``tokens`` tokens entering it: ``phase="fwd"`` the forward kernels, ``phase="bwd"`` the
input-gradient (``pass_="dgrad"``) kernels and the weight-gradient (``pass_="wgrad"``)
ones. The kernels themselves (shapes, layouts, dtypes, the bytes each moves, the names
they have in a profile) are built in :mod:`moesim.model.kernels`; docs/kernels.md lists
them.

Conventions (all per rank):

- A GEMM Y = X·W with X (m, k), W (k, n) costs 2·m·n·k FLOP in each of its passes
  (forward, dgrad dX = dY·Wᵀ, wgrad dW = Xᵀ·dY); ``m`` is always the token dimension.
- ``fp8=True`` (``compute.precision: fp8``, set on the model as ``spec.precision``):
  Linear GEMMs in FP8 with the quantisation kernels around them (DeepSeek-V3 report
  §3.3); core attention, the router GEMM and the LM head stay BF16 (§3.3.1).
- Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): QKV/out projections, core
  attention (by heads), dense and shared FFN (by width), embedding and LM head (by vocab)
  are split over ``tp``; norms/residuals by tokens with sequence parallelism (``sp``,
  Korthikanti et al. 2022), else on all tokens; MLA down-projections (on the sequence
  shard with ``sp``, as MLA's latent norms), the router and routed experts are not split.
- :func:`split_backward` separates the input-gradient part ``B`` from the weight-gradient
  part ``W`` by each kernel's pass (zero-bubble pipelines; DualPipe's WeightGradStore).
"""

from __future__ import annotations

from typing import Literal

from moesim.compute.base import Kernel
from moesim.model.kernels import attention as _attn
from moesim.model.kernels import moe as _moe
from moesim.model.kernels.linear import linear
from moesim.model.kernels.make import ACT_BYTES, FP32_BYTES, mem, residual_add, rmsnorm
from moesim.model.spec import ModelSpec

Phase = Literal["fwd", "bwd"]
PHASES = ("fwd", "bwd")

CAUSAL_FRACTION = _attn.CAUSAL_FRACTION
ATTENTION_BWD_FLOPS = _attn.ATTENTION_BWD_FLOPS
ADAM_BYTES_PER_PARAM = 28   # read fp32 master, m, v + bf16 grad (14); write them + bf16 weight (14)
ADAM_FLOPS_PER_PARAM = 10   # moments, bias correction, sqrt, divide, update (approximate)
__all__ = ["ACT_BYTES", "FP32_BYTES"]


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")


def fp8(spec: ModelSpec) -> bool:
    """Whether the model's Linear GEMMs run in FP8 (``compute.precision: fp8``)."""
    return getattr(spec, "precision", "bf16") == "fp8"


def gemm(name: str, m: int, n: int, k: int, phase: Phase = "fwd",
         elem_bytes: int = ACT_BYTES) -> list[Kernel] | Kernel:
    """Y(m, n) = X(m, k)·W(k, n) in BF16: the forward GEMM (one kernel), or for
    ``phase="bwd"`` the list [dgrad, wgrad]. ``elem_bytes`` is kept for callers; BF16
    operands are assumed."""
    _check_phase(phase)
    ks = linear(name, m, n, k, phase, False)
    return ks[0] if phase == "fwd" else ks


def memory_op(name: str, nbytes: float, flops: float, phase: Phase = "fwd",
              count: int = 1, kclass: str = "elementwise") -> Kernel:
    """A memory-bound op (m = n = k = 0); its backward (named ``name_bwd``, an
    input-gradient kernel) moves 2× the bytes (reads the upstream gradient and the saved
    input, writes a gradient)."""
    _check_phase(phase)
    if phase == "fwd":
        return mem(name, nbytes, "fwd", kclass, flops=flops, count=count)
    return mem(name + "_bwd", 2.0 * nbytes, "dgrad", kclass, flops=2.0 * flops, count=count)


def attention_kernels(spec: ModelSpec, tokens: int, seq_len: int, tp: int = 1,
                      phase: Phase = "fwd", sp: bool = False) -> list[Kernel]:
    """Projections, rotary embedding, head-layout copies and flash attention of one layer
    (:mod:`moesim.model.kernels.attention`); with sequence parallelism (``sp``) MLA's
    down-projections and latent norms run on the rank's ⌈tokens/tp⌉ shard, else on all
    ``tokens``."""
    _check_phase(phase)
    return _attn.attention_kernels(spec, tokens, seq_len, tp, phase, fp8(spec), sp)


def router_kernels(spec: ModelSpec, tokens: int, phase: Phase = "fwd") -> list[Kernel]:
    """Router GEMM, score, top-k and aux-loss statistics (+ the FP8 dispatch cast)."""
    _check_phase(phase)
    return _moe.router_kernels(spec, tokens, phase, fp8(spec))


def ffn_kernels(spec: ModelSpec, tokens: int, width: int, prefix: str,
                phase: Phase = "fwd") -> list[Kernel]:
    """One FFN of ``width``: fc1 (gate+up fused), activation, fc2."""
    _check_phase(phase)
    return _moe.ffn_kernels(spec, tokens, width, prefix, phase, fp8(spec))


def expert_kernels(spec: ModelSpec, tokens: int, phase: Phase = "fwd",
                   width: int | None = None) -> list[Kernel]:
    """One routed expert's share of the grouped GEMMs for ``tokens`` rows (empty for 0)."""
    _check_phase(phase)
    return _moe.expert_kernels(spec, tokens, phase, fp8(spec), width)


def shared_expert_kernels(spec: ModelSpec, tokens: int, tp: int = 1,
                          phase: Phase = "fwd") -> list[Kernel]:
    """All shared experts of a layer, fused as one FFN of width n_shared·shared_ffn/tp."""
    _check_phase(phase)
    return _moe.shared_expert_kernels(spec, tokens, tp, phase, fp8(spec))


def dense_ffn_kernels(spec: ModelSpec, tokens: int, tp: int = 1,
                      phase: Phase = "fwd") -> list[Kernel]:
    _check_phase(phase)
    return _moe.dense_ffn_kernels(spec, tokens, tp, phase, fp8(spec))


def norm_kernels(spec: ModelSpec, tokens: int, tp: int = 1, phase: Phase = "fwd",
                 sp: bool = True) -> list[Kernel]:
    """The layer's two RMSNorms (before attention and before the MLP) and two residual
    adds (Megatron-Core's bias-dropout-adds, no dropout): 2·4 + 2·6 = 20 bytes per
    token-feature forward, 2·6 + 2·6 = 24 backward (:func:`moesim.model.kernels.make.
    rmsnorm`). With sequence parallelism (``sp``) they run on the rank's ⌈tokens/tp⌉
    sequence shard (Korthikanti et al. 2022 arXiv:2205.05198 §4.2.2; Megatron-Core
    ``TransformerLayer``: ``input_layernorm``, ``self_attn_bda``, ``pre_mlp_layernorm``,
    ``mlp_bda`` on the [s/tp, b, h] hidden states); without it every TP rank runs them
    on all ``tokens``."""
    _check_phase(phase)
    rows = -(-tokens // tp) if sp else tokens
    if rows <= 0:
        return []
    h = spec.hidden
    return [rmsnorm(rows, h, phase), residual_add(rows, h, phase),
            rmsnorm(rows, h, phase), residual_add(rows, h, phase)]


def permute_kernels(spec: ModelSpec, assignments: int, phase: Phase = "fwd") -> list[Kernel]:
    """Gather token copies into expert order around the exchange."""
    _check_phase(phase)
    return _moe.permute_kernels(spec, assignments, phase, fp8(spec))


def unpermute_kernels(spec: ModelSpec, assignments: int, phase: Phase = "fwd") -> list[Kernel]:
    """Weighted sum of the top-k expert outputs back into token order."""
    _check_phase(phase)
    return _moe.unpermute_kernels(spec, assignments, phase)


def embedding_kernels(spec: ModelSpec, tokens: int, tp: int = 1,
                      phase: Phase = "fwd") -> list[Kernel]:
    """Vocab-parallel embedding lookup: read and write tokens × h rows."""
    if tokens <= 0:
        return []
    return [memory_op("embedding", 2 * ACT_BYTES * tokens * spec.hidden, 0, phase)]


def lm_head_kernels(spec: ModelSpec, tokens: int, tp: int = 1,
                    phase: Phase = "fwd", sp: bool = False) -> list[Kernel]:
    """Final norm, LM-head GEMM (vocab split over tp, BF16) and the FP32 softmax
    cross-entropy (~5 FLOP per logit; reads BF16 logits, writes FP32 log-probs). With
    sequence parallelism (``sp``) the final norm runs on the rank's ⌈tokens/tp⌉ shard
    (Megatron-Core ``TransformerBlock.final_layernorm`` on the [s/tp, b, h] output; the
    output layer all-gathers the sequence)."""
    _check_phase(phase)
    if tokens <= 0:
        return []
    v = spec.vocab // tp
    t = tokens
    head = linear("lm_head", t, v, spec.hidden, phase, False, dtype="bf16")
    loss = memory_op("loss", t * v * (ACT_BYTES + FP32_BYTES), 5 * t * v, phase)
    norm = rmsnorm(-(-t // tp) if sp else t, spec.hidden, phase)
    return [norm, *head, loss] if phase == "fwd" else [loss, *head, norm]


def optimizer_kernels(n_params: float) -> list[Kernel]:
    """Memory-bound mixed-precision Adam step over the rank's (sharded) parameters
    (apex/TE ``multi_tensor_adam``)."""
    if n_params <= 0:
        return []
    return [Kernel("optimizer", ADAM_FLOPS_PER_PARAM * n_params,
                   ADAM_BYTES_PER_PARAM * float(n_params), kind="memory", kclass="optimizer",
                   dtype="fp32")]


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


def is_backward(k: Kernel) -> bool:
    """A backward kernel: an input- or weight-gradient pass (``pass_`` dgrad/wgrad), or an
    unsplit legacy one named ``*_bwd``."""
    return k.pass_ in ("dgrad", "wgrad") or (not k.pass_ and k.name.endswith("_bwd"))


def split_backward(kernels: list[Kernel]) -> tuple[list[Kernel], list[Kernel]]:
    """(B, W): a backward kernel list split into its input-gradient part ``B``
    (``pass_ == "dgrad"``: dX GEMMs, core attention's backward, norms, activations,
    permutation, the casts for them) and its weight-gradient part ``W`` (``pass_ ==
    "wgrad"``: dW GEMMs and the transposed FP8 copies they read); zero-bubble pipelines,
    Qi et al. 2023 arXiv:2401.10241 §2; deepseek-ai/DualPipe ``WeightGradStore``. B + W
    is the whole backward, kernel for kernel."""
    b: list[Kernel] = []
    w: list[Kernel] = []
    for k in kernels:
        if not is_backward(k):
            raise ValueError(f"split_backward takes backward kernels, got {k.name!r}")
        (w if k.pass_ == "wgrad" else b).append(k)
    return b, w


def backward_part(kernels: list[Kernel], part: str) -> list[Kernel]:
    """The ``B`` or ``W`` part (:func:`split_backward`) of a kernel list; forward kernels
    (recomputation) pass through unchanged for ``B`` and are dropped for ``W``."""
    if part not in ("B", "W"):
        raise ValueError(f"part must be B or W, got {part!r}")
    fwd = [k for k in kernels if not is_backward(k)]
    b, w = split_backward([k for k in kernels if is_backward(k)])
    return fwd + b if part == "B" else w


def total_flops(kernels: list[Kernel]) -> float:
    return sum(k.flops for k in kernels)


def total_bytes(kernels: list[Kernel]) -> float:
    return sum(k.bytes for k in kernels)
