"""Transformer Engine's per-tensor current scaling around a Linear's FP8 GEMMs
(``Float8CurrentScaling``; Megatron-LM ``--fp8-recipe tensorwise``, what NVIDIA's
Megatron-Bridge "FP8-CS" runs use), the inventory's ``fp8_recipe: tensorwise``.

One quantised tensor is three kernels (NVIDIA/TransformerEngine v2.8,
``transformer_engine/pytorch/csrc/quantizer.cpp``,
``Float8CurrentScalingQuantizer::quantize_impl``):

1. ``amax_kernel`` (``nvte_compute_amax``, ``common/recipe/current_scaling.cu``): reads
   the BF16 tensor once, writes one FP32 amax;
2. ``compute_scale_from_amax_kernel`` (one thread): reads the amax, writes the scale;
3. ``cast_transpose_kernel`` (``nvte_quantize_v2``): reads the BF16 tensor again and
   writes it in FP8 row-wise and, where the backward needs it, transposed (Hopper's FP8
   GEMMs take TN operands only, so the weight gradient reads transposed copies).

Between 1 and 3 a sequence-parallel input's amax is all-reduced over the
tensor-parallel group (4 bytes, ``with_amax_reduction``): not in this inventory.

A linear with its norm fused in front (``LayerNormLinear``; Megatron-LM's
``column_parallel_layer_norm_linear``: a dense model's QKV and fc1, MLA's q and kv
up-projections with ``qk_layernorm``, Megatron-LM d98e8a6
``megatron/core/models/gpt/gpt_layer_specs.py``) skips kernel 1: the norm writes its
BF16 output with the amax (``csrc/extensions/normalization.cpp``,
``FUSED_NORM_AMAX_FP8``), then ``quantize_with_amax`` runs 2 and 3.

Per Linear (``module/linear.py``, ``module/grouped_linear.py``, v2.8):

- forward: X quantised row-wise for the forward GEMM and column-wise for the weight
  gradient (``input_quantizer.set_usage(rowwise=True, columnwise=weight_requires_grad)``):
  the three kernels over m·k;
- backward: dY quantised row-wise (dgrad) and column-wise (wgrad): the three kernels over
  m·n; the weight gradient reads the X transpose the forward saved, so nothing more;
- the weight is cast with its transpose at the step's first micro-batch and cached for
  the rest (``is_first_microbatch``, which Megatron-LM's TE wrappers pass): once per
  step, so no weight transpose among a micro-batch's kernels.

``GroupedLinear`` (the routed experts) quantises each expert's rows on their own
(``tex.split_quantize`` -> ``multi_tensor_quantize_impl`` in ``csrc/extensions/cast.cpp``:
the fused multi-tensor cast-transpose serves delayed scaling only), so a routed expert's
share holds its own three kernels per quantised tensor, as :func:`linear` lists them.
The tokens reach the experts in BF16 and Megatron's SwiGLU writes BF16: both expert
GEMMs quantise their input (``moesim.model.kernels.moe``).
"""

from __future__ import annotations

from collections.abc import Callable

from moesim.compute.base import Kernel
from moesim.model.kernels.make import ACT_BYTES, FP32_BYTES, mem

TENSORWISE = "tensorwise"
AMAX, SCALE, CAST_T = "amax_kernel", "compute_scale_from_amax_kernel", "cast_transpose_kernel"
NAMES = (AMAX, SCALE, CAST_T)
FP8_BYTES = 1            # per-tensor scaling: one byte per element, one FP32 scale per tensor


def quantize(rows: int, cols: int, pass_: str, norm_amax: bool = False) -> list[Kernel]:
    """The three kernels that quantise one rows × cols BF16 tensor, row-wise and
    transposed, in ``pass_``; ``norm_amax``: the two after the amax, which the norm
    before it computed (below)."""
    elems = float(rows) * cols
    amax = [] if norm_amax else [mem(AMAX, ACT_BYTES * elems + FP32_BYTES, pass_, "cast")]
    return [*amax, mem(SCALE, 2 * FP32_BYTES, pass_, "cast"),
            mem(CAST_T, elems * (ACT_BYTES + 2 * FP8_BYTES) + 2 * FP32_BYTES, pass_, "cast")]


def linear(gemm: Callable[[str], Kernel], m: int, n: int, k: int, phase: str,
           cast_input: bool = True, norm_amax: bool = False) -> list[Kernel]:
    """Kernels of Y(m, n) = X(m, k)·W(k, n) under per-tensor current scaling; ``gemm(p)``
    gives the GEMM of pass ``p``; ``cast_input=False`` when X is already quantised;
    ``norm_amax`` when X is the output of the norm a ``LayerNormLinear`` fuses in front
    (its forward quantisation has no amax pass)."""
    if phase == "fwd":
        return [*(quantize(m, k, "fwd", norm_amax) if cast_input else []), gemm("fwd")]
    return [*quantize(m, n, "dgrad"), gemm("dgrad"), gemm("wgrad")]


__all__ = ["AMAX", "CAST_T", "NAMES", "SCALE", "TENSORWISE", "linear", "quantize"]
