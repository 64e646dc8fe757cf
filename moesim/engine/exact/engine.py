"""The exact engine: one simulated training step on simpy, every flow on the network
model (the max-min flow network or the analytical one), desmod-style lifecycle: build
(the resolved scenario), elaborate (pure op programs, :mod:`moesim.program`), run
(simpy :class:`~moesim.engine.exact.execute.Executor`), post-simulate (the shared
summary, :mod:`moesim.engine.summary`).

Reached through :func:`moesim.engine.api.simulate` with ``engine.mode: exact``.
"""

from __future__ import annotations

import time

import simpy

from moesim.collectives.communicator import Communicator
from moesim.collectives.nccl.choice import scenario_tuning
from moesim.engine.breakdown import breakdown
from moesim.engine.exact.execute import Executor
from moesim.engine.exact.mirrored import MirroredNetwork
from moesim.engine.summary import link_stats, make_result, summarize
from moesim.network import AnalyticalNetwork, FlowNetwork
from moesim.program.build import build_step
from moesim.program.replicas import replica_map, replicas_mode
from moesim.scenario.resolved import Resolved
from moesim.trace.result import SimResult


def simulate_exact(res: Resolved, *, progress=None, record_series: bool = True,
                   replicas: str | None = None, dedup: bool = True,
                   mirror_traffic: bool = True, coalesce_rtol: float | None = None,
                   build=None) -> SimResult:
    """Simulate one step of ``res`` on simpy.

    ``replicas``: ``independent`` or ``identical`` (default: the scenario's
    ``engine.replicas``, else independent); with ``identical`` and ``dedup`` (default)
    one representative per replica class is simulated (:mod:`moesim.program.replicas`),
    ``dedup=False`` simulates every rank (the full-fidelity reference). Shortcuts taken
    are listed in ``summary["shortcuts"]``. ``mirror_traffic`` (default) puts the
    mirrors' EP/TP/PP flows on the network too (:class:`MirroredNetwork`), so replicas
    contend for shared links as in the full run; False drops them (faster, measured
    error in docs/scale.md). ``coalesce_rtol`` > 0 passes the flow network's coalescing
    option (a flow may finish up to that fraction of its duration early; 0 = exact;
    default: the scenario's ``engine.coalesce_rtol``). ``build(res, replicas=, dedup=)``
    makes the step's :class:`~moesim.program.build.StepPlan` (default
    :func:`~moesim.program.build.build_step`; serving passes its own,
    :mod:`moesim.serve.program`)."""
    t0 = time.perf_counter()
    if coalesce_rtol is None:
        coalesce_rtol = res.scenario.engine.coalesce_rtol
    mode = replicas_mode(res.scenario, replicas)
    dedup = dedup and mode == "identical" and res.layout.edp > 1
    plan = (build_step if build is None else build)(res, replicas=mode, dedup=dedup)
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
    comm = Communicator(env, net, gpus, rank_host=[topo.host_of(g) for g in gpus],
                        nccl=scenario_tuning(res))
    ex = Executor(env, net, comm, gpus, plan.programs, progress=progress,
                  mirrors=rmap.mirrors if rmap is not None else None,
                  sm_total=getattr(res.device, "sms", 0))
    step = ex.run()
    spans = sorted(ex.spans, key=lambda s: (s.rank, s.start_s, s.end_s))
    links = link_stats(topo, net.link_bytes(),
                       net.series() if hasattr(net, "series") and record_series else None)
    _, rows = breakdown(spans, res.layout.world, step)
    if rmap is not None:    # a mirror reports its representative's timeline
        rows = [rows[int(rmap.rep[r])] for r in range(res.layout.world)]
    summary = summarize(res, plan, rows, step)
    summary["replicas"] = mode
    summary["shortcuts"] = shortcuts(res, rmap, mirror_traffic)
    if coalesce_rtol > 0 and net_cls is FlowNetwork:
        summary["shortcuts"].append({
            "name": "coalesce_finishes", "coalesce_rtol": coalesce_rtol,
            "detail": "flows finishing close together share one max-min re-solve",
            "bound": f"every flow finishes at most {coalesce_rtol:.2%} of its duration early"})
    return make_result(res, plan, spans, summary, step, links, t0)


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
