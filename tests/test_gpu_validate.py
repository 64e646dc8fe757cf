"""moesim validate on a GPU trace: per-layer GEMM/attention times of annotated DualPipe
phases against a compute model, on a synthetic trace with hand-computed FLOPs."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.model.spec import ModelSpec
from moesim.validation.gpu.summary import summarize
from moesim.validation.gpu.trace import gpu_trace_from_doc
from moesim.validation.gpu.validate import forward_fit, gpu_validate, text_table
from tests.gpu_trace_gen import DEEPEP_DISPATCH, FLASH, GEMM_BF16, GpuTraceBuilder

US = 1e-6
SPEC = ModelSpec(hidden=4, heads=2, kv_heads=2, head_dim=2, n_experts=4, top_k=2,
                 expert_ffn=8)


class PerFlop:
    """1 GFLOP/s, nothing else: time = FLOPs · 1e-9 s."""

    name = "per-flop"

    def time_s(self, k) -> float:
        return k.flops * 1e-9


def trace() -> GpuTraceBuilder:
    b = GpuTraceBuilder()
    t = 0
    for name, kernels in (("mlp(F)", [(GEMM_BF16, 4)]),
                          ("attn(B)", [(GEMM_BF16, 2), (FLASH, 1)]),
                          ("attn(W)", [(GEMM_BF16, 1.28)]),
                          ("dispatch(F)", [(DEEPEP_DISPATCH, 10)])):
        b.annotation(name, t, 10)
        for i, (kn, dur) in enumerate(kernels):
            b.kernel(kn, 27 if "ep::" in kn else 7, t + 20 + 10 * i, dur, launch=t + 1 + i)
        t += 100
    return b


def test_per_layer_phases_by_hand():
    """8 tokens, EP2 → 2 local experts × 8 rows; per expert 3 GEMMs of 2·8·8·4 = 512 FLOP
    → mlp 3072 FLOP; attention GEMMs: QKV 2·8·12·4 = 768, out 2·8·4·4 = 256, router
    2·8·4·4 = 256 → 1280 FLOP; causal core 0.5·2·8·8·2·4 = 512 FLOP, backward 2.5×."""
    g = summarize(gpu_trace_from_doc(trace().doc(), "x"))
    doc = gpu_validate(g, SPEC, PerFlop(), tokens=8, seq_len=8, ep=2)
    sim, meas, err = (doc[k]["phases"] for k in ("simulated", "measured", "error"))
    assert sim["mlp(F)"]["0"]["gemm_s"] == pytest.approx(3072e-9)
    assert meas["mlp(F)"]["0"]["gemm_s"] == pytest.approx(4 * US)
    assert err["mlp(F)"]["0"]["gemm_s"] == pytest.approx((3.072 - 4) / 4)
    assert sim["attn(B)"]["0"]["gemm_s"] == pytest.approx(1280e-9)
    assert sim["attn(B)"]["0"]["attention_s"] == pytest.approx(1280e-9)
    assert err["attn(B)"]["0"]["attention_s"] == pytest.approx(0.28)
    assert sim["attn(W)"]["0"] == {"gemm_s": pytest.approx(1280e-9), "attention_s": 0.0,
                                   "comm_s": None, "busy_s": None}
    assert err["attn(W)"]["0"]["gemm_s"] == pytest.approx(0, abs=1e-9)
    assert meas["dispatch(F)"]["0"]["comm_s"] == pytest.approx(10 * US)
    assert sim["dispatch(F)"]["0"]["comm_s"] is None
    assert doc["simulated"]["span_s"] is None and doc["measured"]["span_s"] > 0
    assert "measured only: not simulated" in doc["compared"]
    assert "mlp(F)" in text_table(doc)


def test_cli_validate_gpu(tmp_path, capsys):
    p = trace().write(tmp_path / "train.json")
    assert main(["validate", str(p), "--scenario", "scenarios/toy-cpu.yaml", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"measured", "simulated", "error", "compared"}
    assert doc["measured"]["trace_stream_busy_s"]["7"] > 0
    assert doc["simulated"]["span_s"] is None and "1f1b" in doc["compared"]
    assert doc["simulated"]["phases"]["mlp(F)"]["0"]["gemm_s"] > 0
    assert main(["validate", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--scenario" in err
    out = tmp_path / "v"
    assert main(["validate", str(p), "--scenario", "scenarios/toy-cpu.yaml", "-o",
                 str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert json.loads((out / "validation.json").read_text())["measured"]["span_s"] > 0
    assert main(["validate", str(p), "--scenario", "scenarios/toy-cpu.yaml", "-o",
                 str(out)]) == 2
    assert "--force" in capsys.readouterr().err


def test_cli_validate_cpu_trace_still_needs_calibration(tmp_path, capsys):
    b = GpuTraceBuilder()
    b.op("aten::mm", 0, 10)
    p = b.write(tmp_path / "cpu.json")
    assert main(["validate", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--calibration" in err


def test_forward_fit_predicts_backward_from_forward_rates(tmp_path, capsys):
    """attn(F): GEMMs 1280 FLOP in 2 µs → 6.4e8 FLOP/s; core 512 FLOP in 1 µs → 5.12e8.
    mlp(F) GEMMs 3072 FLOP in 4 µs: the GEMM rate over both is 4352 FLOP / 6 µs."""
    b = trace()
    b.annotation("attn(F)", 1000, 10)
    b.kernel(GEMM_BF16, 7, 1020, 2, launch=1001)
    b.kernel(FLASH, 7, 1030, 1, launch=1002)
    g = summarize(gpu_trace_from_doc(b.doc(), "x"))
    fit = forward_fit(g, SPEC, tokens=8, seq_len=8, ep=2)
    assert fit.gemm_flops_per_s == pytest.approx(4352 / 6e-6)
    assert fit.attention_flops_per_s == pytest.approx(512 / 1e-6)
    doc = gpu_validate(g, SPEC, fit, tokens=8, seq_len=8, ep=2)
    sim = doc["simulated"]["phases"]
    assert sim["attn(B)"]["0"]["attention_s"] == pytest.approx(1280 / 512e6)   # 2.5× fwd
    assert sim["attn(W)"]["0"]["gemm_s"] == pytest.approx(1280 / (4352 / 6e-6))
    by = doc["median_abs_error_by_pass"]
    assert set(by) == {"F", "B", "W"} and by["W"] == pytest.approx(abs(
        1280 / (4352 / 6e-6) / 1.28e-6 - 1))
    p = b.write(tmp_path / "t.json")
    assert main(["validate", str(p), "--scenario", "scenarios/toy-cpu.yaml",
                 "--fit-forward", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compute_model"] == "forward-fit" and out["forward_fit"]["gemm_flops_per_s"] > 0
    no_f = GpuTraceBuilder()
    no_f.annotation("mlp(B)", 0, 10)
    no_f.kernel(GEMM_BF16, 7, 20, 2, launch=1)
    q = no_f.write(tmp_path / "nof.json")
    assert main(["validate", str(q), "--scenario", "scenarios/toy-cpu.yaml",
                 "--fit-forward"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "attn(F)" in err
