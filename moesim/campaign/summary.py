"""A campaign's summary (JSON-able, units in every key) and its text: ETTR, days to a
token budget, interruptions by cause against their expectation, the checkpoint interval
a sweep finds beside Young's and Daly's, each assumed cost with its source."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from moesim.campaign import defaults as D
from moesim.campaign.formulas import daly_interval, expected_ettr, young_interval
from moesim.campaign.simulate import Costs, Timeline, recovery_s, simulate_campaign, units
from moesim.campaign.spec import DAY, Campaign

#: checkpoint intervals the sweep tries, as multiples of Young's interval
SWEEP_FACTORS = tuple(float(x) for x in np.geomspace(1 / 8, 8, 19))


def mtbf_s(camp: Campaign, costs: Costs) -> float:
    """Mean wall seconds between interruptions of the job (every cause, planned too;
    stragglers, which interrupt nothing, left out)."""
    return 1.0 / sum(c.rate * units(c, costs) for c in camp.causes if c.slow_s == 0)


def straggle_share(camp: Campaign, costs: Costs) -> float:
    """Training lost to stragglers per second of wall clock (first order)."""
    return sum(c.rate * units(c, costs) * c.slow_s for c in camp.causes if c.slow_s > 0)


def restart_and_losing(camp: Campaign, costs: Costs) -> tuple[float, float]:
    """(mean seconds an interruption stops the job, share of interruptions that lose the
    work since the last checkpoint), weighted by rate, as :mod:`simulate` charges them
    (no spare taken: a spare's swap when the campaign has spares)."""
    tot = down = lose = 0.0
    for c in camp.causes:
        if c.slow_s > 0:
            continue
        r = c.rate * units(c, costs)
        spare = None if c.per == "job" or c.planned else camp.spare_nodes > 0
        d = recovery_s(camp, c, costs, spare)
        if c.planned:
            d, lost = d + costs.write_s, 0.0
        elif camp.domain == "replica" and c.scope == "node" and costs.dp > 1:
            det = camp.detect_hang_s if c.detect == "hang" else camp.detect_crash_s
            d, lost = det + (d - det - costs.load_s + costs.peer_load_s) / costs.dp, 0.0
        else:
            lost = 1.0
        tot, down, lose = tot + r, down + r * d, lose + r * lost
    return down / tot, lose / tot


def interval_sweep(camp: Campaign, costs: Costs, days: float, seed: int) -> dict:
    """ETTR simulated (same failures) and expected at intervals around Young's."""
    m = mtbf_s(camp, costs)
    young = young_interval(costs.pause_s, m)
    daly = daly_interval(costs.pause_s, m)
    restart, losing = restart_and_losing(camp, costs)
    rows = []
    for iv in sorted({young * f for f in SWEEP_FACTORS} | {young, daly}):
        tl = simulate_campaign(camp, costs, days=days, seed=seed, interval_s=iv,
                               keep_points=False)
        rows.append({"interval_s": iv, "ettr": tl.work_s / tl.wall_s,
                     "expected_ettr": expected_ettr(iv, costs.pause_s, restart, m,
                                                    costs.lag_s, losing)
                     * (1 - straggle_share(camp, costs))})
    best = max(rows, key=lambda r: (r["ettr"], -r["interval_s"]))
    return {"young_s": young, "daly_s": daly, "best_s": best["interval_s"],
            "best_ettr": best["ettr"],
            "best_expected_s": max(rows, key=lambda r: r["expected_ettr"])["interval_s"],
            "rows": rows}


def summarize(camp: Campaign, costs: Costs, tl: Timeline, sources: dict, *, seed: int,
              days: float | None, tokens: float | None, sweep: dict | None) -> dict:
    wall_days = tl.wall_s / DAY
    slow = {c.name for c in camp.causes if c.slow_s > 0}
    counts = Counter(name for _, name, _, _ in tl.failures)
    causes = []
    for c in camp.causes:
        exp = c.rate * units(c, costs) * tl.wall_s
        causes.append({"cause": c.name, "per": c.per, "planned": c.planned,
                       "simulated": counts.get(c.name, 0), "expected": exp})
    lost = sum(x[2] for x in tl.failures)
    down = sum(x[3] for x in tl.failures if x[1] not in slow)
    straggled = sum(x[3] for x in tl.failures if x[1] in slow)
    n_exp = sum(r["expected"] for r in causes if r["cause"] not in slow)
    m = mtbf_s(camp, costs)
    restart, losing = restart_and_losing(camp, costs)
    out = {
        "campaign": camp.name, "source": camp.source, "seed": seed,
        "gpus": costs.gpus, "nodes": costs.nodes, "dp": costs.dp,
        "days_asked": days, "tokens_asked": tokens,
        "wall_days": wall_days,
        "ettr": tl.work_s / tl.wall_s if tl.wall_s > 0 else 0.0,
        "expected_ettr": expected_ettr(camp.interval_s, costs.pause_s, restart, m,
                                       costs.lag_s, losing) * (1 - straggle_share(camp, costs)),
        "meta_llama3_ettr_over": D.LLAMA3_ETTR,
        "work_s": tl.work_s, "steps": tl.work_s / costs.step_s if costs.step_s else None,
        "tokens": tl.work_s / costs.step_s * costs.tokens_per_step if costs.step_s else None,
        "lost_work_s": lost, "recovery_s": down, "checkpoint_pause_s": tl.paused_s,
        "interruptions": sum(1 for x in tl.failures if x[1] not in slow),
        "interruptions_expected": n_exp,
        "stragglers": sum(1 for x in tl.failures if x[1] in slow), "straggler_s": straggled,
        "interruptions_sd": math.sqrt(n_exp),
        "mtbf_h": m / 3600.0, "mean_restart_s": restart,
        "checkpoints": len(tl.checkpoints), "spare_waits": tl.spare_waits,
        "by_cause": causes,
        "policy": {"interval_s": camp.interval_s, "mode": camp.mode, "target": camp.target,
                   "domain": camp.domain, "spare_nodes": camp.spare_nodes},
        "costs": {
            "step_s": costs.step_s, "tokens_per_step": costs.tokens_per_step,
            "checkpoint_TB": costs.ckpt_bytes / 1e12,
            "checkpoint_GB_per_gpu": costs.ckpt_bytes_per_gpu / 1e9,
            "pause_s": costs.pause_s, "lag_s": costs.lag_s, "write_s": costs.write_s,
            "load_s": costs.load_s, "detect_crash_s": camp.detect_crash_s,
            "detect_hang_s": camp.detect_hang_s, "relaunch_s": camp.relaunch_s,
            "nccl_init_s": camp.nccl_init_s, "replace_s": camp.replace_s,
            "swap_s": camp.swap_s, "storage_write_GBps": camp.write_Bps / 1e9,
            "storage_read_GBps": camp.read_Bps / 1e9,
            "host_copy_GBps": camp.host_copy_Bps / 1e9, "peer_GBps": camp.peer_Bps / 1e9},
        "sources": sources,
    }
    if sweep is not None:
        out["sweep"] = sweep
    return out


def _f(x: float, d: int = 1) -> str:
    return f"{x:,.{d}f}"


def text(s: dict) -> str:
    """The summary as lines a reader checks by eye (units in every figure)."""
    c, p = s["costs"], s["policy"]
    lines = [
        f"{s['campaign']}: {_f(s['wall_days'], 2)} days on {s['gpus']:,} GPUs "
        f"({s['nodes']:,} nodes, DP {s['dp']}), seed {s['seed']}",
        f"  ETTR {100 * s['ettr']:.1f} % simulated, {100 * s['expected_ettr']:.1f} % "
        f"expected (first order); Meta's Llama 3 405B run: more than "
        f"{100 * s['meta_llama3_ettr_over']:.0f} %",
    ]
    if s["tokens"] is not None:
        lines.append(f"  trained {s['tokens'] / 1e12:,.3f} T tokens in {_f(s['steps'], 0)} "
                     f"steps of {c['step_s']:.3f} s ({c['tokens_per_step']:,.0f} tokens/step)")
    if s.get("tokens_asked") is not None:
        lines.append(f"  token budget {s['tokens_asked'] / 1e12:,.3f} T tokens: "
                     + (f"reached in {_f(s['wall_days'], 2)} wall-clock days"
                        if s.get("tokens_reached") else "not reached in the days asked"))
    lines += [
        f"  interruptions {s['interruptions']} simulated, {s['interruptions_expected']:.1f} "
        f"± {s['interruptions_sd']:.1f} expected (MTBF {s['mtbf_h']:.2f} h)",
        f"  lost work {_f(s['lost_work_s'] / 3600)} h, recovery {_f(s['recovery_s'] / 3600)} "
        f"h, checkpoint pauses {_f(s['checkpoint_pause_s'] / 3600)} h; "
        f"{s['checkpoints']} checkpoints durable"
        + (f"; {s['stragglers']} stragglers cost {_f(s['straggler_s'] / 3600)} h"
           if s["stragglers"] else ""),
        f"  checkpoint {c['checkpoint_TB']:.3f} TB ({c['checkpoint_GB_per_gpu']:.2f} GB per "
        f"GPU), every {_f(p['interval_s'] / 60)} min, {p['mode']} to {p['target']}: pause "
        f"{c['pause_s']:.1f} s, durable {c['lag_s']:.1f} s later, load {c['load_s']:.1f} s",
        f"  restart: detect {c['detect_crash_s']:.0f} s (crash) / {c['detect_hang_s']:.0f} s "
        f"(hang), replace node {c['replace_s']:.0f} s (hot spare {c['swap_s']:.0f} s, "
        f"{p['spare_nodes']} spares), relaunch {c['relaunch_s']:.0f} s, NCCL init "
        f"{c['nccl_init_s']:.0f} s; mean {s['mean_restart_s']:.0f} s; failure domain "
        f"{p['domain']}",
    ]
    if "sweep" in s:
        w = s["sweep"]
        lines.append(f"  checkpoint interval: best of the sweep {_f(w['best_s'] / 60)} min "
                     f"(ETTR {100 * w['best_ettr']:.2f} %), Young {_f(w['young_s'] / 60)} "
                     f"min, Daly {_f(w['daly_s'] / 60)} min, first-order optimum "
                     f"{_f(w['best_expected_s'] / 60)} min")
    lines.append("  interruptions by cause: simulated / expected")
    for r in sorted(s["by_cause"], key=lambda r: -r["expected"]):
        lines.append(f"    {r['cause']:<30} {r['simulated']:>6} / {r['expected']:8.1f}"
                     f"  (per {r['per']})")
    return "\n".join(lines)


def markdown(s: dict) -> str:
    src = "\n".join(f"- {k}: {v}" for k, v in s["sources"].items() if v)
    return f"# Training campaign {s['campaign']}\n\n```\n{text(s)}\n```\n\nSources:\n\n{src}\n"
