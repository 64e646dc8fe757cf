"""NVTX ranges of a Megatron-Core MoE layer's forward on the host's two clocks
(moesim.program.nvtx_ranges), worked by hand from host_dispatch's prices (TP1, one local
expert, eager prices: the parts' host times 174.2, 212.6, 164.7, 96.6, 19.4 | 64.4 | 19.4,
72.56, 87.1 | 51.6 us)."""

from __future__ import annotations

import pytest

from moesim.program import host_dispatch as hd
from moesim.program import nvtx_ranges as nr

US = 1e-6


def test_ranges_group_every_moe_part_once():
    parts = [p.name for p in hd.FORWARD_OPS]
    assert sorted(nr.MLP + nr.ATTENTION) == sorted(parts)
    assert len(set(nr.MLP)) == len(nr.MLP)


def test_host_ranges_without_gpu_work_are_the_issue_times():
    r = nr.layer_ranges({}, 1, 1, 1, te=False)
    # router 212.6 + preprocess 164.7 + token counts 96.6 + permute 19.4
    assert r["router_and_preprocess"][0] == pytest.approx(493.3 * US, rel=1e-12)
    assert r["dispatch"][0] == pytest.approx(64.4 * US, rel=1e-12)
    assert r["experts_compute"][0] == pytest.approx(179.06 * US, rel=1e-12)
    assert r["combine"][0] == pytest.approx(51.6 * US, rel=1e-12)
    assert r["MLP"][0] == pytest.approx(788.36 * US, rel=1e-12)
    assert r["attention"] == (pytest.approx(174.2 * US, rel=1e-12), None)
    assert all(g is None for _, g in r.values())


def test_the_sync_wait_lands_in_the_dispatch_range():
    # the attention's 2,000 us on the GPU (10 launches of 200 us, the first at 17.42 us)
    # end at 2,017.42 us; the host reaches the sync at 174.2 + 493.3 = 667.5 us and waits
    # inside token_dispatch: 2,017.42 - 667.5 + 64.4 = 1,414.32 us of dispatch range
    gpu = {"attention block": 2000 * US}
    r = nr.layer_ranges(gpu, 1, 1, 1, te=False)
    assert r["router_and_preprocess"][0] == pytest.approx(493.3 * US, rel=1e-12)
    assert r["dispatch"][0] == pytest.approx(1414.32 * US, rel=1e-12)
    assert r["MLP"][0] == pytest.approx(2138.28 * US, rel=1e-12)
    assert r["attention"][1] == pytest.approx(2000 * US, rel=1e-12)
    # the two clocks end where host_dispatch's timeline ends
    _, end = nr.trace(gpu, 1, 1, 1, te=False)
    assert end == pytest.approx(hd.timeline_pass_s(gpu, 1, 1, 1, te=False), rel=1e-12)


def test_median_over_layers_and_gpu_projection():
    # the experts' 2,000 us start at 763.3933 us (host_dispatch's hand-worked case), end at
    # 2,763.3933; layer 2's host reaches its sync at 962.56 + 667.5 = 1,630.06 us and waits:
    # dispatch 2,763.3933 - 1,630.06 + 64.4 = 1,197.7333 us; layer 1's dispatch 64.4 us
    gpu = {"experts": 2000 * US}
    r = nr.layer_ranges(gpu, 1, 1, 2, te=False)
    assert r["dispatch"][0] == pytest.approx((64.4 + 1197.7333) / 2 * US, rel=1e-7)
    assert r["experts_compute"] == (pytest.approx(179.06 * US, rel=1e-12),
                                    pytest.approx(2000 * US, rel=1e-12))
    assert r["dispatch"][1] is None


def test_te_gemm_calls_repriced_by_hand():
    # the experts part's 2 GEMMs per local expert at 13.7 us rather than 2.43: 72.56 +
    # 2 x 11.27 = 95.10 us; experts_compute 19.4 + 95.10 + 87.1 = 201.6 us
    r = nr.layer_ranges({}, 1, 1, 1, te=False, cpp_launch_s=13.7 * US)
    assert r["experts_compute"][0] == pytest.approx(201.6 * US, rel=1e-12)
    # 16 local experts: 32 calls x 11.279 us more = 360.928 us on the layer
    _, base = nr.trace({}, 16, 1, 1)
    _, more = nr.trace({}, 16, 1, 1, cpp_launch_s=nr.TE_GEMM_CALL_S)
    assert more - base == pytest.approx(360.928 * US, rel=1e-9)
