"""What a fast-path step adds to the shared summary (:mod:`moesim.engine.summary`): its
step plan without op programs, and the shortcuts it took with their measured bounds."""

from __future__ import annotations

import numpy as np

from moesim.program.build import Builder, StepPlan
from moesim.schedule.pipeline import inflight_microbatches

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
    "ep_overlap": "with ep_comm_overlap: step +0.81% (that configuration) and +0.77% "
                  "(PP8, 16 micro-batches); the stall/all-to-all/DP/idle split is off by "
                  "up to 3.3% of the step (docs/fast-path.md)",
}


def make_plan(b: Builder, flops: float) -> StepPlan:
    L = len(b.moe_layers)
    return StepPlan(
        programs=[], moe_layers=b.moe_layers, expert_tokens=b.expert_tokens,
        expert_kept=b.expert_kept, expert_dropped=b.expert_tokens - b.expert_kept,
        expert_capacity=b.expert_capacity if L else np.zeros(0),
        lb_loss=np.divide(b.lb, np.maximum(b.lb_n, 1)), rank_received=b.received,
        model_flops=flops, tokens_per_step=b.tokens * b.m * b.dp, hot_ranks=b._hot_ranks(),
        inflight=inflight_microbatches(b.order))


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
        {"name": "no_link_bytes",
         "detail": "per-link bytes are not tracked: result.links.bytes is all zeros and "
                   "there are no link series",
         "bound": "use the exact engine for link utilization"},
        {"name": "bounded_spans",
         "detail": f"spans kept for the {span_ranks} lowest ranks and (up to 512 GPUs, "
                   f"4 chains) the hot ranks; per-rank breakdowns cover all {world} ranks",
         "bound": "none needed: summaries come from every rank"},
    ]
    if ctx.overlap:
        out.append({"name": "ep_overlap",
                    "detail": "paired items (the exact builder's PairRule) expose only "
                              "max(0, a2a - partner's non-expert compute / 2) per all-to-all",
                    "bound": BOUNDS["ep_overlap"]})
    if dedup:
        out.append({"name": "identical_replicas", "simulated_chains": n_chains,
                    "detail": "routing.replicas=identical: one chain per replica class runs; "
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
