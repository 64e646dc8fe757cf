"""Calibration by shape on a GPU: a shape sweep recorded with CUDA activity is read by its
kernels' GPU time, and a GPU trace's calibration takes it (synthetic Kineto traces)."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.compute.base import Kernel
from moesim.compute.calibrated import load_calibration
from moesim.validation.calibration.shape_fit import gpu_samples, sweep_samples, sweep_table
from moesim.validation.gpu.trace import gpu_trace_from_doc
from tests.gpu_trace_gen import ELEMENTWISE, GEMM_BF16, NCCL_A2A, GpuTraceBuilder

H, F = 512, 1024
BF = ["c10::BFloat16"] * 2


def kernel_us(rows: int) -> float:
    """The synthetic GEMM's GPU time (µs): not linear in rows, so a line fit would miss it."""
    return 5.0 + 0.01 * rows + 20.0 * (rows >= 1000)


def sweep_trace(rows: list[int], repeats: int = 2) -> GpuTraceBuilder:
    """Per pass and row count R: a ``sweep/rows=R`` label, an aten::mm R×H·H×F whose CPU
    span (3 µs) says nothing of its GPU kernel (kernel_us(R)), an aten::mul launching one
    elementwise kernel (R·F·2 bytes in µs / 1000), and, outside every label, an extra GEMM
    and an NCCL kernel that must not count."""
    b = GpuTraceBuilder()
    t = 0.0
    for _ in range(repeats):
        for r in rows:
            g, e = kernel_us(r), r * F * 2 / 1000 / 1000
            b.annotation(f"sweep/rows={r}", t, 200)
            b.op("aten::mm", t + 1, 3, dims=[[r, H], [H, F]], types=BF)
            b.kernel(GEMM_BF16, 7, t + 10, g, launch=t + 2)
            b.op("aten::mul", t + 5, 3, dims=[[r, F], [r, F]], types=BF)
            b.kernel(ELEMENTWISE, 7, t + 10 + g, e, launch=t + 6)
            t += 300
    b.op("aten::mm", t, 3, dims=[[7, H], [H, F]], types=BF)          # outside the labels
    b.kernel(GEMM_BF16, 7, t + 10, 999.0, launch=t + 1)
    b.op("record_param_comms", t + 1100, 3)
    b.kernel(NCCL_A2A, 20, t + 1110, 50.0, launch=t + 1101)
    return b


ROWS = [1, 10, 100, 1000, 4000]


def test_gpu_sweep_samples_are_kernel_times(tmp_path):
    d = tmp_path / "sweep"
    d.mkdir()
    sweep_trace(ROWS).write(d / "shape_sweep.json")
    gemm, memory = sweep_samples(d)
    assert sorted(gemm) == sorted((r, H, F, kernel_us(r) * 1e-6) for r in ROWS for _ in (0, 1))
    assert all(name == "aten::mul" for name, _, _ in memory) and len(memory) == 2 * len(ROWS)
    tab = sweep_table([str(d)])
    fam = tab.gemm[("m", H, F)]
    assert fam.x == tuple(map(float, ROWS))
    assert fam.t_s == pytest.approx([kernel_us(r) * 1e-6 for r in ROWS])
    # between two points: the straight line in log-log
    assert tab.gemm_time(2000, H, F) == pytest.approx(
        (kernel_us(1000) * 1e-6) ** 0.5 * (kernel_us(4000) * 1e-6) ** 0.5, rel=1e-12)


def test_gpu_sweep_without_labels_is_one_line(tmp_path, capsys):
    b = GpuTraceBuilder()
    b.op("aten::mm", 0, 3, dims=[[4, H], [H, F]], types=BF)
    b.kernel(GEMM_BF16, 7, 10, 5.0, launch=1)
    d = tmp_path / "sweep"
    d.mkdir()
    b.write(d / "shape_sweep.json")
    trace = GpuTraceBuilder()
    trace.op("aten::mm", 0, 3, dims=[[100, H], [H, F]], types=BF)
    trace.kernel(GEMM_BF16, 7, 10, 5.0, launch=1)
    p = trace.write(tmp_path / "gpu.json")
    rc = main(["calibrate", str(p), "--device", "H800", "-o", str(tmp_path / "c.json"),
               "--shape-sweep", str(d)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "sweep/rows=R" in err[0]
    assert not (tmp_path / "c.json").exists()


def test_gpu_calibration_takes_the_sweep_scaled_to_the_trace(tmp_path, capsys):
    """The traced layer's GEMMs ran 1.5× the sweep's kernel times: the table is scaled
    by 1.5, and a shape inside the swept range is priced from it, not from the line fit."""
    d = tmp_path / "sweep"
    d.mkdir()
    sweep_trace(ROWS).write(d / "shape_sweep.json")
    b = GpuTraceBuilder()
    t = 0.0
    for r in (50, 100, 200, 100):
        b.op("aten::mm", t, 3, dims=[[r, H], [H, F]], types=BF)
        b.kernel(GEMM_BF16, 7, t + 10, 1.5 * kernel_us(r) if r != 50 else 1.5 * (
            kernel_us(10) ** 0.3 * kernel_us(100) ** 0.7), launch=t + 1)
        t += 100
    tr = gpu_trace_from_doc(b.doc(), "x")
    gemm, _ = gpu_samples(tr)
    assert sorted(x[0] for x in gemm) == [50, 100, 100, 200]
    p = b.write(tmp_path / "gpu.json")
    out = tmp_path / "c.json"
    assert main(["calibrate", str(p), "--device", "H800", "-o", str(out),
                 "--shape-sweep", str(d)]) == 0
    text = capsys.readouterr().out
    assert "shape sweep: 1 GEMM families (swept dim 1–4000)" in text and "×1.500" in text
    doc = json.loads(out.read_text())
    assert doc["shape_sweep"]["scales"]["gemm"] == pytest.approx(1.5)
    assert doc["shape_sweep"]["sources"] == [str(d)]
    model = load_calibration(out)
    k = Kernel("expert_gemm", 2.0 * 4000 * H * F, 0.0, m=4000, n=F, k=H)
    assert model.time_s(k) == pytest.approx(1.5 * kernel_us(4000) * 1e-6)
    # a GEMM outside the swept family keeps the line fit
    other = Kernel("expert_gemm", 2.0 * 100 * H * 64, 0.0, m=100, n=64, k=H)
    g = doc["gemm"]
    assert model.time_s(other) == pytest.approx(g["overhead_s"] + other.flops / g["flops_per_s"])


def test_record_gpu_sweep_needs_cuda(tmp_path, capsys):
    """--backend nccl: the sweep on the first GPU; on a machine without CUDA (or without
    torch) one line naming --backend, and nothing written."""
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        pytest.skip("a CUDA device is present: the refusal is for machines without one")
    out = tmp_path / "s"
    rc = main(["record", str(out), "--shape-sweep", "--backend", "nccl"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--backend" in err[0] and "CUDA" in err[0]
    assert not out.exists()
