"""What a fast-path step adds to the shared summary (:mod:`moesim.engine.summary`): its
step plan without op programs, and the shortcuts it took with their measured bounds."""

from __future__ import annotations

from moesim.engine.fast.network import EXACT_FLOW_BUDGET
from moesim.program.build import Builder, StepPlan

#: measured gaps against the exact engine (tests/test_fast_path.py, docs/fast-path.md)
BOUNDS = {
    "link_bound_a2a": "128-GPU DeepSeek-shaped step (EP16 over 2 nodes: exact all-to-alls, "
                      "no EP overlap): step -0.45%, every breakdown category within 0.33% "
                      "of the step, per-rank stall within 0.51% of the step of the exact "
                      "flow engine; mixtral-8x7b-64gpu (EP8 in a node: sharing): step "
                      "+0.008%, categories within 0.06%, per-rank stall within 0.12%; "
                      "groups over 32 members (link bound), one EP64 all-to-all over 8 "
                      "nodes against the flow engine: its end within 0.92% of its span, but members "
                      "end together, up to 60% of its span after their exact end "
                      "(tests/test_fast_path.py, docs/fast-path.md)",
    "a2a_sharing": "Qwen3-235B-A22B on 256 H100 (TP2 PP8 VPP4 EP32 over 4 nodes, DeepEP) "
                   "cut to 64 GPUs (PP2 VPP2, 8 layers, 4 micro-batches; EP32 still over 4 "
                   "nodes) against the same step with every such all-to-all flow by flow: "
                   "step within 1.3e-16 relative with DeepEP (the SM bound decides), "
                   "within 3.4e-15 and every category within 0.02 % of the step with "
                   "NCCL all-to-alls (docs/fast-path.md)",
    "dualpipe": "DeepSeek-shaped PP2 DualPipe, EP16 over two H800 nodes, zipf 0.3: "
                "128 GPUs, DeepEP, overlap static: step +0.41%, worst category dp 0.81%, "
                "worst per-rank stall 0.27% of the step; 32 GPUs, NCCL: step -1.82% "
                "(overlap none), -1.84% (static), worst per-rank stall 2.22% "
                "(docs/fast-path.md)",
    "a2a_1f1b": "32-GPU DeepSeek-shaped PP2 interleaved (vpp 2), EP16 over two H800 "
                "nodes: step -3.34%, worst category bubble 2.71%, worst per-rank stall "
                "1.72% of the step (pipeline sends sharing NICs with all-to-alls are "
                "not modelled; docs/fast-path.md)",
    "ep_overlap": "overlapped pairs as the exact engine runs them (two streams, SM "
                  "sharing): mixtral-8x7b-64gpu static step +0.05%, categories within "
                  "0.33%, per-rank stall 0.43%; DeepSeek-shaped cases: step within 1.84%, "
                  "worst per-rank stall 2.34% (docs/fast-path.md)",
}


def make_plan(b: Builder, flops: float) -> StepPlan:
    return StepPlan(programs=[], model_flops=flops, tokens_per_step=b.tokens * b.m * b.dp * b.cp,
                    inflight=b.inflight(), **b.routes.stats())


def shortcuts(ctx, dedup: bool, n_chains: int, world: int, span_ranks: int
               ) -> list[dict]:
    out = [
        {"name": "link_bound_a2a",
         "detail": "all-to-alls of groups over several hosts with at most 32 members run "
                   "flow by flow on the max-min flow network (exact, engine.coalesce_rtol "
                   "applies); within one host each flow ends at its latest end over the "
                   "links of its path, each link shared by processor sharing among the "
                   "flows started up to it (earlier ones as a queued backlog) + path "
                   "latency (exact there); groups of more than 32: when every link of "
                   "its path has drained; TP and "
                   "pipeline transfers alone on their path (a backward send while "
                   "gradient buckets run: half its bottleneck); a member starts moving "
                   "data when its latest partner arrives",
         "bound": BOUNDS["link_bound_a2a"]},
        {"name": "closed_form_rings",
         "detail": "gradient buckets and ZeRO gathers: steps × (chunk × slowest s/B of one "
                   "ring step + latency), rings as the exact engine expands them",
         "bound": "exact for uniform ring phases on the link bound"},
        {"name": "no_link_series",
         "detail": "per-link bytes are counted from every flow's path and bytes "
                   "(all-to-alls, pipeline sends, TP and ring collectives); there is no "
                   "utilization series over time: links.png shows mean utilization",
         "bound": "link bytes equal the exact engine's (tests/test_fast_spans_links.py)"},
        {"name": "bounded_spans",
         "detail": f"spans kept for the {span_ranks} lowest ranks and, per pipeline stage, "
                   "the most-stalled and the most-loaded hot rank of the chain holding "
                   "the most-stalled rank (up to 512 GPUs also every hot rank, 3 more "
                   "chains): summary spans_kept lists them; per-rank breakdowns cover "
                   f"all {world} ranks",
         "bound": "none needed: summaries come from every rank"},
    ]
    if not ctx.net.exact_ok:
        out.append({"name": "a2a_sharing_over_budget",
                    "detail": f"this step would run about {ctx.exact_flows:,} flows of "
                              "multi-host all-to-alls (groups of at most 32) flow by flow, "
                              f"more than the fast path's budget of {EXACT_FLOW_BUDGET:,} "
                              "(moesim.engine.fast.network.EXACT_FLOW_BUDGET): they are "
                              "timed by per-link processor sharing instead (flows started "
                              "together share each link of their path; a flow ends at its "
                              "latest end over its links + path latency)",
                    "bound": BOUNDS["a2a_sharing"]})
    if ctx.overlap:
        out.append({"name": "ep_overlap",
                    "detail": "paired items (the exact builder's PairRule) run on two "
                              "streams as in the exact engine; an all-to-all's flows do "
                              "not share links with other streams' traffic",
                    "bound": BOUNDS["ep_overlap"]})
    if ctx.dual is not None:
        out.append({"name": "dualpipe_buckets_and_pairs",
                    "detail": "gradient buckets overlapping the other stage's backward do "
                              "not slow its all-to-alls; F&B pairs run on two streams as "
                              "in the exact engine",
                    "bound": BOUNDS["dualpipe"]})
    if ctx.res.scenario.overlap.kind == "a2a-1f1b":
        out.append({"name": "a2a_1f1b_pairs",
                    "detail": "each (forward, backward) step runs on two streams as in "
                              "the exact engine; its pipeline sends do not share NICs "
                              "with the next step's all-to-alls",
                    "bound": BOUNDS["a2a_1f1b"]})
    if dedup:
        out.append({"name": "identical_replicas", "simulated_chains": n_chains,
                    "detail": "engine.replicas=identical: one chain per replica class runs; "
                              "mirrors copy its timeline and join DP collectives",
                    "bound": "exact given identical routing"})
    if ctx.res.scenario.overlap.nccl_sms > 0:
        out.append({"name": "nccl_sm_sharing_not_modeled",
                    "detail": "overlap.nccl_sms: compute overlapping DP buckets, pipeline "
                              "sends and TP collectives is not slowed on the fast path (EP "
                              "kernels' SM share is: see ep_overlap)",
                    "bound": "unmeasured: use the exact engine for NCCL SM sharing"})
    if ctx.etp > 1:
        out.append({"name": "etp_peers_equal",
                    "detail": "parallel.etp: each rank's expert GEMMs and ETP all-gather / "
                              "reduce-scatter take its ETP peers to have received as many "
                              "tokens per expert as it did (the exact engine sums theirs)",
                    "bound": "exact under balanced routing; unmeasured otherwise"})
    if ctx.res.scenario.parallel.zero == 3:
        out.append({"name": "zero3_lockstep_replicas",
                    "detail": "ZeRO-3 per-layer weight all-gathers (DP x CP, then EDP) on "
                              "each rank's comm stream, prefetched as the exact builder "
                              "does; DP replicas reach each gather together",
                    "bound": "measured in tests/test_folding.py against the exact engine"})
    return out
