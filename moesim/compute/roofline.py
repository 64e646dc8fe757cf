"""Roofline compute model with small-GEMM efficiency.

time = count · launch_overhead + max(flops / (peak · eff(m, n, k)),
                                     bytes / (hbm_Bps · hbm_efficiency))

eff(m, n, k) = max(min_efficiency, mfu_large · d / (d + half_efficiency_tokens)), with
d the smallest non-zero GEMM dimension (for an expert GEMM: its tokens). Kernels that
are not GEMMs (m = n = k = 0) run their FLOPs at ``mfu_large``. Since flops ∝ m and
eff is non-decreasing in m, time never decreases when tokens grow. ``peak`` is the
precision's dense peak; with ``precision: fp8`` the kernels an FP8 recipe keeps in BF16
(core attention, router, LM head: :data:`HIGH_PRECISION_KERNELS`) use the bf16 peak.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moesim.compute.base import ComputeModel, Kernel, per_launch_s
from moesim.compute.devices import DeviceSpec
from moesim.errors import InputError
from moesim.units import US

# Defaults (chosen, then meant to be replaced by `moesim calibrate`):
# Published whole training runs reach 40-55 % of bf16 peak (Megatron-LM SC'21 52 %,
# PaLM Table 3 46.2 %, Llama 3 Table 4 38-43 %; docs/sources.md) and single
# large GEMMs well above that; we take 0.75 of peak for a large bf16 GEMM. Checked
# afterwards, not fitted (benchmarks/gemm_published.py): Transformer Engine's GEMM-profiling
# guide (NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst,
# 1609c890e) measures cuBLAS BF16 GEMMs with every dim >= 4096 at 71.2-72.6 % of an H200
# NVL's peak, where this curve gives 0.727; stas00/ml-engineering's MAMF table (b9e29720)
# finds cuBLAS's best BF16 shapes, one dim 1024-2048, at 80-87 % of peak on H100 and A100,
# where it gives 0.67-0.71.
MFU_LARGE = 0.75
# Floor for the tiniest GEMMs (a cold expert with a handful of tokens): 2 % of peak.
MIN_EFFICIENCY = 0.02
# Tokens at which a GEMM reaches half of MFU_LARGE. Tensor-core tiles are 64-128 rows, so
# an expert GEMM with fewer rows wastes most of a tile (small expert GEMMs run
# far below large ones); 128 is our assumption.
HALF_EFFICIENCY_TOKENS = 128
# Fraction of peak HBM bandwidth a streaming kernel achieves; 0.8 is our assumption
# (typical of STREAM-like copies on HBM3), to be calibrated.
HBM_EFFICIENCY = 0.8

PRECISIONS = ("bf16", "fp8")
#: Kernels that stay in BF16 when the GEMMs run in FP8 (``precision: fp8``): DeepSeek-V3
#: technical report (arXiv:2412.19437) §3.3.1 keeps "the embedding module, the output
#: head, MoE gating modules, normalization operators, and attention operators" in their
#: original precision (BF16 or FP32); its inference system (deepseek-ai/open-infra-index,
#: "Day 6: DeepSeek-V3/R1 Inference System Overview") likewise runs "core MLA
#: computations" in BF16. Here: core attention (training and serving), the router GEMM
#: and the LM head; the attention projections are Linear layers, FP8. Embedding and
#: norms are memory-bound kernels, which no FLOP peak prices.
HIGH_PRECISION_KERNELS = frozenset({"attention", "attention_decode", "router", "lm_head"})


class RooflineModel:
    """A :class:`ComputeModel` from a device's peaks and a small-GEMM efficiency curve."""

    def __init__(self, device: DeviceSpec, *, mfu_large: float = MFU_LARGE,
                 min_efficiency: float = MIN_EFFICIENCY,
                 half_efficiency_tokens: float = HALF_EFFICIENCY_TOKENS,
                 hbm_efficiency: float = HBM_EFFICIENCY,
                 launch_overhead_s: float | None = None, precision: str = "bf16") -> None:
        if not 0 < mfu_large <= 1 or not 0 < min_efficiency <= mfu_large:
            raise ValueError("need 0 < min_efficiency <= mfu_large <= 1")
        if not 0 < hbm_efficiency <= 1 or half_efficiency_tokens < 0:
            raise ValueError("need 0 < hbm_efficiency <= 1 and half_efficiency_tokens >= 0")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        peak = device.peak_fp8_flops if precision == "fp8" else device.peak_bf16_flops
        if peak <= 0:
            raise ValueError(f"device {device.name} has no {precision} peak")
        self.device = device
        self.precision = precision
        self.peak_flops = float(peak)                      # FLOP/s
        #: FLOP/s of the kernels an FP8 recipe keeps in BF16 (HIGH_PRECISION_KERNELS)
        self.high_precision_flops = float(device.peak_bf16_flops)
        self.mfu_large = float(mfu_large)
        self.min_efficiency = float(min_efficiency)
        self.half_efficiency_tokens = float(half_efficiency_tokens)
        self.hbm_Bps = device.hbm_Bps * float(hbm_efficiency)   # achieved bytes/s
        self.launch_overhead_s = float(
            device.launch_overhead_s if launch_overhead_s is None else launch_overhead_s)
        #: per launch of a kernel replayed from a CUDA graph (moesim.compute.devices)
        self.graph_kernel_s = float(getattr(device, "graph_kernel_s", 0.0) or 0.0)
        self.name = f"roofline({device.name},{precision})"

    def efficiency(self, m: int, n: int = 0, k: int = 0) -> float:
        """Fraction of peak FLOP/s for a GEMM of these dims (mfu_large if not a GEMM)."""
        dims = [d for d in (m, n, k) if d > 0]
        if not dims:
            return self.mfu_large
        d = float(min(dims))
        return max(self.min_efficiency, self.mfu_large * d / (d + self.half_efficiency_tokens))

    def time_s(self, kernel: Kernel) -> float:
        compute = 0.0
        if kernel.flops > 0:
            eff = self.efficiency(kernel.m, kernel.n, kernel.k)
            base = kernel.name
            for suffix in ("_bwd", "_dgrad", "_wgrad"):
                base = base.removesuffix(suffix)
            high = base in HIGH_PRECISION_KERNELS or kernel.dtype in ("bf16", "fp32")
            peak = self.high_precision_flops if high else self.peak_flops
            compute = kernel.flops / (peak * eff)
        memory = kernel.bytes / self.hbm_Bps if kernel.bytes > 0 else 0.0
        return kernel.count * self.per_launch_s(kernel) + max(compute, memory)

    def per_launch_s(self, kernel: Kernel) -> float:
        """Fixed seconds per launch (:func:`moesim.compute.base.per_launch_s`)."""
        return per_launch_s(kernel, self.launch_overhead_s, self.graph_kernel_s)


_ROOFLINE_KEYS = {
    "mfu_large": "a fraction in (0, 1]",
    "min_efficiency": "a fraction in (0, mfu_large]",
    "half_efficiency_tokens": "a number of tokens >= 0",
    "hbm_efficiency": "a fraction in (0, 1]",
    "launch_overhead_us": "microseconds >= 0",
    "precision": "bf16 or fp8",
}


def _number(d: dict, key: str, source: str, lo: float, hi: float, lo_open: bool) -> float:
    value = d[key]
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        raise InputError(source, f"compute.{key}", _ROOFLINE_KEYS[key], value)
    return float(value)


def compute_model_from_dict(d: Any, source: str, device: DeviceSpec) -> ComputeModel:
    """``{"kind": "roofline", ...params}`` (default) or ``{"kind": "calibration", "file": p}``.

    YAML edge units: ``launch_overhead_us`` in µs. A relative calibration path is taken
    relative to the directory of ``source``.
    """
    d = {} if d is None else d
    if not isinstance(d, dict):
        raise InputError(source, "compute", "a mapping with kind: roofline or calibration", d)
    kind = d.get("kind", "roofline")
    if kind == "calibration":
        extra = sorted(set(d) - {"kind", "file"})
        if extra:
            raise InputError(source, f"compute.{extra[0]}", "only kind and file for calibration",
                             extra[0])
        path = d.get("file")
        if not isinstance(path, str) or not path:
            raise InputError(source, "compute.file", "a path to a calibration file", path)
        p = Path(path)
        if not p.is_absolute() and Path(source).is_file():
            p = Path(source).parent / p
        from moesim.compute.calibrated import load_calibration
        return load_calibration(p)
    if kind != "roofline":
        raise InputError(source, "compute.kind", "roofline or calibration", kind)
    for key in d:
        if key != "kind" and key not in _ROOFLINE_KEYS:
            raise InputError(source, f"compute.{key}",
                             f"one of kind, {', '.join(_ROOFLINE_KEYS)}", key)
    kw: dict[str, Any] = {}
    if "mfu_large" in d:
        kw["mfu_large"] = _number(d, "mfu_large", source, 0, 1, True)
    if "min_efficiency" in d:
        kw["min_efficiency"] = _number(d, "min_efficiency", source, 0,
                                       kw.get("mfu_large", MFU_LARGE), True)
    elif "mfu_large" in kw:
        kw["min_efficiency"] = min(MIN_EFFICIENCY, kw["mfu_large"])
    if "half_efficiency_tokens" in d:
        kw["half_efficiency_tokens"] = _number(d, "half_efficiency_tokens", source, 0,
                                               float("inf"), False)
    if "hbm_efficiency" in d:
        kw["hbm_efficiency"] = _number(d, "hbm_efficiency", source, 0, 1, True)
    if "launch_overhead_us" in d:
        kw["launch_overhead_s"] = _number(d, "launch_overhead_us", source, 0,
                                          float("inf"), False) * US
    if "precision" in d:
        prec = d["precision"]
        if prec not in PRECISIONS:
            raise InputError(source, "compute.precision", _ROOFLINE_KEYS["precision"], prec)
        if prec == "fp8" and device.peak_fp8_flops <= 0:
            raise InputError(source, "compute.precision",
                             f"bf16 (device {device.name} has no fp8 peak)", prec)
        kw["precision"] = prec
    return RooflineModel(device, **kw)
