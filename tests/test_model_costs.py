"""FLOPs and bytes per op, checked by hand."""

from __future__ import annotations

import pytest

from moesim.model import PRESETS, count_params
from moesim.model import costs as C


def _gemm_flops(kernels):
    return sum(k.flops for k in kernels if k.m and k.n and k.k)


def test_expert_gemm_flops_by_hand():
    s = PRESETS["toy"]
    n, h, f = 37, 512, 1024
    ks = C.expert_kernels(s, n, "fwd")
    gemms = [k for k in ks if k.name == "expert_gemm"]
    assert len(gemms) == 3
    assert sum(k.flops for k in gemms) == 2 * 3 * n * h * f
    assert all(k.m == n for k in gemms)
    assert {(k.n, k.k) for k in gemms} == {(f, h), (h, f)}
    # up GEMM bytes: 2 bytes · (n·h + h·f + n·f)
    assert gemms[0].bytes == 2 * (n * h + h * f + n * f)


def test_backward_is_twice_forward_for_gemms():
    s = PRESETS["toy"]
    fwd = C.expert_kernels(s, 64, "fwd")
    bwd = C.expert_kernels(s, 64, "bwd")
    assert [k.name for k in bwd] == [k.name + "_bwd" for k in fwd]
    for a, b in zip(fwd, bwd, strict=True):
        assert b.flops == 2 * a.flops and b.bytes == 2 * a.bytes


def test_zero_tokens_no_kernels():
    s = PRESETS["toy"]
    assert C.expert_kernels(s, 0) == []
    assert C.permute_kernels(s, 0) == []


def test_two_matrix_ffn():
    s = PRESETS["switch-base"]
    ks = C.expert_kernels(s, 10)
    assert _gemm_flops(ks) == 2 * 2 * 10 * 768 * 3072


def test_mha_attention_by_hand():
    s = PRESETS["toy"]   # h 512, 8 heads of 64
    t, seq = 2 * 128, 128
    ks = C.attention_kernels(s, t, seq, tp=1)
    assert _gemm_flops(ks) == 2 * t * 4 * 512 * 512        # q, k, v, o projections
    core = [k for k in ks if k.name == "attention"][0]
    # causal half of QKᵀ and P·V: 0.5 · 2 · t · s · heads · (64 + 64)
    assert core.flops == 0.5 * 2 * t * seq * 8 * 128
    bwd = [k for k in C.attention_kernels(s, t, seq, 1, "bwd") if k.name == "attention_bwd"][0]
    assert bwd.flops == 2.5 * core.flops


def test_tp_splits_attention_and_dense_ffn():
    s = PRESETS["mixtral-8x7b"]
    one = C.attention_kernels(s, 512, 512, tp=1)
    two = C.attention_kernels(s, 512, 512, tp=2)
    assert sum(k.flops for k in two) == pytest.approx(sum(k.flops for k in one) / 2)
    ds = PRESETS["deepseek-v3"]
    assert _gemm_flops(C.dense_ffn_kernels(ds, 8, tp=4)) == 2 * 3 * 8 * 7168 * 18432 / 4


def test_forward_gemm_flops_equal_two_per_active_weight():
    # every active weight matrix is used once per token in a GEMM: forward GEMM FLOPs =
    # 2 · (active params - embedding - norms), and MLA down-projection norms aside.
    for name in ("mixtral-8x7b", "toy"):
        s = PRESETS[name]
        t = 8
        ks = C.lm_head_kernels(s, t)
        for i in range(s.layers):
            ks += C.layer_kernels(s, i, t, t)
            if s.is_moe_layer(i):
                ks += C.expert_kernels(s, t * s.top_k)   # all assignments, one batch
        c = count_params(s)
        assert _gemm_flops(ks) == 2 * t * (c.active - c.embedding - c.norms)


def test_mla_and_shared_expert_gemm_flops_match_params():
    s = PRESETS["deepseek-v3"]
    t = 4
    ks = C.lm_head_kernels(s, t)
    for i in range(s.layers):
        ks += C.layer_kernels(s, i, t, t)
        if s.is_moe_layer(i):
            ks += C.expert_kernels(s, t * s.top_k)
    c = count_params(s)
    mla_norms = s.layers * (s.q_lora_rank + s.kv_lora_rank)   # inside attention params
    assert _gemm_flops(ks) == 2 * t * (c.active - c.embedding - c.norms - mla_norms)


def test_memory_bound_ops():
    s = PRESETS["toy"]
    (norm,) = C.norm_kernels(s, 100, tp=2)
    assert norm.bytes == 20 * 50 * 512 and norm.count == 4 and norm.m == 0
    (perm,) = C.permute_kernels(s, 10)
    assert perm.bytes == 2 * 2 * 10 * 512
    (opt,) = C.optimizer_kernels(1000)
    assert opt.bytes == 28 * 1000


def test_router_kernels():
    s = PRESETS["toy"]
    r = C.router_kernels(s, 100)
    assert r[0].flops == 2 * 100 * 512 * 8 and r[0].n == 8
    assert C.router_kernels(PRESETS["toy"], 0) == []


def test_bad_phase():
    with pytest.raises(ValueError):
        C.gemm("x", 1, 1, 1, "sideways")  # type: ignore[arg-type]


def test_expert_flops_conserved_across_experts():
    # splitting N tokens over experts in any way gives the same GEMM FLOPs as one batch
    s = PRESETS["mixtral-8x7b"]
    counts = [0, 1, 7, 300, 12, 4096]
    split = sum(_gemm_flops(C.expert_kernels(s, n)) for n in counts)
    assert split == _gemm_flops(C.expert_kernels(s, sum(counts)))
