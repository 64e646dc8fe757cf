"""``serve.prefill_overlap: sglang``: SGLang's prefill TBO order (moesim.serve.prefill_tbo),
checked op by op on DeepSeek-V3 cut to 5 layers (3 dense, 2 MoE) on one node, EP8."""

from __future__ import annotations

import pytest

from moesim.errors import InputError
from moesim.scenario.sections.serve import serve_from_dict
from moesim.serve.program import ServeBuilder
from moesim.serve.run import resolve_serve

SMALL = ["cluster.nodes=1", "serve.ep=8", "routing.max_nodes=null", "model.layers=5"]


def _prog(*extra: str):
    res, cfg = resolve_serve("deepseek-v3-prefill-sglang", [*SMALL, *extra])
    return ServeBuilder(res, cfg).rank_program(0)


def test_layer_order_is_sglangs():
    prog = _prog()
    seq = [(op.name.removeprefix("fwd."), op.microbatch) for op in prog if op.layer == 3]
    # [attn, gate] of A then B; [dispatch, experts] of A then B; [combine, shared, output]
    # of A then B (operations_strategy.py _compute_moe_deepseek_blog_prefill, delta 0)
    assert seq == [("attn", 0), ("router", 0), ("attn", 1), ("router", 1),
                   ("dispatch", 0), ("experts", 0), ("dispatch", 1), ("experts", 1),
                   ("combine", 0), ("shared_fc1", 0), ("shared_fc2", 0), ("unpermute", 0),
                   ("combine", 1), ("shared_fc1", 1), ("shared_fc2", 1), ("unpermute", 1)]
    at = {(op.name, op.layer, op.microbatch): i for i, op in enumerate(prog)}
    # the in-order compute stream: B's shared experts wait for A's combine, A's next layer
    # for B's combine (combine_b's current_stream_wait)
    assert at["fwd.combine", 3, 0] in prog[at["fwd.shared_fc1", 3, 1]].deps
    assert at["fwd.combine", 3, 1] in prog[at["fwd.attn", 4, 0]].deps
    # both micro-batches' all-to-alls on the one EP stream, in launch order
    ep = [(op.name, op.microbatch) for op in prog if op.stream == "ep" and op.layer == 3]
    assert ep == [("fwd.dispatch", 0), ("fwd.dispatch", 1), ("fwd.combine", 0),
                  ("fwd.combine", 1)]


def test_segments_unchanged_by_default():
    names = [(op.name, op.microbatch) for op in _prog("serve.prefill_overlap=segments")
             if op.layer == 3]
    assert ("fwd.shared_fc1", 0) not in names     # shared experts stay in the unpermute


def test_refusals():
    with pytest.raises(InputError, match="serve.prefill_overlap"):
        resolve_serve("deepseek-v3-prefill-sglang", [*SMALL, "engine.mode=fast"])
    with pytest.raises(InputError, match="serve.phase"):
        serve_from_dict({"phase": "decode", "two_microbatch": True, "ep": 8, "batch_per_gpu": 2,
                         "prefill_overlap": "sglang"}, "t")
    with pytest.raises(InputError, match="serve.two_microbatch"):
        serve_from_dict({"phase": "prefill", "ep": 8, "prefill_overlap": "sglang"}, "t")
