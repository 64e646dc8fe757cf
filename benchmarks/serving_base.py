"""The published serving figures and the helpers the serving comparisons share
(``benchmarks/serving_published.py``, ``benchmarks/serving_sglang.py``): the published
numbers with their sources, a serving step's mean over routing steps, tokens/s per node,
a step's parts and one MoE layer's stages."""

from __future__ import annotations

import statistics

#: the day-6 overview's figures (see the module doc)
DECODE_TOKENS_PER_S_PER_NODE = 14.8e3
DECODE_TOKENS_PER_S_PER_REQUEST = (20.0, 22.0)
PREFILL_TOKENS_PER_S_PER_NODE = 73.7e3
CACHE_HIT_SHARE = 342 / 608          # "608B, of which 342B tokens (56.3%) hit"
#: the LMSYS blog's decode table, column "SGLang (Default)" (see the module doc)
SGLANG_TOKENS_PER_S_PER_NODE = 22_282
SGLANG_ITL_S = 0.100                 # "Inter-Token Latency (ITL) at approximately 100ms"
#: the blog's TBO ablation for decode: "The speedup reaches 25.5% at 256 tokens with a
#: performance of 22,310 tokens per second"
SGLANG_TBO_TOKENS_PER_S_PER_NODE = 22_310
SGLANG_TBO_SPEEDUP = 1.255
#: the blog's prefill, 4 nodes EP32, 16,384 tokens per device, input length 4,096 ("Overall
#: Throughput" table): "SGLang (Default)" and "SGLang + Simulated Perfect EPLB"
SGLANG_PREFILL_TOKENS_PER_S_PER_NODE = 50_302
SGLANG_PREFILL_PERFECT_EPLB_PER_NODE = 59_337
SGLANG_TTFT_S = (2.0, 5.0)           # "Time to First Token (TTFT) at 2-5 seconds"
#: "TBO achieves a 27% to 35% throughput increase compared to the vanilla setup" (prefill)
SGLANG_PREFILL_TBO_SPEEDUP = (27, 35)
#: the blog's decode table, column "DeepSeek Profile" (derived by the blog from
#: deepseek-ai/profile-data's decode.json: batch 128, KV 4,096, 16 nodes)
DEEPSEEK_PROFILE_TOKENS_PER_S_PER_NODE = 18_598
#: the blog's "Detail Breakdown" of decode: "Both DeepSeek and SGLang show dispatch times of
#: ~0.17ms per layer" (kernel time, "busy-waiting for data")
PROFILE_DISPATCH_S = 0.17e-3
#: a MoE layer of the middle of the model, whose stages are printed
STAGE_LAYER = 30
#: the overlaps and placements compared on DeepSeek's production point
EPLB = "routing.placement={kind: eplb, redundant: 32, mode: global, loads: policy}"
EPLB_NO_COPIES = "routing.placement={kind: eplb, redundant: 0, mode: global, loads: policy}"
NO_EPLB = "routing.placement=null"
#: the production scenario's earlier layout, EP128 on 16 nodes (2 experts per GPU without
#: copies), beside DeepSeek's EP144 with 32 redundant
EP128 = ["cluster.nodes=16", "serve.ep=128"]
#: the SGLang scenario's earlier layout: EP64 on 8 nodes, uniform routing, no placement
SGLANG_EARLIER = ["cluster.nodes=8", "serve.ep=64", "routing.kind=uniform",
                  "routing.placement=null"]


def _mean_step(name: str, overrides: list[str], steps: int) -> tuple[float, dict, object, object]:
    """Mean step time over ``steps`` routing steps (:class:`moesim.serve.steps.ServeSteps`),
    per token a request emits in it (a decode step with ``serve.mtp`` emits 1 + acceptance:
    the mean TPOT, :mod:`moesim.serve.mtp`), and the first step's breakdown (a full
    summary)."""
    from moesim.serve.mtp import emitted_tokens
    from moesim.serve.run import resolve_serve, simulate_serve
    from moesim.serve.steps import ServeSteps
    res, cfg = resolve_serve(name, overrides)
    pricer = ServeSteps(res, cfg)
    times = [pricer.step_s(step=cfg.step + i) for i in range(steps)]
    s = simulate_serve(res, cfg, spans=False).summary
    assert s["step_time_s"] == times[0]        # the summary's step is the priced one
    return statistics.fmean(times) / emitted_tokens(cfg), s, res, cfg


def decode_per_node(tpot: float, res, cfg) -> float:
    """Output tokens/s per node of a decode step of ``tpot`` seconds."""
    return cfg.batch_per_gpu * res.scenario.gpus_per_node / tpot


def prefill_per_node(ttft: float, res, cfg) -> float:
    """Input tokens/s per node of a prefill step of ``ttft`` seconds (every prompt of
    every GPU computed)."""
    nodes = res.layout.world // res.scenario.gpus_per_node
    return cfg.batch_per_gpu * cfg.prompt * res.layout.world / ttft / nodes


def _parts(s: dict) -> str:
    b = s["breakdown_s"]
    step = s["step_time_s"]
    keep = [k for k in ("compute", "ep_dispatch", "ep_combine", "stall", "tp") if b.get(k)]
    return ", ".join(f"{k} {b[k] * 1e3:.1f} ms ({b[k] / step * 100:.0f} %)" for k in keep)


def _stages(name: str, overrides: list[str]) -> str:
    """One MoE layer's parts on rank 0, micro-batch 0 (:data:`STAGE_LAYER`): compute
    blocks and the all-to-alls' time on the wire (from send to received, the late partner
    included), in µs."""
    from moesim.serve.run import resolve_serve, simulate_serve
    res, cfg = resolve_serve(name, overrides)
    spans = [sp for sp in simulate_serve(res, cfg).spans if sp.rank == 0
             and sp.layer == STAGE_LAYER and sp.microbatch == 0]
    parts: dict[str, float] = {}
    label = {"fwd.attn": "attention", "fwd.attn0": "ATTN-0", "fwd.attn1": "ATTN-1",
             "fwd.router": "gate", "fwd.shared_fc1": "SHARED", "fwd.shared_fc2": "SHARED",
             "fwd.experts": "MLP", "fwd.unpermute": "unpermute"}
    for sp in spans:
        key = sp.kind.replace("ep_", "").upper() if sp.kind in ("ep_dispatch", "ep_combine") \
            else label.get(sp.name) if sp.stream == "compute" else None
        if key:
            parts[key] = parts.get(key, 0.0) + sp.dur_s
    return ", ".join(f"{k} {v * 1e6:.0f}" for k, v in parts.items())
