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
