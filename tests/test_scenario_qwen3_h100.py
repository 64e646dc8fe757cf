"""The Qwen3 MoE H100 scenarios are Megatron-Bridge's published recipes, field by field,
worked by hand: Qwen3-30B-A3B on 16 H100 (NeMo 26.04.01: GBS 1024, MBS 1, sequence 4096,
TP1 PP1 EP16) and Qwen3-235B-A22B on 256 H100 (NeMo 25.11: GBS 2048, MBS 1, TP2 PP8 VP4
EP32)."""

from __future__ import annotations

from moesim.model.read import model_from_dict
from moesim.scenario import load_scenario, scenario_layout
from moesim.wiring import resolve


def _scenario(name):
    s = resolve(load_scenario(name)).scenario
    layout, warns = scenario_layout(s)
    return s, layout, warns


def test_qwen3_30b_a3b_16_h100_is_the_published_layout():
    s, layout, warns = _scenario("qwen3-30b-a3b-16-h100")
    assert warns == []
    assert s.world == 16 and (layout.tp, layout.pp, layout.ep) == (1, 1, 16)
    assert layout.dp == 16 and layout.edp == 1
    # GBS 1024 = DP 16 x 64 micro-batches x MBS 1
    assert s.schedule.microbatches * layout.dp * s.schedule.micro_batch_size == 1024
    assert s.schedule.seq_len == 4096
    # the EP group spans both DGX nodes: 8 ranks on each
    assert sorted({r // 8 for r in layout.ep_groups[0]}) == [0, 1]
    spec = model_from_dict(s.model, s.source)
    assert (spec.layers, spec.hidden, spec.n_experts, spec.top_k) == (48, 2048, 128, 8)
    assert spec.n_experts // layout.ep == 8            # local experts per rank
    assert s.routing.policy["kind"] == "uniform" and s.memory.recompute == "none"
    assert (s.parallel.ep_backend.kind, s.parallel.ep_backend.held_sms(0)) == ("hybridep", 32)


def test_qwen3_235b_256_h100_is_the_published_layout():
    s, layout, warns = _scenario("qwen3-235b-256-h100-fp8")
    assert warns == []
    assert s.world == 256 and (layout.tp, layout.pp, layout.ep) == (2, 8, 32)
    # DP = 256 / (2 x 8) = 16; EDP = 256 / (32 x 8) = 1
    assert layout.dp == 16 and layout.edp == 1
    # GBS 2048 = DP 16 x 128 micro-batches x MBS 1 ("GA 128")
    assert s.schedule.microbatches * layout.dp * s.schedule.micro_batch_size == 2048
    assert s.schedule.microbatches == 128 and s.parallel.vpp == 4
    assert s.parallel.sequence_parallel and s.overlap.kind == "a2a-1f1b"
    assert s.parallel.ep_backend.kind == "nccl"
    spec = model_from_dict(s.model, s.source)
    assert (spec.layers, spec.n_experts, spec.top_k) == (94, 128, 8)
