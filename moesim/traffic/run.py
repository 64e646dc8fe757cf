"""A run over time end to end, and the capacity search.

:func:`run_load` builds the deployment (:mod:`moesim.traffic.deploy`), submits the
``load`` section's requests, runs to the last finish and summarises
(:mod:`moesim.traffic.metrics`, over the steady-state window of :mod:`moesim.traffic.window`).

:func:`find_capacity` is the largest arrival rate the deployment serves at steady state
within an SLO, by bisection over simulations as Vidur's capacity search does
(vidur/config_optimizer/config_explorer/capacity_search.py: a binary search on the QPS),
the same seed at every rate (each rate replays the same request sequence compressed in
time). A rate passes when its window is steady (:mod:`moesim.traffic.window`: the waiting
queue does not grow, the window long enough), the window's percentiles meet the SLO and
no request is refused. A run too short to tell is repeated with more requests (the same
sequence, longer: at least twice as many, up to ``max_requests`` or a trace's rows), so
the capacity is the deployment's, not the run's: a 500-request scenario and a
5,000-request one find the same rate, and the result says how many requests a run
needed. Near the bound (a percentile within ``CONFIRM_MARGIN`` of it) a passing run is
confirmed by one twice as long at the same rate: a queue close to saturation settles
slowly, and a percentile still rising with the run length is not yet the steady state's.
"""

from __future__ import annotations

from collections.abc import Callable

from moesim.traffic.config import LoadConfig
from moesim.traffic.metrics import SLO_KEYS, summarize

#: the most requests the capacity search gives one run (it stops extending there)
SEARCH_MAX_REQUESTS = 100_000
#: a passing run with a percentile this close to its bound (share of the bound) is
#: confirmed by a run of twice the requests at the same rate
CONFIRM_MARGIN = 0.25


def run_load(build: Callable, load_cfg: LoadConfig, slo: dict | None = None,
             series: bool = True):
    """``build(load_cfg, series)`` -> LoadSim. Returns (sim, load summary)."""
    sim = build(load_cfg, series)
    sim.submit(load_cfg.requests_list())
    sim.run()
    return sim, summarize(sim, slo)


def find_capacity(build: Callable, load_cfg: LoadConfig, slo: dict, *, lo: float = 0.0,
                  hi: float | None = None, rel_tol: float = 0.02, max_runs: int = 40,
                  max_requests: int | None = None, progress: Callable | None = None
                  ) -> dict:
    """The largest rate (requests/s) served at steady state within ``slo``, to
    ``rel_tol``: ``hi`` doubles from the configured rate until a rate fails, then
    bisection. Returns {capacity_rps, requests_per_run, needs_requests, verdict, runs:
    [{rate_rps, requests, met, verdict, ...}]}; ``verdict`` is ``found``, ``too short``
    (a run at ``max_requests`` still too short: ``needs_requests`` says how many) or
    ``none`` (the smallest rate tried fails). A run too short to tell that cannot be
    lengthened (``max_requests`` reached, or a trace's rows all used) ends the search."""
    runs: list[dict] = []
    n0 = load_cfg.requests
    cap = max_requests or max(n0 or 0, SEARCH_MAX_REQUESTS)
    state = {"n": n0, "short": None}

    def near(s: dict) -> bool:
        """A percentile of the SLO within CONFIRM_MARGIN of its bound."""
        return any(s[SLO_KEYS[k][0]][k.split("_")[1]] >= (1 - CONFIRM_MARGIN) * b
                   for k, b in slo.items())

    def ok(rate: float, _confirm: bool = True) -> bool:
        prev = None
        confirm = _confirm
        while True:
            lc = load_cfg.with_rate(rate)
            if state["n"] is not None:
                lc = lc.with_requests(state["n"])
            sim, s = run_load(build, lc, slo, series=False)
            w = s["window"]
            n = s["requests"]["arrived"]
            met = (s["slo_met"] and s["requests"]["rejected"] == 0
                   and w["verdict"] == "steady")
            runs.append({"rate_rps": rate, "requests": n,
                         "met": met, "verdict": w["verdict"],
                         "ttft_p99_s": s["ttft_s"]["p99"], "tpot_p99_s": s["tpot_s"]["p99"],
                         "window_s": [w["start_s"], w["end_s"]],
                         "throughput_rps": s["throughput_rps"]})
            if progress:
                progress(runs[-1])
            if met and confirm and near(s) and n < cap:
                confirm = False         # once: the same rate, twice the requests
                state_n, state["n"] = state["n"], min(cap, 2 * n)
                try:
                    return ok(rate, _confirm=False)
                finally:
                    state["n"] = state_n
            if w["verdict"] != "too short" or not s["slo_met"]:
                return met      # (a run still filling that misses already: a miss)
            more = min(cap, max(w["needs_requests"] or 0, 2 * n))
            if more <= n or (prev is not None and n <= prev):   # (a trace's rows used up)
                state["short"] = w["needs_requests"]
                raise _TooShort
            state["n"], prev = more, n

    rate = load_cfg.rate or 1.0
    try:
        if hi is None:
            hi = rate
            while len(runs) < max_runs and ok(hi):
                lo, hi = hi, hi * 2
        while hi - lo > rel_tol * hi and len(runs) < max_runs:
            mid = (lo + hi) / 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
        verdict = "found" if lo > 0 else "none"
    except _TooShort:
        verdict = "too short"
    return {"capacity_rps": lo, "verdict": verdict, "requests_per_run": state["n"],
            "configured_requests": n0, "needs_requests": state["short"], "runs": runs}


class _TooShort(Exception):
    """A run too short to tell that cannot be made longer."""
