"""Rates of two quantised kernel classes from their published benchmarks, as mechanisms:
the CUTLASS NVFP4 GEMM on B200 (tile waves) and Marlin's weight-only GEMM on H100 (a
fixed cost per main-loop iteration in series with the weight stream). Each has one
calibration figure, named below; the checks are the other figures on
docs/results/quantisation.md (the split was written with the published tables in view,
as that page says). Each applies only to its kernel class on
its device (:data:`NVFP4_CUTLASS`, :data:`MARLIN_ITER`); elsewhere the quantised GEMM
keeps the pricing of :mod:`moesim.compute.quant_model`.

**NVFP4 on B200 (CUTLASS SM100 block-scaled GEMM).** vLLM's NVFP4 kernel
(vllm-project/vllm ``csrc/quantization/fp4/nvfp4_scaled_mm_kernels.cu`` as it stood
before PR #20646, the version that PR's "Before" table timed) runs ``MmaTileShape``
256×256×256 (a 2-SM MMA, ``PerSmTileShape_MNK`` 128×256×256) in a ``ClusterShape`` of
4×4 CTAs: a cluster of 16 SMs covers an output tile of 512×1024 and works through its
K loop at a sustained rate. With 148 SMs (CUDA's device query, pytorch/ao PR #4002)
floor(148/16) = 9 clusters are taken to run at once (how 16-SM clusters fit B200's GPCs
is not published), so a GEMM takes

    waves = ceil(ceil(m/512) · ceil(n/1024) · groups / 9)
    time  = max(waves · 2·512·1024·k / (16 · peak_fp4/148 · η), bytes / HBM rate)

η, the share of the FP4 peak a cluster sustains in its K loop, is the one calibrated
number: from PR #20646's "Before" table (bench_nvfp4_gemm.py, ``nvfp4-noquant``,
N = 6144, K = 4096) at its largest batch, 16384 rows at 3904.33 TFLOP/s (22 waves):
η = 0.460. The other rows of that table, its N = 4096 table, and FlashInfer issue #1732's
M = 1 GEMM are checks, not fitted. At few rows the wave count is 1 and the time is one
cluster's K loop: the published floor of ~11 µs at m = 1-512 that a bytes-only price
(2 µs) misses.

**Marlin weight-only on H100.** Marlin (IST-DASLab/marlin ``marlin/marlin_cuda_kernel.cu``
@2f6d7c10) gives each SM a stripe of 128×128 weight tiles (``thread_k = thread_n = 128``
for ≤16 rows; 64×256 above: the same tile area) in 64-row slices of the batch; one SM
runs ceil(tiles · slices / SMs) main-loop iterations, each with its barrier and
pipeline wait. Marlin is an Ampere kernel (``cp.async`` and ``mma.sync``, no Hopper TMA);
on H100 its time is taken as

    time = max(math, bytes / HBM rate + iterations · c)

with c the per-iteration cost in series with the stream, calibrated on one figure:
Marlin W4A16 at m = 1, N = K = 8192 on an H100, 4.98 TFLOP/s (inclusionAI/humming PR #2,
"Kernel Benchmarks", channelwise): c = 0.450 µs. Checked on Marlin W8A16 of the same
table (twice the bytes per iteration), which the calibration did not see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from moesim.compute.base import Kernel

US = 1e-6


@dataclass(frozen=True)
class Nvfp4Cutlass:
    """CUTLASS SM100 NVFP4 GEMM on one device: SMs, the cluster's SMs and output tile,
    and the calibration figure (m, n, k, seconds) that gives η."""

    sms: int
    cluster_sms: int
    tile_m: int
    tile_n: int
    calibration: tuple[int, int, int, float]
    source: str

    @property
    def clusters(self) -> int:
        return self.sms // self.cluster_sms

    def waves(self, m: int, n: int, groups: int = 1) -> int:
        tiles = math.ceil(m / self.tile_m) * math.ceil(n / self.tile_n) * max(groups, 1)
        return math.ceil(tiles / self.clusters)

    def wave_s_at_peak(self, k: int, peak_fp4: float) -> float:
        """One cluster's K loop at the datasheet FP4 peak."""
        return 2.0 * self.tile_m * self.tile_n * k / (self.cluster_sms * peak_fp4 / self.sms)

    def eta(self, peak_fp4: float) -> float:
        """Share of the FP4 peak sustained, from the calibration figure alone."""
        m, n, k, t = self.calibration
        return self.waves(m, n) * self.wave_s_at_peak(k, peak_fp4) / t

    def math_s(self, m: int, n: int, k: int, groups: int, peak_fp4: float) -> float:
        return (self.waves(m, n, groups) * self.wave_s_at_peak(k, peak_fp4)
                / self.eta(peak_fp4))


#: vLLM PR #20646 (2025-07-08), "Before", N=6144 K=4096, batch 16384: 3904.33 TFLOP/s
_VLLM_20646_16384 = (16384, 6144, 4096, 2 * 16384 * 6144 * 4096 / 3904.33e12)
NVFP4_CUTLASS: dict[str, Nvfp4Cutlass] = {
    "B200": Nvfp4Cutlass(148, 16, 512, 1024, _VLLM_20646_16384,
                         "CUTLASS NVFP4 tile waves (vLLM nvfp4_scaled_mm_kernels.cu; "
                         "eta from vLLM PR #20646)"),
}


@dataclass(frozen=True)
class MarlinIter:
    """Marlin's per-iteration cost on one device, from one calibration figure
    (m, n, k, weight bits incl. scales, seconds)."""

    tile: int
    slice_rows: int
    calibration: tuple[int, int, int, float, float]
    source: str

    def iterations(self, m: int, n: int, k: int, groups: int, sms: int) -> int:
        tiles = math.ceil(k / self.tile) * math.ceil(n / self.tile) * max(groups, 1)
        return math.ceil(tiles * math.ceil(max(m, 1) / self.slice_rows) / sms)

    def per_iteration_s(self, hbm_Bps: float, sms: int) -> float:
        m, n, k, bits, t = self.calibration
        nbytes = 2 * m * k + bits / 8 * k * n + 2 * m * n
        return (t - nbytes / hbm_Bps) / self.iterations(m, n, k, 1, sms)


#: inclusionAI/humming PR #2 (mgoin, 2026-03-24): H100, N = K = 8192, channelwise,
#: marlin-w4a16 at m = 1: 4.98 TFLOP/s (4-bit weights; one FP16 scale per column)
_HUMMING_2_W4 = (1, 8192, 8192, 4 + 16 / 8192, 2 * 8192 * 8192 / 4.98e12)
MARLIN_ITER: dict[str, MarlinIter] = {
    "H100": MarlinIter(128, 64, _HUMMING_2_W4,
                       "Marlin per-iteration cost (IST-DASLab/marlin @2f6d7c10; "
                       "c from humming PR #2 W4A16)"),
}


def nvfp4_s(device: Any, k: Kernel, hbm_Bps: float) -> tuple[float, str] | None:
    """(seconds without launches, detail) of an NVFP4 weight GEMM on a device with a
    CUTLASS NVFP4 model, else None."""
    fit = NVFP4_CUTLASS.get(getattr(device, "name", ""))
    if fit is None or k.m <= 0:
        return None
    peak = float(device.peak_fp4_flops)
    math_s = fit.math_s(k.m, k.n, k.k, k.groups, peak) * max(k.count, 1)
    mem_s = k.bytes / hbm_Bps
    waves = fit.waves(k.m, k.n, k.groups)
    return max(math_s, mem_s), (f"{fit.source}: {waves} wave(s) at eta "
                                f"{fit.eta(peak):.3f} of {peak / 1e15:g} PFLOP/s")


def marlin_s(device: Any, k: Kernel, hbm_Bps: float,
             math_s: float) -> tuple[float, str] | None:
    """(seconds without launches, detail) of a Marlin weight-only GEMM on a device with
    a per-iteration cost, else None."""
    name = getattr(device, "name", "")
    fit = MARLIN_ITER.get(name)
    sms = int(getattr(device, "sms", 0) or 0)
    if fit is None or sms <= 0:
        return None
    c = fit.per_iteration_s(hbm_Bps, sms)
    iters = fit.iterations(k.m, k.n, k.k, k.groups, sms) * max(k.count, 1)
    stream = k.bytes / hbm_Bps + iters * c
    return max(math_s, stream), (f"{fit.source}: {iters} iterations x "
                                 f"{c / US:.3f} us + bytes")
