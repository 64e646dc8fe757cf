"""Device catalog and roofline compute model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moesim.compute import (
    DEVICES,
    Kernel,
    RooflineModel,
    compute_model_from_dict,
    get_device,
)
from moesim.errors import InputError
from moesim.model import PRESETS
from moesim.model.costs import expert_kernels, gemm

H100 = get_device("H100")


def test_catalog_figures():
    assert H100.peak_bf16_flops == 989e12 and H100.hbm_Bps == 3.35e12
    # device memory as nvidia-smi reports it, in MiB (devices.py cites each figure)
    assert H100.hbm_bytes == 81559 * 2**20 == 85_520_809_984
    assert get_device("h200").hbm_bytes == 143771 * 2**20
    assert get_device("A100").peak_fp8_flops == 0
    assert DEVICES["cpu"].calibrated_from


def test_unknown_device():
    with pytest.raises(InputError) as ei:
        get_device("TPUv9", "c.yaml")
    assert ei.value.field == "device" and "H100, H200, H200-NVL, H800, A100, H20, B200, GB200, cpu" in str(ei.value)


def test_huge_gemm_runs_at_mfu_large():
    rm = RooflineModel(H100, mfu_large=0.75, half_efficiency_tokens=128, launch_overhead_s=0)
    k = gemm("g", 1 << 20, 16384, 16384)
    t = rm.time_s(k)
    # smallest dim 16384: eff = 0.75 · 16384 / (16384 + 128), within 1 % of 0.75
    assert k.flops / t == pytest.approx(0.75 * 16384 / 16512 * 989e12)
    assert k.flops / t == pytest.approx(0.75 * 989e12, rel=0.01)


def test_efficiency_by_hand():
    rm = RooflineModel(H100, mfu_large=0.8, half_efficiency_tokens=100, min_efficiency=0.001)
    assert rm.efficiency(100, 4096, 4096) == pytest.approx(0.4)
    assert rm.efficiency(300, 4096, 4096) == pytest.approx(0.6)
    assert rm.efficiency(1, 4096, 4096) == pytest.approx(0.8 / 101)
    assert rm.efficiency(4096, 8, 4096) == pytest.approx(0.8 * 8 / 108)  # narrow router GEMM
    assert rm.efficiency(0) == 0.8
    tiny = RooflineModel(H100, min_efficiency=0.05, half_efficiency_tokens=128)
    assert tiny.efficiency(1, 4096, 4096) == 0.05


def test_tiny_gemm_is_memory_or_overhead_bound():
    rm = RooflineModel(H100, launch_overhead_s=4e-6, hbm_efficiency=0.8)
    k = gemm("g", 1, 4096, 4096)   # one token: reads a 32 MiB weight
    t = rm.time_s(k)
    assert t == pytest.approx(4e-6 + k.bytes / (0.8 * 3.35e12))
    assert k.flops / t < 0.01 * 989e12
    empty = Kernel("launch", 0.0, 0.0, count=3)
    assert rm.time_s(empty) == pytest.approx(12e-6)


def test_memory_bound_op():
    rm = RooflineModel(H100, launch_overhead_s=0, hbm_efficiency=0.5)
    assert rm.time_s(Kernel("norm", 1e3, 3.35e9)) == pytest.approx(2.0e-3)


@given(st.integers(0, 20000), st.integers(1, 5000))
def test_time_monotone_in_tokens(n, extra):
    rm = RooflineModel(H100)
    s = PRESETS["mixtral-8x7b"]

    def total(tokens):
        return sum(rm.time_s(k) for k in expert_kernels(s, tokens, "fwd"))

    assert total(n + extra) >= total(n)


def test_fp8_uses_fp8_peak():
    rm = RooflineModel(H100, precision="fp8", launch_overhead_s=0, half_efficiency_tokens=0)
    k = gemm("g", 1 << 16, 1 << 14, 1 << 14)
    assert k.flops / rm.time_s(k) == pytest.approx(0.75 * 1979e12)


def test_fp8_recipe_keeps_attention_router_and_head_in_bf16():
    """DeepSeek-V3 report §3.3.1: attention operators, gating and the output head stay in
    BF16 under FP8 training; the attention projections (Linear) are FP8 GEMMs."""
    from moesim.model.costs import attention_kernels
    fp8 = RooflineModel(H100, precision="fp8", launch_overhead_s=0, half_efficiency_tokens=0)
    bf16 = RooflineModel(H100, precision="bf16", launch_overhead_s=0, half_efficiency_tokens=0)
    big = 1 << 14
    for name in ("attention", "attention_decode", "router", "lm_head"):
        for k in (gemm(name, big, big, big), *gemm(name, big, big, big, "bwd")):
            assert k.flops / fp8.time_s(k) == pytest.approx(0.75 * 989e12)
            assert fp8.time_s(k) == bf16.time_s(k)
    for name in ("attention_gemm", "expert_gemm", "dense_gemm", "attentionx"):
        k = gemm(name, big, big, big)
        assert k.flops / fp8.time_s(k) == pytest.approx(0.75 * 1979e12)
    # a DeepSeek-V3 layer's forward: core attention at half the projections' rate
    ks = attention_kernels(PRESETS["deepseek-v3"], 4096, 4096)
    core = [k for k in ks if k.name == "attention"]
    assert len(core) == 1 and fp8.time_s(core[0]) == pytest.approx(
        max(core[0].flops / (0.75 * 989e12), core[0].bytes / fp8.hbm_Bps))


def test_compute_model_from_dict():
    rm = compute_model_from_dict({"kind": "roofline", "mfu_large": 0.6,
                                  "launch_overhead_us": 2.5}, "s.yaml", H100)
    assert rm.mfu_large == 0.6 and rm.launch_overhead_s == pytest.approx(2.5e-6)
    low = compute_model_from_dict({"mfu_large": 0.01}, "s.yaml", H100)
    assert low.min_efficiency == 0.01          # the default floor is capped at mfu_large
    default = compute_model_from_dict(None, "s.yaml", H100)
    assert default.launch_overhead_s == H100.launch_overhead_s


@pytest.mark.parametrize("d, field", [
    ({"kind": "magic"}, "compute.kind"),
    ({"mfu_large": 1.5}, "compute.mfu_large"),
    ({"mfu_large": "high"}, "compute.mfu_large"),
    ({"hbm_efficiency": 0}, "compute.hbm_efficiency"),
    ({"launch_overhead_us": -1}, "compute.launch_overhead_us"),
    ({"speed": 3}, "compute.speed"),
    ({"precision": "fp4"}, "compute.precision"),
    ({"kind": "calibration"}, "compute.file"),
    ("fast", "compute"),
])
def test_bad_compute_dict(d, field):
    with pytest.raises(InputError) as ei:
        compute_model_from_dict(d, "s.yaml", H100)
    assert ei.value.field == field and ei.value.source == "s.yaml"


def test_fp8_on_a100_rejected():
    with pytest.raises(InputError) as ei:
        compute_model_from_dict({"precision": "fp8"}, "s.yaml", get_device("A100"))
    assert ei.value.field == "compute.precision"


def test_calibration_kind_delegates_to_loader(monkeypatch, tmp_path):
    import sys
    import types

    seen = []
    fake = types.ModuleType("moesim.compute.calibrated")
    fake.load_calibration = lambda path: seen.append(path) or RooflineModel(H100)
    monkeypatch.setitem(sys.modules, "moesim.compute.calibrated", fake)
    scen = tmp_path / "scen.yaml"
    scen.write_text("x: 1\n")
    model = compute_model_from_dict({"kind": "calibration", "file": "cal.json"}, str(scen), H100)
    assert isinstance(model, RooflineModel)
    assert seen == [tmp_path / "cal.json"]   # relative to the scenario file
