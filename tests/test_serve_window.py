"""Sliding-window attention in serving (issue 22 item 6): a windowed layer caches and
reads only its last ``window`` tokens; worked out by hand on the gpt-oss-120b preset.

gpt-oss-120b (HF config openai/gpt-oss-120b): 36 layers alternating a 128-token window
(layers 1, 3, ... 1-based) with full attention, 8 KV heads of 64: bf16 K and V are
2 · 8 · 64 · 2 = 2048 bytes per token per layer. Sinks are a learned logit per head and
cache nothing.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from moesim.model import PRESETS
from moesim.serve.kv import kv_bytes_per_request, kv_bytes_per_token
from moesim.serve.memory import table
from moesim.serve.program import build_serve_step
from moesim.serve.run import resolve_serve, simulate_serve

OSS = PRESETS["gpt-oss-120b"]
PER_LAYER_TOKEN = 2 * 8 * 64 * 2          # 2048 bytes
BW = 3.35e12 * 0.8                        # H100 SXM HBM at the roofline's 0.8


def test_gpt_oss_kv_bytes_at_8k_by_hand():
    ctx = 8192
    # 18 full layers keep 8192 tokens, 18 windowed layers 128
    want = 18 * 8192 * PER_LAYER_TOKEN + 18 * 128 * PER_LAYER_TOKEN
    assert want == 306_708_480
    assert kv_bytes_per_request(OSS, ctx) == want
    # without the window every layer keeps the context: 36 · 8192 · 2048
    plain = dataclasses.replace(OSS, window=0)
    assert kv_bytes_per_request(plain, ctx) == 36 * 8192 * 2048 == 603_979_776
    assert kv_bytes_per_request(plain, ctx) == kv_bytes_per_token(OSS, 2) * ctx
    # TP2 splits the 8 KV heads; shorter than the window: every layer keeps the context
    assert kv_bytes_per_request(OSS, ctx, 2, tp=2) == want // 2
    assert kv_bytes_per_request(OSS, 100) == 36 * 100 * PER_LAYER_TOKEN
    # sinks are no cached tokens
    assert kv_bytes_per_request(dataclasses.replace(OSS, attention_sinks=False), ctx) == want


def _scenario(tmp_path, layers: int = 2, window: int = 128) -> str:
    data = {"name": "oss", "cluster": {"topology": "dgx-h100",
                                       "params": {"gpus_per_node": 1}},
            "model": {"preset": "gpt-oss-120b", "layers": layers, "window": window},
            "serve": {"phase": "decode", "batch_per_gpu": 1, "context": 8192},
            "compute": {"model": "roofline"}}
    p = tmp_path / f"oss-{window}.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def _decode_kernel(op):
    return next(k for k in op.kernels if k.name == "attention_decode")


def test_decode_reads_a_windowed_layers_last_128_tokens(tmp_path):
    res, cfg = resolve_serve(_scenario(tmp_path))
    plan = build_serve_step(res, cfg)
    attn = {op.layer: _decode_kernel(op) for op in plan.programs[0] if op.name == "fwd.attn"}
    # one request: cached tokens · 2048 bytes + bf16 query and output (2 · 64 heads · 64)
    qo = 2 * 2 * 64 * 64
    assert attn[0].bytes == 128 * PER_LAYER_TOKEN + qo           # windowed
    assert attn[1].bytes == 8192 * PER_LAYER_TOKEN + qo          # full
    # QK^T and ·V: 4 FLOP per cached token per head per feature
    assert attn[0].flops == 4 * 128 * 64 * 64
    assert attn[1].flops == 4 * 8192 * 64 * 64
    # the memory table holds the same request's bytes (2 layers: one of each)
    t = table(res.model, cfg, 80e9)
    assert t["kv_per_request_bytes"] == (8192 + 128) * PER_LAYER_TOKEN


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_the_window_saves_its_cache_read_on_both_engines(tmp_path, mode):
    steps = {}
    for w in (0, 128):
        res, cfg = resolve_serve(_scenario(tmp_path, window=w), [f"engine.mode={mode}"])
        steps[w] = simulate_serve(res, cfg).summary["step_time_s"]
    # batch 1 decode attention is memory-bound at both lengths: layer 0 reads
    # (8192 - 128) · 2048 bytes fewer at the roofline's HBM rate
    assert steps[0] - steps[128] == pytest.approx((8192 - 128) * PER_LAYER_TOKEN / BW,
                                                  rel=1e-6)
