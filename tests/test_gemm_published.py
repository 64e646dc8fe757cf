"""Transformer Engine's published cuBLAS GEMM times (H200 NVL) against moesim's pricing
(issue 21): the device's peaks from its datasheet, the GEMMs' FLOPs and moesim's time for
them, worked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moesim.compute.devices import HOPPER_GRAPH_KERNEL_S, get_device
from moesim.compute.roofline import HALF_EFFICIENCY_TOKENS, MFU_LARGE
from moesim.errors import InputError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import gemm_published as gp  # noqa: E402


def test_h200_nvl_is_the_datasheets_nvl_column_halved_for_density():
    nvl, sxm = get_device("h200-nvl"), get_device("H200")
    assert nvl.name == "H200-NVL"
    assert nvl.peak_bf16_flops == 1671e12 / 2 and nvl.peak_fp8_flops == 3341e12 / 2
    # the same GH100 die and memory as the SXM part, at a lower power limit
    assert (nvl.hbm_bytes, nvl.hbm_Bps, nvl.sms) == (sxm.hbm_bytes, sxm.hbm_Bps, sxm.sms)
    assert nvl.graph_kernel_s == HOPPER_GRAPH_KERNEL_S
    assert nvl.peak_bf16_flops < sxm.peak_bf16_flops
    with pytest.raises(InputError):
        get_device("H200 NVL")


def test_each_pass_is_the_guides_6_39_tflop():
    # 2 * 15872 * 4096 * (12288 + 4096 + 16384) + 2 * 15872 * 16384 * 4096
    want = 2 * 15872 * 4096 * (12288 + 4096 + 16384 + 16384)
    for p in ("fwd", "dgrad", "wgrad"):
        assert gp.pass_flops(p) == want
    assert round(want / 1e12, 2) == 6.39


def test_moesim_time_is_the_roofline_worked_by_hand():
    rows = {(r["dtype"], r["pass"]): r for r in gp.rows()}
    d = 4096                                    # the smallest dim of every GEMM here
    eff = MFU_LARGE * d / (d + HALF_EFFICIENCY_TOKENS)
    flops = 2 * 15872 * 4096 * 49152
    # GPU time of back-to-back launches: no fixed cost per launch
    bf16 = flops / (835.5e12 * eff) * 1e3
    fp8 = flops / (1670.5e12 * eff) * 1e3
    assert rows["bf16", "fwd"]["moesim_ms"] == pytest.approx(bf16, rel=1e-12)
    assert rows["fp8", "wgrad"]["moesim_ms"] == pytest.approx(fp8, rel=1e-12)
    # no GEMM table covers the device: the catalog prices them by the roofline
    assert rows["bf16", "fwd"]["priced_by"] == rows["fp8", "wgrad"]["priced_by"] == "roofline"
    # the published side: 6.391e12 FLOP in 10.632 ms = 601.1 TFLOP/s
    assert rows["bf16", "fwd"]["published_tflops"] == pytest.approx(flops / 10.632e-3 / 1e12)
    r = rows["fp8", "dgrad"]
    assert r["error"] == pytest.approx((r["moesim_ms"] - 5.661) / 5.661)


def test_mamf_rows_price_the_published_shape_on_the_published_device():
    rows = {(r["device"], r["dtype"]): r for r in gp.mamf_rows()}
    r = rows["H100", "bf16"]
    # the roofline at M=N=2048, K=13312: 0.75 x 2048 / (2048 + 128) of 989 TFLOP/s
    want = 989.0 * MFU_LARGE * 2048 / (2048 + HALF_EFFICIENCY_TOKENS)
    assert r["moesim_tflops"] == pytest.approx(want, rel=1e-12)
    assert r["priced_by"] == "roofline" and r["published_tflops"] == 794.5
    a = rows["A100", "bf16"]
    assert a["moesim_tflops"] == pytest.approx(312.0 * MFU_LARGE * 1024 / 1152, rel=1e-12)
    assert a["error"] == pytest.approx((a["moesim_tflops"] - 271.2) / 271.2)
    assert rows["H100", "fp8"]["priced_by"] == "catalog"     # DeepGEMM's tables
