"""verl's actor-update MFU (moesim.rl.verl_mfu): its three FLOP counters by hand."""

from __future__ import annotations

import pytest

from moesim.errors import InputError
from moesim.model.presets import PRESETS
from moesim.model.spec import ModelSpec
from moesim.rl.verl_mfu import actor_mfu, verl_flops, verl_peak

DENSE = ModelSpec(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, vocab=10,
                  attention="gqa", dense_ffn=16, n_experts=0, top_k=0)
MOE = ModelSpec(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, vocab=10,
                attention="gqa", n_experts=4, top_k=2, expert_ffn=6)


def test_dense_counter_by_hand():
    """_estimate_qwen2_flops: N = (mlp 8·16·3 + attention 8·(8 + 4 + 4 + 8)) · 2 layers +
    embedding and head 10·8·2 = 1,312; samples of 3 and 5 tokens: 6·1,312·8 = 62,976 and
    attention 12·(9 + 25)·4·2·2 = 6,528."""
    assert verl_flops(DENSE, [3, 5]) == 6 * 1312 * 8 + 12 * 34 * 4 * 2 * 2 == 69_504


def test_moe_counter_by_hand():
    """_estimate_qwen2_moe_flops: per layer the top-2 experts 8·2·6·3 = 288 and the router
    8·4 = 32 beside attention's 192: N = 2·512 + 160 = 1,184."""
    assert verl_flops(MOE, [3, 5]) == 6 * 1184 * 8 + 6528 == 63_360


def test_deepseek_v3_counter_by_hand():
    """_estimate_deepseek_v3_flops on the preset: MLA's projections 187,105,280 a layer;
    58 MoE layers with the router (7168·256) and 8 routed + 1 shared experts at width 2,048;
    3 dense layers (FFN 18,432); the embedding and head 129,280·7168·2. One sample of one
    token adds attention 12·1·192·128·61."""
    attn = (7168 * 1536 + 128 * 192 * 1536 + 7168 * (512 + 64) + 128 * (192 - 64 + 128) * 512
            + 128 * 128 * 7168)
    assert attn == 187_105_280
    n = ((7168 * 256 + 7168 * 2048 * 9 * 3 + attn) * 58 + (7168 * 18432 * 3 + attn) * 3
         + 129280 * 7168 * 2)
    assert n == 37_551_276_032
    assert verl_flops(PRESETS["deepseek-v3"], [1]) == 6 * n + 12 * 192 * 128 * 61


def test_mfu_divides_by_time_peak_and_gpus():
    """verl's perf/mfu/actor: FLOPs x epochs / time / peak / world size; the H20's peak
    is verl's 148 TFLOP/s."""
    assert verl_peak("H20") == 148e12
    f = verl_flops(DENSE, [3, 5])
    assert actor_mfu(DENSE, [3, 5], 2.0, 4, 1e3, epochs=2) == pytest.approx(f * 2 / 2 / 1e3 / 4)


def test_a_device_verl_does_not_list_is_one_line():
    with pytest.raises(InputError) as e:
        verl_peak("cpu", "x.yaml")
    assert e.value.field == "cluster.device" and "H20" in str(e.value)
