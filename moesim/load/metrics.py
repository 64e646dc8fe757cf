"""What a run over time reports: the ``load`` object of ``moesim serve --json``.

Per request (finished ones): TTFT (arrival to first token), TPOT (mean time per output
token after the first), end-to-end latency, queueing delay (arrival to first scheduled);
their mean and P50/P90/P99; the time between tokens over every token (P50/P90/P99, from a
histogram); throughput (finished requests and output tokens per second of the run, from
the first arrival to the last finish); the time-averaged number of requests in the system
(so Little's law, ``mean_in_system = throughput_rps · mean e2e``, can be checked);
goodput under an SLO (requests per second that met every bound, DistServe's definition);
the peak share of KV blocks in use on any rank.
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
    """The ``load`` object of a finished (or stopped) run of ``sim``."""
    fin = [r for r in sim.finished if not r.rejected]
    lat = latencies(sim.finished)
    arrived = sum(1 for r in sim.requests if r.arrival_s <= sim.now)
    t0 = min((r.arrival_s for r in sim.requests), default=0.0)
    t1 = max((r.finish_s for r in fin), default=t0)
    span = t1 - t0
    out_tok = sum(r.generated for r in fin)
    out = {
        "requests": {"arrived": arrived, "finished": len(fin),
                     "in_flight": arrived - len(sim.finished),
                     "rejected": sum(1 for r in sim.finished if r.rejected)},
        "ttft_s": stats(lat["ttft_s"]), "tpot_s": stats(lat["tpot_s"]),
        "e2e_s": stats(lat["e2e_s"]), "queue_s": stats(lat["queue_s"]),
        "tbt_s": {"mean": sim.tbt_sum / sim.tbt_n if sim.tbt_n else 0.0,
                  "p50": sim.tbt_quantile(0.5), "p90": sim.tbt_quantile(0.9),
                  "p99": sim.tbt_quantile(0.99)},
        "throughput_rps": len(fin) / span if span > 0 else 0.0,
        "output_tokens_per_s": out_tok / span if span > 0 else 0.0,
        "mean_in_system": sim.mean_in_system(),
        "duration_s": sim.now,
        "kv_peak_fraction": sim.kv_peak,
        "preemptions": sum(r.preemptions for r in sim.requests),
        "steps": sim.steps,
    }
    if slo:
        good = sum(1 for r in fin if all(
            r.latency()[SLO_KEYS[k][0]] <= b for k, b in slo.items()))
        out["slo"] = dict(slo)
        out["goodput_rps"] = good / span if span > 0 else 0.0
        out["slo_met"] = meets(lat, slo)
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
        out[k] = s
    if not out:
        raise InputError(source, "--slo", "at least one KEY=TIME, e.g. ttft_p99=2s", text)
    return out


def plot_series(ax, sim, what: str = "running"):
    """Per lockstep group over time: ``running`` batch, ``kv`` (share of blocks in use on
    its fullest rank) or ``queue``; one line per group. Returns ``ax``."""
    col = {"running": 1, "kv": 2, "queue": 3}[what]
    label = {"running": "running requests", "kv": "KV blocks in use (fullest rank)",
             "queue": "queued requests"}[what]
    for gi, rows in enumerate(sim.series):
        if rows:
            a = np.asarray(rows)
            ax.step(a[:, 0], a[:, col], where="post", label=f"group {gi}", lw=0.8)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(label)
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
