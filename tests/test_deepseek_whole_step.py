"""DeepSeek-V3's whole DualPipe step, part by part (issue 38): how many overlapped
forward-backward pairs, lone forwards and lone backwards each rank runs (the reference's
eight loops, deepseek-ai/DualPipe ``dualpipe/dualpipe.py``), and the first/last stage
split that puts the MTP module and output heads on rank 0 and rank P-1."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest

from moesim.errors import InputError
from moesim.model import PRESETS
from moesim.schedule.dualpipe import dualpipe_order
from moesim.schedule.layout_string import stage_chunks

#: deepseek-v3-2048 ships DeepSeek's MTP module and its first/last stage split; the
#: cuts below take them off (a pp 2 cut of a few layers cannot hold that split).
NO_MTP = ("model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
          "parallel.decoder_last_pipeline_num_layers=null")


def test_pp16_120_chunks_items_per_rank_by_hand():
    # DualPipe.step with 16 ranks, 120 chunks: half_num_chunks 60, num_half_ranks 8.
    # Rank 0 (h = 0): step 1 nF0 = 2*(8-0-1) = 14 forwards, step 2 one F0 and one F1,
    # step 3 (8-0-1) = 7 x (B1 zero-bubble, W, F1); step 4 (60-16+0+1) = 45 x two F&B;
    # step 5 7 x (BW1, F&B); step 6 one BW1 and one B0 (the second half zero-bubble);
    # step 7 7 x (W, B0 zero-bubble); step 8 one W.
    # F&B = 90 + 7 = 97; F = 14 + 2 + 7 = 23; B = 7 + 1 + 7 = 15; W = 7 + 7 + 1 = 15;
    # BW = 7 + 1 = 8. Every chunk runs once forward and once backward: 97 + 23 = 120.
    o = dualpipe_order(16, 120)
    assert Counter(it.kind for it in o.items[0]) == {"F&B": 97, "F": 23, "B": 15, "W": 15,
                                                      "BW": 8}
    # the middle rank 7 (h = 7): step 4 = 60-16+7+1 = 52 iterations of two, whose first
    # forward and backward the reference does not overlap: F&B = 104 - 1 = 103; step 5
    # none; F = 0 + 2*8 (step 2) + 1 = 17; backward: step 6 8 x (BW1|B1, BW0|B0) with
    # the zero-bubble switch at i = 4 (h odd: B1 from i = 4, then B0): BW 4+4+1 = 9
    o7 = Counter(it.kind for it in o.items[7])
    assert o7 == {"F&B": 103, "F": 17, "BW": 9, "B": 8, "W": 8}
    # 120 forwards and 120 backwards on every rank
    for r in range(16):
        c = Counter(it.kind for it in o.items[r])
        assert c["F&B"] + c["F"] == 120
        assert c["F&B"] + c["BW"] + c["B"] == 120


def _scn(kind: str, first=None, last=None):
    par = SimpleNamespace(pp=16, pipeline_layout=None, decoder_first_pipeline_num_layers=first,
                          decoder_last_pipeline_num_layers=last)
    return SimpleNamespace(parallel=par, source="x.yaml", schedule=SimpleNamespace(kind=kind))


def test_dualpipe_first_last_split_with_mtp():
    # 61 layers, first 3 (the dense ones), last 2: 56 left over 14 stages = 4 each; the
    # MTP layer (index 61) after the last decoder layer on stage 15
    spec = PRESETS["deepseek-v3"]
    spec = replace(spec, mtp_layers=1)
    chunks = stage_chunks(_scn("dualpipe", 3, 2), spec, 16, dual=True)
    assert [len(c) for c in chunks] == [3] + [4] * 14 + [3]
    assert chunks[0] == range(0, 3) and chunks[1] == range(3, 7)
    assert chunks[15] == range(59, 62)
    # rank r holds stages r and 15-r: rank 0 = 3 + 3 (with MTP), the others 4 + 4
    assert len(chunks[0]) + len(chunks[15]) == 6
    assert all(len(chunks[r]) + len(chunks[15 - r]) == 8 for r in range(1, 8))
    # without a split, the even one: 3 | 4 x 13 | 3 | 3 (+ MTP)
    even = stage_chunks(_scn("dualpipe"), spec, 16, dual=True)
    assert [len(c) for c in even] == [3] + [4] * 13 + [3, 4]


def test_dualpipev_refuses_first_last():
    spec = PRESETS["deepseek-v3"]
    with pytest.raises(InputError):
        stage_chunks(_scn("dualpipev", 3, 2), spec, 32, dual=True)


def test_spread_cuts_a_dense_item_over_the_other_items_segments():
    from moesim.engine.fast.pairs import spread
    dense = [[("c", 1), ("c", 2), ("c", 3), ("c", 4), ("c", 5)]]
    moe = [[("c", 10), ("a", 11)], [("c", 12), ("a", 13)], [("c", 14)]]
    # 5 ops over 3 segments: cuts at 5k // 3 = 0, 1, 3, 5
    assert spread(dense, moe) == [[("c", 1)], [("c", 2), ("c", 3)], [("c", 4), ("c", 5)]]
    assert spread(moe, dense) == moe                   # an item with all-to-alls stays
    assert spread(dense, [[("c", 9)]]) == dense        # nothing to hide: unchanged


def test_dense_backward_spread_over_a_moe_forward_in_an_fb_pair():
    # DeepSeek-V3 cut to pp 2: stage 0 two dense layers, stage 1 two MoE layers + head.
    # Rank 0's F&B pair F3.1 & B0.0: the dense backward's 10 ops (per layer recompute,
    # ffn, attn, w_mlp, w_attn) over the MoE forward's 5 segments (4 all-to-alls + the
    # tail): runs of 2, each before a forward segment (the backward's first).
    from moesim.program.build import build_step
    from moesim.wiring import resolve_path
    res = resolve_path("deepseek-v3-2048", [*NO_MTP,
        "cluster.nodes=16", "parallel.pp=2", "model.layers=4", "model.first_dense_layers=2",
        "schedule.microbatches=4", "engine.mode=exact"])
    prog = build_step(res).programs[0]
    i = next(k for k, op in enumerate(prog) if op.name == "bwd.recv" and op.microbatch == 0)
    names = [(op.name, op.layer) for op in prog[i + 1:i + 24]]
    assert names == [
        ("bwd.recompute", 1), ("bwd.ffn", 1),
        ("fwd.attn", 2), ("fwd.router", 2), ("fwd.dispatch", 2),
        ("bwd.attn", 1), ("bwd.w_mlp", 1),
        ("fwd.experts", 2), ("fwd.combine", 2),
        ("bwd.w_attn", 1), ("bwd.recompute", 0),
        ("fwd.unpermute", 2), ("fwd.attn", 3), ("fwd.router", 3), ("fwd.dispatch", 3),
        ("bwd.ffn", 0), ("bwd.attn", 0),
        ("fwd.experts", 3), ("fwd.combine", 3),
        ("bwd.w_mlp", 0), ("bwd.w_attn", 0),
        ("fwd.unpermute", 3), ("fwd.lm_head", -1)]
