"""GPU calibration on synthetic traces with known GEMM, attention, copy and NCCL rates."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.compute.base import Kernel
from moesim.compute.calibrated import load_calibration
from moesim.validation.calibration.gpu_calibrate import gpu_calibration
from moesim.validation.gpu.trace import gpu_trace_from_doc
from tests.gpu_trace_gen import (
    DEEPEP_DISPATCH,
    ELEMENTWISE,
    FLASH,
    GEMM_BF16,
    GEMM_FP8,
    NCCL_A2A,
    GpuTraceBuilder,
)

M, K = 1000, 500            # 2·M·K·n = 1e6·n FLOP


def synthetic() -> GpuTraceBuilder:
    """BF16 GEMMs: t = 2 µs + FLOPs / 1e14 FLOP/s (n = 100 j → j µs of FLOPs);
    FP8 GEMMs: t = 1 µs + FLOPs / 2e14; one GEMM op launching a GEMM and a split-K
    reduction (their sum is its time); attention: 4·b·h·s²·d / 5e14 + 0; memcpy:
    bytes / 2e12; NCCL all-to-all: 10 µs + bytes / 1e11."""
    b = GpuTraceBuilder()
    t = 0.0

    def op_kernel(name, kernel, dur, dims, types, extra=None):
        nonlocal t
        b.op(name, t, 8, dims=dims, types=types)
        b.kernel(kernel, 7, t + 10, dur, launch=t + 2)
        if extra is not None:
            b.kernel(extra[0], 7, t + 10 + dur, extra[1], launch=t + 4)
        t += 100

    bf = ["c10::BFloat16"] * 2
    for j in (1, 2, 3, 5):
        op_kernel("aten::mm", GEMM_BF16, 2 + j, [[M, K], [K, 100 * j]], bf)
    f8 = ["c10::Float8_e4m3fn"] * 2
    for j in (2, 4, 8):
        op_kernel("aten::mm", GEMM_FP8, 1 + j / 2, [[M, K], [K, 100 * j]], f8)
    # a bf16 GEMM whose time is split over the GEMM and a reduction kernel: 2 + 4 µs
    op_kernel("aten::mm", GEMM_BF16, 4, [[M, K], [K, 400]], bf,
              extra=("void splitKreduce_kernel<32, 16>(float*)", 2))
    # attention [b, h, s, d] = [1, 8, 1000, 125]: 4·8·1000²·125 = 4e9 FLOP → 8 µs
    q = [1, 8, 1000, 125]
    op_kernel("aten::_scaled_dot_product_flash_attention", FLASH, 8, [q, q, q], bf)
    q2 = [2, 8, 1000, 125]
    op_kernel("aten::_scaled_dot_product_flash_attention", FLASH, 16, [q2, q2, q2], bf)
    for nbytes in (4_000_000, 10_000_000):   # 2 and 5 µs at 2e12 B/s
        b.kernel("Memcpy DtoD (Device -> Device)", 7, t, nbytes / 2e6, cat="gpu_memcpy",
                 nbytes=nbytes)
        t += 100
    for nel in (1_000_000, 3_000_000):       # bf16: 2e6, 6e6 bytes → 10 + 20, 10 + 60 µs
        b._x("cpu_op", "record_param_comms", 100, 100, t, 8,
             {"Collective name": "all_to_allv", "In msg nelems": nel,
              "Out msg nelems": nel, "dtype": "BFloat16"})
        b.kernel(NCCL_A2A, 27, t + 10, 10 + nel * 2 / 1e5, launch=t + 2, grid=(16, 1, 1))
        t += 200
    b.kernel(DEEPEP_DISPATCH, 27, t, 50, grid=(20, 1, 1))
    b.kernel(ELEMENTWISE, 7, t + 100, 3)
    return b


def test_recovers_known_rates_exactly():
    doc = gpu_calibration(gpu_trace_from_doc(synthetic().doc(), "syn"), "H800")
    g = doc["gpu"]
    bf, f8 = g["gemm_by_dtype"]["bf16"], g["gemm_by_dtype"]["fp8"]
    assert bf["flops_per_s"] == pytest.approx(1e14, rel=1e-9)
    assert bf["overhead_s"] == pytest.approx(2e-6, rel=1e-9)
    assert bf["n_samples"] == 5 and bf["median_rel"] == pytest.approx(0, abs=1e-9)
    assert f8["flops_per_s"] == pytest.approx(2e14, rel=1e-9)
    assert f8["overhead_s"] == pytest.approx(1e-6, rel=1e-9)
    assert doc["gemm"]["dtype"] == "bf16" and doc["gemm"]["source"] == "trace"
    assert doc["gemm"]["flops_per_s"] == pytest.approx(1e14, rel=1e-9)
    assert g["attention"]["flops_per_s"] == pytest.approx(5e14, rel=1e-9)
    assert g["attention"]["overhead_s"] == pytest.approx(0, abs=1e-12)
    assert g["memory"]["bytes_per_s"] == pytest.approx(2e12, rel=1e-9)
    a2a = g["comm_bandwidth"]["nccl:SendRecv"]
    assert a2a["bandwidth_Bps"] == pytest.approx(1e11, rel=1e-9)
    assert a2a["overhead_s"] == pytest.approx(10e-6, rel=1e-9)
    assert doc["comm"]["bandwidth_Bps"] == pytest.approx(1e11, rel=1e-9)
    assert g["comm_kernels"]["dispatch"] == {"count": 1, "mean_s": pytest.approx(50e-6),
                                             "sms": 20}
    assert g["comm_kernels"]["nccl:SendRecv"]["sms"] == 16


def test_without_shapes_the_catalog_stands_in():
    b = GpuTraceBuilder()
    b.kernel(GEMM_BF16, 7, 0, 10)
    b.kernel(GEMM_BF16, 7, 15, 10)
    doc = gpu_calibration(gpu_trace_from_doc(b.doc(), "x"), "H800")
    assert doc["gemm"]["source"] == "catalog" and doc["gemm"]["flops_per_s"] == 989e12
    assert doc["memory"]["source"] == "catalog"
    assert "comm" not in doc and doc["gpu"]["kernel_gap"]["median_s"] == pytest.approx(5e-6)


def test_cli_calibrate_gpu_and_load(tmp_path, capsys):
    p = synthetic().write(tmp_path / "gpu.json")
    out = tmp_path / "h800.json"
    assert main(["calibrate", str(p), "--device", "H800", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "gemm bf16: 2.00 µs/op + FLOPs / 100.0 TFLOP/s" in text
    assert "gemm fp8: 1.00 µs/op + FLOPs / 200.0 TFLOP/s" in text
    model = load_calibration(out)
    assert model.device == "H800"
    # attention: 4e9 FLOP at 5e14 FLOP/s
    assert model.time_s(Kernel("attention", 4e9, 0.0)) == pytest.approx(8e-6)
    assert model.time_s(Kernel("expert_gemm", 1e8, 0.0, m=10)) == pytest.approx(3e-6)
    assert json.loads(out.read_text())["gpu"]["format"] == "moesim-gpu-calibration/1"


def test_cli_calibrate_errors_one_line(tmp_path, capsys):
    b = GpuTraceBuilder()
    b.op("aten::mm", 0, 10)
    cpu = b.write(tmp_path / "cpu.json")
    assert main(["calibrate", str(cpu), "--device", "H800", "-o",
                 str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "only CPU events" in err and str(cpu) in err
    p = synthetic().write(tmp_path / "gpu.json")
    assert main(["calibrate", str(p), "--device", "X9000", "-o",
                 str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device" in err


def test_zero_length_samples_are_no_fit():
    """A memset of 0 µs (as Kineto writes sub-µs ones) is no sample: the catalog stays."""
    b = GpuTraceBuilder()
    b.kernel("Memset (Device)", 7, 0, 0, cat="gpu_memset", nbytes=8)
    b.kernel(GEMM_BF16, 7, 10, 5)
    doc = gpu_calibration(gpu_trace_from_doc(b.doc(), "x"), "H800")
    assert doc["memory"]["source"] == "catalog"
    assert doc["memory"]["bytes_per_s"] == pytest.approx(3.35e12)


def test_calibration_without_comm_refused_where_comm_is_needed(tmp_path, capsys):
    """A GPU calibration with no NCCL byte counts has no comm section: loading works,
    a scenario's `topology: calibration` says why it cannot use it."""
    b = GpuTraceBuilder()
    b.kernel(GEMM_BF16, 7, 0, 10)
    p = b.write(tmp_path / "gpu.json")
    cal = tmp_path / "c.json"
    assert main(["calibrate", str(p), "--device", "H800", "-o", str(cal)]) == 0
    capsys.readouterr()
    assert load_calibration(cal).comm is None
    scn = tmp_path / "s.yaml"
    scn.write_text(
        "name: t\ncluster: {topology: calibration, nodes: 1, device: H800, "
        f"params: {{file: {cal}, ranks: 2}}}}\nmodel: {{preset: toy}}\n")
    rc = main(["run", str(scn), "-o", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "comm: expected an all-to-all fit" in err
