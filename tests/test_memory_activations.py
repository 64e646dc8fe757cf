"""Activations tensor by tensor (moesim.memory.activations), and what each recompute
choice keeps, worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.errors import InputError
from moesim.memory.activations import attention_tensors
from moesim.memory.model import layer_activation_bytes, memory_per_rank
from moesim.model import PRESETS

TOY = PRESETS["toy"]            # 2 MoE layers, h 512, 8 heads of 64, 8 experts top-2, f 1024
H, F, E, A = 512, 1024, 8, 8
T, S = 256, 128


def layer(mode="selective", **kw):
    return layer_activation_bytes(TOY, 0, T, S, 1, mode, 2 * T, **kw)


def test_gqa_attention_counts_narrow_keys_and_values():
    mix = PRESETS["mixtral-8x7b"]             # h 4096, 32 query heads, 8 KV heads of 128
    t = attention_tensors(mix, 4096)
    assert t["qkv"] == 2 * (4096 + 1024 + 1024)
    assert t["proj_in"] == 2 * 4096 and t["core"] == 4 * 32
    assert attention_tensors(mix, 4096, "materialized")["core"] == 5 * 32 * 4096


def test_mla_attention_counts_latents_and_up_projected_heads():
    ds = PRESETS["deepseek-v3"]               # 128 heads, nope 128 + rope 64, v 128
    t = attention_tensors(ds, 4096)
    assert t["latents"] == 2 * (2 * 1536 + 2 * 512 + 64)
    assert t["qkv"] == 2 * (128 * 192 + 128 * 192 + 128 * 128)
    assert t["proj_in"] == 2 * 128 * 128


def test_each_selective_module_drops_its_tensors():
    base = layer()                             # core_attn, Megatron's default
    assert layer(modules=["core_attn"]) == base
    assert layer("none") - base == T * 4 * A                         # the log-sum-exp
    # layernorm: both norms' outputs (QKV input, MoE input), 2h each per token
    assert base - layer(modules=["core_attn", "layernorm"]) == T * 4 * H
    # moe_act: the SwiGLU output of every routed assignment, 2f each
    assert base - layer(modules=["core_attn", "moe_act"]) == 2 * T * 2 * F
    # moe: the whole MoE block but its input: router probs, experts with their fp32
    # routing probabilities (the output dropout mask belongs to the bias-dropout-add after
    # the block and stays)
    moe_block = 4 * E * T + 2 * T * (2 * H + 6 * F + 4)
    assert base - layer(modules=["core_attn", "moe"]) == moe_block
    dense = dataclasses.replace(TOY, n_experts=0, top_k=0)
    d = layer_activation_bytes(dense, 0, T, S, 1, "selective", 0)
    d_mlp = layer_activation_bytes(dense, 0, T, S, 1, "selective", 0,
                                   modules=["core_attn", "mlp"])
    assert d - d_mlp == T * 6 * 2048                   # dense SwiGLU of width 2048: 6f
    shared = dataclasses.replace(TOY, n_shared_experts=1, shared_ffn=256)
    s = layer_activation_bytes(shared, 0, T, S, 1, "selective", 2 * T)
    s_off = layer_activation_bytes(shared, 0, T, S, 1, "selective", 2 * T,
                                   modules=["core_attn", "shared_experts"])
    assert s - s_off == T * 6 * 256


def test_full_recompute_uniform_and_block_by_hand():
    four = dataclasses.replace(TOY, layers=4)
    kw = dict(micro_batch_tokens=T, seq_len=S)
    none = layer_activation_bytes(four, 0, T, S, 1, "none", 2 * T)
    inp = 2 * T * H
    ends = 2 * T * H + 2 * T * H + 4 * T * 32000     # embedding out, final norm in, logits
    u1 = memory_per_rank(four, recompute="full", **kw)
    assert u1.activations == 4 * inp + ends and u1.recompute_workspace == none
    u2 = memory_per_rank(four, recompute="full", recompute_num_layers=2, **kw)
    assert u2.activations == 2 * inp + ends and u2.recompute_workspace == 2 * none
    b1 = memory_per_rank(four, recompute="full", recompute_method="block",
                         recompute_num_layers=1, **kw)
    assert b1.activations == inp + 3 * none + ends and b1.recompute_workspace == none
    with pytest.raises(InputError) as ei:
        memory_per_rank(four, recompute="selective", recompute_modules=["attn"], **kw)
    assert ei.value.field == "memory.recompute_modules"


def test_fp8_activation_caching_on_deepseek_v3_by_hand():
    """DeepSeek-V3 report §3.3.2: Linear inputs in FP8 (1 + 4/128 bytes with the 1x128
    tiles' fp32 scales), the output projection's input in E5M6 (1.5 + 4/128), the MoE
    SwiGLU's input in FP8; with layernorm and mla_up_proj recomputed (§3.2.3)."""
    from moesim.memory.activations import layer_bytes_per_token, routed_expert_bytes
    ds = PRESETS["deepseek-v3"]   # h 7168, 128 heads, q/kv ranks 1536/512, rope 64, f 2048
    h, fp8, e5m6 = 7168, 1 + 4 / 128, 1.5 + 4 / 128
    mods = frozenset({"layernorm", "mla_up_proj"})
    common = 512 + 7168 + 4 * h + h + 4 * 256   # lse, mask, norm inputs, router: as they are
    bf16 = common + 2 * (2 * 1536 + 2 * 512 + 64) + 2 * 16384 + 2 * (2 * 2048 + 2048)
    f8 = (common + 2 * (1536 + 512 + 64) + fp8 * (1536 + 512)   # normed latents in FP8
          + e5m6 * 16384                                        # output projection's input
          + fp8 * (2 * 2048 + 2048))                            # shared SwiGLU in and out
    layer = ds.first_dense_layers                                # the first MoE layer
    # per routed assignment: the permuted input and the weighted SwiGLU's fp32 probability
    assert layer_bytes_per_token(ds, layer, 4096, modules=mods) == (pytest.approx(bf16),
                                                                      2 * h + 4)
    tok, per = layer_bytes_per_token(ds, layer, 4096, modules=mods, act_dtype="fp8")
    assert tok == pytest.approx(f8) and per == pytest.approx(fp8 * h + 4)
    # a routed assignment: SwiGLU input 2f in FP8, its output (fc2's input) FP8, or
    # recomputed with moe_act
    assert routed_expert_bytes(ds, 2048, mods, "fp8") == pytest.approx(fp8 * 3 * 2048)
    assert routed_expert_bytes(ds, 2048, mods | {"moe_act"}, "fp8") == pytest.approx(
        fp8 * 2 * 2048)
    assert routed_expert_bytes(ds, 2048, mods) == 2 * 3 * 2048


def test_activation_dtype_is_checked():
    with pytest.raises(InputError) as ei:
        memory_per_rank(TOY, micro_batch_tokens=T, seq_len=S, activation_dtype="fp4")
    assert ei.value.field == "memory.activation_dtype"
