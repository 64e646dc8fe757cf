"""Quantised weight GEMMs: the ``compute.weights`` / ``compute.activations`` knobs.

A format stores each element in ``bits`` plus its share of the scale factors
(``scale_bits``: a scale's bits over the elements it covers):

| format | bits | scales | math | source |
|---|---|---|---|---|
| ``bf16`` | 16 | none | bf16 | (the unquantised default) |
| ``fp8`` | 8 | one FP32 per tensor (0) | fp8 | Transformer Engine's per-tensor ("delayed") scaling |
| ``fp8-block`` | 8 | FP32 per 128×128 weight block, per 1×128 activation tile | fp8 | DeepSeek-V3 report (arXiv:2412.19437) §3.3.2 |
| ``mxfp8`` | 8 | one E8M0 (8 bits) per 32 | fp8 | OCP Microscaling Formats (MX) v1.0 spec §5 (block 32, E8M0 scale) |
| ``nvfp4`` | 4 | one E4M3 (8 bits) per 16 | fp4 | NVIDIA Blackwell architecture technical brief, "NVFP4" (16-value micro-blocks, FP8 E4M3 scale) |
| ``int8`` | 8 | FP16 per group of 128 | bf16 (weight-only) or int8 | Marlin (IST-DASLab/marlin README @2f6d7c10: group size 128) |
| ``int4`` | 4 | FP16 per group of 128 (0.125 bits) | bf16 (weight-only) | Marlin README @2f6d7c10 ("the 0.125 bits storage overhead of the group scales") |

A mode is a (weights, activations) pair (:data:`MODES`); ``activations`` defaults to the
weights' natural partner (:data:`DEFAULT_ACTIVATIONS`): ``int4`` / ``int8`` weights with
BF16 activations are weight-only (Marlin-class kernels: the weights are dequantised in
registers and the math runs on the BF16/FP16 tensor cores). The quantised GEMMs are a
layer's forward weight GEMMs (``*_gemm`` kernels of forward passes: attention projections,
experts, shared and dense FFNs; the router and LM head stay in BF16 as an FP8 recipe keeps
them, :data:`moesim.compute.roofline.HIGH_PRECISION_KERNELS`). Backward passes are left as
the scenario's ``precision`` prices them.

How a quantised GEMM is priced (:class:`QuantModel`, wrapping the scenario's compute
model): its bytes with the weight and activation operands at the format's bits incl.
scales; its time the slower of those bytes at the device's streaming rate (the catalog's
stream table, else the roofline's) and its math:

- ``fp8`` / ``fp8-block``: the catalog's FP8 tables (DeepGEMM's published block-scaled
  rates, moesim/data/kernels/deepgemm.yaml); where no row covers the shape, the roofline
  at the FP8 peak (counted as roofline);
- ``int4`` / ``int8`` weight-only: Marlin's kernel (IST-DASLab/marlin
  ``marlin/marlin_cuda_kernel.cu`` @2f6d7c10: 16-row ``mma.m16n8k16`` FP16 tiles over the
  batch, ``thread_m_blocks`` 1-4) runs the math on the FP16 tensor cores with rows padded to
  16, at the roofline's large-GEMM efficiency; its README publishes "essentially ideal
  speedups" (3.87x at 4.125 bits) "up to batchsizes around 16-32" for INT4, so an INT4 GEMM
  of up to 32 rows counts as published (catalog); above it, and INT8 weight-only (no
  figure), the same formula counts as roofline;
- ``int8`` W8A8, ``mxfp8``, ``nvfp4``: the roofline at the format's peak
  (``DeviceSpec.peak_int8_ops``, ``peak_fp8_flops``, ``peak_fp4_flops``), counted as
  roofline: no per-shape table of these kernels is shipped;
- two kernel classes on the device their published benchmarks calibrate
  (:mod:`moesim.compute.quant_kernels`): ``nvfp4`` on B200 as CUTLASS's tile waves, and
  weight-only ``int4`` / ``int8`` on H100 with Marlin's cost per main-loop iteration.

A device without the format's math (``peak_fp4_flops == 0`` for NVFP4, no block-scaled
tensor cores for MXFP8, no FP8 for FP8) is a one-line :class:`InputError`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from moesim.compute.base import Kernel
from moesim.compute.roofline import HIGH_PRECISION_KERNELS
from moesim.errors import InputError

BF16_BYTES = 2
#: DeepSeek-V3 (arXiv:2412.19437 §3.3.2): one FP32 scale per 1×128 activation tile and per
#: 128×128 weight block; the recipe's FP8 kernels carry these bytes
#: (moesim.model.kernels.make FP8_ACT / FP8_WEIGHT)
FP8_BLOCK_ACT = 1 + 4 / 128
FP8_BLOCK_WEIGHT = 1 + 4 / 128 ** 2


@dataclass(frozen=True)
class Format:
    """A stored number format: ``bits`` per element, ``scale_bits`` per element for its
    weights and activations (a scale's bits over the elements it covers), the peak its
    math runs at (``math``: bf16 | fp8 | fp4 | int8) when both operands are in it."""

    name: str
    bits: float
    weight_scale_bits: float
    act_scale_bits: float
    math: str

    def weight_bytes(self) -> float:
        return (self.bits + self.weight_scale_bits) / 8

    def act_bytes(self) -> float:
        return (self.bits + self.act_scale_bits) / 8


FORMATS: dict[str, Format] = {
    "bf16": Format("bf16", 16, 0, 0, "bf16"),
    "fp8": Format("fp8", 8, 0, 0, "fp8"),
    "fp8-block": Format("fp8-block", 8, 32 / 128 ** 2, 32 / 128, "fp8"),
    "mxfp8": Format("mxfp8", 8, 8 / 32, 8 / 32, "fp8"),
    "nvfp4": Format("nvfp4", 4, 8 / 16, 8 / 16, "fp4"),
    "int8": Format("int8", 8, 16 / 128, 0, "int8"),
    "int4": Format("int4", 4, 16 / 128, 0, "int4"),
}
WEIGHTS = tuple(FORMATS)
#: the (weights, activations) pairs with a kernel; the first activation is the default
MODES: dict[str, tuple[str, ...]] = {
    "bf16": ("bf16",),
    "fp8": ("fp8",),
    "fp8-block": ("fp8-block",),
    "mxfp8": ("mxfp8",),
    "nvfp4": ("nvfp4",),
    "int8": ("bf16", "int8"),       # W8A16 (Marlin-class) or W8A8 (int8 tensor cores)
    "int4": ("bf16",),              # W4A16 (Marlin)
}
DEFAULT_ACTIVATIONS = {w: acts[0] for w, acts in MODES.items()}
ACTIVATIONS = tuple(dict.fromkeys(a for acts in MODES.values() for a in acts))
#: rows a Marlin tile covers (marlin_cuda_kernel.cu: mma.m16n8k16, 16 rows per m-block)
MARLIN_ROWS = 16
#: Marlin README @2f6d7c10: ideal speed-ups "up to batchsizes around 16-32"
MARLIN_PUBLISHED_ROWS = 32
#: MXFP8 needs Blackwell's block-scaled tensor cores (the B200/GB200 datasheets list
#: FP8/FP6 and FP4 with micro-scaling; Hopper's FP8 has per-tensor scales only): a device
#: with an FP4 peak is taken to have them
_MATH_PEAK = {"bf16": "peak_bf16_flops", "fp8": "peak_fp8_flops", "fp4": "peak_fp4_flops",
              "int8": "peak_int8_ops", "int4": "peak_bf16_flops"}


@dataclass(frozen=True)
class QuantMode:
    """The checked (weights, activations) of a ``compute`` section."""

    weights: str = "bf16"
    activations: str = "bf16"

    @property
    def on(self) -> bool:
        return self.weights != "bf16"

    @property
    def weight_only(self) -> bool:
        return self.weights in ("int4", "int8") and self.activations == "bf16"

    @property
    def math(self) -> str:
        """The tensor-core math the GEMM runs: bf16 for weight-only kernels."""
        return "bf16" if self.weight_only else FORMATS[self.weights].math

    def weight_bytes(self) -> float:
        return FORMATS[self.weights].weight_bytes()

    def act_bytes(self) -> float:
        return FORMATS[self.activations].act_bytes()


def mode_of(weights: Any, activations: Any, source: str) -> QuantMode:
    """The mode of ``compute.weights`` / ``compute.activations`` (None: not given)."""
    if weights is None and activations is not None:
        raise InputError(source, "compute.activations", "compute.weights set too (the "
                         "activations' format goes with a weight format)", activations)
    w = "bf16" if weights is None else weights
    if w not in FORMATS:
        raise InputError(source, "compute.weights", " or ".join(WEIGHTS), w)
    a = DEFAULT_ACTIVATIONS[w] if activations is None else activations
    if a not in MODES[w]:
        raise InputError(source, "compute.activations",
                         f"{' or '.join(MODES[w])} with weights {w}", a)
    return QuantMode(w, a)


def check_device(mode: QuantMode, device: Any, source: str) -> None:
    """One line, exit 2, when ``device`` cannot run ``mode``'s math."""
    if not mode.on:
        return
    name = getattr(device, "name", "?")
    peak = float(getattr(device, _MATH_PEAK[mode.math], 0.0) or 0.0)
    if mode.weights == "mxfp8" and float(getattr(device, "peak_fp4_flops", 0.0) or 0.0) <= 0:
        peak = 0.0
    if peak <= 0:
        raise InputError(source, "compute.weights", f"a format device {name} runs (it has no "
                         f"{mode.math if mode.weights != 'mxfp8' else 'block-scaled fp8'} "
                         "tensor-core peak)", mode.weights)


def is_weight_gemm(kernel: Kernel) -> bool:
    """A forward weight GEMM a quantised or sparse checkpoint changes."""
    if not kernel.name.endswith("_gemm") or kernel.k <= 0 or kernel.n <= 0:
        return False
    if kernel.pass_ not in ("", "fwd"):
        return False
    return kernel.name.rsplit(".", 1)[-1] not in HIGH_PRECISION_KERNELS


def operand_bytes(kernel: Kernel) -> tuple[float, float]:
    """(activation, weight) bytes per element the recipe gave ``kernel``."""
    if kernel.dtype == "fp8":
        return FP8_BLOCK_ACT, FP8_BLOCK_WEIGHT
    return float(BF16_BYTES), float(BF16_BYTES)


def weight_elements(kernel: Kernel) -> float:
    return float(kernel.k) * kernel.n * max(kernel.count, 1) * max(kernel.groups, 1)


def requantised(kernel: Kernel, act_bytes: float, weight_bytes: float) -> Kernel:
    """``kernel`` (as the recipe wrote it: BF16 or FP8 operands) with its activation
    input and weight at these bytes per element."""
    a0, w0 = operand_bytes(kernel)
    rows = float(kernel.m) * kernel.k * max(kernel.count, 1)
    nbytes = (kernel.bytes - (a0 - act_bytes) * rows
              - (w0 - weight_bytes) * weight_elements(kernel))
    return dataclasses.replace(kernel, bytes=max(nbytes, 0.0))


def fill(m: int, rows: int) -> float:
    """Share of a tile column of ``rows`` rows that ``m`` rows use."""
    if m <= 0:
        return 1.0
    return m / (rows * -(-m // rows))
