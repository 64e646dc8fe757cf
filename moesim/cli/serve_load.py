"""``moesim serve`` on a scenario with a ``load:`` section: requests over time.

Builds (or reads from the cache) the engine's step-cost surface, runs the requests,
prints the ``load`` summary (``--json``: ``{"scenario", "load"}``), optionally the
surface's error against direct simulation (``--check-surface N``) and the capacity under
``--slo`` (``--find-capacity``); ``-o DIR`` writes ``summary.json``, ``requests.csv``,
``load.png`` (running batch, KV use and queue per lockstep group over time) and
``trace.json`` (the same as Perfetto counter tracks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CLI = "command line"


def _load_cfg(res, overrides):
    from moesim.errors import InputError
    from moesim.load.config import load_from_dict
    from moesim.scenario.blame import blame_overrides
    scn = res.scenario
    src = Path(scn.source)
    base = str(src.parent) if src.is_file() else "."
    try:
        return load_from_dict(dict(scn.load), scn.source, seed=scn.seed, base=base)
    except InputError as err:
        raise blame_overrides(err, scn.source, list(overrides)) from None


def run_load_cmd(args, res, cfg) -> int:
    from moesim.errors import InputError
    from moesim.load.deploy import build_for
    from moesim.load.metrics import parse_slo
    from moesim.load.run import find_capacity, run_load
    from moesim.load.surface import EngineStepCosts
    from moesim.trace.report import check_outdir

    load_cfg = _load_cfg(res, args.overrides)
    slo = parse_slo(args.slo) if args.slo else None
    if args.find_capacity and not slo:
        raise InputError(CLI, "--find-capacity", "an SLO to meet: --slo ttft_p99=2s,"
                         "tpot_p99=50ms", "no --slo")
    out = Path(args.out) if args.out else None
    if out is not None:
        check_outdir(out, args.force, res.scenario.to_dict())
    quiet = args.quiet or args.json

    def say(msg: str) -> None:
        if not quiet:
            print(f"moesim serve: {msg}", file=sys.stderr, flush=True)

    n = [0]

    def point(kw) -> None:
        n[0] += 1
        say(f"surface point {n[0]}: {kw}")

    costs = EngineStepCosts(res, cfg, cache=not args.no_cache, progress=point,
                            **load_cfg.surface)
    surf = {"points": costs.sims, "from_cache": costs.from_cache,
            "build_cpu_s": costs.build_s, "key": costs.key()}
    if args.check_surface:
        chk = costs.check(args.check_surface)
        surf["check"] = {"points": args.check_surface, "worst_error": chk["worst_error"],
                         "worst_at": list(chk["worst"])}
        say(f"surface vs direct simulation, {args.check_surface} random points per phase: "
            f"worst error {chk['worst_error'] * 100:.2f} % at {chk['worst']}")

    def build(lc, series):
        return build_for(res, cfg, lc, costs, series=series)

    sim, load = run_load(build, load_cfg, slo)
    if args.find_capacity:
        cap = find_capacity(build, load_cfg, slo, progress=lambda r: say(
            f"rate {r['rate_rps']:.3f} req/s: {'meets' if r['met'] else 'misses'} the SLO "
            f"(TTFT p99 {r['ttft_p99_s']:.3f} s, TPOT p99 {r['tpot_p99_s'] * 1e3:.1f} ms)"))
        load["capacity_rps"] = cap["capacity_rps"]
        load["capacity_runs"] = cap["runs"]
    load["surface"] = surf
    summary = {"scenario": res.scenario.name, "mode": "load", "scheduler": load_cfg.scheduler,
               "router": load_cfg.router, "groups": len(sim.groups),
               "members": len(sim.members), "kv_tokens_per_member":
               sim.members[0].kv.tokens, "load": load}
    if out is not None:
        _write(out, sim, summary, args.force)
        say(f"wrote {out}/ (summary.json, requests.csv, load.png, trace.json)")
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(text(summary))
    return 0


def text(s: dict) -> str:
    ld = s["load"]
    rq = ld["requests"]

    def pct(k, scale=1.0, unit="s"):
        x = ld[k]
        return (f"mean {x['mean'] * scale:.3f} / p50 {x['p50'] * scale:.3f} / p90 "
                f"{x['p90'] * scale:.3f} / p99 {x['p99'] * scale:.3f} {unit}")

    lines = [f"{s['scenario']}: {rq['arrived']} requests ({rq['finished']} finished, "
             f"{rq['in_flight']} in flight, {rq['rejected']} rejected) on {s['members']} "
             f"attention-DP ranks in {s['groups']} lockstep group(s), {s['scheduler']}, "
             f"{s['router']}; {ld['duration_s']:.2f} s simulated",
             f"  TTFT {pct('ttft_s')}", f"  TPOT {pct('tpot_s', 1e3, 'ms')}",
             f"  time between tokens {pct('tbt_s', 1e3, 'ms')}",
             f"  end to end {pct('e2e_s')}", f"  queueing {pct('queue_s')}",
             f"  throughput {ld['throughput_rps']:.3f} requests/s, "
             f"{ld['output_tokens_per_s']:,.0f} output tokens/s; mean in system "
             f"{ld['mean_in_system']:.2f}; KV peak {ld['kv_peak_fraction'] * 100:.1f} %; "
             f"{ld['preemptions']} preemptions"]
    if "goodput_rps" in ld:
        lines.append(f"  goodput {ld['goodput_rps']:.3f} requests/s under "
                     + ", ".join(f"{k} <= {v:g} s" for k, v in ld["slo"].items())
                     + f" (SLO {'met' if ld['slo_met'] else 'missed'})")
    if "capacity_rps" in ld:
        lines.append(f"  capacity {ld['capacity_rps']:.3f} requests/s meeting the SLO "
                     f"({len(ld['capacity_runs'])} runs)")
    sf = ld["surface"]
    lines.append(f"  step costs: surface of {sf['points']} engine steps"
                 + (" (cached)" if sf["from_cache"] else f" ({sf['build_cpu_s']:.1f} s CPU)")
                 + (f"; worst error vs direct {sf['check']['worst_error'] * 100:.2f} %"
                    if "check" in sf else ""))
    return "\n".join(lines)


def _write(out: Path, sim, summary: dict, force: bool) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from moesim.load.metrics import counter_events, plot_series
    from moesim.outputs import make_dir, save_figure, write_text
    make_dir(out)
    write_text(out / "summary.json", json.dumps(summary, indent=1), force=force)
    rows = ["id,arrival_s,prompt,output,ttft_s,tpot_s,e2e_s,queue_s,preemptions,member,"
            "rejected"]
    for r in sorted(sim.requests, key=lambda r: r.id):
        lat = r.latency()
        rows.append(",".join(str(x) for x in (
            r.id, r.arrival_s, r.prompt, r.output, lat["ttft_s"], lat["tpot_s"],
            lat["e2e_s"], lat["queue_s"], r.preemptions, r.member, int(r.rejected))))
    write_text(out / "requests.csv", "\n".join(rows) + "\n", force=force)
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    for ax, what in zip(axes, ("running", "kv", "queue"), strict=True):
        plot_series(ax, sim, what)
    fig.tight_layout()
    save_figure(fig, out / "load.png", force=force, dpi=110)
    plt.close(fig)
    write_text(out / "trace.json", json.dumps({"traceEvents": counter_events(sim),
                                               "displayTimeUnit": "ms"}), force=force)
