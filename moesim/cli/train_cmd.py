"""``moesim train [SCENARIO] --days D``: pre-training as a campaign over days, with
failures drawn per component, checkpoints, restarts and lost work
(:mod:`moesim.campaign`; docs/campaign.md).

The step time comes from one simulated step of SCENARIO (or ``--step-s``), the tokens per
step from its schedule and layout, the checkpoint from its memory model; failure rates and
costs from ``--campaign FILE`` (default: the Llama 3 405B table, arXiv 2407.21783 Table
5). Prints ETTR, interruptions by cause against their expectation, the checkpoint
interval a sweep finds beside Young's and Daly's; the folder (``-o DIR``, default
``out/<name>``) gets summary.md, summary.json and timeline.png. The what-if flags
(``--interval-s``, ``--mode``, ``--target``, ``--spares``, ``--domain``) override the
campaign file.
"""

from __future__ import annotations

import argparse
import json
import sys

from moesim.cli.common import add_output_flags, finite_float


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", nargs="?", default=None,
                   help="scenario YAML file or shipped name (optional when the campaign "
                        "file gives cluster.gpus, step and checkpoint.bytes)")
    p.add_argument("--campaign", default=None, metavar="FILE",
                   help="campaign file: failure rates, costs, checkpoints (default: the "
                        "Llama 3 405B table)")
    p.add_argument("--days", type=finite_float, default=None,
                   help="wall-clock days to simulate (at most 3650)")
    p.add_argument("--tokens", type=finite_float, default=None,
                   help="a token budget: run until it is trained (wall days to reach it)")
    p.add_argument("--step-s", type=finite_float, default=None,
                   help="step time in seconds instead of simulating one step")
    p.add_argument("--seed", type=int, default=0, help="seed of the failure draws "
                   "(default 0)")
    p.add_argument("--interval-s", type=finite_float, default=None,
                   help="what-if: seconds of training between checkpoints")
    p.add_argument("--mode", choices=("sync", "async"), default=None,
                   help="what-if: synchronous or asynchronous checkpoints")
    p.add_argument("--target", choices=("storage", "memory"), default=None,
                   help="what-if: checkpoints to storage, or to peers' CPU memory (Gemini)")
    p.add_argument("--spares", type=int, default=None, help="what-if: hot spare nodes")
    p.add_argument("--domain", choices=("job", "replica"), default=None,
                   help="what-if: a node failure restarts the job, or only its DP replica")
    p.add_argument("--no-sweep", action="store_true",
                   help="skip the checkpoint-interval sweep")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override one scenario field (repeatable)")
    add_output_flags(p, out_default="out/<campaign name>--<scenario name>", strict=False)


def _what_ifs(camp, args):
    from moesim.campaign.spec import positive
    from moesim.errors import InputError

    kw = {}
    if args.interval_s is not None:
        kw["interval_s"] = positive("command line", "--interval-s", args.interval_s)
    if args.mode is not None:
        kw["mode"] = args.mode
    if args.target is not None:
        kw["target"] = args.target
    if args.spares is not None:
        if args.spares < 0:
            raise InputError("command line", "--spares", "an integer >= 0", args.spares)
        kw["spare_nodes"] = args.spares
    if args.domain is not None:
        kw["domain"] = args.domain
    return camp.with_(**kw) if kw else camp


def run(args: argparse.Namespace) -> int:
    from moesim.campaign.run import check_length, resolve_step, run_campaign
    from moesim.campaign.spec import positive, read_campaign
    from moesim.cli.common import output_folder
    from moesim.outputs import check_run_folder, claim
    from moesim.trace.progress import Progress

    days, tokens = check_length(args.days, args.tokens)
    if args.seed < 0:
        from moesim.errors import InputError
        raise InputError("command line", "--seed", "an integer >= 0", args.seed)
    if args.step_s is not None:
        positive("command line", "--step-s", args.step_s)
    camp = _what_ifs(read_campaign(args.campaign), args)
    name = camp.name + (f"--{_stem(args.scenario)}" if args.scenario else "")
    out = output_folder(args, name, args.overrides)
    identity = {"campaign": camp.source, "scenario": args.scenario,
                "overrides": list(args.overrides)}
    if out is not None:
        check_run_folder(out, args.force, identity=identity)    # before the long part
    if args.scenario is not None:   # before a step is simulated
        from moesim.cli.common import refuse_serving
        from moesim.scenario import load_scenario
        refuse_serving(load_scenario(args.scenario, list(args.overrides)), args.overrides,
                       "train", "count a training step's time and checkpoint")
    res, step_s, step_from = resolve_step(args.scenario, args.overrides, args.step_s)
    prog = Progress(days or 0.0, f"campaign {camp.name} (days)",
                    quiet=args.quiet or args.json)
    done = [0.0]

    def progress(day: float) -> None:
        prog.update(day - done[0])
        done[0] = day

    result = run_campaign(camp, res, step_s, step_from, days=days, tokens=tokens,
                          seed=args.seed, sweep=not args.no_sweep, progress=progress)
    prog.close()
    if out is not None:
        with claim(out, force=args.force, identity=identity):
            write_outputs(result, out, force=args.force)
    from moesim.campaign.summary import text

    if args.json:
        print(json.dumps(result.summary, indent=1, allow_nan=False))
        if out is not None:
            print(f"moesim train: wrote {out}/", file=sys.stderr)
    else:
        print(text(result.summary))
        if out is not None:
            print(f"  wrote {out}/ (summary.md, summary.json, timeline.png)")
    return 0


def _stem(scenario: str) -> str:
    from pathlib import Path

    return Path(scenario).stem


def write_outputs(result, out, *, force: bool) -> None:
    from moesim.campaign.plot import plot_causes, plot_progress
    from moesim.campaign.summary import markdown
    from moesim.outputs import Outputs
    from moesim.trace.plots import new_figure
    from moesim.trace.report import save_figure

    outs = Outputs(out, force=force)
    try:
        fig = new_figure(13, 5)
        gs = fig.add_gridspec(1, 3)
        plot_progress(fig.add_subplot(gs[0, :2]), result.timeline, result.summary)
        plot_causes(fig.add_subplot(gs[0, 2]), result.summary)
        outs.add("timeline.png", lambda t: save_figure(fig, t))
        outs.commit(result.summary, lambda s: markdown(s))
    finally:
        outs.discard()
