"""One simulated training step, desmod-style lifecycle: build (resolve the scenario),
elaborate (pure op programs), run (simpy), post-simulate (summary).

``simulate(path_or_scenario, overrides)`` is what ``moesim run`` and sweeps call.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import simpy

from moesim.collectives.communicator import Communicator
from moesim.engine.breakdown import breakdown
from moesim.engine.build import StepPlan, build_step
from moesim.engine.execute import Executor
from moesim.engine.replicas import MirroredNetwork, replica_map, replicas_mode
from moesim.memory_report import CATEGORIES, StageMemory
from moesim.network import AnalyticalNetwork, FlowNetwork
from moesim.scenario import load_scenario
from moesim.scenario.limits import check_work
from moesim.scenario.resolve import Resolved, resolve
from moesim.trace.result import LinkStats, SimResult


def resolve_path(path: str | Path, overrides: Sequence[str] = ()) -> Resolved:
    res = resolve(load_scenario(path, list(overrides), resolve=False))
    check_size(res)
    return res


def check_size(res: Resolved) -> None:
    """Refuse a step too large to simulate before building it (moesim.scenario.limits)."""
    scn = res.scenario
    layers = getattr(res.model, "layers", 1)
    check_work(scn.source, scn.engine.mode, res.layout.world, layers, scn.schedule.microbatches)


def simulate(target: str | Path | Resolved, overrides: Sequence[str] = (), *,
             record_series: bool = True, progress=None, replicas: str | None = None,
             dedup: bool = True, mirror_traffic: bool = True,
             coalesce_rtol: float | None = None) -> SimResult:
    """Simulate one step. ``target``: a scenario file/name or an already resolved one.

    ``replicas``: ``independent`` or ``identical`` (default: the scenario's
    ``engine.replicas``, else independent); with ``identical`` and ``dedup`` (default)
    one representative per replica class is simulated (:mod:`moesim.engine.replicas`),
    ``dedup=False`` simulates every rank (the full-fidelity reference). Shortcuts taken
    are listed in ``summary["shortcuts"]``. ``mirror_traffic`` (default) puts the
    mirrors' EP/TP/PP flows on the network too (:class:`MirroredNetwork`), so replicas
    contend for shared links as in the full run; False drops them (faster, measured
    error in docs/scale.md). ``coalesce_rtol`` > 0 passes the flow network's coalescing
    option (a flow may finish up to that fraction of its duration early; 0 = exact;
    default: the scenario's ``engine.coalesce_rtol``). A scenario with ``engine.mode:
    fast`` runs the analytical lockstep model instead (:mod:`moesim.engine.fast`)."""
    t0 = time.perf_counter()
    res = target if isinstance(target, Resolved) else resolve_path(target, overrides)
    check_size(res)
    if res.scenario.engine.mode == "fast":
        from moesim.engine.fast import simulate_fast

        return simulate_fast(res, progress=progress)
    if coalesce_rtol is None:
        coalesce_rtol = res.scenario.engine.coalesce_rtol
    mode = replicas_mode(res.scenario, replicas)
    dedup = dedup and mode == "identical" and res.layout.edp > 1
    plan = build_step(res, replicas=mode, dedup=dedup)
    rmap = replica_map(res.layout) if dedup else None
    if progress:
        progress("built", sum(len(p) for p in plan.programs))
    env = simpy.Environment()
    topo = res.topology
    net_cls = FlowNetwork if res.scenario.cluster.network == "flow" else AnalyticalNetwork
    net = (net_cls(env, topo, record_series=record_series, coalesce_rtol=coalesce_rtol)
           if net_cls is FlowNetwork else net_cls(env, topo))
    gpus = list(topo.gpus)
    if rmap is not None and mirror_traffic:
        net = MirroredNetwork(net, {gpus[r]: tuple(gpus[m] for m in ms)
                                    for r, ms in rmap.mirrors.items()})
    comm = Communicator(env, net, gpus, rank_host=[topo.host_of(g) for g in gpus])
    ex = Executor(env, net, comm, gpus, plan.programs, progress=progress,
                  mirrors=rmap.mirrors if rmap is not None else None)
    step = ex.run()
    spans = sorted(ex.spans, key=lambda s: (s.rank, s.start_s, s.end_s))
    links = LinkStats(names=list(topo.link_names), kinds=list(topo.link_kinds),
                      capacity_Bps=np.asarray(topo.capacity_Bps, dtype=float),
                      bytes=np.asarray(net.link_bytes(), dtype=float),
                      series=net.series() if hasattr(net, "series") and record_series else {})
    summary = summarize(res, plan, spans, step, rep=None if rmap is None else rmap.rep)
    summary["replicas"] = mode
    summary["shortcuts"] = shortcuts(res, rmap, mirror_traffic)
    if coalesce_rtol > 0 and net_cls is FlowNetwork:
        summary["shortcuts"].append({
            "name": "coalesce_finishes", "coalesce_rtol": coalesce_rtol,
            "detail": "flows finishing close together share one max-min re-solve",
            "bound": f"every flow finishes at most {coalesce_rtol:.2%} of its duration early"})
    summary["sim_wall_s"] = time.perf_counter() - t0
    return SimResult(
        spans=spans, summary=summary, scenario=res.scenario.to_dict(),
        n_ranks=res.layout.world, ranks_per_node=int(topo.gpus_per_node), step_time_s=step,
        hot_ranks=plan.hot_ranks, expert_tokens=plan.expert_tokens,
        expert_dropped=plan.expert_dropped, expert_capacity=plan.expert_capacity, links=links,
        wall_s=time.perf_counter() - t0)


def shortcuts(res: Resolved, rmap, mirror_traffic: bool = True) -> list[dict]:
    """What the run did not simulate one by one (empty: every rank simulated)."""
    if rmap is None:
        return []
    reps = len(rmap.representatives)
    traffic = ("their EP/TP/PP flows are copied onto the network at the representative's "
               "times" if mirror_traffic else
               "their EP/TP/PP flows are left off the network (mirror_traffic=False)")
    return [{"name": "identical_replicas",
             "simulated_ranks": reps, "world": res.layout.world,
             "mirror_traffic": mirror_traffic,
             "detail": (f"engine.replicas=identical: one representative per expert-data-"
                        f"parallel class ({reps} of {res.layout.world} ranks) runs the op "
                        "program; mirrors join data-parallel collectives with their "
                        f"representative; {traffic}; a mirror reports its representative's "
                        "timeline"),
             "bound": "step time, breakdown and per-rank stalls within 1% of the full "
                      "simulation on the fidelity configurations (tests/test_scale_fidelity.py)"}]


def summarize(res: Resolved, plan: StepPlan, spans, step: float,
              rep: np.ndarray | None = None) -> dict:
    """The JSON summary of a step (units in every key). ``rep[r]``: the rank whose spans
    stand for rank r (identical replicas; None: every rank has its own)."""
    world = res.layout.world
    if rep is None:
        mean, rows = breakdown(spans, world, step)
    else:
        _, own = breakdown(spans, world, step)
        rows = [own[int(rep[r])] for r in range(world)]
        mean = {k: float(np.mean([row[k] for row in rows])) for k in rows[0]}
    device = res.device
    peak = float(getattr(device, "peak_bf16_flops", 0.0) or 0.0)
    mfu = plan.model_flops / (step * world * peak) if step > 0 and peak > 0 else 0.0
    per_rank = [{"rank": r, "stage": int(res.layout.coords["pp"][r]),
                 "breakdown_s": row, "busy_s": step - row["idle"]} for r, row in enumerate(rows)]
    return {
        "scenario": res.scenario.name,
        "world": world,
        "step_time_s": step,
        "tokens_per_step": plan.tokens_per_step,
        "tokens_per_s": plan.tokens_per_step / step if step > 0 else 0.0,
        "model_flops": plan.model_flops,
        "mfu": mfu,
        "breakdown_s": mean,
        "per_rank": per_rank,
        "experts": expert_summary(plan),
        "memory": memory_summary(res, plan),
        "hot_ranks": plan.hot_ranks,
        "warnings": list(res.warnings),
    }


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
                     "by_category": {k: d[k] for k in CATEGORIES}})
    cap = sm.row(0)["capacity_bytes"]
    return {"per_rank": rows, "capacity_bytes": cap,
            "peak_bytes_max": max((x["peak_bytes"] for x in rows), default=0.0),
            "oom": any(x["oom"] for x in rows)}
