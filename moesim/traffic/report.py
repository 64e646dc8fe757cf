"""What ``moesim serve`` prints and writes for a run over time: the text summary, the
``summary.md`` page, ``requests.csv`` and the ``load.png`` figure (running batch, KV
blocks in use as a fraction of the cache, queue, per lockstep group over time, the
measurement window shaded)."""

from __future__ import annotations

VERDICT_NOTE = {
    "too short": "the run is too short to show a steady state: ask for at least {needs:,} "
                 "requests (load.requests) to measure one",
    "queue grows": "the waiting queue grows through the run: the offered rate is more than "
                   "the deployment serves, and a longer run only makes the latencies worse",
}


def _pct(x: dict, scale: float = 1.0, unit: str = "s") -> str:
    return (f"mean {x['mean'] * scale:.3f} / p50 {x['p50'] * scale:.3f} / p90 "
            f"{x['p90'] * scale:.3f} / p99 {x['p99'] * scale:.3f} {unit}")


def window_line(ld: dict) -> str:
    w = ld["window"]
    if w["whole_run"]:
        return (f"  measured over the whole run, {w['start_s']:.2f} to {w['end_s']:.2f} s "
                "(every request arrives at once: no steady state to cut out)")
    return (f"  measurement window {w['start_s']:.2f} to {w['end_s']:.2f} s (warm-up cut by "
            f"MSER-5, to the last arrival): {w['requests']:,} requests arrive in it, "
            f"{w['completed']:,} complete in it; {w['verdict']}")


def text(s: dict) -> str:
    """The text summary of a run over time (``s``: the command's summary)."""
    ld = s["load"]
    rq = ld["requests"]
    run = ld["run"]
    lines = [f"{s['scenario']}: {rq['arrived']:,} requests ({rq['finished']:,} finished, "
             f"{rq['in_flight']:,} in flight, {rq['rejected']:,} rejected) on {s['members']} "
             f"attention-DP ranks in {s['groups']} lockstep group(s), {s['scheduler']}, "
             f"{s['router']}; {ld['duration_s']:.2f} s simulated",
             window_line(ld),
             f"  TTFT {_pct(ld['ttft_s'])}", f"  TPOT {_pct(ld['tpot_s'], 1e3, 'ms')}",
             f"  end to end {_pct(ld['e2e_s'])}", f"  queueing {_pct(ld['queue_s'])}",
             f"  throughput {ld['throughput_rps']:.3f} requests/s (completions in the "
             f"window), {ld['output_tokens_per_s']:,.0f} output tokens/s; mean in system "
             f"{ld['mean_in_system']:.1f}, in flight at the window's end "
             f"{ld['in_flight_at_end']:,}",
             f"  whole run (warm-up and drain included): {run['throughput_rps']:.3f} "
             f"requests/s from the first arrival to the last finish; time between tokens "
             f"{_pct(ld['tbt_s'], 1e3, 'ms')}; KV peak "
             f"{ld['kv_peak_fraction'] * 100:.1f} % of the blocks; {ld['preemptions']:,} "
             "preemptions"]
    w = ld["window"]
    if w["verdict"] in VERDICT_NOTE:
        lines.append("  ** " + VERDICT_NOTE[w["verdict"]].format(
            needs=w["needs_requests"] or 0) + " **")
    if "goodput_rps" in ld:
        lines.append(f"  goodput {ld['goodput_rps']:.3f} requests/s in the window under "
                     + ", ".join(f"{k} <= {v:g} s" for k, v in ld["slo"].items())
                     + f" (SLO {'met' if ld['slo_met'] else 'missed'})")
    if "capacity" in ld:
        lines.append(capacity_line(ld["capacity"]))
    sf = ld["surface"]
    lines.append(f"  step costs: surface of {sf['points']} engine steps"
                 + (" (cached)" if sf["from_cache"] else f" ({sf['build_cpu_s']:.1f} s CPU)")
                 + (f"; worst error vs direct {sf['check']['worst_error'] * 100:.2f} %"
                    if "check" in sf else ""))
    if s.get("fit") is not None:
        from moesim.memory.fit import fit_line
        lines.append(fit_line(s["fit"]))
    return "\n".join(lines)


def capacity_line(c: dict) -> str:
    n = c["requests_per_run"]
    runs = len(c["runs"])
    if c["verdict"] == "too short":
        return ("  capacity: not found, the runs are too short to tell (at least "
                f"{c['needs_requests']:,} requests needed)")
    if c["verdict"] == "none":
        return (f"  capacity: below {min(r['rate_rps'] for r in c['runs']):.4g} requests/s, "
                f"the smallest rate tried ({runs} runs)")
    txt = (f"  capacity {c['capacity_rps']:.3f} requests/s at steady state within the SLO "
           f"({runs} runs" + (f" of {n:,} requests" if n else "") + ")")
    if n and c["configured_requests"] and n > c["configured_requests"]:
        txt += (f"; {c['configured_requests']:,} requests are too short to tell, the search "
                f"ran {n:,}")
    return txt


def markdown(s: dict) -> str:
    """summary.md of a run over time."""
    ld = s["load"]
    w = ld["window"]
    rows = [("scenario", s["scenario"]), ("requests", f"{ld['requests']['arrived']:,}"),
            ("deployment", f"{s['members']} attention-DP ranks in {s['groups']} lockstep "
                           f"group(s), {s['scheduler']}, {s['router']}"),
            ("measurement window", f"{w['start_s']:.3f} to {w['end_s']:.3f} s"),
            ("window rule", w["rule"]),
            ("requests arriving in the window", f"{w['requests']:,}"),
            ("completions in the window", f"{w['completed']:,}"),
            ("steady state", w["verdict"]),
            ("throughput", f"{ld['throughput_rps']:.3f} requests/s"),
            ("output tokens", f"{ld['output_tokens_per_s']:,.0f} tokens/s"),
            ("mean in system (window)", f"{ld['mean_in_system']:.2f} requests"),
            ("in flight at the window's end", f"{ld['in_flight_at_end']:,} requests"),
            ("TTFT p50 / p99", f"{ld['ttft_s']['p50']:.4f} / {ld['ttft_s']['p99']:.4f} s"),
            ("TPOT p50 / p99", f"{ld['tpot_s']['p50'] * 1e3:.3f} / "
                               f"{ld['tpot_s']['p99'] * 1e3:.3f} ms"),
            ("end to end p50 / p99", f"{ld['e2e_s']['p50']:.3f} / {ld['e2e_s']['p99']:.3f} s"),
            ("whole-run throughput (drain included)",
             f"{ld['run']['throughput_rps']:.3f} requests/s"),
            ("KV peak", f"{ld['kv_peak_fraction'] * 100:.1f} % of the blocks"),
            ("preemptions", f"{ld['preemptions']:,}")]
    if "goodput_rps" in ld:
        rows.append(("goodput", f"{ld['goodput_rps']:.3f} requests/s (SLO "
                                f"{'met' if ld['slo_met'] else 'missed'})"))
    if "capacity" in ld:
        rows.append(("capacity", capacity_line(ld["capacity"]).strip()
                     .removeprefix("capacity").lstrip(": ")))
    if s.get("fit") is not None:
        rows.append(("fits in device memory", "no" if s["fit"]["oom"] else "yes"))
    out = [f"# {s['scenario']}: requests over time", "", "| metric | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows]
    if w["verdict"] in VERDICT_NOTE:
        out += ["", VERDICT_NOTE[w["verdict"]].format(needs=w["needs_requests"] or 0) + "."]
    c = ld.get("capacity")
    if c and c["runs"]:
        out += ["", "## Capacity search", "", "| rate (requests/s) | requests | verdict | "
                "TTFT p99 (s) | TPOT p99 (ms) | meets the SLO |", "|---|---|---|---|---|---|"]
        out += [f"| {r['rate_rps']:.4g} | {r['requests']:,} | {r['verdict']} | "
                f"{r['ttft_p99_s']:.3f} | {r['tpot_p99_s'] * 1e3:.2f} | "
                f"{'yes' if r['met'] else 'no'} |" for r in c["runs"]]
    return "\n".join(out) + "\n"


def requests_csv(sim) -> str:
    rows = ["id,arrival_s,prompt,output,ttft_s,tpot_s,e2e_s,queue_s,preemptions,member,"
            "rejected"]
    for r in sorted(sim.requests, key=lambda r: r.id):
        lat = r.latency()
        rows.append(",".join(str(x) for x in (
            r.id, r.arrival_s, r.prompt, r.output, lat["ttft_s"], lat["tpot_s"],
            lat["e2e_s"], lat["queue_s"], r.preemptions, r.member, int(r.rejected))))
    return "\n".join(rows) + "\n"


def load_figure(sim, s: dict):
    """The load.png figure: three panels over time (s), the window shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from moesim.traffic.metrics import plot_series
    w = s["load"]["window"]
    fig, axes = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    for ax, what in zip(axes, ("running", "kv", "queue"), strict=True):
        plot_series(ax, sim, what)
        if not w["whole_run"] and w["end_s"] > w["start_s"]:
            ax.axvspan(w["start_s"], w["end_s"], color="0.9", zorder=0,
                       label="measurement window" if what == "running" else None)
    axes[0].legend(fontsize="small", loc="upper left")
    n = s["load"]["requests"]["arrived"]
    fig.suptitle(f"{s['scenario']}: {n:,} requests over time, per lockstep group "
                 f"(shaded: the measurement window, {w['start_s']:.1f} to "
                 f"{w['end_s']:.1f} s)", fontsize="medium")
    fig.tight_layout()
    return fig

