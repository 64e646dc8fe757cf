"""The DeepSeek-V3 1024-H100 scenario is Megatron-Bridge's published recipe (NeMo 25.09:
1024 GPUs, GBS 8192, MBS 1, sequence 4096, TP2 PP8 VP4 EP64, layout "Et|(tt|)*30mL"),
field by field, worked by hand."""

from __future__ import annotations

from moesim.model.read import model_from_dict
from moesim.scenario import load_scenario, scenario_layout
from moesim.schedule.layout_string import stage_chunks
from moesim.wiring import resolve


def test_layout_and_batch_are_the_published_ones():
    s = resolve(load_scenario("deepseek-v3-1024-h100")).scenario
    layout, _ = scenario_layout(s)
    assert s.world == 1024 and (layout.tp, layout.pp, layout.ep) == (2, 8, 64)
    assert layout.dp == 1024 // (2 * 8) == 64 and layout.edp == 1024 // (64 * 8) == 2
    # GBS 8192 = DP 64 x 128 micro-batches x MBS 1
    assert s.schedule.microbatches * layout.dp * s.schedule.micro_batch_size == 8192
    assert s.schedule.seq_len == 4096 and s.parallel.vpp == 4
    assert s.parallel.sequence_parallel and s.parallel.zero == 1
    assert tuple(s.memory.recompute_modules) == ("mla_up_proj", "mlp")
    assert s.overlap.dp_overlap is False


def test_pipeline_layout_puts_two_layers_per_virtual_stage():
    s = resolve(load_scenario("deepseek-v3-1024-h100")).scenario
    spec = model_from_dict(s.model, s.source)
    assert spec.layers == 61 and spec.mtp_layers == 1
    chunks = stage_chunks(s, spec, 8 * 4)
    # "E t" | 30 x "t t" | "m L": 1 + 60 decoders, then the MTP layer (index 61)
    assert len(chunks) == 32
    assert list(chunks[0]) == [0]
    assert all(len(c) == 2 for c in chunks[1:31])
    assert list(chunks[31]) == [61]
    assert sum(len(c) for c in chunks) == 62
