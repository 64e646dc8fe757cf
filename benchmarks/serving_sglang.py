"""SGLang's decode on H100 against the LMSYS blog (``deepseek-v3-decode-sglang``): the
rows of ``benchmarks/serving_published.py``'s SGLang decode section, the step's parts and
each part beside the figure the blog publishes for it."""

from __future__ import annotations

from serving_base import (
    PROFILE_DISPATCH_S,
    SGLANG_EARLIER,
    SGLANG_ITL_S,
    SGLANG_TBO_SPEEDUP,
    SGLANG_TBO_TOKENS_PER_S_PER_NODE,
    SGLANG_TOKENS_PER_S_PER_NODE,
    STAGE_LAYER,
    _mean_step,
    _parts,
    _stages,
    decode_per_node,
)


def sglang_decode(steps: int) -> None:
    """SGLang's large-scale-EP decode on H100 (LMSYS blog, 2025-05-05)."""
    print("## Decode: deepseek-v3-decode-sglang (SGLang on H100, EP72 on 9 nodes, 32 "
          "redundant experts, 256 requests per GPU, KV 2,000)")
    print()
    pub = SGLANG_TOKENS_PER_S_PER_NODE
    print("| run | TPOT | output tokens/s per node | published | error |")
    print("|---|---|---|---|---|")
    rows = []
    for label, ov in (("the scenario (CUDA graphs, `ll_sms: compute`)", []),
                      ("`serve.ll_sms=none` (the low-latency kernels hold no SMs)",
                       ["serve.ll_sms=none"]),
                      ("`serve.cuda_graphs=false` (eager)", ["serve.cuda_graphs=false"]),
                      ("`serve.decode_overlap=five_stage`",
                       ["serve.decode_overlap=five_stage"]),
                      ("`serve.mla_decode=gemm` (training's MLA kernels)",
                       ["serve.mla_decode=gemm"]),
                      ("EP64 on 8 nodes, uniform routing, no placement (the earlier layout)",
                       SGLANG_EARLIER)):
        tpot, s, res, cfg = _mean_step("deepseek-v3-decode-sglang", ov, steps)
        per_node = decode_per_node(tpot, res, cfg)
        rows.append((label, tpot, s))
        print(f"| {label} | {tpot * 1e3:.2f} ms | {per_node:,.0f} | {pub:,} "
              f"| {(per_node / pub - 1) * 100:+.1f} % |")
    step_pub = cfg.batch_per_gpu * res.scenario.gpus_per_node / pub
    print(f"| published, implied step (256 x 8 / 22,282) | {step_pub * 1e3:.1f} ms [D] | "
          f"| ITL ~{SGLANG_ITL_S * 1e3:.0f} ms (blog, \"Limitations\") | |")
    print()
    off, _, _, _ = _mean_step("deepseek-v3-decode-sglang", ["serve.two_microbatch=false"],
                              steps)
    pub_off = SGLANG_TBO_TOKENS_PER_S_PER_NODE / SGLANG_TBO_SPEEDUP
    per_off = decode_per_node(off, res, cfg)
    print("Two-batch overlap on and off (the blog's TBO ablation at 256 tokens: \"The speedup "
          "reaches 25.5% at 256 tokens with a performance of 22,310 tokens per second\"):")
    print()
    print("| run | TPOT | output tokens/s per node | published | error |")
    print("|---|---|---|---|---|")
    print(f"| `serve.two_microbatch=false` | {off * 1e3:.2f} ms | {per_off:,.0f} | "
          f"{pub_off:,.0f} [D] (22,310 / 1.255) | {(per_off / pub_off - 1) * 100:+.1f} % |")
    off64, _, _, _ = _mean_step("deepseek-v3-decode-sglang",
                                [*SGLANG_EARLIER, "serve.two_microbatch=false"], steps)
    per_off64 = decode_per_node(off64, res, cfg)
    print(f"| `serve.two_microbatch=false`, EP64 on 8 nodes, uniform (the earlier layout) | "
          f"{off64 * 1e3:.2f} ms | {per_off64:,.0f} | {pub_off:,.0f} [D] | "
          f"{(per_off64 / pub_off - 1) * 100:+.1f} % |")
    for label, tpot, _ in rows:
        if "EP64" in label:
            print(f"| TBO speed-up, {label} | | {off64 / tpot:.3f}x | "
                  f"{SGLANG_TBO_SPEEDUP:.3f}x | "
                  f"{(off64 / tpot / SGLANG_TBO_SPEEDUP - 1) * 100:+.1f} % |")
            continue
        if "eager" in label or "mla" in label:      # the run without TBO is the scenario's
            continue
        print(f"| TBO speed-up, {label} | | {off / tpot:.3f}x | {SGLANG_TBO_SPEEDUP:.3f}x | "
              f"{(off / tpot / SGLANG_TBO_SPEEDUP - 1) * 100:+.1f} % |")
    print()
    for label, _, s in rows:
        print(f"Mean of {steps} routing steps; {label}, the step's parts (mean over ranks, "
              f"step 0): {_parts(s)}; tokens per expert, max/mean over the layers' "
              f"experts: {s['experts']['max_over_mean_max']:.2f}; "
              f"memory: weights {s['memory']['weights_bytes'] / 1e9:.2f} GB, KV "
              f"{s['memory']['kv_total_bytes'] / 1e9:.2f} GB, free "
              f"{s['memory']['free_bytes'] / 1e9:.2f} GB, largest batch "
              f"{s['memory']['largest_batch_per_gpu']} per GPU.")
        print()
    _decode_parts("deepseek-v3-decode-sglang")
    _ll_parts(rows[0][2], rows[1][2])
    print(f"Layer {STAGE_LAYER}, micro-batch 0, rank 0, five_stage (µs): "
          f"{_stages('deepseek-v3-decode-sglang', ['serve.decode_overlap=five_stage'])}; "
          "the blog's profile: combine 2x DeepSeek's (\"due to shorter attention "
          "computation, causing communication kernels to busy-wait\"), MoE kernels 25 % "
          "slower than DeepSeek's; no other absolute part is in its text (the breakdown is "
          "a figure).")
    print()
    print("SGLang's decode TBO is DeepSeek's 5-stage pipeline (operations_strategy.py "
          "`_compute_moe_deepseek_blog_decode`, tbo_delta_stages=2); the blog does not say "
          "the measured run had it, so the scenario keeps `segments` (five_stage beside). "
          "The blog's reading of its combine (slower \"due to shorter attention "
          "computation\") says its combine waited under attention, as in five_stage; under "
          "`segments` a combine hides under the other micro-batch's experts.")
    print()
    print("MLA as SGLang's decode runs it (`serve.mla_decode: sglang`, moesim.serve.mla; "
          "deepseek_v2.py `forward_absorb_prepare` / `_core` at 00114aef): per-tensor FP8 "
          "quantisation and batched FP8 GEMMs per head for w_kc and w_vc, where training's "
          "list (the `mla_decode=gemm` row) has one up-projection GEMM and per-head copies.")
    print()
    print("Why it differs: the routing is zipf 0.3 (the production scenario's residual "
          "skew; the blog says \"even with EPLB, some imbalance is inevitable\" and publishes "
          "none), its experts placed by EPLB with 32 redundant copies from the routing's "
          "expected loads, standing for the blog's distribution \"matching the input/output "
          "data\" (in-distribution). The blog's own decode "
          "profile has its MoE kernels \"25% slower\" than DeepSeek's and its combine 2x "
          "slower than DeepSeek's; moesim prices the kernels from published rates, the same "
          "for both deployments. `ll_sms: compute` prices the send and receive kernels' SM "
          "time from DeepEP's published hook-mode logs, a fixed part and a part per "
          "message at the Hopper family's rates (H20's dispatch rows, PR 425's combine; "
          "held-out errors, the blog's \"0.06ms occupying SMs\" among them, on "
          "[ll-sms-logs](ll-sms-logs.md)). The layout is the blog's EP72 on 9 nodes, 288 "
          "slots (256 + 32 redundant, `--ep-num-redundant-experts 32` in issue 6017's decode "
          "command), 4 per GPU. The blog's reproduction commands (sgl-project/sglang issue 6017) "
          "pass --cuda-graph-bs 256: the scenario replays CUDA graphs. The published "
          "figure is decode measured alone (\"assuming unlimited resources for the "
          "non-tested phase\"); its output length is not published.")
    print()


def _ll_parts(on: dict, off: dict) -> None:
    """DeepEP's low-latency kernels per MoE layer and micro-batch on the compute stream
    (their SM time, ``serve.ll_sms: compute``, and the exposed wait for the data) beside
    the blog's figures."""
    from moesim.serve import ll_sms
    from moesim.serve.program import ServeBuilder
    from moesim.serve.run import resolve_serve
    res, cfg = resolve_serve("deepseek-v3-decode-sglang", [])
    sb = ServeBuilder(res, cfg)
    model = sb.builder.timer.model
    comb, disp = (model.time_s(k) for k in sb.ll)
    calls = sum(res.model.is_moe_layer(i) for i in range(res.model.layers)) * cfg.microbatches
    print(f"DeepEP's low-latency kernels per MoE layer and micro-batch ({calls} calls of "
          "each per step), µs:")
    print()
    print("| part | moesim, `ll_sms: compute` | moesim, `ll_sms: none` | published |")
    print("|---|---|---|---|")
    print(f"| dispatch send + receive on the SMs | {disp * 1e6:.1f} | 0 | "
          f"{ll_sms.DISPATCH_SM_S * 1e6:.0f} (\"0.06ms occupying SMs\", DeepEP unit test) |")
    print(f"| combine send + receive on the SMs | {comb * 1e6:.1f} | 0 | hook-mode logs: "
          "[ll-sms-logs](ll-sms-logs.md) |")
    for name, key in (("dispatch", "ep_dispatch"), ("combine", "ep_combine")):
        a, b = on["breakdown_s"][key] / calls, off["breakdown_s"][key] / calls
        print(f"| exposed {name} wait (busy-waiting) | {a * 1e6:.1f} | {b * 1e6:.1f} | |")
    a = disp + on["breakdown_s"]["ep_dispatch"] / calls
    b = off["breakdown_s"]["ep_dispatch"] / calls
    print(f"| dispatch on the compute stream, both | {a * 1e6:.1f} | {b * 1e6:.1f} | "
          f"~{PROFILE_DISPATCH_S * 1e6:.0f} per layer (\"~0.17ms per layer\", kernel time "
          "with busy-waiting; 0.09 ms with dummy kernels between send and receive) |")
    print()


def _decode_class(k) -> str:
    """A decode kernel's part: the attention over the cache, GEMMs (SGLang's batched
    ``bmm_fp8`` of the absorbed MLA among them), casts and quantisation, other kernels."""
    if k.name == "attention_decode":
        return "attention over the cache"
    if k.kind in ("gemm", "grouped_gemm") or k.kclass == "gemm":
        return "GEMMs"
    return "casts" if k.kclass == "cast" else "other kernels"


def _decode_parts(name: str) -> None:
    """Rank 0's decode kernels by part, as priced (ms summed over the step's program),
    with ``serve.mla_decode`` ``gemm`` and ``sglang``."""
    from moesim.serve.program import ServeBuilder
    from moesim.serve.run import resolve_serve
    cols = ("attention over the cache", "GEMMs", "casts", "other kernels")
    print("Rank 0's decode kernels as priced (ms over the step, launches included):\n")
    print("| `serve.mla_decode` | " + " | ".join(cols) + " | sum |")
    print("|---|" + "---|" * (len(cols) + 1))
    for mla in ("gemm", "sglang"):
        res, cfg = resolve_serve(name, [f"serve.mla_decode={mla}"])
        sb, part = ServeBuilder(res, cfg), dict.fromkeys(cols, 0.0)
        model = sb.builder.timer.model
        for op in sb.rank_program(0):
            for k in op.kernels if op.is_compute else ():
                part[_decode_class(k)] += model.time_s(k)
        print(f"| {mla} | " + " | ".join(f"{part[c] * 1e3:.1f}" for c in cols)
              + f" | {sum(part.values()) * 1e3:.1f} |")
    print()
