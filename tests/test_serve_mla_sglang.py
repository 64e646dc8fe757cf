"""``serve.mla_decode: sglang``: SGLang's weight-absorbed FP8 MLA in a decode step
(moesim.serve.mla), kernels and bytes worked out by hand on DeepSeek-V3 (128 heads,
nope 128, kv_lora_rank 512, v 128) at 2 tokens on one rank."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.errors import InputError
from moesim.model.read import model_from_dict
from moesim.scenario.sections.serve import serve_from_dict
from moesim.serve.costs import decode_attention_kernels

T = 2


def _ks(mla_decode: str, preset: str = "deepseek-v3"):
    spec = dataclasses.replace(model_from_dict({"preset": preset}, "t"), precision="fp8")
    return decode_attention_kernels(spec, T, 2000, 1, 2, mla_decode)


def test_sglang_kernels_by_hand():
    ks = _ks("sglang")
    names = [k.name for k in ks]
    at = names.index("attention_decode")
    assert names[at - 3:at] == ["per_tensor_quant_mla_fp8_stage1",
                                "per_tensor_quant_mla_fp8_stage2", "bmm_fp8"]
    assert names[at + 1:at + 7] == ["per_tensor_quant_mla_fp8_stage1",
                                    "per_tensor_quant_mla_fp8_stage2", "bmm_fp8",
                                    "transpose_copy", "per_token_cast_to_fp8",
                                    "attention_gemm"]
    q1, q2, kc = ks[at - 3:at]
    o1, o2, vc, cp, cast, oproj = ks[at + 1:at + 7]
    # query: 2 x 128 x 128 BF16 values read (65,536 B), read again + FP8 written (98,304 B)
    assert (q1.bytes, q2.bytes) == (65_536, 98_304)
    # w_kc: 128 GEMMs of (2, 512, 128): FP8 in (2x128 + 128x512), BF16 out (2x512 x 2 B)
    assert kc.flops == 2 * 128 * 2 * 512 * 128 == 33_554_432
    assert kc.bytes == 128 * (2 * 128 + 128 * 512 + 2 * 2 * 512) == 8_683_520
    assert (kc.m, kc.n, kc.k) == (2, 512, 128)
    # output: 2 x 128 x 512 values (262,144 B; 393,216 B)
    assert (o1.bytes, o2.bytes) == (262_144, 393_216)
    assert vc.bytes == 128 * (2 * 512 + 512 * 128 + 2 * 2 * 128) == 8_585_216
    assert cp.bytes == 2 * 2 * 2 * 128 * 128 == 131_072
    # o_proj's input cast: 2 x 16,384 BF16 read, FP8 written with a 4-byte scale per 128
    assert cast.bytes == 2 * 16_384 * (2 + 1 + 4 / 128) == 99_328 and (oproj.n, oproj.k) == (7168, 16_384)


def test_sglang_replaces_training_kernels():
    gemm, sg = _ks("gemm"), _ks("sglang")
    names = [k.name for k in sg]
    for gone in ("_copy_tensor_kernel", "direct_copy_kernel"):
        assert gone in [k.name for k in gemm] and gone not in names
    kv_b = [k for k in gemm if k.name == "attention_gemm" and k.n == 128 * 256]
    assert len(kv_b) == 1 and not [k for k in sg if k.name == "attention_gemm"
                                   and k.n == 128 * 256]
    # the absorbed GEMMs do the up-projection's FLOPs: 2 x 2 x 32,768 x 512
    assert sum(k.flops for k in sg if k.name == "bmm_fp8") == kv_b[0].flops == 67_108_864
    # one cast of the attention output (o_proj's) where training has two
    assert sum(k.name == "per_token_cast_to_fp8" for k in sg) == \
        sum(k.name == "per_token_cast_to_fp8" for k in gemm) - 2


def test_non_mla_model_unchanged():
    assert _ks("sglang", "mixtral-8x7b") == _ks("gemm", "mixtral-8x7b")


def test_prefill_refused():
    with pytest.raises(InputError, match="serve.mla_decode"):
        serve_from_dict({"phase": "prefill", "mla_decode": "sglang"}, "t")
    with pytest.raises(InputError, match="serve.mla_decode"):
        serve_from_dict({"phase": "decode", "mla_decode": "flashmla"}, "t")


def _prefill(mla_prefill: str):
    from moesim.serve.costs import prefill_attention_kernels
    spec = dataclasses.replace(model_from_dict({"preset": "deepseek-v3"}, "t"),
                               precision="fp8")
    return prefill_attention_kernels(spec, T, T, 1, 2, mla_prefill)


def test_sglang_prefill_by_hand():
    tr, sg = _prefill("training"), _prefill("sglang")
    names = [k.name for k in sg]
    # q_a (1536) and kv_a (512 + 64) over one input cast: one GEMM of n = 2,112
    fused = [k for k in sg if k.name == "attention_gemm" and k.k == 7168]
    assert [(k.m, k.n) for k in fused] == [(2, 2112)]
    assert fused[0].flops == sum(k.flops for k in tr if k.name == "attention_gemm"
                                 and k.k == 7168) == 2 * 2 * 2112 * 7168
    # the latent made contiguous (2 x 512 BF16 read and written) just before its norm
    at = names.index("contiguous_copy")
    assert sg[at].bytes == 2 * 2 * 2 * 512 == 4096
    assert names[at + 1] == "norm" and sg[at + 1].bytes == 2 * 2 * 2 * 512 + 4 * 2
    assert "direct_copy_kernel" in [k.name for k in tr] and "direct_copy_kernel" not in names
    assert "_copy_tensor_kernel" in names          # the key's assembly stays
    # casts: kv_a's input cast and the output's FP8 copy for a backward are gone
    assert sum(k.name == "per_token_cast_to_fp8" for k in sg) == \
        sum(k.name == "per_token_cast_to_fp8" for k in tr) - 2


def test_mla_prefill_refused_for_decode():
    with pytest.raises(InputError, match="serve.mla_prefill"):
        serve_from_dict({"phase": "decode", "mla_prefill": "sglang"}, "t")
