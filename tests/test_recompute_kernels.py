"""The forward kernels each recompute choice re-runs inside the backward
(moesim.program.recompute), worked out by hand on the toy model."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.model import PRESETS, costs
from moesim.program.recipe import recompute_layer as layer_recompute_kernels
from moesim.program.recompute import expert_recompute, recomputes

TOY = PRESETS["toy"]            # h 512, 8 heads of 64, 8 experts top-2, f 1024, dense_ffn 2048
DENSE = dataclasses.replace(TOY, n_experts=0, top_k=0)
T, S, H = 256, 128, 512


def flops(ks):
    return sum(k.flops for k in ks)


def kernels(spec, mods, layer=0):
    return layer_recompute_kernels(spec, layer, frozenset(mods), tokens=T, seq_len=S, tp=1,
                                   ep_tokens=T, sent=2 * T)


def test_mlp_recompute_adds_the_mlps_forward_flops():
    got = kernels(DENSE, {"mlp"})
    # SwiGLU 2048 wide: 3 GEMMs of 2·T·h·f plus 5 FLOP per element of the activation
    assert flops(got) == 3 * 2 * T * H * 2048 + 5 * T * 2048
    assert flops(got) == flops(costs.dense_ffn_kernels(DENSE, T, 1, "fwd"))
    assert all(k.name.startswith("recompute.") for k in got)


def test_core_attention_recompute_is_the_core_kernel():
    got = kernels(TOY, {"core_attn"})
    # causal half of 2·T·s·a·(d_qk + d_v) = 0.5 · 2 · 256 · 128 · 8 · 128
    assert [k.name for k in got] == ["recompute.attention"]
    assert flops(got) == 0.5 * 2 * T * S * 8 * 128


def test_layernorm_recompute_is_the_two_norms():
    got = kernels(TOY, {"layernorm"})
    # two RMSNorms over T x h: 4 FLOP per element each; read x, write y (bf16) and an
    # fp32 1/rms per row
    assert [k.name for k in got] == ["recompute.norm", "recompute.norm"]
    assert flops(got) == 2 * 4 * T * H
    assert sum(k.bytes for k in got) == 2 * (2 * 2 * T * H + 4 * T)


def test_full_recompute_reruns_the_whole_layer_forward():
    dense_full = kernels(DENSE, {"full"})
    assert flops(dense_full) == flops(costs.norm_kernels(DENSE, T, 1, "fwd")
                                      + costs.attention_kernels(DENSE, T, S, 1, "fwd")
                                      + costs.dense_ffn_kernels(DENSE, T, 1, "fwd"))
    assert kernels(TOY, set()) == []


def test_which_layers_full_recompute_reruns():
    assert recomputes("full", None, "uniform", 2, 5) == {"full"}
    assert recomputes("full", None, "block", 2, 1) == {"full"}
    assert recomputes("full", None, "block", 2, 2) == frozenset()
    assert recomputes("selective", None, "uniform", 1, 0) == {"core_attn"}
    assert recomputes("none", None, "uniform", 1, 0) == frozenset()


def test_expert_recompute_by_hand():
    seen = []

    def price(n, make, later):
        seen.append((n, later))
        return 1e-6 * n, flops(make())

    def fwd(n):
        return costs.expert_kernels(TOY, n, "fwd")
    # moe_act: only the SwiGLU of each expert, 5 FLOP per element of n x 1024
    t, f = expert_recompute(TOY, 0, frozenset({"moe_act"}), [100, 0, 28], price, fwd)
    assert f == 5 * 128 * 1024 and t == 128e-6
    # the expert without tokens is not priced; the rank's later experts say so
    assert seen == [(100, False), (28, True)]
    _, f = expert_recompute(TOY, 0, frozenset({"moe"}), [100, 28], price, fwd)
    assert f == 128 * (3 * 2 * H * 1024 + 5 * 1024)
    assert expert_recompute(TOY, 0, frozenset({"core_attn"}), [100], price, fwd) == (0.0, 0.0)


def _plan(*sets):
    from moesim.program.build import build_step
    from moesim.scenario import load_scenario
    from moesim.wiring import resolve
    res = resolve(load_scenario("toy-cpu", ["model.n_experts=0", "model.top_k=0",
                                            "parallel.ep=1", *sets]))
    return res, build_step(res)


def test_mlp_recompute_in_the_step_program():
    # a dense toy: every layer's backward starts with the MLP's forward kernels again
    res, p = _plan("memory.recompute=selective", "memory.recompute_modules=[mlp]")
    _, p0 = _plan()
    T = res.scenario.schedule.tokens_per_microbatch
    rc = [op for op in p.programs[0] if op.name == "bwd.recompute"]
    m, layers = res.scenario.schedule.microbatches, 2
    assert len(rc) == m * layers
    assert all(op.phase == "bwd" and op.flops == flops(costs.dense_ffn_kernels(DENSE, T, 1,
                                                                               "fwd"))
               for op in rc)
    assert p.model_flops == p0.model_flops          # MFU counts model FLOPs, not recompute
    assert not any(op.name == "bwd.recompute" for op in p0.programs[0])


def test_recompute_time_on_both_engines():
    from moesim.wiring import simulate
    steps = {}
    for mode in ("exact", "fast"):
        for r in ("none", "full"):
            sets = ["model.n_experts=0", "model.top_k=0", "parallel.ep=1",
                    f"engine.mode={mode}", f"memory.recompute={r}"]
            steps[mode, r] = simulate("toy-cpu", sets, record_series=False) \
                .summary["step_time_s"]
    res, p = _plan("memory.recompute=full")
    extra = sum(op.duration_s for op in p.programs[0] if op.name == "bwd.recompute")
    assert extra > 0
    for mode in ("exact", "fast"):
        assert steps[mode, "full"] - steps[mode, "none"] == pytest.approx(extra, rel=1e-6)


def test_mla_up_proj_recompute_by_hand():
    ds = PRESETS["deepseek-v3"]       # q latent 1536, kv latent 512, 128 heads
    got = layer_recompute_kernels(ds, 5, frozenset({"mla_up_proj"}), tokens=T, seq_len=S,
                                  tp=1, ep_tokens=T, sent=8 * T)
    gemms = [k for k in got if k.name == "recompute.attention_gemm"]
    # W_UQ: 1536 -> 128 x (128 + 64); W_UKV: 512 -> 128 x (128 + 128)
    assert sum(k.flops for k in gemms) == 2 * T * 1536 * 128 * 192 + 2 * T * 512 * 128 * 256
    assert any(k.name == "recompute.rotary_kernel" for k in got)
