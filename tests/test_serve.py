"""Serving (issue 16): decode and prefill steps, KV bytes, memory table, overlap, CLI.

Every expected number below is worked out by hand from the model dims and the device's
datasheet figures (H100 SXM: 989 TFLOP/s bf16, 3.35 TB/s HBM, 80 GB) with the roofline's
documented constants (HBM efficiency 0.8, 4 µs per kernel launch, small-GEMM efficiency
0.75·m/(m+128) floored at 0.02).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from moesim.cli import main
from moesim.model.presets import DEEPSEEK_V3, MIXTRAL_8X7B
from moesim.scenario.sections.serve import serve_from_dict
from moesim.serve.config import serving_scenario
from moesim.serve.kv import kv_bytes_per_token
from moesim.serve.memory import largest_batch, table
from moesim.serve.program import build_serve_step
from moesim.serve.run import resolve_serve, simulate_serve
from moesim.wiring import resolve

PEAK = 989e12
BW = 3.35e12 * 0.8          # achieved HBM bytes/s
LAUNCH = 4e-6
GRAPH_KERNEL = 65536 / 52e9  # a kernel replayed from a CUDA graph on Hopper (gpu-benches)
H, F, A, D, V, L = 1024, 4096, 8, 128, 4096, 2   # the dense test model


def _scenario(tmp_path, serve: dict, model: dict | None = None, name: str = "s",
              cluster: dict | None = None, routing: dict | None = None) -> str:
    data = {"name": name,
            "cluster": cluster or {"topology": "dgx-h100", "params": {"gpus_per_node": 1}},
            "model": model or {"layers": L, "hidden": H, "heads": A, "kv_heads": A,
                               "head_dim": D, "vocab": V, "attention": "mha", "dense_ffn": F,
                               "n_experts": 0},
            "serve": serve,
            # the roofline alone: every expected time below is its arithmetic (the kernel
            # catalog would price the memory-bound kernels at its streaming bandwidth)
            "compute": {"model": "roofline"}}
    if routing:
        data["routing"] = routing
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


# ---------------------------------------------------------------- KV cache bytes

def test_kv_bytes_gqa_and_mla_by_hand():
    # GQA, Mixtral 8x7B: 2 (K and V) · 32 layers · 8 KV heads · 128 · 2 bytes
    assert kv_bytes_per_token(MIXTRAL_8X7B, 2) == 2 * 32 * 8 * 128 * 2 == 131072
    # TP2 splits the 8 KV heads: 4 per rank
    assert kv_bytes_per_token(MIXTRAL_8X7B, 2, tp=2) == 2 * 32 * 4 * 128 * 2
    # MLA, DeepSeek-V3: 61 layers · (512 latent + 64 RoPE) · 2 bytes; TP does not split it
    assert kv_bytes_per_token(DEEPSEEK_V3, 2) == 61 * (512 + 64) * 2 == 70272
    assert kv_bytes_per_token(DEEPSEEK_V3, 2, tp=8) == 70272
    assert kv_bytes_per_token(DEEPSEEK_V3, 1) == 61 * 576


# ---------------------------------------------------------------- decode: memory-bound

def test_dense_decode_batch1_is_weight_and_kv_bytes_over_bandwidth(tmp_path):
    c = 1000
    res, cfg = resolve_serve(_scenario(tmp_path, {"phase": "decode", "batch_per_gpu": 1,
                                                  "context": c}))
    step = simulate_serve(res, cfg).summary["step_time_s"]
    # weights read once (bf16): per layer QKV h·3h... written as (a+2kv)·d·h, out a·d·h,
    # gate+up+down 3·h·f; embedding row not a GEMM; LM head V·h
    w = 2 * (L * (3 * A * D * H + A * D * H + 3 * H * F) + V * H)
    # KV cache read: context · 2 (K, V) · 8 heads · 128 · 2 bytes per layer
    kv = 2 * L * c * 2 * A * D
    # activations (bf16 unless said): per layer 2 norms 4·h + FP32 1/rms 4 bytes each,
    # 2 residual adds 6·h; QKV in h + out 3h; rotary on q and k (a + kv heads of d, read
    # and written); attention q and o 2·a·d; out proj in a·d + out h; KV write 2·a·d; gate
    # and up fused: in h + out 2f; SiLU·up 3f; down in f + out h; embedding 2·h; head norm
    # 2h, GEMM in h + out V, sampler V·(2 + 4)
    per_layer = (2 * 20 * H // 2 + 2 * 4 + 2 * (H + 3 * H) + 2 * 2 * 2 * A * D
                 + 2 * 2 * A * D + 2 * (A * D + H)
                 + 2 * 2 * A * D + 2 * (H + 2 * F) + 2 * 3 * F + 2 * (F + H))
    act = L * per_layer + 2 * 2 * H + 2 * 2 * H + 2 * (H + V) + 6 * V
    # launches: per layer 4 norm/residual ops + QKV + rotary + attention + out + KV write
    # + gate/up (one GEMM), act, down; embedding; head: norm, GEMM, sampler
    launches = L * 12 + 1 + 3
    assert step == pytest.approx(launches * LAUNCH + (w + kv + act) / BW, rel=1e-12)
    # replayed from a CUDA graph (serve.cuda_graphs): the same bytes, no host launch;
    # each kernel pays the graph floor instead
    res, cfg = resolve_serve(_scenario(tmp_path, {"phase": "decode", "batch_per_gpu": 1,
                                                  "context": c, "cuda_graphs": True},
                                       name="graphed"))
    graphed = simulate_serve(res, cfg).summary["step_time_s"]
    assert graphed == pytest.approx(launches * GRAPH_KERNEL + (w + kv + act) / BW,
                                    rel=1e-12)
    assert step - graphed == pytest.approx(launches * (LAUNCH - GRAPH_KERNEL), rel=1e-9)


def test_cuda_graphs_leave_prefill_eager(tmp_path):
    # vLLM captures decode batches only; a prefill step launches every kernel
    steps = []
    for graphs in (False, True):
        res, cfg = resolve_serve(_scenario(tmp_path, {"phase": "prefill", "batch_per_gpu": 1,
                                                      "prompt": 512, "cuda_graphs": graphs},
                                           name=f"p{graphs}"))
        steps.append(simulate_serve(res, cfg).summary["step_time_s"])
    assert steps[0] == steps[1]


def _ffn_op(tmp_path, batch: int) -> float:
    res, cfg = resolve_serve(_scenario(tmp_path, {"phase": "decode", "batch_per_gpu": batch,
                                                  "context": 100}, name=f"b{batch}"))
    plan = build_serve_step(res, cfg)
    (op,) = [o for o in plan.programs[0] if o.name == "fwd.ffn" and o.layer == 0]
    return op.duration_s


def test_decode_gemms_memory_bound_until_the_ridge(tmp_path):
    # One FFN GEMM (h×f) for b tokens: compute 2·b·h·f / (peak · 0.75·b/(b+128)) =
    # 2·h·f·(b+128)/(0.75·peak); memory 2·(b·h + h·f + b·f)/BW. They cross where
    # (b+128)/(0.75·peak) = (1 + b/f + b/h)/BW, i.e. b* = (0.75·peak/BW - 128) /
    # (1 - 0.75·peak/BW·(1/f + 1/h)) ≈ 225 (the fused gate+up GEMM, n = 2f, crosses a
    # little earlier: b* = (r - 128) / (1 - r·(1/2f + 1/h))).
    r = 0.75 * PEAK / BW
    b_star = (r - 128) / (1 - r * (1 / F + 1 / H))
    assert 200 < b_star < 250
    assert 200 < (r - 128) / (1 - r * (1 / (2 * F) + 1 / H)) < b_star

    def expected(b: int, bound: str) -> float:
        def gemm(n: int, k: int) -> float:      # b × n × k: one of the two bounds
            return (2 * n * k * (b + 128) / (0.75 * PEAK) if bound == "compute"
                    else 2 * (b * k + k * n + b * n) / BW)
        # gate and up fused (n = 2f: one GEMM, X read once), SiLU·up, down
        return 3 * LAUNCH + gemm(2 * F, H) + gemm(H, F) + 2 * 3 * b * F / BW

    for b in (1, 16, 64, 128):
        assert b < b_star
        assert _ffn_op(tmp_path, b) == pytest.approx(expected(b, "memory"), rel=1e-12)
    for b in (256, 1024):
        assert b > b_star
        assert _ffn_op(tmp_path, b) == pytest.approx(expected(b, "compute"), rel=1e-12)
    # memory-bound: 64 requests cost barely more than one (weights read once)
    assert _ffn_op(tmp_path, 64) < 1.1 * _ffn_op(tmp_path, 1)


def test_decode_attention_reads_the_kv_cache_linear_in_context(tmp_path):
    def attn(c: int) -> float:
        res, cfg = resolve_serve(_scenario(tmp_path, {"phase": "decode", "batch_per_gpu": 8,
                                                      "context": c}, name=f"c{c}"))
        (op,) = [o for o in build_serve_step(res, cfg).programs[0]
                 if o.name == "fwd.attn" and o.layer == 0]
        return op.duration_s
    # 8 requests × c tokens × 2·8·128 values × 2 bytes more per extra context token
    assert attn(4000) - attn(2000) == pytest.approx(8 * 2000 * 2 * A * D * 2 / BW, rel=1e-9)


def test_prefill_attention_is_quadratic_in_the_prompt(tmp_path):
    def core_flops(p: int) -> float:
        res, cfg = resolve_serve(_scenario(tmp_path, {"phase": "prefill", "batch_per_gpu": 1,
                                                      "prompt": p}, name=f"p{p}"))
        from moesim.serve.costs import prefill_attention_kernels
        ks = prefill_attention_kernels(res.model, p, p, 1, 2)
        (core,) = [k for k in ks if k.name == "attention"]
        return core.flops
    # causal half of p × p scores and values: 0.5 · 2 · p · p · a · 2d
    assert core_flops(1024) == 0.5 * 2 * 1024 * 1024 * A * 2 * D
    assert core_flops(2048) == 4 * core_flops(1024)


# ---------------------------------------------------------------- memory table

def test_largest_batch_agrees_with_the_memory_table():
    cfg = serve_from_dict({"phase": "decode", "batch_per_gpu": 32, "context": 4096,
                           "ep": 8}, "t")
    cap = 80e9
    b = largest_batch(MIXTRAL_8X7B, cfg, cap)
    assert b > 1
    assert table(MIXTRAL_8X7B, cfg, cap, b)["fits"]
    assert not table(MIXTRAL_8X7B, cfg, cap, b + 1)["fits"]
    t = table(MIXTRAL_8X7B, cfg, cap, b)
    # KV per request by hand: 4096 tokens · 131072 bytes; b requests on a TP1 rank
    assert t["kv_per_request_bytes"] == 4096 * 131072
    assert t["kv_total_bytes"] == b * 4096 * 131072
    assert t["free_bytes"] == pytest.approx(cap - t["weights_bytes"] - t["kv_total_bytes"]
                                            - t["activations_bytes"])
    # the next request's KV alone no longer fits in what is free
    assert t["free_bytes"] < table(MIXTRAL_8X7B, cfg, cap, b + 1)["used_bytes"] - t["used_bytes"]


def test_memory_weights_hold_every_local_expert():
    cfg = serve_from_dict({"phase": "decode", "ep": 8}, "t")
    t = table(MIXTRAL_8X7B, cfg, 80e9)
    m = MIXTRAL_8X7B
    attn = m.hidden * (m.heads + 2 * m.kv_heads) * m.head_dim + m.heads * m.head_dim * m.hidden
    per_layer = attn + 2 * m.hidden + m.hidden * m.n_experts + 3 * m.hidden * m.expert_ffn
    params = m.layers * per_layer + 2 * m.vocab * m.hidden + m.hidden   # + final norm
    assert t["weights_bytes"] == 2 * params


# ---------------------------------------------------------------- EP, overlap, routing

def _ep_scenario(tmp_path, name: str, **serve) -> str:
    model = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "head_dim": 128,
             "vocab": 4096, "attention": "mha", "dense_ffn": 4096, "n_experts": 8,
             "top_k": 2, "expert_ffn": 2048}
    s = {"phase": "decode", "batch_per_gpu": 64, "context": 512, "ep": 8,
         "ep_backend": "nccl", **serve}
    return _scenario(tmp_path, s, model, name, cluster={"topology": "dgx-h100"})


def _step_and_parts(res, cfg):
    s = simulate_serve(res, cfg).summary
    comm = max(r["breakdown_s"]["ep_dispatch"] + r["breakdown_s"]["ep_combine"]
               + r["breakdown_s"]["stall"] for r in s["per_rank"])
    compute = max(r["breakdown_s"]["compute"] for r in s["per_rank"])
    return s["step_time_s"], comm, compute


def test_two_microbatch_overlap_hides_at_most_min_comm_compute(tmp_path):
    res, cfg = resolve_serve(_ep_scenario(tmp_path, "ov", two_microbatch=True))
    assert res.scenario.overlap.ep_comm_overlap
    seq_scn = dataclasses.replace(res.scenario, overlap=dataclasses.replace(
        res.scenario.overlap, ep_comm_overlap=False))
    seq = resolve(seq_scn)
    t_seq, comm, compute = _step_and_parts(seq, cfg)
    t_ov, _, _ = _step_and_parts(res, cfg)
    assert comm > 0 and compute > 0
    assert t_ov < t_seq                                   # something was hidden
    assert t_seq - t_ov <= min(comm, compute) + 1e-12


def test_two_microbatch_never_lengthens_a_step_with_nothing_to_hide(tmp_path):
    # EP1: no all-to-all to hide; the two micro-batches' programs are the same either way
    path = _scenario(tmp_path, {"phase": "decode", "batch_per_gpu": 8, "two_microbatch": True})
    res, cfg = resolve_serve(path)
    off = resolve(dataclasses.replace(res.scenario, overlap=dataclasses.replace(
        res.scenario.overlap, ep_comm_overlap=False)))
    assert (simulate_serve(res, cfg).summary["step_time_s"]
            == simulate_serve(off, cfg).summary["step_time_s"])


def test_hot_expert_stalls_a_decode_step(tmp_path):
    res, cfg = resolve_serve(_ep_scenario(tmp_path, "hot"), [
        "routing.kind=hot", "routing.hot_experts=1", "routing.hot_fraction=0.5"])
    r = simulate_serve(res, cfg)
    hot = [s for s in r.spans if s.kind == "stall" and s.expert == 0]
    assert hot                                        # waits name the hot expert 0
    assert r.summary["experts"]["max_over_mean_max"] > 3.0
    assert r.summary["breakdown_s"]["stall"] > 0


def test_decode_tokens_and_requests(tmp_path):
    res, cfg = resolve_serve(_ep_scenario(tmp_path, "tok"))
    s = simulate_serve(res, cfg).summary
    assert s["phase"] == "decode" and s["tpot_s"] == s["step_time_s"]
    assert s["tokens_per_step"] == 8 * 64 == s["requests_per_step"]
    assert s["tokens_per_s"] == pytest.approx(512 / s["step_time_s"])
    assert s["tokens_per_s_per_gpu"] == pytest.approx(s["tokens_per_s"] / 8)
    tok = s["experts"]["tokens_per_expert"]
    assert sum(map(sum, tok)) == 2 * 512 * 2        # 2 MoE layers · 512 tokens · top-2


# ---------------------------------------------------------------- CLI, determinism, errors

@pytest.mark.slow
def test_same_seed_same_bytes(tmp_path, capsys):
    path = _ep_scenario(tmp_path, "det", two_microbatch=True)
    outs = []
    for d in ("a", "b"):
        assert main(["serve", path, "--quiet", "-o", str(tmp_path / d)]) == 0
        outs.append((tmp_path / d / "summary.json").read_bytes())
    assert outs[0] == outs[1]
    for f in ("trace.json", "timeline.png", "stalls.csv", "summary.md"):
        assert (tmp_path / "a" / f).is_file()
    md = (tmp_path / "a" / "summary.md").read_text()
    assert "## Serving" in md and "TPOT" in md and "largest batch" in md
    capsys.readouterr()
    assert main(["serve", path, "--no-files", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    for key in ("phase", "step_time_s", "tpot_s", "tokens_per_s", "tokens_per_s_per_gpu",
                "breakdown_s", "per_rank", "experts", "memory"):
        assert key in s
    for key in ("weights_bytes", "kv_per_request_bytes", "kv_total_bytes",
                "activations_bytes", "free_bytes", "largest_batch_per_gpu"):
        assert key in s["memory"]


@pytest.mark.parametrize("override, field", [
    ("serve.phase=train", "serve.phase"),
    ("serve.batch_per_gpu=0", "serve.batch_per_gpu"),
    ("serve.batch_per_gpu=.nan", "serve.batch_per_gpu"),
    ("serve.tp=3", "serve.tp"),
    ("serve.ep=3", "serve.ep"),
    ("serve.attn_dp=4", "serve.attn_dp"),
    ("serve.ep_backend=gloo", "serve.ep_backend"),
    ("serve.two_microbatch=maybe", "serve.two_microbatch"),
    ("serve.cuda_graphs=1", "serve.cuda_graphs"),
    ("serve.batch_per_gpu=63", "serve.batch_per_gpu"),    # odd with two micro-batches
    ("serve.colour=red", "serve.colour"),
    ("engine.mode=turbo", "engine.mode"),
    # overlap a serving step sets itself: refused, not dropped without a word
    ("overlap.shared_expert=true", "overlap.shared_expert"),
    ("overlap.cuda_graphs=[attn]", "overlap.cuda_graphs"),
    ("overlap.kind=static", "overlap.kind"),
])
def test_bad_input_one_line(tmp_path, capsys, override, field):
    path = _ep_scenario(tmp_path, "bad", two_microbatch=True)
    assert main(["serve", path, "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    # a value given by --set is blamed on the command line (issue 12 item 14)
    assert f"command line: --set {field}:" in err, err


def test_missing_serve_section_is_one_line(tmp_path, capsys):
    p = tmp_path / "n.yaml"
    p.write_text(yaml.safe_dump({"name": "n", "cluster": {"topology": "dgx-h100"},
                                 "model": {"preset": "toy"}}))
    assert main(["serve", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "serve:" in err


def test_serving_layout_is_pp1_dp_attention():
    cfg = serve_from_dict({"phase": "prefill", "batch_per_gpu": 4, "prompt": 4096,
                           "ep": 32, "two_microbatch": True}, "t")
    from moesim.scenario.schema import Scenario
    scn = serving_scenario(Scenario(name="x"), cfg)
    assert (scn.parallel.pp, scn.parallel.ep, scn.parallel.ep_backend.kind) == (1, 32, "deepep")
    assert (scn.schedule.microbatches, scn.schedule.micro_batch_size,
            scn.schedule.seq_len) == (2, 2, 4096)    # 16K tokens per GPU in two halves
    dec = serve_from_dict({"phase": "decode", "batch_per_gpu": 128, "ep": 128}, "t")
    assert serving_scenario(Scenario(name="x"), dec).parallel.ep_backend.kind == "deepep-ll"


@pytest.mark.parametrize("overrides", [
    [], ["serve.two_microbatch=true"], ["routing.kind=hot", "routing.hot_fraction=0.5"],
    # DeepEP normal kernels hold 20 SMs: compute under them is re-rated
    ["serve.two_microbatch=true", "serve.ep_backend=deepep", "serve.phase=prefill",
     "serve.prompt=256", "serve.batch_per_gpu=2"],
    ["serve.two_microbatch=true", "serve.ep_backend=deepep-ll", "routing.kind=hot",
     "routing.hot_fraction=0.5"],
    # TP2 x attention DP4, EP4: TP all-reduces and the head's distributed top-k
    ["serve.tp=2", "serve.ep=4", "serve.batch_per_gpu=16", "serve.two_microbatch=true"],
    # decode replayed from a CUDA graph: both engines drop every launch
    ["serve.cuda_graphs=true"], ["serve.cuda_graphs=true", "serve.two_microbatch=true"],
    # every routed expert launched on its own (serving's default is grouped)
    ["compute.expert_launches=per_expert", "serve.two_microbatch=true"]])
def test_fast_engine_matches_exact_step(tmp_path, overrides):
    path = _ep_scenario(tmp_path, "fx")
    steps = {}
    for mode in ("exact", "fast"):
        res, cfg = resolve_serve(path, [*overrides, f"engine.mode={mode}"])
        s = simulate_serve(res, cfg).summary
        steps[mode] = s
    assert steps["fast"]["step_time_s"] == pytest.approx(steps["exact"]["step_time_s"],
                                                         rel=1e-3)
    step = steps["exact"]["step_time_s"]
    for k, v in steps["exact"]["breakdown_s"].items():    # within 0.5 % of the step
        assert steps["fast"]["breakdown_s"][k] == pytest.approx(v, abs=5e-3 * step)
    assert steps["fast"]["experts"] == steps["exact"]["experts"]     # same routing
    assert steps["fast"]["engine"] == "fast"


def test_prefill_summary_ttft_and_tokens(tmp_path):
    res, cfg = resolve_serve(_scenario(tmp_path, {"phase": "prefill", "batch_per_gpu": 2,
                                                  "prompt": 512}))
    s = simulate_serve(res, cfg).summary
    assert s["phase"] == "prefill" and s["ttft_s"] == s["step_time_s"] and "tpot_s" not in s
    assert s["tokens_per_step"] == 2 * 512 and s["requests_per_step"] == 2
    # the prompts' KV cache: 2 requests · 512 tokens · 2·2 layers·8 heads·128 · 2 bytes
    assert s["memory"]["kv_total_bytes"] == 2 * 512 * 2 * L * A * D * 2


def test_fp8_kv_cache_halves_its_bytes():
    bf = serve_from_dict({"phase": "decode", "context": 4096}, "t")
    f8 = serve_from_dict({"phase": "decode", "context": 4096, "kv_dtype": "fp8"}, "t")
    assert (table(DEEPSEEK_V3, f8, 80e9)["kv_per_request_bytes"] * 2
            == table(DEEPSEEK_V3, bf, 80e9)["kv_per_request_bytes"] == 4096 * 70272)


def test_deepep_needs_a_hidden_multiple_of_128(tmp_path, capsys):
    # DeepEP's kernels static_assert kHidden % 128 == 0: with hidden 1000, `auto` runs the
    # exchange on NCCL (the same step as ep_backend: nccl); asking for DeepEP is one line
    path = _ep_scenario(tmp_path, "h1000", ep_backend="auto")
    args = ["model.hidden=1000", "model.head_dim=125"]
    res, cfg = resolve_serve(path, args)
    assert res.scenario.parallel.ep_backend.kind == "nccl"
    auto = simulate_serve(res, cfg).summary["step_time_s"]
    res, cfg = resolve_serve(path, [*args, "serve.ep_backend=nccl"])
    assert simulate_serve(res, cfg).summary["step_time_s"] == auto
    res, cfg = resolve_serve(path, ["serve.ep_backend=auto"])      # hidden 1024: DeepEP LL
    assert res.scenario.parallel.ep_backend.kind == "deepep-ll"
    sets = [x for a in args for x in ("--set", a)]
    assert main(["serve", path, *sets, "--set", "serve.ep_backend=deepep-ll"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "serve.ep_backend" in err and "multiple of 128" in err
