"""The measurement window of a run over time: steady state, without warm-up or drain.

A run starts empty (warm-up: the batch fills, latencies are low) and, after its last
arrival, drains (no new work: the last requests decode in a shrinking batch). Neither is
the deployment's steady state, so the figures a user compares (throughput, goodput,
latency percentiles, requests in the system) are taken over a window:

- **end**: the last arrival (after it the run only drains);
- **start**: the warm-up truncation point of the MSER-5 rule (White, "An effective
  truncation heuristic for bias reduction in simulation output", Simulation 69(6), 1997;
  Hoad, Robinson & Davies, JORS 61, 2010, found it the most reliable automatic warm-up
  rule) applied to the number of requests in the system that each arrival finds, in
  arrival order: batch means of 5 arrivals, the truncation d (at most half the batches)
  that minimises the standard error of the mean of what is left; the window starts at
  the arrival that opens batch d+1.

Requests *in* the window are those arriving in it (start, end]; their latencies give the
percentiles (they finish when they finish, possibly in the drain). Throughput and goodput
are completions inside the window per second of it. vLLM's benchmark (benchmarks/
benchmark_serving.py, ``calculate_metrics``: ``request_throughput = completed / dur_s``
over the whole benchmark) and Vidur (vidur/config_optimizer/config_explorer/
capacity_search.py: the P99 scheduling delay of every request) measure over the whole
run, which counts the drain: a short run then reports less throughput than was offered
and an overloaded one meets an SLO it would miss at steady state.

The verdict says whether the window is a steady state:

- ``queue grows``: the requests waiting to be scheduled grow over the second half of the
  arrivals (a least-squares line through the queue each arrival finds) by more than
  ``GROWTH_TOL`` of those arrivals plus three standard deviations of the queue about
  that line: the rate is above what the deployment serves, and a longer run only grows
  the queue (a rise above ``GROWTH_TOL`` but within the noise cannot be told from chance
  in a run that short: ``too short``);
- ``too short``: the requests in the system still grow through the window (a
  least-squares line through what each arrival finds rises by more than ``GROWTH_TOL``
  of the window's arrivals plus three standard deviations of a count of that mean: the
  batch is still filling), or the window is shorter than ``TURNOVERS`` mean end-to-end
  latencies of its requests (they have not been replaced that often) or holds fewer than
  ``MIN_REQUESTS`` (and, under an SLO, fewer than twenty requests beyond each percentile
  it bounds, :func:`min_requests`: 2,000 for a p99): the run needs more requests
  (``needs_requests``, an estimate: enough for that count after the warm-up, and the
  warm-up plus ``TURNOVERS + 1`` latencies at the offered rate; at least twice the run);
- ``steady``: otherwise.
"""

from __future__ import annotations

import math

import numpy as np

RULE = ("MSER-5 warm-up truncation on the requests in the system seen by each arrival "
        "(White 1997) to the last arrival")
#: the waiting queue may grow by this share of the arrivals before the rate is unstable
GROWTH_TOL = 0.02
#: a steady window lasts at least this many mean end-to-end latencies of its requests
TURNOVERS = 2.0
#: and holds at least this many arrivals
MIN_REQUESTS = 50
#: requests a window holds beyond each percentile an SLO bounds
TAIL = 20


def in_system_seen(arr: np.ndarray, leave: np.ndarray) -> np.ndarray:
    """Requests in the system that each arrival (sorted ``arr``) finds: arrived strictly
    before it minus left at or before it (``leave``: when each left; inf: not yet)."""
    before = np.arange(arr.size)
    left = np.searchsorted(np.sort(leave), arr, side="right")
    return (before - left).astype(float)


def mser5(x: np.ndarray) -> tuple[int, int]:
    """(truncation in observations, batches) of the MSER-5 rule on series ``x``: the d
    in [0, m/2] minimising the variance of the batch means after d over (m-d)^2."""
    m = x.size // 5
    if m < 2:
        return 0, m
    z = x[:m * 5].reshape(m, 5).mean(axis=1)
    s1 = np.cumsum(z[::-1])[::-1]               # suffix sums from batch d
    s2 = np.cumsum((z * z)[::-1])[::-1]
    k = np.arange(m, 0, -1, dtype=float)        # batches left after truncating d
    half = m // 2
    sse = s2[:half + 1] - s1[:half + 1] ** 2 / k[:half + 1]
    score = np.maximum(sse, 0.0) / k[:half + 1] ** 2
    d = int(np.argmin(score))
    return d * 5, m


def _slope(t: np.ndarray, y: np.ndarray) -> float:
    if t.size < 3 or t[-1] <= t[0]:
        return 0.0
    tc = t - t.mean()
    return float((tc * (y - y.mean())).sum() / (tc * tc).sum())


def min_requests(quantiles=()) -> int:
    """The arrivals a steady window needs: ``MIN_REQUESTS``, and for each percentile an
    SLO bounds at least ``TAIL`` requests beyond it (20 / (1 - q): 2,000 for a p99)."""
    return max([MIN_REQUESTS, *(math.ceil(TAIL / (1 - q) - 1e-9) for q in quantiles if q < 1)])


def measure(requests, now: float, need: int = MIN_REQUESTS) -> dict:
    """The window of a run of ``requests`` stopped at ``now``: start_s, end_s, the
    requests arriving in it and completing in it, the verdict (module doc; ``need``: the
    arrivals a steady window holds, :func:`min_requests`), and for the metrics ``_rs``
    (the arrived requests in arrival order), ``_in`` (which arrived in the window,
    finished or not) and ``_leave`` (when each left; inf: not yet)."""
    rs = sorted((r for r in requests if r.arrival_s <= now), key=lambda r: (r.arrival_s, r.id))
    n = len(rs)
    arr = np.array([r.arrival_s for r in rs], dtype=float)
    inf = math.inf
    leave = np.array([r.finish_s if r.finish_s is not None else inf for r in rs])
    # (a rejected request has finish_s: when it was turned away)
    adm = np.array([r.admitted_s if r.admitted_s is not None else
                    (r.finish_s if r.rejected else inf) for r in rs], dtype=float)
    out = {"rule": RULE, "start_s": 0.0, "end_s": 0.0, "requests": 0, "completed": 0,
           "verdict": "too short", "needs_requests": None, "queue_growth": 0.0,
           "in_system_growth": 0.0,
           "in_system_start": 0, "in_system_end": 0, "whole_run": False}
    if n == 0:
        out["needs_requests"] = need
        return {**out, "_rs": rs, "_in": np.zeros(0, bool), "_leave": leave}
    occ = in_system_seen(arr, leave)
    d, m = mser5(occ)
    t0, t1 = float(arr[d]), float(arr[-1])
    whole = t1 <= t0
    fin_t = leave[np.isfinite(leave)]
    if whole:      # every request arrives at once: the run has no steady state to find
        t0, t1 = float(arr[0]), float(fin_t.max()) if fin_t.size else float(now)
        inw = np.ones(n, bool)
    else:
        inw = (arr > t0) & (arr <= t1)
    done = np.array([r.finish_s is not None and not r.rejected for r in rs])
    fin = np.array([r.finish_s if r.finish_s is not None else inf for r in rs])
    completed = int(np.count_nonzero(done & (fin > t0) & (fin <= t1))) if not whole \
        else int(done.sum())
    # the waiting queue each arrival finds, over the second half of the arrivals
    waiting = np.arange(n) - np.searchsorted(np.sort(adm), arr, side="right")
    h = n // 2
    span = float(arr[-1] - arr[h]) if n > 2 else 0.0
    b = _slope(arr[h:], waiting[h:].astype(float)) if span > 0 else 0.0
    q_up = b * span
    growth = q_up / max(n - h, 1)
    wq = waiting[h:].astype(float)
    resid = wq - wq.mean() - b * (arr[h:] - arr[h:].mean()) if n > h else np.zeros(1)
    q_noise = 3.0 * float(resid.std())
    e2e = (fin - arr)[inw & done]
    mean_e2e = float(e2e.mean()) if e2e.size else inf
    length = t1 - t0
    rate = (n - 1) / float(arr[-1] - arr[0]) if n > 1 and arr[-1] > arr[0] else 0.0
    # the requests in the system over the window (a least-squares line through what each
    # arrival finds): flat at steady state, within the noise of a count of that size
    a_in = int(inw.sum())
    filling = (_slope(arr[inw], occ[inw]) * length if a_in > 2 and not whole else 0.0)
    noise = GROWTH_TOL * a_in + 3.0 * math.sqrt(max(float(occ[inw].mean()) if a_in else 0.0,
                                                    1.0))
    if growth > GROWTH_TOL and q_up > GROWTH_TOL * (n - h) + q_noise:
        verdict = "queue grows"
    elif (whole or a_in < need or length < TURNOVERS * mean_e2e
          or filling > noise or growth > GROWTH_TOL):
        verdict = "too short"
    else:
        verdict = "steady"
    needs = None
    if verdict == "too short":
        w = mean_e2e if math.isfinite(mean_e2e) else length
        est = rate * (TURNOVERS + 1) * w + d if rate > 0 else 0.0
        short = math.ceil(n * need / a_in) + d if a_in < need and a_in > 0 else 0
        needs = int(max(2 * n, need * 2 if a_in == 0 else short, math.ceil(est)))
    out.update(start_s=t0, end_s=t1, requests=a_in, completed=completed,
               verdict=verdict, needs_requests=needs, queue_growth=float(growth),
               in_system_growth=float(filling),
               in_system_start=int(np.count_nonzero((arr <= t0) & (leave > t0))),
               in_system_end=int(np.count_nonzero((arr <= t1) & (leave > t1))),
               whole_run=bool(whole))
    return {**out, "_rs": rs, "_in": inw, "_leave": leave}


def mean_in_system(arr: np.ndarray, leave: np.ndarray, t0: float, t1: float) -> float:
    """Time-averaged requests in the system over [t0, t1] (each request's stay clipped
    to the window)."""
    if t1 <= t0:
        return 0.0
    stay = np.clip(np.minimum(leave, t1), t0, t1) - np.clip(arr, t0, t1)
    return float(np.maximum(stay, 0.0).sum() / (t1 - t0))
