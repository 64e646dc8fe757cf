"""Speculative decoding with the MTP module as draft (``serve.mtp``, moesim.serve.mtp),
on a tiny model by hand: the verify forward runs 2 tokens per request (every GEMM's FLOPs
double, the KV cache is read once), the MTP layer runs as one more MoE layer, a request
emits 1 + acceptance tokens per step, and TPOT is the step over that."""

from __future__ import annotations

import pytest
import yaml

from moesim.errors import InputError
from moesim.model import costs
from moesim.serve import costs as serve_costs
from moesim.serve.program import build_serve_step
from moesim.serve.run import resolve_serve, simulate_serve

B, CTX, H, VOCAB, HEADS, D = 4, 512, 1024, 4096, 8, 128   # requests per GPU, dims
MTP = {"draft_tokens": 1, "acceptance": 0.875}


def _scenario(tmp_path, mtp=MTP, mtp_layers=1, phase="decode", **serve):
    """8 GPUs of one DGX H100, EP8 over NCCL, 2 layers (the first dense) and one MTP
    depth, 8 experts top-2, one micro-batch of decode, the roofline's prices."""
    model = {"layers": 2, "hidden": H, "heads": HEADS, "kv_heads": HEADS, "head_dim": D,
             "vocab": VOCAB, "attention": "mha", "dense_ffn": 4096, "n_experts": 8,
             "top_k": 2, "expert_ffn": 1024, "first_dense_layers": 1,
             "mtp_layers": mtp_layers}
    sv = {"phase": phase, "batch_per_gpu": B, "context": CTX, "ep": 8,
          "ep_backend": "nccl", **serve}
    if mtp is not None:
        sv["mtp"] = mtp
    data = {"name": "mtp", "seed": 1, "cluster": {"topology": "dgx-h100", "nodes": 1},
            "model": model, "compute": {"model": "roofline"}, "serve": sv}
    p = tmp_path / "mtp.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def _ops(path, overrides=()):
    res, cfg = resolve_serve(path, list(overrides))
    return {(op.name, op.layer): op for op in build_serve_step(res, cfg).programs[0]}


def _expert_tokens(path, layer, overrides=()):
    """Token copies the experts of MoE layer ``layer`` compute, summed over the 8 GPUs."""
    res, cfg = resolve_serve(path, list(overrides))
    return sum(sum(op.expert_tokens) for prog in build_serve_step(res, cfg).programs
               for op in prog if op.name == "fwd.experts" and op.layer == layer)


def test_verify_doubles_every_gemm_and_reads_the_cache_once(tmp_path):
    on = _ops(_scenario(tmp_path))
    off = _ops(_scenario(tmp_path), ["serve.mtp=null"])
    # the target's layers: 2 tokens per request where there was 1 (k = 1)
    for key in (("fwd.attn", 0), ("fwd.ffn", 0), ("fwd.attn", 1), ("fwd.router", 1)):
        assert on[key].flops == 2 * off[key].flops > 0, key
        gemms = [(a, b) for a, b in zip(on[key].kernels, off[key].kernels, strict=True)
                 if a.kind == "gemm"]
        for a, b in gemms:
            assert a.flops == 2 * b.flops and a.m == 2 * b.m, (key, a.name)
    path = _scenario(tmp_path)     # 8 GPUs x B requests x 2 tokens, each to 2 experts
    assert _expert_tokens(path, 1) == 8 * B * 2 * 2
    assert _expert_tokens(path, 1, ["serve.mtp=null"]) == 8 * B * 2
    # attention over the cache: FLOPs 4·t·c·a·d for t = 2B queries; the cache (B requests
    # x CTX tokens x 2·8·128 values x 2 bytes) read once, the query and output vectors of
    # 2B tokens (2·t·a·d bf16 values)
    core_on = next(k for k in on[("fwd.attn", 0)].kernels if k.name == "attention_decode")
    core_off = next(k for k in off[("fwd.attn", 0)].kernels if k.name == "attention_decode")
    assert core_on.flops == 4.0 * (2 * B) * CTX * HEADS * D == 2 * core_off.flops
    cache = B * CTX * 2 * HEADS * D * 2
    assert core_off.bytes == cache + 2 * (2 * B * HEADS * D)
    assert core_on.bytes == cache + 2 * (2 * 2 * B * HEADS * D)
    # the KV write: the draft token's KV too (2B tokens' key and value vectors)
    kv = next(k for k in on[("fwd.attn", 0)].kernels if k.name == "kv_write")
    assert kv.bytes == 2 * B * 2 * HEADS * D * 2


def test_the_mtp_layer_runs_as_one_more_moe_layer_and_the_head_carries_the_draft(tmp_path):
    path = _scenario(tmp_path)
    on = _ops(path)
    off = _ops(path, ["serve.mtp=null"])
    names = ["fwd.attn", "fwd.router", "fwd.dispatch", "fwd.experts", "fwd.combine",
             "fwd.unpermute"]
    assert all((n, 2) in on for n in names) and not any((n, 2) in off for n in names)
    # the MTP layer over 2 tokens per request, as the target's MoE layer
    assert on[("fwd.attn", 2)].flops == on[("fwd.attn", 1)].flops
    assert _expert_tokens(path, 2) == 8 * B * 2 * 2
    res, cfg = resolve_serve(path)
    spec = res.model
    head = on[("fwd.lm_head", -1)]
    # the verify's head over 2B tokens; the draft's embedding, enorm + hnorm, eh_proj
    # (2B x 2h -> h) over 2B, its head on B (the last position of each request)
    want = [*serve_costs.head_kernels(spec, 2 * B, 1), *costs.embedding_kernels(
        spec, 2 * B, 1, "fwd"), costs.memory_op("mtp_norm", 2 * 4 * 2 * B * H,
                                                 2 * 4 * 2 * B * H, "fwd", count=2),
        costs.gemm("mtp_eh_proj", 2 * B, H, 2 * H, "fwd"), *serve_costs.head_kernels(spec, B, 1)]
    assert [k.name for k in head.kernels] == [k.name for k in want]
    assert head.flops == pytest.approx(sum(k.flops for k in want), rel=1e-12)
    eh = next(k for k in head.kernels if k.name == "mtp_eh_proj")
    assert eh.flops == 2.0 * (2 * B) * H * (2 * H)
    lm = [k for k in head.kernels if k.name == "lm_head"]
    assert [k.flops for k in lm] == [2.0 * 2 * B * VOCAB * H, 2.0 * B * VOCAB * H]


@pytest.mark.parametrize("engine", ["exact", "fast"])
def test_tpot_is_the_step_over_the_tokens_a_request_emits(tmp_path, engine):
    path = _scenario(tmp_path, output=10)
    res, cfg = resolve_serve(path, [f"engine.mode={engine}"])
    s = simulate_serve(res, cfg).summary
    step = s["step_time_s"]
    assert s["tpot_s"] == step / 1.875
    assert s["request_decode_s"] == 10 * step / 1.875
    assert s["tokens_per_step"] == 8 * B * 1.875              # 8 GPUs x B requests
    assert s["tokens_per_s"] == 8 * B * 1.875 / step
    m = s["mtp"]
    assert m["emitted_per_request"] == 1.875 and m["step_s"] == step
    assert 0 < m["draft_s"] < step and m["verify_s"] == step - m["draft_s"]
    assert s["serve"]["mtp"] == MTP and s["serve"]["tokens_per_gpu"] == 2 * B


def test_both_engines_run_the_same_step(tmp_path):
    path = _scenario(tmp_path, two_microbatch=True)
    got = []
    for engine in ("exact", "fast"):
        res, cfg = resolve_serve(path, [f"engine.mode={engine}"])
        s = simulate_serve(res, cfg).summary
        got.append((s["step_time_s"], s["model_flops"], s["mtp"]["draft_s"]))
    assert got[0] == pytest.approx(got[1], rel=1e-9)


def test_off_by_default_and_an_mtp_depth_alone_changes_nothing_in_the_step(tmp_path):
    path = _scenario(tmp_path, mtp=None)
    res, cfg = resolve_serve(path)
    assert cfg.mtp is None and cfg.tokens_per_request == 1
    s = simulate_serve(res, cfg).summary
    assert "mtp" not in s and "mtp" not in s["serve"]
    assert s["tpot_s"] == s["step_time_s"] and s["tokens_per_step"] == 8 * B
    assert max(op.layer for op in _ops(path).values()) == 1


@pytest.mark.parametrize("mtp, field", [
    ({"draft_tokens": 2}, "serve.mtp.draft_tokens"),
    ({"acceptance": 1.2}, "serve.mtp.acceptance"),
    ({"acceptance": "high"}, "serve.mtp.acceptance"),
    ({"draft": 1}, "serve.mtp.draft"),
    ("on", "serve.mtp"),
])
def test_bad_mtp_is_one_line_naming_the_field(tmp_path, mtp, field):
    with pytest.raises(InputError) as e:
        resolve_serve(_scenario(tmp_path, mtp=mtp))
    assert e.value.field == field
    assert "\n" not in str(e.value)


def test_mtp_needs_a_decode_step_and_a_model_with_an_mtp_depth(tmp_path):
    with pytest.raises(InputError) as e:
        resolve_serve(_scenario(tmp_path, phase="prefill", prompt=64))
    assert e.value.field == "serve.phase"
    with pytest.raises(InputError) as e:
        resolve_serve(_scenario(tmp_path, mtp_layers=0))
    assert e.value.field == "model.mtp_layers"


def test_a_load_run_refuses_mtp_in_one_line():
    # the request-level run emits one token per request per step: serve.mtp is refused
    from moesim.traffic.session import load_config, serve_under_load
    res, cfg = resolve_serve("mixtral-8x7b-serve-load",
                             ["model.mtp_layers=1", "serve.mtp={draft_tokens: 1}"])
    with pytest.raises(InputError) as e:
        serve_under_load(res, cfg, load_config(res, requests=False))
    assert e.value.field == "serve.mtp" and "\n" not in str(e.value)
