"""DeepSeek's 5-stage decode overlap (``serve.decode_overlap: five_stage``,
moesim/serve/five_stage.py): the stage order of SGLang's ``_compute_moe_deepseek_blog_decode``
(``tbo_delta_stages=2``) on a tiny decode, its step replayed by hand from the spans, the
attention split, the knob's checks, and the default left as it was."""

from __future__ import annotations

import pytest
import yaml

from moesim.errors import InputError
from moesim.serve.five_stage import split_attention
from moesim.serve.program import ServeBuilder
from moesim.serve.run import resolve_serve, simulate_serve


def _scenario(tmp_path, **serve) -> str:
    """16 GPUs over two DGX H100 nodes, EP16, 2 layers (layer 0 dense, layer 1 MoE with
    one shared expert), 16 experts top-2, uniform routing, on the fast engine."""
    data = {"name": "five", "seed": 3,
            "cluster": {"topology": "dgx-h100", "nodes": 2},
            "model": {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "head_dim": 128,
                      "vocab": 4096, "attention": "mha", "dense_ffn": 4096, "n_experts": 16,
                      "top_k": 2, "expert_ffn": 1024, "first_dense_layers": 1,
                      "n_shared_experts": 1, "shared_ffn": 1024},
            "routing": {"kind": "uniform"},
            "compute": {"model": "roofline"},
            "serve": {"phase": "decode", "batch_per_gpu": 8, "context": 1024, "ep": 16,
                      "two_microbatch": True, "ep_backend": "deepep-ll", **serve},
            "engine": {"mode": "fast"}}
    p = tmp_path / "five.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


#: rank 0's compute stream, worked by hand from the stage lists (A: micro-batch 0, B: 1;
#: B starts two stages behind; a dense layer has no stage boundary):
#: A0 = embedding, layer 0, ATTN-0 of layer 1 | A1 = ATTN-1, gate | A2 = dispatch sent,
#: shared experts | A3 = dispatch received, experts, combine sent | A4 = combine received
#: | then the unpermute and the head
ORDER = [("fwd.embedding", 0), ("fwd.attn", 0), ("fwd.ffn", 0), ("fwd.attn0", 0),   # A0
         ("fwd.attn1", 0), ("fwd.router", 0),                                      # A1
         ("fwd.shared_fc1", 0), ("fwd.shared_fc2", 0),                             # A2
         ("fwd.embedding", 1), ("fwd.attn", 1), ("fwd.ffn", 1), ("fwd.attn0", 1),  # B0
         ("fwd.experts", 0),                                                       # A3
         ("fwd.attn1", 1), ("fwd.router", 1),                                      # B1
         # A4: the wait for A's combine
         ("fwd.shared_fc1", 1), ("fwd.shared_fc2", 1),                             # B2
         ("fwd.unpermute", 0), ("fwd.lm_head", 0),                                 # A's end
         ("fwd.experts", 1),                                                       # B3
         ("fwd.unpermute", 1), ("fwd.lm_head", 1)]                                 # B4, end


def _run(path, *overrides):
    res, cfg = resolve_serve(path, list(overrides))
    return simulate_serve(res, cfg)


def test_stage_order_and_step_replayed_by_hand(tmp_path):
    r = _run(_scenario(tmp_path, decode_overlap="five_stage"))
    mine = [s for s in r.spans if s.rank == 0]
    comp = sorted((s for s in mine if s.stream == "compute"), key=lambda s: s.start_s)
    assert [(s.name, s.microbatch) for s in comp] == ORDER
    dur = {(s.name, s.microbatch): s.dur_s for s in comp}
    a2a = {(s.kind, s.microbatch): s for s in mine if s.kind in ("ep_dispatch", "ep_combine")}
    # replay: each block starts when the one before it on the stream ends, and a block
    # that reads an all-to-all also waits for its end; the all-to-alls are sent when the
    # block before them ends (their starts may wait for a late peer or the ep stream)
    t = 0.0
    for name in ORDER[:6]:
        t += dur[name]
    assert a2a["ep_dispatch", 0].start_s >= t - 1e-15
    t += dur["fwd.shared_fc1", 0] + dur["fwd.shared_fc2", 0]
    for name in ORDER[8:12]:
        t += dur[name]
    t = max(t, a2a["ep_dispatch", 0].end_s) + dur["fwd.experts", 0]
    assert a2a["ep_combine", 0].start_s >= t - 1e-15
    t += dur["fwd.attn1", 1] + dur["fwd.router", 1]
    t = max(t, a2a["ep_combine", 0].end_s)                  # A4: A's combine received
    assert a2a["ep_dispatch", 1].start_s >= t - 1e-15       # B2 sends after A4
    t += dur["fwd.shared_fc1", 1] + dur["fwd.shared_fc2", 1]
    t += dur["fwd.unpermute", 0] + dur["fwd.lm_head", 0]
    t = max(t, a2a["ep_dispatch", 1].end_s) + dur["fwd.experts", 1]
    t = max(t, a2a["ep_combine", 1].end_s)
    t += dur["fwd.unpermute", 1] + dur["fwd.lm_head", 1]
    assert comp[-1].end_s == pytest.approx(t, rel=1e-12)
    # the step is the last rank's end (another rank's experts may take longer)
    assert r.summary["step_time_s"] >= t * (1 - 1e-12)
    assert r.summary["serve"]["decode_overlap"] == "five_stage"


def test_attention_split_keeps_every_kernel(tmp_path):
    res, cfg = resolve_serve(_scenario(tmp_path), [])
    ks = ServeBuilder(res, cfg).attn_kernels(1)
    a0, a1 = split_attention(ks)
    assert a0 + a1 == ks
    assert a1[0].name == "attention_decode" and all(k.name != "attention_decode" for k in a0)
    assert split_attention([ks[0]]) == ([], [ks[0]])        # no core kernel: all ATTN-1


def test_default_is_segments_and_not_echoed(tmp_path):
    r = _run(_scenario(tmp_path))
    assert "decode_overlap" not in r.summary["serve"]
    assert any(s.name == "fwd.attn" and s.layer == 1 for s in r.spans)
    assert not any(s.name.startswith("fwd.attn0") for s in r.spans)


@pytest.mark.parametrize("field,value,bad", [
    ("phase", "prefill", "serve.phase"),
    ("two_microbatch", False, "serve.two_microbatch"),
    ("ep_backend", "deepep", "serve.ep_backend"),
    ("decode_overlap", "three_stage", "serve.decode_overlap"),
])
def test_knob_refuses_what_it_cannot_run(tmp_path, field, value, bad):
    with pytest.raises(InputError) as e:
        resolve_serve(_scenario(tmp_path, **{"decode_overlap": "five_stage", field: value}), [])
    assert e.value.field == bad


def test_exact_engine_runs_the_same_step(tmp_path):
    # the exact builder's reordered op programs (moesim.serve.program) and the fast
    # engine's chain (moesim.serve.five_stage) give the same step, to the last digit here,
    # on a skewed 4-layer case (3 MoE layers, hot ranks stall their partners)
    path = _scenario(tmp_path, decode_overlap="five_stage")
    over = ["model.layers=4", "routing.kind=zipf", "routing.zipf_s=0.8"]
    fast = _run(path, *over).summary
    exact = _run(path, *over, "engine.mode=exact")
    assert exact.summary["step_time_s"] == pytest.approx(fast["step_time_s"], rel=1e-12)
    for k, v in fast["breakdown_s"].items():
        assert exact.summary["breakdown_s"][k] == pytest.approx(v, rel=1e-9, abs=1e-15)
    one = _run(path, "engine.mode=exact")             # the 2-layer case: the same order
    comp = sorted((s for s in one.spans if s.rank == 0 and s.stream == "compute"),
                  key=lambda s: s.start_s)
    assert [(s.name, s.microbatch) for s in comp] == ORDER
