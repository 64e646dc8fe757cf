"""A run over time end to end, and the capacity search.

:func:`run_load` builds the deployment (:mod:`moesim.load.deploy`), submits the
``load`` section's requests, runs to the last finish and summarises
(:mod:`moesim.load.metrics`). :func:`find_capacity` is the largest arrival rate whose
run meets an SLO, by bisection over simulations as Vidur's capacity search does
(vidur/config_optimizer: a binary search on the QPS): the same seed at every rate, so
each rate replays the same request sequence compressed in time.
"""

from __future__ import annotations

from collections.abc import Callable

from moesim.load.config import LoadConfig
from moesim.load.metrics import latencies, meets, summarize


def run_load(build: Callable, load_cfg: LoadConfig, slo: dict | None = None,
             series: bool = True):
    """``build(load_cfg, series)`` -> LoadSim. Returns (sim, load summary)."""
    sim = build(load_cfg, series)
    sim.submit(load_cfg.requests_list())
    sim.run()
    return sim, summarize(sim, slo)


def find_capacity(build: Callable, load_cfg: LoadConfig, slo: dict, *, lo: float = 0.0,
                  hi: float | None = None, rel_tol: float = 0.02, max_runs: int = 24,
                  progress: Callable | None = None) -> dict:
    """The largest rate (requests/s) meeting ``slo``, to ``rel_tol``: ``hi`` doubles
    from the configured rate until a run fails, then bisection. Returns
    {capacity_rps, runs: [{rate_rps, met, ...}]}."""
    runs = []

    def ok(rate: float) -> bool:
        sim, s = run_load(build, load_cfg.with_rate(rate), slo, series=False)
        met = meets(latencies(sim.finished), slo) and s["requests"]["rejected"] == 0
        runs.append({"rate_rps": rate, "met": met, "ttft_p99_s": s["ttft_s"]["p99"],
                     "tpot_p99_s": s["tpot_s"]["p99"]})
        if progress:
            progress(runs[-1])
        return met

    rate = load_cfg.rate or 1.0
    if hi is None:
        hi = rate
        while ok(hi) and len(runs) < max_runs:
            lo, hi = hi, hi * 2
    while hi - lo > rel_tol * hi and len(runs) < max_runs:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return {"capacity_rps": lo, "runs": runs}
