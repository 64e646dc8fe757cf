"""``model.qk_norm`` (Qwen3's QK-norm; Megatron-Core ``q_layernorm`` / ``k_layernorm``):
an RMSNorm over every query head and every key head after the QKV projection.

Hand figures, toy GQA layer: 16 tokens, 4 query heads and 2 KV heads of 8 features, tp 1.
Query norm: 16 · 4 = 64 rows of 8: forward reads x and writes y in BF16 (2 · 2 · 64 · 8 =
2,048 B) plus an FP32 1/rms per row (256 B): 2,304 B; backward 3 · 2 · 64 · 8 + 256 =
3,328 B. Key norm: 32 rows: 1,152 B forward, 1,664 B backward.
"""

from __future__ import annotations

import dataclasses

from moesim.model.kernels.attention import attention_kernels
from moesim.model.presets import PRESETS

SPEC = dataclasses.replace(PRESETS["toy"], heads=4, kv_heads=2, head_dim=8, hidden=32,
                           attention="gqa")


def norms(kernels):
    return [(k.name, k.bytes) for k in kernels if k.name.startswith("norm")]


def test_qk_norm_adds_a_query_and_a_key_norm_in_order():
    on = dataclasses.replace(SPEC, qk_norm=True)
    fwd = attention_kernels(on, 16, 16, phase="fwd")
    assert norms(fwd) == [("norm", 2304.0), ("norm", 1152.0)]
    names = [k.name for k in fwd]
    assert names.index("attention_gemm") < names.index("norm") < names.index("rotary_kernel")
    bwd = attention_kernels(on, 16, 16, phase="bwd")
    assert norms(bwd) == [("norm_bwd", 1664.0), ("norm_bwd", 3328.0)]


def test_off_by_default_leaves_the_layer_as_it_was():
    assert norms(attention_kernels(SPEC, 16, 16, phase="fwd")) == []
    assert not PRESETS["qwen3-30b-a3b"].qk_norm
