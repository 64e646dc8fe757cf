"""What a run over time reports: the ``load`` object of ``moesim serve --json``.

Over the measurement window (:mod:`moesim.traffic.window`: steady state, warm-up and drain
left out): per request arriving in it (and finished), TTFT (arrival to first token), TPOT
(mean time per output token after the first), end-to-end latency, queueing delay (arrival
to first scheduled), their mean and P50/P90/P99; throughput (requests completing inside
the window, and their output tokens, per second of it); the time-averaged number of
requests in the system over the window and those in flight at its end; goodput under an
SLO (completions inside the window that met every bound, per second: DistServe's
definition). Over the whole run: the time between tokens over every token (P50/P90/P99,
from a histogram), the peak share of KV blocks in use on any rank, and under ``run`` the
throughput from the first arrival to the last finish with the time-averaged requests in
the system over that span (Little's law, ``mean_in_system = throughput_rps · e2e_mean_s``,
holds there exactly).
"""

from __future__ import annotations

import numpy as np

#: the SLO metrics --slo accepts: key -> (request latency field, quantile)
SLO_KEYS = {f"{m}_{q}": (f"{m}_s", float(q[1:]) / 100) for m in ("ttft", "tpot", "e2e")
            for q in ("p50", "p90", "p99")}


def stats(x: np.ndarray) -> dict[str, float]:
    if x.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    p = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p[0]), "p90": float(p[1]),
            "p99": float(p[2])}


def meets(lat: dict[str, np.ndarray], slo: dict[str, float]) -> bool:
    """Whether the run's percentiles meet every bound of ``slo`` (key: seconds)."""
    for k, bound in slo.items():
        field, q = SLO_KEYS[k]
        x = lat[field]
        if x.size == 0 or float(np.percentile(x, q * 100)) > bound:
            return False
    return True


def latencies(finished) -> dict[str, np.ndarray]:
    ok = [r for r in finished if not r.rejected]
    rows = [r.latency() for r in ok]
    return {k: np.array([x[k] for x in rows], dtype=float)
            for k in ("ttft_s", "tpot_s", "e2e_s", "queue_s")}


def summarize(sim, slo: dict[str, float] | None = None) -> dict:
    """The ``load`` object of a finished (or stopped) run of ``sim``: the headline figures
    over the measurement window (:mod:`moesim.traffic.window`), the whole run under ``run``."""
    from moesim.traffic.window import mean_in_system, measure, min_requests
    fin = [r for r in sim.finished if not r.rejected]
    arrived = sum(1 for r in sim.requests if r.arrival_s <= sim.now)
    w = measure(sim.requests, sim.now, min_requests(SLO_KEYS[k][1] for k in (slo or {})))
    rs, inw, leave = w.pop("_rs"), w.pop("_in"), w.pop("_leave")
    t0, t1 = w["start_s"], w["end_s"]
    length = t1 - t0
    wreq = [r for r, k in zip(rs, inw, strict=True) if k and r.done and not r.rejected]
    lat = latencies(wreq)
    arr = np.array([r.arrival_s for r in rs], dtype=float)
    done_in = [r for r in fin if (t0 < r.finish_s <= t1) or w["whole_run"]]
    out_tok = sum(r.generated for r in done_in)
    # the whole run, first arrival to last finish: Little's law holds exactly there
    a0 = float(arr[0]) if arr.size else 0.0
    end = max((r.finish_s for r in fin), default=a0)
    span = end - a0
    run_lat = latencies(sim.finished)
    out = {
        "requests": {"arrived": arrived, "finished": len(fin),
                     "in_flight": arrived - len(sim.finished),
                     "rejected": sum(1 for r in sim.finished if r.rejected)},
        "window": w,
        "ttft_s": stats(lat["ttft_s"]), "tpot_s": stats(lat["tpot_s"]),
        "e2e_s": stats(lat["e2e_s"]), "queue_s": stats(lat["queue_s"]),
        "tbt_s": {"mean": sim.tbt_sum / sim.tbt_n if sim.tbt_n else 0.0,
                  "p50": sim.tbt_quantile(0.5), "p90": sim.tbt_quantile(0.9),
                  "p99": sim.tbt_quantile(0.99)},
        "throughput_rps": len(done_in) / length if length > 0 else 0.0,
        "output_tokens_per_s": out_tok / length if length > 0 else 0.0,
        "mean_in_system": mean_in_system(arr, leave, t0, t1),
        "in_flight_at_end": w["in_system_end"],
        "run": {"start_s": a0, "end_s": end,
                "throughput_rps": len(fin) / span if span > 0 else 0.0,
                "output_tokens_per_s": sum(r.generated for r in fin) / span
                if span > 0 else 0.0,
                "mean_in_system": mean_in_system(arr, np.minimum(leave, sim.now), a0, end)
                if span > 0 else 0.0,
                "e2e_mean_s": float(run_lat["e2e_s"].mean()) if run_lat["e2e_s"].size
                else 0.0},
        "duration_s": sim.now,
        "kv_peak_fraction": sim.kv_peak,
        "preemptions": sum(r.preemptions for r in sim.requests),
        "steps": sim.steps,
    }
    if slo:
        good = sum(1 for r in done_in if all(
            r.latency()[SLO_KEYS[k][0]] <= b for k, b in slo.items()))
        out["slo"] = dict(slo)
        out["goodput_rps"] = good / length if length > 0 else 0.0
        out["slo_met"] = meets(lat, slo) and w["verdict"] != "queue grows"
    t = getattr(sim, "transfer", None)
    if t is not None:
        out["kv_transfer"] = {"bytes": t.bytes, "busy_s": t.busy_s}
    return out


def parse_slo(text: str, source: str = "command line") -> dict[str, float]:
    """``ttft_p99=2s,tpot_p99=50ms`` -> {key: seconds}."""
    from moesim.errors import InputError
    out = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in SLO_KEYS:
            raise InputError(source, "--slo", f"KEY=TIME items, KEY one of "
                             f"{sorted(SLO_KEYS)} (e.g. ttft_p99=2s,tpot_p99=50ms)", part)
        v = v.strip()
        try:
            if v.endswith("ms"):
                s = float(v[:-2]) / 1e3
            elif v.endswith("us"):
                s = float(v[:-2]) / 1e6
            elif v.endswith("s"):
                s = float(v[:-1])
            else:
                s = float(v)
        except ValueError:
            raise InputError(source, "--slo", "a time such as 2s, 50ms", part) from None
        if not np.isfinite(s) or s <= 0:
            raise InputError(source, "--slo", "a positive finite time", part)
        if k in out:
            raise InputError(source, "--slo", f"each key once ({k} is given twice)", text)
        out[k] = s
    if not out:
        raise InputError(source, "--slo", "at least one KEY=TIME, e.g. ttft_p99=2s", text)
    return out


def plot_series(ax, sim, what: str = "running"):
    """Per lockstep group over time (s): ``running`` batch, ``kv`` (the fraction of KV
    blocks in use on its fullest rank, 0 to 1) or ``queue``; one line per group. Returns
    ``ax``."""
    col = {"running": 1, "kv": 2, "queue": 3}[what]
    label = {"running": "running (requests)",
             "kv": "KV blocks in use\n(fraction of the cache,\nfullest rank, 0-1)",
             "queue": "queued (requests)"}[what]
    for gi, rows in enumerate(sim.series):
        if rows:
            a = np.asarray(rows)
            ax.step(a[:, 0], a[:, col], where="post", label=f"group {gi}", lw=0.8)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(label)
    if what == "kv":
        ax.set_ylim(0.0, 1.02)
    if len(sim.series) <= 8:
        ax.legend(fontsize="small")
    return ax


def counter_events(sim) -> list[dict]:
    """Perfetto/Chrome counter tracks ("ph": "C") per group: running, KV use, queue."""
    ev = []
    for gi, rows in enumerate(sim.series):
        for t, run, kv, q in rows:
            ev.append({"name": f"group {gi}", "ph": "C", "pid": 0, "ts": t * 1e6,
                       "args": {"running": run, "kv_used": kv, "queue": q}})
    return ev
