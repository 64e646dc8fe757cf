"""``moesim rl SCENARIO``: GRPO post-training steps (rollouts, scoring, training, weight
sync; colocated or disaggregated, synchronous or with bounded staleness).

Prints the step (the steady-state mean, or with too few steps for one the fill-and-drain
mean, said so), the phases, the pools' utilization and memory; ``--json`` prints
summary.json (step_time_s, phases_s, samples_per_s, tokens_per_s_per_gpu, utilization,
staleness, long_tail_s, steps, fit, oom); the output folder (``-o DIR``, default
``out/<scenario name>`` as ``moesim run``'s, none with ``--no-files``) gets summary.md,
summary.json, details.json (pools, weight sync, KV), trace.json (Perfetto: a process per
pool, counter tracks of the rollout batch and KV use) and gantt.png (the first steps).
The trainer's and the engines' memory are checked first (:mod:`moesim.rl.memory`): a
layout that does not fit is a warning on stderr, ``oom: true``, or with ``--strict``
exit 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moesim.cli.common import OUT_DEFAULT, add_output_flags


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file with an rl section, or shipped name "
                   "(e.g. grpo-qwen3-30b-a3b)")
    p.add_argument("--steps", type=int, default=None,
                   help="RL steps to simulate (default: the scenario's rl.steps)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set rl.max_lag=1 (repeatable)")
    add_output_flags(p, out_default=OUT_DEFAULT)


def run(args: argparse.Namespace) -> int:
    from moesim.cli.common import output_folder
    from moesim.errors import InputError
    from moesim.outputs import check_run_folder, claim
    from moesim.rl.run import resolve_rl
    from moesim.scenario.sections.rl import MAX_STEPS

    if args.steps is not None and not 1 <= args.steps <= MAX_STEPS:
        raise InputError("command line", "--steps", f"an integer from 1 to {MAX_STEPS} (RL "
                         "steps one run can simulate)", args.steps)
    setup = resolve_rl(args.scenario, args.overrides)
    out = output_folder(args, setup.scenario.name, args.overrides)
    if out is None:
        return _simulate_and_report(args, setup, None)
    identity = setup.scenario.to_dict()
    check_run_folder(out, args.force, identity=identity)      # before the long part
    with claim(out, force=args.force, identity=identity):     # one run writes it at a time
        return _simulate_and_report(args, setup, out)


def _simulate_and_report(args: argparse.Namespace, setup, out: Path | None) -> int:
    import sys

    from moesim.memory.fit import flag_fits
    from moesim.rl.memory import rl_fits
    from moesim.rl.run import draw_batches, simulate_rl
    from moesim.rl.summary import details, summarize, text_summary
    from moesim.trace.progress import Progress

    steps = args.steps or setup.cfg.steps
    # the pools' memory, before the long part: a warning, or with --strict exit 2
    fits = rl_fits(setup, draw_batches(setup, steps))
    flag_fits(fits, "rl", strict=getattr(args, "strict", False))
    prog = Progress(steps, f"RL steps of {setup.scenario.name}", quiet=args.quiet or args.json)
    done = [0]

    def progress(k: int, total: int) -> None:
        prog.update(k - done[0])
        done[0] = k

    result = simulate_rl(setup, steps, progress=progress, fits=fits)
    prog.close()
    summary, det = summarize(result), details(result)
    if out is not None:
        write_outputs(result, summary, det, out, force=args.force)
    if args.json:
        print(json.dumps(summary, indent=1, allow_nan=False))
        if out is not None:     # stdout is the JSON: the folder goes to stderr
            print(f"moesim rl: wrote {out}/", file=sys.stderr)
    else:
        print(text_summary(summary, det))
        if out is not None:
            print(f"  wrote {out}/ (summary.md, summary.json, details.json, trace.json, "
                  "gantt.png)")
    return 0


def write_outputs(result, summary: dict, det: dict, out: Path, *, force: bool) -> None:
    from moesim.outputs import Outputs
    from moesim.rl.plot import plot_gantt
    from moesim.rl.summary import text_summary
    from moesim.rl.trace import write_trace
    from moesim.trace.plots import new_figure
    from moesim.trace.report import save_figure

    outs = Outputs(out, force=force)
    try:
        outs.add("trace.json", lambda t: write_trace(result, t))
        outs.add("details.json", lambda t: t.write_text(
            json.dumps(det, indent=1, allow_nan=False) + "\n"))
        fig = new_figure(12, 4.5)
        plot_gantt(result, fig.add_subplot())
        outs.add("gantt.png", lambda t: save_figure(fig, t))
        outs.commit(summary, lambda s: "# RL run\n\n```\n" + text_summary(s, det) + "\n```\n")
    finally:
        outs.discard()
