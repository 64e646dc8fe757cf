"""FLOPs and bytes per op, checked by hand."""

from __future__ import annotations

import dataclasses

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
    assert len(gemms) == 2                       # fc1 (gate and up fused), fc2
    assert sum(k.flops for k in gemms) == 2 * 3 * n * h * f
    assert all(k.m == n and k.kind == "grouped_gemm" and k.pass_ == "fwd" for k in gemms)
    assert [(k.n, k.k) for k in gemms] == [(2 * f, h), (h, f)]
    # fc1 bytes: 2 bytes · (n·h + h·2f + n·2f)
    assert gemms[0].bytes == 2 * (n * h + h * 2 * f + n * 2 * f)
    # SwiGLU reads gate and up, writes one: 2 · 3 · n · f bytes
    (act,) = [k for k in ks if k.name == "expert_act"]
    assert act.bytes == 2 * 3 * n * f and act.kclass == "elementwise" and act.kind == "memory"


def test_backward_gemms_are_dgrad_and_wgrad_of_the_forward_shape():
    s = PRESETS["toy"]
    n, h, f = 64, 512, 1024
    fwd = [k for k in C.expert_kernels(s, n, "fwd") if k.m]
    bwd = [k for k in C.expert_kernels(s, n, "bwd") if k.m]
    dg = [k for k in bwd if k.pass_ == "dgrad"]
    wg = [k for k in bwd if k.pass_ == "wgrad"]
    assert [k.name for k in dg] == ["expert_gemm_dgrad"] * 2
    assert [k.name for k in wg] == ["expert_gemm_wgrad"] * 2
    assert {k.kind for k in wg} == {"kgrouped_gemm"} and {k.kind for k in dg} == {"grouped_gemm"}
    # executed last to first: fc2's gradients before fc1's; same FLOPs as the forward
    assert [(k.n, k.k) for k in dg] == [(h, f), (2 * f, h)]
    assert sum(k.flops for k in dg) == sum(k.flops for k in wg) == sum(k.flops for k in fwd)
    # dgrad of fc2 (m=n, n=h, k=f): read dY (n·h) and W (h·f), write dX (n·f) in bf16
    assert dg[0].bytes == 2 * (n * h + h * f + n * f)
    # wgrad of fc2: read X (f·n) and dY (n·h), FP32 main-grad f·h read and written
    assert wg[0].bytes == 2 * (f * n + n * h) + 8 * f * h


def test_fp8_linear_casts_follow_from_tensor_sizes():
    s = dataclasses.replace(PRESETS["toy"], precision="fp8")
    t, h, f = 256, 512, 2048
    fwd = C.dense_ffn_kernels(s, t, 1, "fwd")
    names = [k.name for k in fwd]
    assert names == ["per_token_cast_to_fp8", "dense_gemm", "dense_act",
                     "per_token_cast_to_fp8", "dense_gemm"]
    fp8 = 1 + 4 / 128                     # one byte and an FP32 scale per 128 elements
    assert fwd[0].bytes == t * h * (2 + fp8) and fwd[0].kclass == "cast"
    assert fwd[3].bytes == t * f * (2 + fp8)
    g = fwd[1]
    assert g.dtype == "fp8" and g.bytes == pytest.approx(
        fp8 * t * h + (1 + 4 / 128 ** 2) * h * 2 * f + 2 * t * 2 * f)
    bwd = C.dense_ffn_kernels(s, t, 1, "bwd")
    b, w = C.split_backward(bwd)
    assert [k.name for k in w] == ["per_channel_cast_and_transpose", "dense_gemm_wgrad"] * 2
    assert [k.name for k in b[:4]] == ["per_token_cast_to_fp8", "batched_transpose",
                                       "dense_gemm_dgrad", "per_channel_cast_and_transpose"]
    # the weight's transposed FP8 copy: read and write h·f FP8 (fc2: W is f × h)
    assert b[1].bytes == pytest.approx(2 * (1 + 4 / 128 ** 2) * f * h)
    # bf16: no cast kernels at all
    assert not [k for k in C.dense_ffn_kernels(PRESETS["toy"], t, 1, "bwd") if k.kclass == "cast"]


def test_attention_fp8_keeps_core_and_router_bf16():
    s = dataclasses.replace(PRESETS["deepseek-v3"], precision="fp8")
    ks = C.attention_kernels(s, 4096, 4096) + C.router_kernels(s, 4096)
    core = [k for k in ks if k.kind == "attn_fwd"]
    assert len(core) == 1 and core[0].dtype == "bf16" and core[0].heads == 128
    assert [k.dtype for k in ks if k.name == "router"] == ["bf16"]
    assert {k.dtype for k in ks if k.name == "attention_gemm"} == {"fp8"}
    # the dispatch cast of the tokens (FP8 dispatch): 4096 × 7168
    assert ks[-1].name == "per_token_cast_to_fp8" and ks[-1].bytes == pytest.approx(
        4096 * 7168 * (3 + 4 / 128))


def test_passes_and_classes_of_a_layer():
    s = PRESETS["deepseek-v3"]
    fwd = C.layer_kernels(s, 5, 1024, 1024, 1, "fwd")
    bwd = C.layer_kernels(s, 5, 1024, 1024, 1, "bwd")
    assert {k.pass_ for k in fwd} == {"fwd"}
    assert {k.pass_ for k in bwd} == {"dgrad", "wgrad"}
    assert all(k.kind == "memory" for k in fwd + bwd if k.kclass in
               ("norm", "elementwise", "permute", "cast"))
    assert {k.kclass for k in fwd} >= {"norm", "elementwise", "gemm", "attention", "router"}
    assert [k.name for k in bwd if k.kind == "attn_bwd"] == ["attention_bwd"]
    assert all(k.name.endswith("_wgrad") for k in bwd if k.pass_ == "wgrad" and k.m)


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
    ks = C.norm_kernels(s, 100, tp=2)          # sequence parallel: 50 rows per rank
    assert [k.name for k in ks] == ["norm", "residual_add"] * 2
    # 2 norms (read x, write y: 4 B + FP32 1/rms per row) + 2 adds (read 2, write 1: 6 B)
    assert sum(k.bytes for k in ks) == 20 * 50 * 512 + 2 * 4 * 50
    assert all(k.m == 0 and k.kind == "memory" for k in ks)
    bwd = C.norm_kernels(s, 100, tp=2, phase="bwd")
    assert sum(k.bytes for k in bwd) == 24 * 50 * 512 + 2 * 4 * 50
    (perm,) = C.permute_kernels(s, 10)
    assert perm.bytes == 2 * 2 * 10 * 512 + 4 * 10     # rows read and written, int32 map
    (unp,) = C.unpermute_kernels(s, 10)                # top-2: 5 tokens out
    assert unp.bytes == 2 * (10 * 512 + 5 * 512) + 4 * 10
    (opt,) = C.optimizer_kernels(1000)
    assert opt.bytes == 28 * 1000


def test_router_kernels():
    s = PRESETS["toy"]
    r = C.router_kernels(s, 100)
    assert r[0].flops == 2 * 100 * 512 * 8 and r[0].n == 8
    # FP32 logits: read x (2 B), W (2 B), write 4 B per logit
    assert r[0].bytes == 2 * (100 * 512 + 512 * 8) + 4 * 100 * 8
    assert [k.name for k in r] == ["router", "router_score", "router_topk", "router_aux_stats"]
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


def test_mla_layout_and_flash_backward_bytes_by_hand():
    s = PRESETS["deepseek-v3"]          # 128 heads, nope 128 + rope 64, v 128, kv latent 512
    t, a = 1024, 128
    fwd = {k.name: k for k in C.attention_kernels(s, t, t) if k.kind == "memory"}
    # rotary on q_pe (a heads) and the shared k_pe, read and written in BF16
    assert fwd["rotary_kernel"].bytes == 2 * 2 * t * (a + 1) * 64
    # the per-head key: read k_nope (a·128) and k_pe (64), write a·192
    assert fwd["_copy_tensor_kernel"].bytes == 2 * t * (a * 128 + 64 + a * 192)
    assert fwd["direct_copy_kernel"].bytes == 2 * 2 * t * a * 128
    norms = [k for k in C.attention_kernels(s, t, t) if k.kclass == "norm"]
    assert [k.bytes for k in norms] == [4 * t * 1536 + 4 * t, 4 * t * 512 + 4 * t]
    bwd = {k.name: k for k in C.attention_kernels(s, t, t, 1, "bwd") if k.kclass == "attention"}
    # preprocess: read o and do (a·v each), write the FP32 row dot per head
    assert bwd["flash_bwd_preprocess"].bytes == 2 * 2 * t * a * 128 + 4 * t * a
    # dQ: the FP32 accumulator read, BF16 dQ written
    assert bwd["flash_bwd_convert_dq"].bytes == (4 + 2) * t * a * 192
    assert bwd["attention_bwd"].flops == 2.5 * 0.5 * 2 * t * t * a * (192 + 128)
