"""One layer's kernel inventory (moesim.program.inventory) and ``moesim kernels``."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.program.inventory import balanced_rows, layer_ops
from moesim.scenario import load_scenario
from moesim.wiring import resolve


def _res(name: str, *sets: str):
    return resolve(load_scenario(name, list(sets)))


def _gemm_flops(ops) -> float:
    return sum(k.flops for o in ops for k in o.kernels if k.m and k.n and k.k)


def test_layer_gemm_flops_are_the_models_flops_per_token():
    res = _res("deepseek-v3-fb-pair")
    s, ep = res.model, res.scenario.parallel.ep
    t = res.scenario.schedule.seq_len                       # one sequence per micro-batch
    qk = s.qk_nope_dim + s.qk_rope_dim
    attn = (s.hidden * s.q_lora_rank + s.q_lora_rank * s.heads * qk
            + s.hidden * (s.kv_lora_rank + s.qk_rope_dim)
            + s.kv_lora_rank * s.heads * (s.qk_nope_dim + s.v_head_dim)
            + s.heads * s.v_head_dim * s.hidden)
    dense = attn + s.hidden * s.n_experts + 3 * s.hidden * s.shared_ffn * s.n_shared_experts
    routed = s.top_k * 3 * s.hidden * s.expert_ffn
    for p in ("fwd", "dgrad", "wgrad"):
        ops = layer_ops(res, 0, p)
        experts = [o for o in ops if o.op.endswith("experts")]
        rest = [o for o in ops if not o.op.endswith("experts") and o.op != "bwd.recompute"]
        # the rank's own tokens through attention, router and shared expert; balanced,
        # its local experts receive as many rows as its own tokens' top-k assignments
        # (the EP group's ep·t tokens' rows over ep ranks)
        assert _gemm_flops(rest) == 2 * t * dense, p
        assert _gemm_flops(experts) == 2 * t * routed, p
    local, rows = balanced_rows(res)
    assert local == 4 and rows == t * s.top_k * ep // s.n_experts == 8192


def test_passes_hold_their_kernels_only():
    res = _res("deepseek-v3-fb-pair")
    for p in ("fwd", "dgrad", "wgrad"):
        ks = [k for o in layer_ops(res, 0, p) for k in o.kernels if o.op != "bwd.recompute"]
        assert {k.pass_ for k in ks} == {p}
    # DeepSeek's recipe (the scenario's memory section): the RMSNorms and the MLA
    # up-projections' forward again before the backward
    (rc,) = [o for o in layer_ops(res, 0, "dgrad") if o.op == "bwd.recompute"]
    gemms = [k for k in rc.kernels if k.kind == "gemm"]
    s = res.model
    assert {(k.n, k.k) for k in gemms} == {
        (s.heads * (s.qk_nope_dim + s.qk_rope_dim), s.q_lora_rank),
        (s.heads * (s.qk_nope_dim + s.v_head_dim), s.kv_lora_rank)}
    assert all(k.pass_ == "fwd" for k in rc.kernels)
    assert not [o for o in layer_ops(_res("deepseek-v3-fb-pair", "memory.recompute=none"), 0,
                                     "dgrad") if o.op == "bwd.recompute"]
    names = {k.name for o in layer_ops(res, 0, "wgrad") for k in o.kernels}
    assert names == {"per_channel_cast_and_transpose", "attention_gemm_wgrad", "router_wgrad",
                     "shared_gemm_wgrad", "expert_gemm_wgrad"}
    with pytest.raises(ValueError):
        layer_ops(res, 0, "bwd")


def test_kernels_json(capsys):
    assert main(["kernels", "deepseek-v3-fb-pair", "--pass", "fwd", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["layer"] == 0 and doc["precision"] == "fp8" and doc["local_experts"] == 4
    rows = doc["kernels"]
    assert {r["pass"] for r in rows} == {"fwd"}
    attn = [r for r in rows if r["kind"] == "attn_fwd"]
    assert len(attn) == 1 and attn[0]["dtype"] == "bf16" and attn[0]["x"] == 1
    experts = [r for r in rows if r["op"] == "fwd.experts"]
    assert {r["x"] for r in experts} == {4}             # 4 local experts, identical shares
    assert all(r["time_s"] > 0 and r["priced_by"] for r in rows)
    casts = [r for r in rows if r["class"] == "cast"]
    assert casts and all(r["kind"] == "memory" for r in casts)
    # the SwiGLU with the FP8 cast fused in is a cast (DeepSeek's profile classes it so)
    assert all(r["flops"] == 0 for r in casts if not r["kernel"].endswith("_act"))


def test_kernels_text_and_bad_input(capsys):
    assert main(["kernels", "mixtral-8x7b-64gpu", "--layer", "3"]) == 0
    out = capsys.readouterr().out
    assert "pass fwd" in out and "pass dgrad" in out and "pass wgrad" in out
    assert "expert_gemm_wgrad" in out and "per_token_cast_to_fp8" not in out   # bf16
    assert main(["kernels", "mixtral-8x7b-64gpu", "--layer", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--layer" in err
    assert main(["kernels", "mixtral-8x7b-64gpu", "--pass", "bwd"]) == 2
    assert main(["kernels", "no-such-scenario"]) == 2
    capsys.readouterr()
    # a serving scenario: one line, never a training layer's kernels in its place
    assert main(["kernels", "deepseek-v3-decode"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "serve:" in err and "moesim serve" in err


def test_program_ops_carry_the_kernels_they_were_priced_from():
    from moesim.program.build import build_step
    res = _res("toy-cpu")
    plan = build_step(res)
    ops = [o for prog in plan.programs for o in prog if o.kind == "compute" and o.duration_s > 0]
    assert ops and all(o.kernels for o in ops if o.name != "opt.adam" or o.kernels)
    for o in ops:
        if o.kernels:
            assert sum(res.compute.time_s(k) for k in o.kernels) == pytest.approx(
                o.duration_s, rel=1e-12)
            assert sum(k.flops for k in o.kernels) == pytest.approx(o.flops, rel=1e-12)
    names = {o.name for o in ops if o.kernels}
    assert {"fwd.attn", "fwd.experts", "bwd.experts"} <= names


def test_run_summary_says_what_priced_the_kernels(capsys):
    from moesim.program.inventory import step_pricing
    res = _res("deepseek-v3-fb-pair")
    kp = step_pricing(res)
    # 8 MoE layers, one micro-batch: every pass's kernels, each layer counted
    n = sum(len(o.kernels) for p in ("fwd", "dgrad", "wgrad") for o in layer_ops(res, 0, p))
    assert kp["kernels"] == 8 * n
    assert 0 < kp["roofline_kernels"] < kp["kernels"]          # H800: the catalog prices most
    assert 0 < kp["roofline_fraction"] < 0.5
    roof = _res("deepseek-v3-fb-pair", "compute.model=roofline")
    assert step_pricing(roof)["roofline_fraction"] == 1.0
    toy = step_pricing(_res("toy-cpu"))              # a CPU: no catalog, all roofline
    assert main(["run", "toy-cpu", "--no-files"]) == 0
    out = capsys.readouterr().out
    assert (f"the roofline priced {toy['kernels']} of {toy['kernels']} kernels, 100.0% "
            "of compute time") in out
