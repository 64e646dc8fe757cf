"""Interleaved pipelines: the embedding's output and the loss's FP32 logits are saved by
the virtual chunk that holds them, not by every chunk of the first and last stage."""

from __future__ import annotations

import pytest

from moesim.memory.model import ACT_BYTES, memory_per_rank
from moesim.memory.report import StageMemory
from moesim.model.presets import PRESETS
from moesim.wiring import resolve_path


def test_chunk_ends_move_exactly_the_embedding_output_and_the_logits():
    spec = PRESETS["mixtral-8x7b"]
    kw = dict(micro_batch_tokens=4096, seq_len=4096, tp=2, pp=4, stage=3, layers=[30, 31],
              inflight_microbatches=3)
    last = memory_per_rank(spec, **kw).activations               # as the last stage
    inner = memory_per_rank(spec, chunk_ends=(False, False), **kw).activations
    # final norm input 2·T·h/t and fp32 logits 4·T·V/t, per micro-batch in flight
    t = 4096
    assert last - inner == pytest.approx(
        3 * (ACT_BYTES * t * spec.hidden / 2 + 4 * t * spec.vocab / 2), rel=1e-12)
    first = memory_per_rank(spec, **dict(kw, stage=0, layers=[0, 1])).activations
    plain = memory_per_rank(spec, chunk_ends=(False, False),
                            **dict(kw, stage=0, layers=[0, 1])).activations
    assert first - plain == pytest.approx(3 * ACT_BYTES * t * spec.hidden / 2, rel=1e-12)


def test_interleaved_last_stage_charges_the_logits_to_its_last_chunk_only():
    res = resolve_path("mixtral-8x7b-64gpu")           # PP4, two chunks per stage
    sm = StageMemory(res)
    p, v = res.scenario.parallel.pp, sm.v
    assert v == 2
    for s in (0, p - 1):
        _, alive = sm.peak_alive(s)
        by_hand = sum(
            memory_per_rank(res.model, stage=s, layers=list(sm.chunks[c * p + s]),
                            inflight_microbatches=alive[c],
                            chunk_ends=(s == 0 and c == 0, s == p - 1 and c == v - 1),
                            **sm.common).activations
            for c in range(v) if alive[c])
        assert sm.row(s)["activations"] == pytest.approx(by_hand, rel=1e-12)
        # every chunk charged as an end stage, as before, is more by the other chunk's
        # share of the embedding output or the logits
        every = sum(memory_per_rank(res.model, stage=s, layers=list(sm.chunks[c * p + s]),
                                    inflight_microbatches=alive[c], **sm.common).activations
                    for c in range(v) if alive[c])
        other = alive[1] if s == 0 else alive[0]
        assert other > 0 and every > sm.row(s)["activations"]


def test_the_published_1024_h100_recipe_fits_in_80_gb():
    # NVIDIA ran it on 80 GB H100s (Megatron-Bridge performance summary, NeMo 25.09)
    sm = StageMemory(resolve_path("deepseek-v3-1024-h100"))
    rows = [sm.row(s) for s in range(8)]
    assert not any(r["oom"] for r in rows)
    assert max(r["peak_bytes"] for r in rows) < 80e9
