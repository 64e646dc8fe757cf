"""Kernel fusion as a what-if (``compute.fusion``): one pure transformation of an op's
kernel list (docs/kernels.md, "Fusion as a what-if").

``fuse(kernels, names)`` merges, within one op's list, a producer kernel with the kernel
that reads its output, for each fusion named (:data:`moesim.compute.memory_kernels.
FUSIONS`). The fused kernel is one launch; it moves the two kernels' bytes less the
intermediate tensor's write and read, worked out from the kernels' own sizes (the
element counts below invert the traffic models of :mod:`moesim.model.kernels.make`,
``linear`` and ``moe``), and keeps the ``memory`` kind of its memory-bound part, so the
memory-kernel model (``compute.memory_kernels``) prices it by its bytes:

- ``residual_norm``: the residual add and the RMSNorm that reads the sum (Dao-AILab/
  flash-attention ``flash_attn/ops/layer_norm.py`` at 50c7b6b4,
  ``DropoutAddLayerNormPrenormFN``: one kernel returns the normed output and the sum, its
  backward takes the residual's gradient; the kernel DeepSeek's profile names). Forward: the norm's read of the sum is saved (the sum is still written: the residual
  stream carries it to the next add), 2 bytes per element; backward: the norm's input
  gradient is added to the residual gradient in the norm's kernel, its write and read
  saved, 4 bytes per element. A layer's second add (after the MLP) fuses into the next
  layer's first norm, which has the same shape: it pairs with the op's first norm.
- ``norm_cast``: the RMSNorm and the FP8 per-token cast of its output (NVIDIA/
  TransformerEngine ``transformer_engine/pytorch/module/layernorm_linear.py`` at 3ec87875,
  ``LayerNormLinear``: the norm writes the next GEMM's FP8 input): the BF16 output's write and read, 4 bytes per element.
  Forward only; the pre-MLP norm's output is also read in BF16 by the router GEMM, so its
  dispatch cast (another op) stays.
- ``act_cast``: the activation and the FP8 cast of its output for the next GEMM (the
  kernel DeepSeek's profile names ``swiglu_forward_with_weight_and_per_token_cast_to_fp8``,
  which the routed experts already have; NVIDIA/Megatron-LM
  ``megatron/core/fusions/fused_bias_swiglu.py`` at b1030e9d fuses only the bias): 4 bytes per output element.
- ``permute_cast``: the dispatch's FP8 cast and the permutation that reads its output:
  the FP8 tokens' write and one read, 2 × (1 + 4/128) bytes per element. No public kernel
  found fuses both (Transformer Engine's ``moe_permute``,
  ``transformer_engine/pytorch/permutation.py`` at 0a67aa3b, permutes an FP8 tensor cast
  before it); this one is ours.
- ``ce_chunked``: cross-entropy over the logits chunk by chunk with the logits' gradient
  written in place in the forward (linkedin/Liger-Kernel
  ``src/liger_kernel/ops/fused_linear_cross_entropy.py`` at ead96b61: BF16 logits chunk
  by chunk, ``liger_cross_entropy_kernel`` writes their gradient in place, the backward
  only scales when the loss's gradient is not 1): the forward loss
  reads the BF16 logits and writes their BF16 gradient (4 bytes per logit instead of 6:
  no FP32 log-probabilities), and the backward loss kernel (12 bytes per logit) is gone.
  Liger also runs the head's gradient GEMMs in the forward; they stay in the backward
  here (same FLOPs).

With ``names`` empty the list is returned as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from moesim.compute.base import Kernel
from moesim.compute.memory_kernels import FUSIONS
from moesim.model.kernels.linear import CAST_TOKEN
from moesim.model.kernels.make import ACT_BYTES, FP8_ACT

__all__ = ["FUSIONS", "fuse", "saved"]

Size = Callable[[Kernel], "int | None"]


def _elems(x: float) -> int:
    return int(round(x))


#: FLOPs per element: make.rmsnorm's (4 forward, 8 backward), + 1 with the add fused
_NORM_FLOPS = {"fwd": {"norm": 4.0, "add_norm": 5.0}, "dgrad": {"norm_bwd": 8.0}}


def _norm(pass_: str, fused: bool = True) -> Size:
    per = {n: f for n, f in _NORM_FLOPS[pass_].items() if fused or n != "add_norm"}
    return lambda k: (_elems(k.flops / per[k.name]) if k.name in per and k.pass_ == pass_
                      and k.kind == "memory" else None)


def _add(pass_: str) -> Size:
    name = "residual_add" if pass_ == "fwd" else "residual_add_bwd"
    return lambda k: _elems(k.flops) if k.name == name and k.pass_ == pass_ else None


def _cast(k: Kernel) -> int | None:
    if k.name == CAST_TOKEN and k.pass_ == "fwd":
        return _elems(k.bytes / (ACT_BYTES + FP8_ACT))     # linear.cast_bytes
    return None


def _act(k: Kernel) -> int | None:
    if k.name.endswith("_act") and k.pass_ == "fwd" and k.kclass == "elementwise":
        return _elems(k.flops / 5.0)                       # moe.activation's output elements
    return None


def _permute(k: Kernel) -> int | None:
    return 0 if k.name == "permute" and k.pass_ == "fwd" else None


@dataclass(frozen=True)
class Rule:
    """A producer of ``size`` elements fused with the next consumer of the same size."""

    producer: Size
    consumer: Size
    saved_per_elem: float
    name: Callable[[Kernel, Kernel], str]
    kclass: Callable[[Kernel, Kernel], str]
    wrap: bool = False           # unpaired producers then pair with unpaired consumers
    any_size: bool = False       # the consumer's size is not known: pair by order


def _first(p: Kernel, c: Kernel) -> str:
    return p.kclass


RULES: dict[str, tuple[Rule, ...]] = {
    "residual_norm": (
        Rule(_add("fwd"), _norm("fwd", False), ACT_BYTES, lambda p, c: "add_norm",
             lambda p, c: "norm", wrap=True),
        Rule(_norm("dgrad"), _add("dgrad"), 2 * ACT_BYTES, lambda p, c: "norm_add_bwd",
             lambda p, c: "norm")),
    "norm_cast": (
        Rule(_norm("fwd"), _cast, 2 * ACT_BYTES, lambda p, c: f"{p.name}_cast",
             lambda p, c: "norm"),),
    "act_cast": (
        Rule(_act, _cast, 2 * ACT_BYTES, lambda p, c: p.name, lambda p, c: "cast"),),
    "permute_cast": (
        Rule(_cast, _permute, 2 * FP8_ACT, lambda p, c: "permute_cast",
             lambda p, c: "permute", any_size=True),),
}


def saved(rule: Rule, size: int) -> float:
    """Bytes a fused pair of ``size`` elements no longer moves."""
    return rule.saved_per_elem * size


def _pairs(ks: list[Kernel], rule: Rule) -> list[tuple[int, int, int]]:
    """(producer, consumer, size) pairs: each consumer takes the earliest producer of its
    size not yet fused and seen since the last consumer of that size."""
    pending: dict[int, list[int]] = {}
    taken: set[int] = set()
    out = []
    for i, k in enumerate(ks):
        c = rule.consumer(k)
        if c is not None:
            key = -1 if rule.any_size else c
            if pending.get(key):
                j = pending[key][0]
                size = rule.producer(ks[j]) if rule.any_size else c
                out.append((j, i, size))
                taken |= {i, j}
                pending[key] = []
            continue
        p = rule.producer(k)
        if p is not None:
            pending.setdefault(-1 if rule.any_size else p, []).append(i)
    if rule.wrap:     # a layer's last producer with its first consumer (the next layer's)
        prods = [i for i, k in enumerate(ks) if i not in taken and rule.producer(k) is not None]
        cons = [i for i, k in enumerate(ks) if i not in taken and rule.consumer(k) is not None]
        for j in prods:
            i = next((i for i in cons if rule.consumer(ks[i]) == rule.producer(ks[j])), None)
            if i is not None:
                cons.remove(i)
                out.append((j, i, rule.producer(ks[j])))
    return out


def _apply(ks: list[Kernel], rule: Rule) -> list[Kernel]:
    pairs = _pairs(ks, rule)
    if not pairs:
        return ks
    at: dict[int, Kernel] = {}
    gone = set()
    for j, i, size in pairs:
        p, c = ks[j], ks[i]
        at[i] = replace(c, name=rule.name(p, c), flops=p.flops + c.flops,
                        bytes=p.bytes + c.bytes - saved(rule, size),
                        count=max(p.count, c.count), kclass=rule.kclass(p, c))
        gone.add(j)
    return [at.get(i, k) for i, k in enumerate(ks) if i not in gone]


def _ce_chunked(ks: list[Kernel]) -> list[Kernel]:
    out = []
    for k in ks:
        if k.name == "loss" and k.pass_ == "fwd":
            logits = k.bytes / 6.0             # costs.lm_head_kernels: read 2, write 4
            out.append(replace(k, name="loss_chunked", bytes=4.0 * logits, flops=3 * k.flops))
        elif k.name != "loss_bwd":
            out.append(k)
    return out


def fuse(kernels: Iterable[Kernel], names: Iterable[str]) -> list[Kernel]:
    """``kernels`` (one op's, in execution order) with the fusions ``names`` applied, in
    :data:`FUSIONS` order; unchanged (the same list) when ``names`` is empty."""
    names = tuple(names)
    if not names:
        return kernels if isinstance(kernels, list) else list(kernels)
    unknown = [n for n in names if n not in FUSIONS]
    if unknown:
        raise ValueError(f"unknown fusion {unknown[0]!r}: one of {', '.join(FUSIONS)}")
    ks = list(kernels)
    for name in FUSIONS:
        if name not in names:
            continue
        if name == "ce_chunked":
            ks = _ce_chunked(ks)
        else:
            for rule in RULES[name]:
                ks = _apply(ks, rule)
    return ks
