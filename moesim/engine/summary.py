"""The step summary and result both engines return (shared, engine-independent).

Each engine hands over its per-rank breakdown rows (:mod:`moesim.engine.breakdown`
categories, seconds) and the step's :class:`moesim.program.build.StepPlan`; this module
turns them into the JSON summary (units in every key) and the :class:`SimResult`, so
the two engines report exactly the same keys.
"""

from __future__ import annotations

import time

import numpy as np

from moesim.engine.breakdown import CATEGORIES
from moesim.gating.eplb_placement import plan_summary
from moesim.memory.fit import fit_summary, step_fits
from moesim.memory.report import CATEGORIES as MEMORY_CATEGORIES
from moesim.memory.report import StageMemory
from moesim.program.build import StepPlan
from moesim.program.hot import HOT_RULE
from moesim.program.inventory import step_pricing
from moesim.scenario.resolved import Resolved
from moesim.trace.result import LinkStats, SimResult


def summarize(res: Resolved, plan: StepPlan, rows: list[dict[str, float]], step: float
              ) -> dict:
    """The JSON summary of a step from every rank's breakdown row (``rows[r]``: seconds
    per category of rank r, summing to ``step``)."""
    world = res.layout.world
    mean = {k: float(np.mean([row[k] for row in rows])) if rows else 0.0 for k in CATEGORIES}
    peak = float(getattr(res.device, "peak_bf16_flops", 0.0) or 0.0)
    mfu = plan.model_flops / (step * world * peak) if step > 0 and peak > 0 else 0.0
    per_rank = [{"rank": r, "stage": int(res.layout.coords["pp"][r]),
                 "breakdown_s": row, "busy_s": step - row["idle"]} for r, row in enumerate(rows)]
    memory = memory_summary(res, plan)
    fit = fit_summary(step_fits(memory))     # the verdict every command reports alike
    out = {
        "scenario": res.scenario.name,
        "world": world,
        "step_time_s": step,
        "tokens_per_step": plan.tokens_per_step,
        "tokens_per_s": plan.tokens_per_step / step if step > 0 else 0.0,
        "model_flops": plan.model_flops,
        "mfu": mfu,
        "kernel_pricing": kernel_pricing(res),
        "breakdown_s": mean,
        "per_rank": per_rank,
        "experts": expert_summary(plan),
        "memory": memory,
        "fit": fit,
        "oom": fit["oom"],
        "hot_ranks": plan.hot_ranks,
        "warnings": list(res.warnings),
    }
    if plan.eplb is not None:    # routing.placement: the EPLB plan the step ran
        out["eplb"] = plan_summary(plan.eplb, plan.moe_layers, res.routing.placement)
    return out


def kernel_pricing(res: Resolved) -> dict:
    """What the scenario's ``compute`` section asked for (``compute_section``, in words)
    and what priced the step's kernels (:func:`moesim.program.inventory.step_pricing`)."""
    from moesim.compute.catalog import CatalogModel
    from moesim.compute.roofline import RooflineModel
    from moesim.compute.select import describe
    asked = describe(res.scenario.compute)
    if isinstance(res.compute, RooflineModel) and not isinstance(res.compute, CatalogModel) \
            and asked != "roofline only":
        asked += f" (the catalog has no tables for {getattr(res.device, 'name', 'this device')})"
    return {"compute_section": asked, **step_pricing(res)}


def expert_summary(plan: StepPlan) -> dict:
    tok = plan.expert_tokens
    if tok.size == 0:
        return {"moe_layers": [], "tokens_per_expert": [], "dropped": [], "dropped_total": 0,
                "lb_loss": [], "max_over_mean": []}
    mean = tok.mean(axis=1)
    mom = np.divide(tok.max(axis=1), mean, out=np.zeros(len(mean)), where=mean > 0)
    return {
        "moe_layers": plan.moe_layers,
        "tokens_per_expert": tok.tolist(),
        "kept_per_expert": plan.expert_kept.tolist(),
        "dropped": plan.expert_dropped.tolist(),
        "dropped_total": int(plan.expert_dropped.sum()),
        "capacity_per_expert": [None if not np.isfinite(c) else float(c)
                                for c in plan.expert_capacity],
        "lb_loss": plan.lb_loss.tolist(),
        "lb_loss_mean": float(plan.lb_loss.mean()),
        "max_over_mean": mom.tolist(),
        "max_over_mean_max": float(mom.max()),
    }


def memory_summary(res: Resolved, plan: StepPlan) -> dict:
    """Per-rank peak memory, with the tokens each rank's experts actually received."""
    sm = StageMemory(res)
    moe_pos = {layer: j for j, layer in enumerate(plan.moe_layers)}
    rows = []
    for r in range(res.layout.world):
        s = int(res.layout.coords["pp"][r])
        recv = [int(plan.rank_received[r, moe_pos[i]]) for i in sm.stage_layers(s)
                if i in moe_pos]
        d = sm.row(s, recv or None)
        rows.append({"rank": r, "stage": s, "peak_bytes": d["peak_bytes"], "oom": d["oom"],
                     "by_category": {k: d[k] for k in MEMORY_CATEGORIES}})
    cap = sm.row(0)["capacity_bytes"]
    return {"per_rank": rows, "capacity_bytes": cap,
            "peak_bytes_max": max((x["peak_bytes"] for x in rows), default=0.0),
            "oom": any(x["oom"] for x in rows)}


def make_result(res: Resolved, plan: StepPlan, spans, summary: dict, step: float,
                links: LinkStats, t0: float) -> SimResult:
    """The :class:`SimResult` of a step; ``t0``: ``time.perf_counter()`` at its start."""
    summary["sim_wall_s"] = time.perf_counter() - t0
    return SimResult(
        spans=spans, summary=summary, scenario=res.scenario.to_dict(),
        n_ranks=res.layout.world, ranks_per_node=int(res.topology.gpus_per_node),
        step_time_s=step, hot_ranks=plan.hot_ranks, hot_rule=HOT_RULE,
        expert_tokens=plan.expert_tokens,
        expert_dropped=plan.expert_dropped, expert_capacity=plan.expert_capacity, links=links,
        wall_s=time.perf_counter() - t0)


def link_stats(topo, link_bytes, series=None) -> LinkStats:
    """Per-link totals of a step (``link_bytes`` in the topology's link order)."""
    return LinkStats(names=list(topo.link_names), kinds=list(topo.link_kinds),
                     capacity_Bps=np.asarray(topo.capacity_Bps, dtype=float),
                     bytes=np.asarray(link_bytes, dtype=float), series=series or {})
