"""The serving-under-load KV cache with sliding-window layers (vLLM's hybrid KV cache
manager, moesim.traffic.kvcache): blocks a windowed request holds, worked by hand; a
gpt-oss-120b deployment's pool and how many requests it holds; runs with windows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moesim.model.presets import GPT_OSS_120B
from moesim.traffic.deploy import build_for, build_sim, windows_of
from moesim.traffic.kvcache import BlockManager, kv_groups
from moesim.traffic.request import Request
from tests.test_load_skip import C, _reqs


def test_kv_groups_as_vllm_splits_layers():
    # gpt-oss-120b: layers 1, 3, ... (1-based) windowed (128), the even ones full
    w = windows_of(GPT_OSS_120B)
    assert w[:4] == [128, 0, 128, 0] and w.count(128) == 18 and w.count(0) == 18
    assert kv_groups(w) == ((128, 0), 18)
    # vLLM's example (kv_cache_utils.py): 2 full + 3 sliding -> 3 groups of 2 layers
    assert kv_groups([0, 0, 64, 64, 64]) == ((0, 64, 64), 2)
    assert kv_groups([0] * 36) == ((0,), 36)          # one type: one group of all
    assert windows_of(dataclasses.replace(GPT_OSS_120B, window=0)) is None


def _decode_to(kv, rid, prompt, upto):
    """Prefill ``prompt`` in one step, then decode one token per step to ``upto`` tokens
    (each grow: the cached tokens + the one being written); the blocks after each."""
    kv.grow(rid, prompt)
    out = {prompt: kv.held[rid]}
    for t in range(prompt + 1, upto + 1):
        kv.grow(rid, t)
        out[t] = kv.held[rid]
    return out


def test_blocks_of_a_windowed_request_below_at_and_above_the_window():
    # block 16, one full group + one 128-token window group (gpt-oss-120b's groups)
    kv = BlockManager(1000, 16, (0, 128))
    h = _decode_to(kv, 1, 100, 300)
    # below the window both groups hold ceil(T / 16): 100 -> 7 + 7
    assert h[100] == 14 and h[112] == 14 and h[113] == 16
    # at the window: 128 tokens -> 8 + 8; token 129 written with 128 computed: nothing
    # before token 128 - 128 + 1 = 1 is skipped yet -> 9 + 9
    assert h[128] == 16 and h[129] == 18
    # above: token 144 (143 computed) frees block 0 (tokens 0..15 < 143-127=16): 9 + 8;
    # token 145 opens block 9 in both: 10 + 9 (the window's 128 tokens + partial block)
    assert h[144] == 17 and h[145] == 19
    # 300 tokens: full ceil(300/16) = 19; window 19 - (299 - 127) // 16 = 19 - 10 = 9
    assert h[300] == 28 == kv.used
    # the window group never holds more than 128/16 + 1 blocks once past the window
    assert max(v - -(-t // 16) for t, v in h.items() if t > 144) == 9
    kv.release(1)
    assert kv.used == 0 and not kv.held


def test_a_long_prompt_holds_every_block_for_its_prefill_step_then_frees():
    # vLLM frees with the tokens computed before the step: a 300-token prompt prefilled
    # in one step holds 19 + 19; its first decode (300 computed) keeps 19 + 9
    kv = BlockManager(100, 16, (0, 128))
    assert kv.extra(1, 300) == 38
    kv.grow(1, 300)
    assert kv.used == 38
    assert kv.extra(1, 301) == 28 - 38           # frees 10 blocks
    assert kv.can_grow(1, 301)
    kv.grow(1, 301)
    assert kv.used == 28 and kv.free == 72
    # chunked prefill (Sarathi): chunks of 64; before the 3rd chunk 128 computed
    kv.grow(2, 64)
    kv.grow(2, 128)
    kv.grow(2, 192)      # 128 computed: skips (128 - 127) // 16 = 0 -> 12 + 12
    assert kv.held[2] == 24
    kv.grow(2, 256)      # 192 computed: skips (192 - 127) // 16 = 4 -> 16 + 12
    assert kv.held[2] == 28


def test_a_reserved_decode_frees_window_blocks_as_it_goes():
    # DecodeOnly reserves prompt + output in every group, then decodes below that
    kv = BlockManager(100, 16, (0, 128))
    kv.grow(1, 200 + 56)                          # 16 + 16
    assert kv.used == 32
    kv.grow(1, 201)                               # 200 computed: skip (200-127)//16 = 4
    assert kv.used == 16 + 12
    kv.grow(1, 256)                               # 255 computed: skip 8
    assert kv.used == 16 + 8


def test_no_windows_is_the_full_attention_cache():
    a, b = BlockManager(50, 16), BlockManager(50, 16, (0,))
    for kv in (a, b):
        assert not kv.windowed
        kv.grow(1, 33)
        assert kv.held[1] == 3 and kv.need(33) == 3 and kv.extra(1, 48) == 0
        assert kv.extra(1, 49) == 1
        kv.grow(1, 20)                            # never shrinks
        assert kv.held[1] == 3


def _gpt_oss(kv_tokens):
    from moesim.serve.run import resolve_serve
    from moesim.traffic.session import load_config
    res, cfg = resolve_serve("scenarios/mixtral-8x7b-serve-load.yaml",
                             ["model.preset=gpt-oss-120b"])
    lc = dataclasses.replace(load_config(res), kv_tokens=kv_tokens)
    return res, cfg, lc


def _fill(kv, prompt):
    """Requests prefilled (``prompt`` tokens in one step) and then one token decoded,
    admitted one after the other while the prefill fits: how many the cache holds."""
    n = 0
    while kv.can_grow(n, prompt):
        kv.grow(n, prompt)
        kv.grow(n, prompt + 1)
        n += 1
    return n


def test_gpt_oss_deployment_holds_twice_the_blocks_and_about_twice_the_requests():
    res, cfg, lc = _gpt_oss(529_600)
    sim = build_for(res, cfg, lc, C)
    kv = sim.members[0].kv
    # 529,600 full-attention tokens = 33,100 blocks of 36 layers; the hybrid pool's block
    # is one group of 18 layers: 529,600 * 36 // (18 * 16) = 66,200 blocks, same bytes
    assert kv.windows == (128, 0) and kv.blocks == 66_200 and kv.tokens == 529_600
    full = build_sim(C, [[0]], 529_600).members[0].kv
    assert full.blocks == 33_100 and not full.windowed
    # requests at 4,097 tokens (4,096 prefilled, one decoded): without windows each holds
    # 257 blocks after prefilling 256: (n - 1) * 257 + 256 <= 33,100 -> n = 128.
    # With windows: prefill 256 + 256, then 257 + (257 - (4096 - 127) // 16) = 257 + 9:
    # (n - 1) * 266 + 512 <= 66,200 -> n = 247 (247 / 128 = 1.93; per request
    # 2 * 257 / 266 = 1.93)
    assert _fill(full, 4096) == 128
    assert _fill(kv, 4096) == 247
    assert kv.used == 247 * 266 and full.used == 128 * 257


def test_gpt_oss_deployment_sizes_its_pool_from_memory_with_windows():
    res, cfg, lc = _gpt_oss(None)
    from moesim.traffic.deploy import kv_tokens_per_member
    k = kv_tokens_per_member(res, cfg, lc)
    assert build_for(res, cfg, lc, C).members[0].kv.blocks == k * 36 // (18 * 16)


def _run(windows, skip=True, n=60, kv=16 * 200, sched="vllm"):
    sim = build_sim(C, [[0]], kv, scheduler=sched, token_budget=512, layer_windows=windows)
    sim.skip = skip
    rng = np.random.default_rng(4)
    reqs = [Request(i, 0.0, int(p), int(o)) for i, (p, o) in enumerate(
        zip(rng.integers(16, 200, n), rng.integers(150, 500, n), strict=True))]
    sim.submit(reqs)
    sim.run()
    return sim, reqs


@pytest.mark.parametrize("sched", ["vllm", "sarathi"])
def test_windows_let_more_requests_run_and_the_cache_never_overflows(sched):
    w = windows_of(GPT_OSS_120B)
    sf, rf = _run(None, sched=sched)
    sw, rw = _run(w, sched=sched)
    for sim, reqs in ((sf, rf), (sw, rw)):
        kv = sim.members[0].kv
        assert all(r.done and r.generated == r.output for r in reqs)
        assert kv.used == 0 and not kv.held and sim.kv_peak <= 1.0
    peak = [max(row[1] for row in s.series[0]) for s in (sf, sw)]
    pre = [sum(r.preemptions for r in rs) for rs in (rf, rw)]
    assert peak[1] > peak[0] and pre[1] < pre[0]
    assert sw.series[0][-1][0] < sf.series[0][-1][0]        # done sooner


def test_a_layer_list_with_no_window_gives_the_same_run_as_none():
    a, ra = _run(None)
    b, rb = _run([0] * 36)
    assert b.members[0].kv.blocks == a.members[0].kv.blocks
    assert [(r.first_token_s, r.finish_s, r.preemptions) for r in ra] == \
        [(r.first_token_s, r.finish_s, r.preemptions) for r in rb]
    assert a.series == b.series and a.kv_peak == b.kv_peak


def test_skipping_equals_stepping_with_windows():
    w = windows_of(GPT_OSS_120B)
    (a, ra), (b, rb) = _run(w, skip=False), _run(w, skip=True)
    for x, y in zip(ra, rb, strict=True):
        assert (x.admitted_s, x.first_token_s, x.last_token_s, x.finish_s, x.preemptions) \
            == (y.admitted_s, y.first_token_s, y.last_token_s, y.finish_s, y.preemptions)
    assert a.series == b.series and a.kv_peak == b.kv_peak and a.steps == b.steps
    assert b.skipped == 0                   # windowed members step one by one


def test_skipping_still_skips_without_windows():
    b, _ = _run(None, skip=True)
    assert b.skipped > 0


def test_windowed_disaggregated_run_hands_over_and_finishes():
    reqs = _reqs(n=40, rate=20.0, seed=5)
    sim = build_sim(C, [[0], [1]], 16 * 300, scheduler="disaggregated",
                    layer_windows=windows_of(GPT_OSS_120B))
    sim.submit(reqs)
    sim.run()
    assert all(r.done for r in reqs)
    assert all(m.kv.used == 0 for m in sim.members)


def test_a_windowed_kv_transfer_moves_the_window_of_its_windowed_layers():
    from tests.test_load_disagg import links
    # 1,000-token prompt, 2 layers (one windowed, 128), 1,000 B per token over both:
    # 500 * 1,000 + 500 * 128 = 564,000 B at 1e6 B/s: 0.564 s
    sim = build_sim(C, [[0], [1]], 100_000, scheduler="disaggregated",
                    kv_bytes_per_token=1000.0, links=links(2, 1e6),
                    gpus_of=[("g0",), ("g1",)], layer_windows=[128, 0])
    sim.submit([Request(0, 0.0, 1000, 2)])
    sim.run()
    (_, _, _, t0, t1), = sim.transfer.log
    assert sim.transfer.bytes == 564_000
    assert t1 - t0 == pytest.approx(0.564)
