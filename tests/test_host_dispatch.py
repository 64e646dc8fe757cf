"""The host's eager dispatch per MoE layer (moesim.program.host_dispatch): op counts from
Megatron-LM 2ff0f099's forward, their host seconds, and the bound each layer takes between
two host syncs, worked by hand; rl.train.host_dispatch in the RL trainer's passes."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.program import host_dispatch as hd
from moesim.rl.engine_costs import EngineTrainerCosts
from moesim.rl.run import resolve_rl
from tests.test_rl_run import scenario


def test_counts_and_host_seconds_of_one_layer_by_hand():
    # TP2, 16 local experts: 10 + 13 + 9 + 6 + 1 + 4 + 5 + 1 + 4 + 5 + 3 = 61 Python-level
    # ops, 4 + 1 + 6 + 1 + 1 + 1 + 2 + 1 = 17 views, 2 GEMMs x 16 experts from C++
    assert hd.layer_counts(16, 2) == (61, 17, 32)
    want = 61 * 16.1e-6 + 17 * 3.3e-6 + 32 * 2.43e-6      # 1,115.96 us
    assert hd.layer_host_s(16, 2) == pytest.approx(want, rel=1e-12)
    assert hd.layer_host_s(16, 2) == pytest.approx(1115.96e-6, rel=1e-9)
    # TP1: no TP gathers of the tokens and probs (5 ops fewer)
    assert hd.layer_counts(16, 1) == (56, 17, 32)
    assert hd.layer_host_s(16, 2) - hd.layer_host_s(16, 1) == pytest.approx(5 * 16.1e-6)


def test_a_segment_bound_by_its_host_time():
    # a layer whose GPU work is 300 us while the host issues 1,115.96 us of ops between
    # two syncs takes the host's time; 48 such layers gain 48 x 815.96 us
    h = hd.layer_host_s(16, 2)
    assert hd.segment_s(300e-6, h) == h
    assert hd.pass_extra_s(48, 300e-6, h) == pytest.approx(48 * (h - 300e-6), rel=1e-12)
    # GPU-bound layers gain nothing
    assert hd.pass_extra_s(48, 2e-3, h) == 0.0


def _costs(tmp_path, mode):
    scn = resolve_rl(scenario(tmp_path)).scenario
    tr = dataclasses.replace(scn.rl.train, host_dispatch=mode)
    scn = dataclasses.replace(scn, rl=dataclasses.replace(scn.rl, train=tr))
    return EngineTrainerCosts(scn, 8, 8, tp=1, pp=1, ep=8, seq_len=512)


def test_trainer_passes_take_the_host_bound_only_with_eager(tmp_path):
    off, on = _costs(tmp_path, "none"), _costs(tmp_path, "eager")
    assert off.host_pass_s(512) == 0.0
    spec_layers = 2                                  # the toy: 2 MoE layers, 8 experts
    on._row_s(512, None)
    gpu_layer = on.memo[("layers", 512, None)] / spec_layers
    host = hd.layer_host_s(1, 1)                     # EP8: one local expert, TP1
    # the toy's tiny layers are host-bound: each takes the host's time
    assert host > gpu_layer
    extra = on.host_pass_s(512)
    assert extra == pytest.approx(spec_layers * (host - gpu_layer), rel=1e-12)
    assert on.forward_s(8) == pytest.approx(off.forward_s(8) + extra, rel=1e-12)
    # training: one forward per micro-batch on the 1F1B path (PP1: m slots)
    assert on.train_step_s(20) == pytest.approx(off.train_step_s(20) + 3 * extra, rel=1e-12)


def test_the_rl_summary_echoes_the_knob_only_when_on(tmp_path):
    from moesim.scenario.sections.rl import summary_dict
    cfg = resolve_rl(scenario(tmp_path)).scenario.rl
    assert "host_dispatch" not in summary_dict(cfg)["train"]
    on = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, host_dispatch="eager"))
    assert summary_dict(on)["train"]["host_dispatch"] == "eager"


def test_timeline_attention_bound_layers_by_hand():
    # TP1, one local expert: the parts' host times 174.2, 212.6, 164.7, 96.6, 19.4 (to the
    # sync), then 64.4, 19.4, 72.56, 87.1, 51.6 (295.06 after it): 962.56 us a layer
    assert hd.layer_host_s(1, 1) == pytest.approx(962.56e-6, rel=1e-12)
    # all the GPU's 2,000 us in the attention block (10 launches, 200 us each): the first
    # starts at 17.42 us, the GPU ends at 2,017.42; the host reaches the sync at 667.5 us,
    # waits for the GPU, then issues the MoE tail's 295.06 us with nothing for the GPU:
    # 2,312.48 us a layer, the next layer's attention issued only after it
    gpu = {"attention block": 2000e-6}
    assert hd.timeline_pass_s(gpu, 1, 1, 1, te=False) == pytest.approx(2312.48e-6, rel=1e-12)
    assert hd.timeline_pass_s(gpu, 1, 1, 2, te=False) == pytest.approx(4624.96e-6, rel=1e-12)
    assert hd.timeline_extra_s(gpu, 1, 1, 2, te=False) == pytest.approx(624.96e-6, rel=1e-9)
    # max(G, H) sees no bound at all: the GPU's 2,000 us exceed the host's 962.56
    assert hd.pass_extra_s(2, 2000e-6, hd.layer_host_s(1, 1)) == 0.0


def test_timeline_expert_bound_layer_and_te_prices_by_hand():
    # all 2,000 us in the experts (4 ops + 2 GEMMs: 6 launches of 12.0933 us host): the
    # host issues 751.3 us of parts before them, so the GPU starts at 763.3933 us
    gpu = {"experts": 2000e-6}
    assert hd.timeline_pass_s(gpu, 1, 1, 1, te=False) == pytest.approx(2763.3933e-6, rel=1e-7)
    # with Transformer Engine's module calls at 115 us (2 in the attention block, 2 in the
    # experts): 372.0 + 212.6 + 164.7 + 96.6 + 19.4 + 64.4 + 19.4 = 949.1 us, then
    # 270.36 / 6 = 45.06 us to the first expert launch
    assert hd.layer_host_s(1, 1, te=True) == pytest.approx(962.56e-6 + 4 * 98.9e-6)
    assert hd.timeline_pass_s(gpu, 1, 1, 1) == pytest.approx(2994.16e-6, rel=1e-9)


def test_comm_shares_and_parts_by_hand():
    # 2,048 rows a GPU, top-8, EP8, TP2 with SP: each all-to-all sends 2,048 x 8 x 7/8 =
    # 14,336 rows, the SP all-gather and reduce-scatter 2,048 each: 4,096 of 32,768
    assert hd.comm_shares(2048, 8, 8, 2) == {"dispatch all-to-alls": 0.4375,
                                             "combine all-to-all and unpermute": 0.4375,
                                             "attention block": 0.125}
    assert hd.comm_shares(100, 2, 1, 1) == {}
    assert hd.part_of("fwd.router", "sort_chunks_by_idxs") == "sort by local expert"
    assert hd.part_of("fwd.unpermute", "sort_chunks_by_idxs") == "unsort and TP reduce-scatter"
    assert hd.part_of("fwd.router", "permute") == "permute"
    assert hd.part_of("fwd.router", "router_topk") == "router"
    assert hd.part_of("fwd.attn", "norm") == "attention block"
    assert hd.part_of("fwd.experts", "expert_gemm") == "experts"


def test_timeline_knob_in_the_trainer_passes(tmp_path):
    off, on = _costs(tmp_path, "none"), _costs(tmp_path, "timeline")
    extra = on.host_pass_s(512)
    assert extra > 0.0
    assert on.forward_s(8) == pytest.approx(off.forward_s(8) + extra, rel=1e-12)
    assert on.train_step_s(20) == pytest.approx(off.train_step_s(20) + 3 * extra, rel=1e-12)
