"""Sliding-window attention and sinks (moesim.model.window), worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.model import PRESETS, costs
from moesim.model.params import attention_params
from moesim.model.window import effective_seq, is_window_layer, kv_bytes, score_pairs
from moesim.program.build import build_step
from moesim.scenario import load_scenario
from moesim.wiring import resolve

OSS = PRESETS["gpt-oss-120b"]      # 64 heads of 64, 8 KV heads, window 128 every other layer


def core_flops(spec, tokens, seq):
    return next(k.flops for k in costs.attention_kernels(spec, tokens, seq, 1, "fwd")
                if k.name == "attention")


def test_gpt_oss_alternates_windowed_and_full_layers():
    # Megatron: layer number n (1-based) is full when window_attn_skip_freq 2 divides it
    assert [is_window_layer(OSS, i) for i in range(4)] == [True, False, True, False]


def test_a_128_token_window_attention_flops_by_hand():
    s = 4096
    pairs = 128 * 4096 - 128 * 128 / 2            # W·s - W²/2 = 516,096 per sequence
    assert score_pairs(s, 128) == pairs == 516_096
    # QK^T and ·V: 2 FLOP per pair per head per feature of q·k (64) and of v (64)
    windowed = core_flops(OSS, s, effective_seq(OSS, 0, s))
    assert windowed == pytest.approx(2 * pairs * 64 * (64 + 64), rel=1e-12)
    full = core_flops(OSS, s, effective_seq(OSS, 1, s))
    assert full == pytest.approx(2 * (s * s / 2) * 64 * 128, rel=1e-12)
    assert effective_seq(OSS, 0, 100) == 100     # shorter than the window: causal


def test_sliding_window_kv_bytes_by_hand():
    # bf16 K and V of 8 heads x 64 = 2 x 8 x 64 x 2 = 2048 bytes per token
    assert kv_bytes(OSS, 0, 32768) == 2048 * 128          # windowed: the last 128 tokens
    assert kv_bytes(OSS, 1, 32768) == 2048 * 32768        # full attention: the context
    assert kv_bytes(OSS, 0, 100) == 2048 * 100


def test_attention_sinks_add_one_parameter_per_head():
    plain = dataclasses.replace(OSS, attention_sinks=False)
    assert attention_params(OSS).total - attention_params(plain).total == 64


def test_window_in_the_step_program():
    sets = ["model.window=32", "model.window_full_every=2"]
    res = resolve(load_scenario("toy-cpu", sets))
    plan = build_step(res)
    fwd = {op.layer: op.flops for op in plan.programs[0] if op.name == "fwd.attn"}
    spec, T, S = res.model, res.scenario.schedule.tokens_per_microbatch, \
        res.scenario.schedule.seq_len
    # layer 0 windowed, layer 1 full: they differ by the core attention's scored pairs
    b = T // S                                    # sequences per micro-batch
    diff = 2 * b * (S * S / 2 - score_pairs(S, 32)) * spec.heads * 2 * spec.head_dim
    assert fwd[1] - fwd[0] == pytest.approx(diff, rel=1e-9)
