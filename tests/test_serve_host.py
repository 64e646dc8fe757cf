"""The serving engine's CPU time per step (moesim.serve.host, ``serve.host_overhead``):
in series it adds to the step, overlapped it costs only what outlasts the GPU; the step
says when it is host-bound and the CPU work is a ``host`` span on its own track."""

from __future__ import annotations

import pytest
import yaml

from moesim.serve import host
from moesim.serve.run import resolve_serve, simulate_serve
from moesim.serve.steps import ServeSteps
from moesim.trace.chrome import chrome_trace, load_chrome_trace_dict


def test_published_per_request_costs():
    # issue 10634: 5.5 ms at batch 256; PR 46112: 0.287 ms at 256 (0.142 ms at 128)
    assert host.SCHEDULE_PER_REQUEST_S * 256 == pytest.approx(5.5e-3, rel=1e-12)
    assert host.OUTPUT_PER_REQUEST_S * 256 == pytest.approx(0.287e-3, rel=1e-12)
    assert host.OUTPUT_PER_REQUEST_S * 128 == pytest.approx(0.142e-3, rel=0.011)


def test_in_series_and_overlapped_by_hand():
    # 10 requests, 0.1 ms scheduling and 0.05 ms output processing each: 1 ms + 0.5 ms
    kw = dict(schedule_per_request_s=1e-4, output_per_request_s=5e-5)
    v = host.host_step("vllm", 10, 2e-3, **kw)      # scheduling in series, outputs beside
    assert (v.schedule_s, v.output_s) == pytest.approx((1e-3, 5e-4))
    assert (v.serial_s, v.overlapped_s) == pytest.approx((1e-3, 5e-4))
    assert v.step_s == pytest.approx(3e-3) and v.exposed_s == pytest.approx(1e-3)
    assert not v.host_bound                         # 1.5 ms of CPU under 2 ms of GPU
    s = host.host_step("sglang", 10, 2e-3, **kw)    # all beside the GPU: hidden
    assert s.step_s == pytest.approx(2e-3) and s.exposed_s == 0.0
    s = host.host_step("sglang", 10, 1e-3, **kw)    # 1.5 ms of CPU over 1 ms of GPU
    assert s.step_s == pytest.approx(1.5e-3) and s.exposed_s == pytest.approx(5e-4)
    assert s.host_bound
    a = host.host_step("vllm-async", 10, 1e-3, **kw)
    assert a.step_s == s.step_s
    # vLLM: the API server's 0.5 ms of outputs outlast 0.1 ms of GPU + 1 ms of scheduling?
    # no: max(0.1 + 1.0, 0.5) = 1.1 ms
    v = host.host_step("vllm", 10, 1e-4, **kw)
    assert v.step_s == pytest.approx(1.1e-3) and v.host_bound
    assert host.host_step("none", 10, 1e-3) is None


def _toy(tmp_path) -> str:
    """8 GPUs of one DGX H100, EP8, a 2-layer MoE decoding 64 requests per GPU: a GPU
    step of well under a millisecond, against 64 x 22.6 µs of CPU per step."""
    data = {"name": "host-toy", "seed": 1,
            "cluster": {"topology": "dgx-h100", "nodes": 1},
            "model": {"layers": 2, "hidden": 512, "heads": 4, "kv_heads": 4, "head_dim": 128,
                      "vocab": 1024, "attention": "mha", "dense_ffn": 1024, "n_experts": 8,
                      "top_k": 2, "expert_ffn": 512, "first_dense_layers": 1},
            "routing": {"kind": "uniform"}, "compute": {"model": "roofline"},
            "serve": {"phase": "decode", "batch_per_gpu": 64, "context": 256, "ep": 8,
                      "ep_backend": "nccl"},
            "engine": {"mode": "fast"}}
    p = tmp_path / "host-toy.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_toy_step_is_host_bound_and_says_so(tmp_path, engine):
    res, cfg = resolve_serve(_toy(tmp_path))
    gpu = simulate_serve(res, cfg).summary["step_time_s"]
    out = simulate_serve(res, cfg, host_overhead=engine)
    s = out.summary
    sched, outp = 64 * host.SCHEDULE_PER_REQUEST_S, 64 * host.OUTPUT_PER_REQUEST_S
    assert gpu < sched + outp                      # the premise: a CPU-bound toy
    want = gpu + sched if engine == "vllm" else sched + outp
    assert s["step_time_s"] == pytest.approx(want, rel=1e-12)
    assert s["tpot_s"] == s["step_time_s"] == out.step_time_s
    assert s["host"]["host_bound"] is True
    assert s["host"]["exposed_s"] == pytest.approx(want - gpu, rel=1e-12)
    assert s["breakdown_s"]["host"] == s["host"]["exposed_s"]
    assert s["tokens_per_s"] == pytest.approx(8 * 64 / want)
    # the host track: one span per rank with spans, kept through Perfetto's format
    spans, _ = load_chrome_trace_dict(chrome_trace(out))
    hs = [sp for sp in spans if sp.kind == "host"]
    assert {sp.rank for sp in hs} == set(range(8)) and {sp.stream for sp in hs} == {"host"}
    if engine == "vllm":
        serial = [sp for sp in hs if sp.name == "host.serial"]
        assert serial[0].start_s == pytest.approx(gpu) and serial[0].end_s == pytest.approx(want)
    else:
        assert {sp.name for sp in hs} == {"host.overlapped"}
        assert max(sp.end_s for sp in hs) == pytest.approx(want)
    ev = chrome_trace(out)["traceEvents"]
    names = {e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    assert "rank 0 host" in names


def test_off_by_default_and_steps_agree(tmp_path):
    res, cfg = resolve_serve(_toy(tmp_path))
    off = simulate_serve(res, cfg)
    assert "host" not in off.summary and "host" not in off.summary["breakdown_s"]
    assert not [sp for sp in off.spans if sp.kind == "host"]
    on = simulate_serve(res, cfg, host_overhead="vllm")
    assert ServeSteps(res, cfg, host_overhead="vllm").step_s() == \
        on.summary["step_time_s"]
    assert ServeSteps(res, cfg).step_s() == off.summary["step_time_s"]


def test_summary_md_names_a_host_bound_step(tmp_path):
    from moesim.trace.report import full_summary, render_markdown
    res, cfg = resolve_serve(_toy(tmp_path))
    out = simulate_serve(res, cfg, host_overhead="sglang")
    md = render_markdown(full_summary(out))
    h = out.summary["host"]
    assert (f"| host CPU per step (sglang) | {h['host_s'] * 1e3:.3f} ms, "
            f"{h['exposed_s'] * 1e3:.3f} ms exposed; **host-bound** |") in md


def test_the_section_accepts_exactly_the_engines_priced(tmp_path):
    """``serve.host_overhead`` takes the names :data:`moesim.serve.host.ENGINES` prices,
    and nothing else (one line, the field named)."""
    from moesim.errors import InputError
    from moesim.scenario.sections.serve import HOST_OVERHEADS, serve_from_dict
    from moesim.serve import host

    assert tuple(host.ENGINES) == HOST_OVERHEADS
    cfg = serve_from_dict({"phase": "decode", "host_overhead": "sglang"}, "s.yaml")
    assert cfg.host_overhead == "sglang"
    assert serve_from_dict({"phase": "decode"}, "s.yaml").host_overhead == "none"
    with pytest.raises(InputError, match=r"serve\.host_overhead"):
        serve_from_dict({"phase": "decode", "host_overhead": "trt"}, "s.yaml")
