"""The forward kernels each recompute choice re-runs inside the backward
(moesim.program.recompute), worked out by hand on the toy model."""

from __future__ import annotations

import dataclasses

from moesim.model import PRESETS, costs
from moesim.program.recompute import expert_recompute, layer_recompute_kernels, recomputes

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
    assert flops(got) == 8 * T * H and sum(k.bytes for k in got) == 8 * T * H


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
    def price(n, make):
        return 1e-6 * n, flops(make())

    def fwd(n):
        return costs.expert_kernels(TOY, n, "fwd")
    # moe_act: only the SwiGLU of each expert, 5 FLOP per element of n x 1024
    t, f = expert_recompute(TOY, 0, frozenset({"moe_act"}), [100, 0, 28], price, fwd)
    assert f == 5 * 128 * 1024 and t == 128e-6
    _, f = expert_recompute(TOY, 0, frozenset({"moe"}), [100, 28], price, fwd)
    assert f == 128 * (3 * 2 * H * 1024 + 5 * 1024)
    assert expert_recompute(TOY, 0, frozenset({"core_attn"}), [100], price, fwd) == (0.0, 0.0)
