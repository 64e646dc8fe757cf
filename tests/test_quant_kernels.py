"""The calibrated kernel models of moesim.compute.quant_kernels (issue 41, item 2): the
CUTLASS NVFP4 GEMM on B200 as tile waves, Marlin's weight-only GEMM on H100 with a cost
per main-loop iteration; each worked out by hand from its one calibration figure, and
each confined to its device."""

from __future__ import annotations

import pytest

from moesim.compute.base import Kernel
from moesim.compute.catalog import price
from moesim.compute.devices import get_device
from moesim.compute.quant_kernels import MARLIN_ITER, NVFP4_CUTLASS
from moesim.compute.select import compute_model

LAUNCH = 4e-6                                   # GPU_LAUNCH_OVERHEAD_S
#: vLLM PR #20646 "Before", N=6144 K=4096, batch 16384: 3904.33 TFLOP/s
T_NVFP4 = 2 * 16384 * 6144 * 4096 / 3904.33e12
#: humming PR #2, H100, Marlin W4A16 at m = 1, N = K = 8192: 4.98 TFLOP/s
T_MARLIN = 2 * 8192 * 8192 / 4.98e12


def _gemm(m: int, n: int, k: int) -> Kernel:
    return Kernel("dense_gemm", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m=m, n=n,
                  k=k, kind="gemm", pass_="fwd", kclass="gemm")


def test_nvfp4_waves_by_hand():
    fit = NVFP4_CUTLASS["B200"]
    assert fit.clusters == 9                      # floor(148 / 16)
    # 512x1024 cluster tiles: 32 x 6 = 192 over 9 clusters -> 22 waves
    assert fit.waves(16384, 6144) == 22
    assert fit.waves(1024, 6144) == 2             # 2 x 6 = 12 tiles
    assert fit.waves(512, 6144) == 1              # one wave up to 512 rows
    assert fit.waves(1, 8192, groups=2) == 2      # 8 tiles per group, 16 in all
    # eta: 22 waves of 2*512*1024*4096 / (16 * 9e15 / 148) in the calibration's time
    wave = 2 * 512 * 1024 * 4096 / (16 * 9e15 / 148)
    assert fit.eta(9e15) == pytest.approx(22 * wave / T_NVFP4, rel=1e-12)
    assert 0.45 < fit.eta(9e15) < 0.47


def test_nvfp4_b200_gemv_by_hand():
    b200 = get_device("B200")
    model = compute_model({"weights": "nvfp4"}, "s.yaml", b200)
    p = price(model, _gemm(1, 8192, 8192))
    # one wave of K = 8192, twice the calibration's K in 1/22 of its waves: T / 11
    math = T_NVFP4 / 11
    # bytes: the NVFP4 input row and weight (4.5 bits), the BF16 output row
    memory = (8192 * 0.5625 + 8192 * 8192 * 0.5625 + 2 * 8192) / (8e12 * 0.8)
    assert math > memory
    assert p.time_s == pytest.approx(LAUNCH + math, rel=1e-12)
    assert p.source == "catalog"
    # the calibration shape gives back its own figure
    assert price(model, _gemm(16384, 6144, 4096)).time_s == pytest.approx(
        LAUNCH + T_NVFP4, rel=1e-12)


def test_nvfp4_model_is_b200s_only():
    # GB200 (no NVFP4 kernel figure of its own) keeps the roofline
    gb200 = get_device("GB200")
    p = price(compute_model({"weights": "nvfp4"}, "s.yaml", gb200), _gemm(1, 8192, 8192))
    assert p.source == "roofline"


def test_marlin_h100_int8_by_hand():
    h100 = get_device("H100")
    hbm = 3.35e12 * 0.8                           # the roofline's achieved HBM rate
    # calibration: W4A16 channelwise (4 + 16/8192 bits) in 27.0 us; 64 x 64 = 4096 tiles of
    # 128 x 128 over 132 SMs -> 32 iterations
    cal_bytes = 2 * 8192 + (4 + 16 / 8192) / 8 * 8192 * 8192 + 2 * 8192
    c = (T_MARLIN - cal_bytes / hbm) / 32
    assert MARLIN_ITER["H100"].per_iteration_s(hbm, 132) == pytest.approx(c, rel=1e-12)
    assert 0.44e-6 < c < 0.46e-6
    model = compute_model({"weights": "int8"}, "s.yaml", h100)
    p = price(model, _gemm(1, 8192, 8192))
    # moesim's INT8 weight-only format: 8.125 bits; BF16 input and output rows
    nbytes = 2 * 8192 + 8192 * 8192 * 8.125 / 8 + 2 * 8192
    assert p.time_s == pytest.approx(LAUNCH + nbytes / hbm + 32 * c, rel=1e-12)
    assert p.source == "catalog"
    # 100 rows: two 64-row slices -> ceil(2 * 4096 / 132) = 63 iterations
    assert MARLIN_ITER["H100"].iterations(100, 8192, 8192, 1, 132) == 63


def test_marlin_model_is_h100s_only():
    # A100 keeps Marlin's formula without the per-iteration cost (bytes at its HBM rate)
    a100 = get_device("A100")
    p = price(compute_model({"weights": "int8"}, "s.yaml", a100), _gemm(1, 4096, 4096))
    nbytes = 2 * 4096 + 4096 * 4096 * 8.125 / 8 + 2 * 4096
    assert p.time_s == pytest.approx(LAUNCH + nbytes / (2.04e12 * 0.8), rel=1e-12)
    # and a 2:4-sparse checkpoint on H100 is not Marlin's dense kernel
    h100 = get_device("H100")
    sparse = compute_model({"weights": "int4", "sparsity": "2:4"}, "s.yaml", h100)
    assert "iterations" not in price(sparse, _gemm(1, 8192, 8192)).detail
