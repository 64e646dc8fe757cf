"""moesim validate on a GPU trace of a DualPipe F&B pair: the simulated pair's span,
stream busy time, exposed communication and per-layer dispatch/combine/busy times
(moesim.validation.gpu.pair), on a synthetic trace laid out as DeepSeek's profile
(attn/dispatch/mlp/combine per layer, compute on stream 7, DeepEP on stream 27)."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.schedule.dualpipe import make_dual_order
from moesim.trace.spans import Span
from moesim.validation.gpu.pair import fb_item, measured_streams, pair_figures, pair_spans
from moesim.validation.gpu.trace import gpu_trace_from_doc
from tests.gpu_trace_gen import (
    DEEPEP_COMBINE,
    DEEPEP_DISPATCH,
    FLASH,
    GEMM_BF16,
    GEMM_FP8,
    GpuTraceBuilder,
)

US = 1e-6
# (annotation, kernel, stream, GPU start µs in the block, duration µs); blocks 100 µs
F_BLOCK = [("attn(F)", GEMM_BF16, 7, 20, 10), ("attn(F)", FLASH, 7, 30, 5),
           ("dispatch(F)", DEEPEP_DISPATCH, 27, 30, 20), ("mlp(F)", GEMM_FP8, 7, 50, 10),
           ("combine(F)", DEEPEP_COMBINE, 27, 55, 25)]
B_BLOCK = [("combine(B)", DEEPEP_COMBINE, 27, 20, 15), ("mlp(B)", GEMM_FP8, 7, 20, 10),
           ("mlp(W)", GEMM_FP8, 7, 30, 10), ("dispatch(B)", DEEPEP_DISPATCH, 27, 40, 15),
           ("attn(B)", GEMM_BF16, 7, 45, 5), ("attn(B)", FLASH, 7, 50, 10),
           ("attn(W)", GEMM_BF16, 7, 60, 5)]
# Per F block: stream 7 busy 20-35, 50-60 = 25 µs; stream 27 30-50, 55-80 = 45 µs;
# overlap 30-35, 55-60 = 10 µs → exposed 35. Per B block: stream 7 20-40, 45-65 = 40;
# stream 27 20-35, 40-55 = 30; overlap 15 + 10 → exposed 5. Two layers of each.
COMPUTE_BUSY, COMM_BUSY, EXPOSED = 2 * (25 + 40) * US, 2 * (45 + 30) * US, 2 * (35 + 5) * US
SPAN = (300 + 65 - 20) * US

SCENARIO = """\
name: tiny-fb-pair
seed: 0
cluster: {topology: dgx-h800, nodes: 1, device: H800, network: flow}
model: {preset: toy, layers: 4}
routing: {kind: uniform, dispatch_dtype: fp8, combine_dtype: bf16}
parallel: {tp: 1, pp: 2, ep: 4, ep_backend: {kind: deepep, sms: 20}}
schedule: {kind: dualpipe, microbatches: 4, micro_batch_size: 1, seq_len: 64}
compute: {kind: roofline}
overlap: {kind: static, dp_overlap: false}
engine: {mode: exact}
"""


def deepseek_like() -> GpuTraceBuilder:
    b = GpuTraceBuilder()
    t = 0
    for block in (F_BLOCK, F_BLOCK, B_BLOCK, B_BLOCK):
        names = list(dict.fromkeys(p for p, *_ in block))
        for i, name in enumerate(names):
            b.annotation(name, t + 2 * i, 1.5)
        for name, kern, stream, start, dur in block:
            grid = (20, 1, 1) if stream == 27 else (132, 1, 1)
            b.kernel(kern, stream, t + start, dur, launch=t + 2 * names.index(name) + 0.1,
                     grid=grid)
        t += 100
    return b


def test_measured_streams_by_role():
    tr = gpu_trace_from_doc(deepseek_like().doc(), "x")
    m = measured_streams(tr)
    assert m["streams"] == {"compute": ["7"], "comm": ["27"]}
    assert m["stream_busy_s"]["compute"] == pytest.approx(COMPUTE_BUSY)
    assert m["stream_busy_s"]["comm"] == pytest.approx(COMM_BUSY)
    assert m["exposed_comm_s"] == pytest.approx(EXPOSED)


def _s(stream, kind, name, a, b, layer, mb, phase):
    return Span(0, stream, kind, name, a, b, layer=layer, microbatch=mb, phase=phase)


def test_pair_spans_and_figures_by_hand():
    """F&B of rank 0 in DualPipe P=2, N=4: forward of mb 3 (stage 1), backward of mb 0
    (stage 0). Other micro-batches, pipeline spans, bubbles and layer -1 are left out;
    the backward's layer k is its k-th in execution order (highest layer first)."""
    item = fb_item(make_dual_order("dualpipe", 2, 4), 0)
    assert (item.mb, item.stage, item.bmb, item.bstage) == (3, 1, 0, 0)
    spans = [
        _s("compute", "bubble", "bwd.recv", 0, 1, 1, 0, "bwd"),
        _s("pp", "pp", "fwd.send", 0, 1, 3, 3, "fwd"),
        _s("compute", "compute", "bwd.unpermute", 1, 2, 1, 0, "bwd"),
        _s("ep", "stall", "bwd.combine", 2, 3, 1, 0, "bwd"),
        _s("ep", "ep_combine", "bwd.combine", 3, 5, 1, 0, "bwd"),
        _s("compute", "compute", "fwd.attn", 2, 4, 2, 3, "fwd"),
        _s("compute", "compute", "bwd.experts", 5, 6, 1, 0, "bwd"),
        _s("ep", "ep_dispatch", "fwd.dispatch", 5, 8, 2, 3, "fwd"),
        _s("compute", "compute", "bwd.attn", 6, 7, 0, 0, "bwd"),
        _s("compute", "compute", "fwd.lm_head", 8, 9, -1, 3, "fwd"),
        _s("compute", "compute", "fwd.attn", 1, 9, 0, 1, "fwd"),     # another mb
    ]
    kept = pair_spans(spans, 0, item)
    assert [s.name for s in kept] == ["bwd.unpermute", "bwd.combine", "fwd.attn",
                                      "bwd.combine", "bwd.experts", "fwd.dispatch",
                                      "bwd.attn"]
    f = pair_figures(kept)
    assert f["span_s"] == 8 - 1
    assert f["stream_busy_s"] == {"compute": 5.0, "comm": 6.0}   # 1-4, 5-7; 2-8
    assert f["exposed_comm_s"] == 2.0                             # 4-5, 7-8
    ph = f["phases"]
    assert ph["mlp(B)"]["0"] == {"busy_s": 2.0, "comm_s": 0.0}    # layer 1 runs first
    assert ph["combine(B)"]["0"] == {"busy_s": 3.0, "comm_s": 3.0}
    assert ph["attn(B)"]["1"] == {"busy_s": 1.0, "comm_s": 0.0}
    assert ph["dispatch(F)"]["0"]["comm_s"] == 3.0
    assert pair_figures([])["span_s"] is None


def test_validate_json_fills_every_simulated_field(tmp_path, capsys):
    p = deepseek_like().write(tmp_path / "train.json")
    scn = tmp_path / "pair.yaml"
    scn.write_text(SCENARIO)
    assert main(["validate", str(p), "--scenario", str(scn), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    meas, sim, err = doc["measured"], doc["simulated"], doc["error"]
    assert meas["span_s"] == pytest.approx(SPAN)
    assert meas["stream_busy_s"] == {"compute": pytest.approx(COMPUTE_BUSY),
                                     "comm": pytest.approx(COMM_BUSY)}
    assert meas["exposed_comm_s"] == pytest.approx(EXPOSED)
    assert sim["pair"]["forward"] == {"microbatch": 3, "stage": 1}
    assert sim["span_s"] > 0 and sim["exposed_comm_s"] >= 0
    assert set(sim["stream_busy_s"]) == {"compute", "comm"}
    assert min(sim["stream_busy_s"].values()) > 0
    assert err["span_s"] == (sim["span_s"] - meas["span_s"]) / meas["span_s"]
    for r in ("compute", "comm"):
        assert err["stream_busy_s"][r] == ((sim["stream_busy_s"][r] - meas["stream_busy_s"][r])
                                           / meas["stream_busy_s"][r])
    assert err["exposed_comm_s"] == ((sim["exposed_comm_s"] - meas["exposed_comm_s"])
                                     / meas["exposed_comm_s"])
    phases = {p for p, *_ in F_BLOCK + B_BLOCK}
    assert set(meas["phases"]) == phases
    for ph in phases:
        assert set(meas["phases"][ph]) == {"0", "1"}
        for lay, m in meas["phases"][ph].items():
            s, e = sim["phases"][ph][lay], err["phases"][ph][lay]
            assert s["busy_s"] > 0
            assert e["busy_s"] == (s["busy_s"] - m["busy_s"]) / m["busy_s"]
            if ph.startswith(("dispatch", "combine")):
                assert s["comm_s"] > 0 and s["gemm_s"] is None
                assert e["comm_s"] == (s["comm_s"] - m["comm_s"]) / m["comm_s"]
            else:
                assert s["comm_s"] == 0.0 and s["gemm_s"] > 0
                assert e["gemm_s"] == (s["gemm_s"] - m["gemm_s"]) / m["gemm_s"]
    assert meas["phases"]["dispatch(F)"]["0"]["comm_s"] == pytest.approx(20 * US)
    assert meas["phases"]["attn(B)"]["1"]["busy_s"] == pytest.approx(15 * US)
    assert "F&B pair" in doc["compared"]
    assert all(v is not None for v in doc["median_abs_error_timeline_by_pass"].values())


def test_validate_text_and_forward_fit_fill_the_pair(tmp_path, capsys):
    p = deepseek_like().write(tmp_path / "train.json")
    scn = tmp_path / "pair.yaml"
    scn.write_text(SCENARIO)
    assert main(["validate", str(p), "--scenario", str(scn), "--fit-forward"]) == 0
    out = capsys.readouterr().out
    assert "compute streams busy" in out and "exposed comm" in out
    line = next(x for x in out.splitlines() if x.startswith("span"))
    assert line.split()[2] != "-"        # simulated span filled


def test_validate_pair_runs_on_a_gpu_calibration(tmp_path, capsys):
    """--calibration C: the pair is simulated on C (GPU calibration of the same trace,
    catalog rates where it measures nothing); every simulated field filled."""
    p = deepseek_like().write(tmp_path / "train.json")
    scn = tmp_path / "pair.yaml"
    scn.write_text(SCENARIO)
    c = tmp_path / "c.json"
    assert main(["calibrate", str(p), "--device", "H800", "-o", str(c)]) == 0
    capsys.readouterr()
    assert main(["validate", str(p), "--scenario", str(scn), "--calibration", str(c),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["compute_model"] == str(c)
    sim = doc["simulated"]
    assert sim["span_s"] > 0 and min(sim["stream_busy_s"].values()) > 0
    assert all(row["busy_s"] > 0 for ph in sim["phases"].values() for row in ph.values())


def test_fast_engine_scenario_leaves_the_pair_null(tmp_path, capsys):
    p = deepseek_like().write(tmp_path / "train.json")
    scn = tmp_path / "fast.yaml"
    scn.write_text(SCENARIO.replace("mode: exact", "mode: fast"))
    assert main(["validate", str(p), "--scenario", str(scn), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["simulated"]["span_s"] is None and doc["error"]["stream_busy_s"] is None
    assert "engine.mode: exact" in doc["compared"]
    assert doc["simulated"]["phases"]["mlp(F)"]["0"]["gemm_s"] > 0   # kernels still priced


def test_validate_pair_bad_input_one_line(tmp_path, capsys):
    p = deepseek_like().write(tmp_path / "train.json")
    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.replace("microbatches: 4", "microbatches: 3"))
    assert main(["validate", str(p), "--scenario", str(bad), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and "microbatches" in err
    cut = tmp_path / "cut.json"
    cut.write_text(p.read_text()[:200])
    scn = tmp_path / "pair.yaml"
    scn.write_text(SCENARIO)
    assert main(["validate", str(cut), "--scenario", str(scn), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cut.json" in err


def test_shipped_fb_pair_scenario_is_the_traced_configuration():
    """EP64 on 8 nodes, TP1, sequence 4096, DeepEP on 20 SMs, 2 DualPipe stages of 4
    MoE layers, one overlapped F&B pair per rank (forward stage 1, backward stage 0)."""
    from moesim.memory.model import split_layers
    from moesim.scenario import load_scenario
    from moesim.wiring import resolve

    res = resolve(load_scenario("scenarios/deepseek-v3-fb-pair.yaml"))
    scn, lay = res.scenario, res.layout
    assert (lay.world, lay.pp, lay.ep, lay.edp, scn.parallel.tp) == (128, 2, 64, 1, 1)
    ep0 = lay.group_of(0, "ep")
    assert sorted(ep0) == list(range(64)) and scn.gpus_per_node == 8   # nodes 0-7
    assert (scn.parallel.ep_backend.kind, scn.parallel.ep_backend.sms) == ("deepep", 20)
    assert (scn.schedule.kind, scn.schedule.seq_len, scn.schedule.micro_batch_size) == \
        ("dualpipe", 4096, 1)
    assert res.model.first_dense_layers == 0 and res.model.n_experts == 256
    assert [len(c) for c in split_layers(res.model.layers, 2)] == [4, 4]
    item = fb_item(make_dual_order("dualpipe", 2, scn.schedule.microbatches), 0)
    assert (item.stage, item.bstage) == (1, 0)
    assert scn.overlap.kind == "static" and scn.overlap.dp_overlap is False


def test_deepseek_profile_script_compares_with_the_simulated_pair(tmp_path, capsys):
    """benchmarks/deepseek_profile.py PATH --scenario S: the comparison table with the
    roofline and the forward fit side by side; errors (sim - meas) / meas."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "deepseek_profile.py"
    spec = importlib.util.spec_from_file_location("deepseek_profile", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    p = deepseek_like().write(tmp_path / "train.json")
    scn = tmp_path / "pair.yaml"
    scn.write_text(SCENARIO)
    assert bench.main([str(p), "--scenario", str(scn)]) == 0
    out = capsys.readouterr().out
    row = next(x for x in out.splitlines() if x.startswith("span (one F&B pair)"))
    meas, roof, roof_err, fit, fit_err = row.split()[4:9]
    assert float(meas) == pytest.approx(SPAN * 1e3)
    for sim, err in ((roof, roof_err), (fit, fit_err)):   # ms printed to 3 decimals
        assert abs(float(err.rstrip("%")) - 100 * (float(sim) / float(meas) - 1)) < 0.3
    assert "forward fit: fitted on attn(F)/mlp(F)" in out
    assert "dispatch(F) comm (mean/layer)" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.replace("kind: dualpipe", "kind: dualpipe9"))
    assert bench.main([str(p), "--scenario", str(bad)]) == 2
