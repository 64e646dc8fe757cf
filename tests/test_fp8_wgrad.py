"""``compute.fp8_wgrad``: an FP8 dense weight-gradient GEMM at DeepGEMM's wgrad rate
(default) or, as cuBLAS runs Transformer Engine's per-tensor FP8 GEMMs (its GEMM-profiling
guide: a layer's Wgrad sum equals its Fprop sum), at its forward twin's rate. Worked by
hand on rows of moesim/data/kernels/deepgemm.yaml: m = n = 4096, k = 7168 is an exact row
of both the normal table (1410 TFLOP/s) and the wgrad table (942 TFLOP/s)."""

from __future__ import annotations

import pytest

from moesim.compute.devices import get_device
from moesim.compute.select import compute_model, parse
from moesim.errors import InputError
from moesim.model.kernels.make import gemm_pass

FLOPS = 2 * 4096 * 4096 * 7168
LAUNCH_S = 4e-6          # the H100 roofline's launch overhead, added once per kernel


def model(**over):
    return compute_model({"kind": "catalog", "precision": "fp8", **over}, "<test>",
                         get_device("H100"))


def gemm(pass_):
    return gemm_pass("dense_gemm", 4096, 4096, 7168, pass_, fp8=True)


def test_default_prices_wgrad_at_deepgemms_wgrad_row():
    m = model()
    assert m.name == "catalog(H100,fp8,memory=fused)"
    assert m.price(gemm("wgrad")).time_s == pytest.approx(FLOPS / 942e12 + LAUNCH_S)
    assert m.price(gemm("fwd")).time_s == pytest.approx(FLOPS / 1410e12 + LAUNCH_S)


def test_cublas_prices_wgrad_at_its_forward_twin():
    m = model(fp8_wgrad="cublas")
    assert m.name == "catalog(H100,fp8,memory=fused,wgrad=cublas)"
    w, f = m.price(gemm("wgrad")), m.price(gemm("fwd"))
    assert w.time_s == f.time_s == pytest.approx(FLOPS / 1410e12 + LAUNCH_S)
    assert "forward twin" in w.detail
    # the forward and dgrad passes keep their prices
    assert m.price(gemm("dgrad")).time_s == model().price(gemm("dgrad")).time_s


def test_cublas_leaves_bf16_and_expert_wgrads_alone():
    on, off = model(fp8_wgrad="cublas"), model()
    bf16 = gemm_pass("dense_gemm", 4096, 4096, 7168, "wgrad", dtype="bf16")
    assert on.price(bf16).time_s == off.price(bf16).time_s
    experts = gemm_pass("expert_gemm", 4096, 4096, 7168, "wgrad", fp8=True,
                        kind="kgrouped_gemm", groups=4)
    assert on.price(experts).time_s == off.price(experts).time_s


def test_bad_value_is_one_line():
    with pytest.raises(InputError, match=r"compute\.fp8_wgrad.*deepgemm or cublas"):
        parse({"fp8_wgrad": "cutlass"}, "s.yaml")
    assert parse({"fp8_wgrad": "cublas"}, "s.yaml").fp8_wgrad == "cublas"
