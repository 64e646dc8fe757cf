"""The decode-only deployment compared with DeepSeek's published production figures
(issue 23): its operating point comes from the published averages, worked by hand here,
and its layout gives each GPU what DeepSeek's EP144 unit gives it."""

from __future__ import annotations

import sys
from pathlib import Path

from moesim.serve.run import resolve_serve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import serving_published as pub  # noqa: E402


def test_operating_point_is_littles_law_on_the_published_averages():
    res, cfg = resolve_serve("deepseek-v3-decode-production")
    # 14.8k output tokens/s per node of 8 GPUs = 1,850 per GPU; each request decodes
    # 21 tokens/s (20-22): 1850 / 21 = 88.1 requests per GPU at a time
    per_gpu = pub.DECODE_TOKENS_PER_S_PER_NODE / res.scenario.gpus_per_node
    assert round(per_gpu / (sum(pub.DECODE_TOKENS_PER_S_PER_REQUEST) / 2)) == 88
    assert cfg.batch_per_gpu == 88 and cfg.kv_tokens == 4989
    assert cfg.phase == "decode" and cfg.microbatches == 2


def test_each_gpu_holds_two_routed_experts_as_in_deepseeks_ep144_unit():
    # DeepSeek: (256 routed + 32 redundant) / 144 GPUs = 2 per GPU, plus the shared one
    res, cfg = resolve_serve("deepseek-v3-decode-production")
    assert (256 + 32) // 144 == 2
    assert res.routing.placement.redundant == 32 and res.layout.ep == 144
    assert (res.model.n_experts + 32) // res.layout.ep == 2 and res.model.n_shared_experts == 1
    assert res.layout.world == 144 and res.layout.dp == 144      # attention DP, TP1


def test_cache_hit_share_is_the_published_one():
    assert abs(pub.CACHE_HIT_SHARE * 100 - 56.3) < 0.06       # 342B of 608B: 56.25 %


def test_sglang_scenario_gives_each_gpu_the_blogs_four_expert_slots_and_batch():
    # LMSYS blog (2025-05-05): EP72 over 9 nodes with 256 + 32 redundant experts = 4 per GPU;
    # decode table: batch size 256, KV cache length 2,000, 22,282 tokens/s per node
    res, cfg = resolve_serve("deepseek-v3-decode-sglang")
    assert (256 + 32) // 72 == 4
    assert res.routing.placement.redundant == 32 and res.layout.ep == 72
    assert (res.model.n_experts + 32) // res.layout.ep == 4
    assert res.layout.world == 72 and res.layout.dp == 72 and res.scenario.gpus_per_node == 8
    assert cfg.batch_per_gpu == 256 and cfg.kv_tokens == 2000
    assert cfg.phase == "decode" and cfg.microbatches == 2 and cfg.backend == "deepep-ll"
    assert pub.SGLANG_TOKENS_PER_S_PER_NODE == 22_282


def test_sglang_prefill_scenario_is_the_blogs_ep32_unit_with_16k_tokens_per_gpu():
    # LMSYS blog (2025-05-05): prefill "On 4 nodes (4x8xH100, EP32)", "16,384 tokens per
    # device and an input length of 4,096": 4 prompts per GPU; 50,302 tokens/s per node
    # ("SGLang (Default)"), 59,337 with "Simulated Perfect EPLB"
    res, cfg = resolve_serve("deepseek-v3-prefill-sglang")
    assert res.layout.world == 32 and res.scenario.gpus_per_node == 8
    assert res.layout.ep == 32 and res.layout.dp == 32
    assert res.model.n_experts // res.layout.ep == 8
    assert cfg.batch_per_gpu * cfg.prompt == 16_384 and cfg.prompt == 4096
    assert cfg.phase == "prefill" and cfg.microbatches == 2 and cfg.backend == "deepep"
    assert pub.SGLANG_PREFILL_TOKENS_PER_S_PER_NODE == 50_302
    assert pub.SGLANG_PREFILL_PERFECT_EPLB_PER_NODE == 59_337
