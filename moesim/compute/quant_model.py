"""The compute model of a quantised or 2:4-sparse checkpoint: :class:`QuantModel` wraps
the scenario's model (catalog or roofline) and prices every forward weight GEMM
(:func:`moesim.compute.quant.is_weight_gemm`) with its operands at the mode's bytes and
its math at the mode's rate (:mod:`moesim.compute.quant`, :mod:`moesim.compute.sparsity`);
every other kernel goes to the wrapped model unchanged.

time = launches + max(math, bytes at the streaming rate), where

- math: the catalog's FP8 tables for ``fp8`` / ``fp8-block`` (DeepGEMM, published), else
  FLOPs / (the math's peak × efficiency): Marlin's 16-row tiles at the roofline's large-GEMM
  efficiency for weight-only ``int4`` / ``int8``, the roofline's curve for the rest;
  divided by the 2:4 speed-up under ``sparsity: 2:4``;
- bytes: the kernel's bytes with the activation input and the weight at the mode's bytes
  per element (2:4: half the weight plus its metadata), at the roofline's achieved HBM
  rate, the rate that prices the bytes of every unquantised GEMM (the catalog's GEMM
  tables are rates of FLOPs), so a memory-bound GEMM gains exactly its bytes' ratio.

Where :mod:`moesim.compute.quant_kernels` has a model of the kernel class on the device
(NVFP4 on B200, Marlin on H100; not under 2:4), that model's time replaces
max(math, bytes).

:meth:`QuantModel.price` says which prices were published (``catalog``) and which the
roofline gave (``roofline``), so the step summary's kernel-pricing count covers them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moesim.compute import quant_kernels as qk
from moesim.compute import sparsity as sp
from moesim.compute.base import Kernel
from moesim.compute.catalog import Priced
from moesim.compute.catalog import price as base_price
from moesim.compute.quant import (
    MARLIN_PUBLISHED_ROWS,
    MARLIN_ROWS,
    QuantMode,
    fill,
    is_weight_gemm,
    operand_bytes,
    requantised,
)

_PEAK = {"bf16": "peak_bf16_flops", "fp8": "peak_fp8_flops", "fp4": "peak_fp4_flops",
         "int8": "peak_int8_ops"}


class QuantModel:
    """A :class:`~moesim.compute.base.ComputeModel` for a quantised / sparse checkpoint."""

    def __init__(self, base: Any, mode: QuantMode, sparsity: str = "none",
                 stored_weight_bytes: float | None = None) -> None:
        self.base = base
        self.mode = mode
        self.sparsity = sparsity
        #: bytes per weight element of the checkpoint without this mode (the model's
        #: ``weight_bytes``, e.g. 1 for DeepSeek-V3's FP8 checkpoint; None: the recipe's)
        self.stored_weight_bytes = stored_weight_bytes
        self.roofline = getattr(base, "roofline", base)
        self.device = self.roofline.device
        self.precision = getattr(base, "precision", "bf16")
        self.launch_overhead_s = self.roofline.launch_overhead_s
        self.graph_kernel_s = self.roofline.graph_kernel_s
        tag = [f"weights={mode.weights}"] if mode.on else []
        if mode.on and mode.activations != "bf16":
            tag.append(f"activations={mode.activations}")
        if sparsity != "none":
            tag.append(f"sparsity={sparsity}")
        self.name = f"{base.name}[{','.join(tag)}]"
        self._memo: dict[Kernel, Priced] = {}

    def stored(self, weight_bytes: float) -> QuantModel:
        """This model for a checkpoint whose weights are stored at ``weight_bytes`` per
        element (``model.weight_bytes``): what a sparse checkpoint halves; a ``weights``
        format replaces it. Serving takes it in place of its ``WeightBytes`` wrapper
        (moesim.serve.costs), so the weight bytes are rewritten once."""
        return QuantModel(self.base, self.mode, self.sparsity, float(weight_bytes))

    # ------------------------------------------------------------------ interface
    def time_s(self, kernel: Kernel) -> float:
        return self.price(kernel).time_s

    def per_launch_s(self, kernel: Kernel) -> float:
        return self.roofline.per_launch_s(kernel)

    def price(self, kernel: Kernel) -> Priced:
        if not is_weight_gemm(kernel):
            return base_price(self.base, kernel)
        p = self._memo.get(kernel)
        if p is None:
            if len(self._memo) >= 1 << 16:
                self._memo.clear()
            p = self._memo[kernel] = self._price(kernel)
        return p

    # ------------------------------------------------------------------ pricing
    def operand_bytes(self, kernel: Kernel) -> tuple[float, float]:
        """(activation, weight) bytes per element of ``kernel`` under this mode."""
        a, w = operand_bytes(kernel)
        if self.stored_weight_bytes is not None:
            w = self.stored_weight_bytes
        if self.mode.on:
            a, w = self.mode.act_bytes(), self.mode.weight_bytes()
        if self.sparsity != "none":
            w = sp.sparse_weight_bytes(w)
        return a, w

    def rewritten(self, kernel: Kernel) -> Kernel:
        """``kernel`` with the mode's operand bytes (and dtype for the catalog)."""
        k = requantised(kernel, *self.operand_bytes(kernel))
        if self.mode.on:
            fp8 = self.mode.weights in ("fp8", "fp8-block")
            k = dataclasses.replace(k, dtype="fp8" if fp8 else self.mode.weights)
        return k

    def _price(self, kernel: Kernel) -> Priced:
        k = self.rewritten(kernel)
        launches = max(kernel.count, 1) * self.per_launch_s(kernel)
        math_s, source, detail = self._math(k)
        mem_s = k.bytes / self.roofline.hbm_Bps
        if self.sparsity != "none":
            s, src, published = sp.speedup(self.device)
            math_s /= s
            detail += f"; 2:4 x{s:.3g} ({src})"
            if not published:
                source = "roofline"
        bound = "memory" if mem_s >= math_s else "math"
        published = None if self.sparsity != "none" else self._published(k, math_s)
        if published is not None:
            t, pdetail = published
            return Priced(launches + t, "catalog", f"{self.name}: {pdetail}; {k.bytes:.4g} B")
        return Priced(launches + max(math_s, mem_s), source,
                      f"{self.name}: {detail}; {k.bytes:.4g} B, {bound}-bound")

    def _published(self, k: Kernel, math_s: float) -> tuple[float, str] | None:
        """The kernel classes with a rate model from their published benchmarks
        (:mod:`moesim.compute.quant_kernels`), on the devices it was calibrated for."""
        hbm = self.roofline.hbm_Bps
        if self.mode.weights == "nvfp4" and self.mode.activations == "nvfp4":
            return qk.nvfp4_s(self.device, k, hbm)
        if self.mode.weight_only:
            return qk.marlin_s(self.device, k, hbm, math_s)
        return None

    def _math(self, k: Kernel) -> tuple[float, str, str]:
        """(seconds of math, source, detail) of a rewritten weight GEMM."""
        mode = self.mode
        launches = max(k.count, 1) * self.per_launch_s(k)
        r = self.roofline
        if not mode.on or mode.weights in ("fp8", "fp8-block"):
            p = base_price(self.base, dataclasses.replace(k, bytes=0.0))
            if p.source != "roofline" or not mode.on:
                return max(p.time_s - launches, 0.0), p.source, p.detail
            # no FP8 row: the roofline at the FP8 peak (the wrapped roofline may be BF16's)
            eff = r.efficiency(k.m, k.n, k.k)
            peak = float(self.device.peak_fp8_flops)
            return (k.flops / (peak * eff), "roofline",
                    f"roofline at the fp8 peak {peak / 1e12:g} TFLOP/s x {eff:.3g} ({p.detail})")
        if mode.weight_only:    # Marlin: FP16 math, rows padded to 16-row tiles
            peak = float(self.device.peak_bf16_flops)
            eff = r.mfu_large * fill(k.m, MARLIN_ROWS)
            # published: Marlin's INT4 figures up to 32 rows; INT8 weight-only and wider
            # batches have no published figure (the same formula, counted as roofline)
            published = mode.weights == "int4" and k.m <= MARLIN_PUBLISHED_ROWS
            return (k.flops / (peak * eff), "catalog" if published else "roofline",
                    f"marlin {mode.weights}xbf16 (IST-DASLab/marlin @2f6d7c10) "
                    f"{'published regime' if published else 'unpublished: roofline'}")
        peak = float(getattr(self.device, _PEAK[mode.math], 0.0) or 0.0)
        eff = r.efficiency(k.m, k.n, k.k)
        return (k.flops / (peak * eff), "roofline",
                f"roofline at the {mode.math} peak {peak / 1e12:g} TFLOP/s x {eff:.3g}")
