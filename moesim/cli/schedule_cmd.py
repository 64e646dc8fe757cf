"""``moesim schedule KIND --pp P --microbatches N``: a pipeline order in stage time.

Runs the order of GPipe, 1F1B, DualPipe or DualPipeV through the stage-time evaluator
(:mod:`moesim.schedule.evaluate`, communication free) with the chunk times of
``--times`` and prints the step, each rank's idle time and activation sets alive,
next to the published bubble formula (deepseek-ai/DualPipe README; docs/schedules.md).
``--pp`` counts ranks (devices): DualPipeV runs 2 x pp stages on them.
"""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path

from moesim.errors import InputError
from moesim.schedule.dualpipe import check, inflight_activations, make_dual_order
from moesim.schedule.evaluate import Durations, evaluate, from_pipeline
from moesim.schedule.pipeline import gpipe_order, inflight_microbatches, one_f_one_b_order

KINDS = ("gpipe", "1f1b", "dualpipe", "dualpipev")
_TIMES = ("F", "B", "W", "FB")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=KINDS, help="pipeline schedule")
    p.add_argument("--pp", type=int, required=True, help="pipeline ranks (devices)")
    p.add_argument("--microbatches", type=int, required=True, help="micro-batches per step")
    p.add_argument("--times", default="F=1,B=2,W=1,FB=3",
                   help="chunk times in one unit of your choice: F forward, B full backward, "
                        "W its weight-gradient part, FB an overlapped forward-and-backward "
                        "pair (default F=1,B=2,W=1,FB=3)")
    p.add_argument("--unit", default="stage-time units", help="name of the --times unit")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--order", action="store_true", help="also print every rank's items")
    p.add_argument("--plot", metavar="PNG", help="draw the per-rank timeline to this file")
    p.add_argument("--force", action="store_true", help="overwrite the --plot file")


def parse_times(text: str) -> Durations:
    want = "F=..,B=..,W=..,FB=.. (numbers >= 0, W <= B)"
    vals: dict[str, Fraction] = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        k = k.strip()
        try:
            x = Fraction(v.strip())
        except (ValueError, ZeroDivisionError):
            raise InputError("command line", "--times", want, text) from None
        if not sep or k not in _TIMES or k in vals or x < 0:
            raise InputError("command line", "--times", want, text)
        vals[k] = x
    if set(vals) != set(_TIMES) or vals["W"] > vals["B"]:
        raise InputError("command line", "--times", want, text)
    return Durations(**vals)


def schedule_report(kind: str, pp: int, m: int, t: Durations) -> dict:
    """Step, idle and activations of ``kind`` on ``pp`` ranks, ``m`` micro-batches."""
    for flag, x in (("--pp", pp), ("--microbatches", m)):
        if x < 1:
            raise InputError("command line", flag, "an integer >= 1", x)
    if kind in ("dualpipe", "dualpipev"):
        why = check(kind, pp, m)
        if why:
            flag, got = ("--pp", pp) if why[0] == "ranks" else ("--microbatches", m)
            raise InputError("command line", flag, why[1].replace("ranks", "--pp"), got)
        order = make_dual_order(kind, pp, m)
        tl = evaluate(order, 0, t)
        inflight, stages, items = inflight_activations(order), order.stages, order.items
        half = stages // 2 - 1
        formula = half * (t.FB + t.B - 3 * t.W)
        name = "(PP/2-1)(F&B+B-3W) on the middle ranks, when F = B-W = W"
    else:
        plain = gpipe_order(pp, m) if kind == "gpipe" else one_f_one_b_order(pp, m)
        items = from_pipeline(plain)
        tl = evaluate(items, pp, t)
        inflight, stages = inflight_microbatches(plain), pp
        formula = (pp - 1) * (t.F + t.B)
        name = "(PP-1)(F+B) on every rank"
    return {
        "kind": kind, "ranks": pp, "stages": stages, "microbatches": m,
        "times": {k: float(getattr(t, k)) for k in _TIMES},
        "step": float(tl.step),
        "idle": [float(tl.idle(r)) for r in range(pp)],
        "compute": [float(tl.busy_time(r)) for r in range(pp)],
        "inflight": inflight,
        "bubble_formula": {"name": name, "value": float(formula)},
        "order": [[str(it) for it in row] for row in items],
        "_timeline": tl,
    }


def format_report(rep: dict, unit: str, show_order: bool) -> str:
    t = rep["times"]
    lines = [f"{rep['kind']}: {rep['ranks']} ranks, {rep['stages']} stages, "
             f"{rep['microbatches']} micro-batches; F={t['F']:g} B={t['B']:g} W={t['W']:g} "
             f"F&B={t['FB']:g} ({unit}; communication free)",
             f"step {rep['step']:g} {unit}",
             f"{'rank':>4} {'compute':>10} {'idle':>10} {'inflight':>8}"]
    for r in range(rep["ranks"]):
        lines.append(f"{r:>4} {rep['compute'][r]:>10g} {rep['idle'][r]:>10g} "
                     f"{rep['inflight'][r]:>8}")
    f = rep["bubble_formula"]
    lines.append(f"published bubble {f['name']}: {f['value']:g} {unit}")
    lines.append("inflight: (micro-batch, stage) activation sets alive at the rank's peak")
    if show_order:
        lines += [f"rank {r}: " + " ".join(row) for r, row in enumerate(rep["order"])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from moesim.outputs import check_figure_target, save_figure
    from moesim.scenario.limits import check_schedule

    t = parse_times(args.times)
    if args.force and not args.plot:
        raise InputError("command line", "--force", "--force only with --plot (it lets the "
                         "picture replace an existing file)", True)
    out = Path(args.plot) if args.plot else None
    if out is not None:
        if not out.suffix:   # the file really written (PNG), checked as such
            out = out.with_name(out.name + ".png")
        check_figure_target(out, args.force, "--plot")
    check_schedule(args.pp, args.microbatches)
    rep = schedule_report(args.kind, args.pp, args.microbatches, t)
    tl = rep.pop("_timeline")
    if out is not None:
        from moesim.schedule.plot import plot_schedule
        from moesim.trace.plots import new_figure

        fig = new_figure(max(8.0, min(40.0, tl.step / 4)), 1.0 + 0.4 * args.pp)
        plot_schedule(fig.add_subplot(), tl, unit=args.unit)
        save_figure(fig, out, force=args.force, bbox_inches="tight")
    if args.json:
        if not args.order:
            rep.pop("order")
        print(json.dumps(rep, indent=1))
    else:
        print(format_report(rep, args.unit, args.order))
    if out is not None and not args.json:
        print(f"wrote {out}")
    return 0
