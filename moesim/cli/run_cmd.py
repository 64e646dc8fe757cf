"""``moesim run SCENARIO``: simulate one training step and write what users look at.

Writes summary.md, summary.json, trace.json (Perfetto), timeline.png, experts.png,
links.png and stalls.csv into ``-o OUTDIR`` (default ``out/<scenario name>``, or
``out/<scenario name>--<overrides>`` with ``--set``: one folder per distinct run, see
:func:`moesim.outputs.default_run_dir`; written atomically by :mod:`moesim.outputs`);
``--json`` prints the summary as JSON on stdout; ``--set key=value`` changes one
scenario field for a what-if; ``--no-files`` only prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from moesim.cli.common import OUT_DEFAULT, add_output_flags
from moesim.trace.progress import Progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario YAML file or shipped name (e.g. toy-cpu)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one field, e.g. --set routing.kind=hot (repeatable)")
    add_output_flags(p, out_default=OUT_DEFAULT)


def run(args: argparse.Namespace) -> int:
    from moesim.cli.common import refuse_serving
    from moesim.errors import InputError
    from moesim.outputs import claim, default_run_dir
    from moesim.trace.report import check_outdir
    from moesim.wiring import resolve_path

    if args.no_files and args.out:      # the output convention (moesim.cli.common)
        raise InputError("command line", "--no-files", "either -o DIR or --no-files", "both")
    res = resolve_path(args.scenario, args.overrides)
    refuse_serving(res.scenario, args.overrides, "run", "simulate a training step")
    for w in res.warnings:
        print(f"moesim run: warning: {w}", file=sys.stderr)
    if args.no_files:
        return _simulate_and_report(args, res, None)
    out = Path(args.out) if args.out else default_run_dir(res.scenario.name, args.overrides)
    check_outdir(out, args.force, res.scenario.to_dict())  # before the long part
    with claim(out):   # the folder is this run's until its files are in place
        check_outdir(out, args.force, res.scenario.to_dict())   # as it is now ours
        if not args.quiet:
            print(f"moesim run: output folder {out}/", file=sys.stderr)
        return _simulate_and_report(args, res, out)


def _simulate_and_report(args: argparse.Namespace, res, out: Path | None) -> int:
    from moesim.engine import collector
    from moesim.engine.api import simulate
    from moesim.memory.fit import fits_of, flag_fits
    from moesim.trace.report import full_summary, jsonable, write_run_outputs

    prog = Progress(0, f"simulating {res.scenario.name}", quiet=args.quiet)

    def progress(stage: str, n: float) -> None:
        if stage == "built":
            prog.total = n
        else:
            prog.update(n)

    # the step and its report; from the command line, what they leave is frozen rather than
    # scanned once more before the process exits (moesim.engine.collector)
    with collector.paused(freeze=getattr(args, "_own_process", False)):
        # links' load over time is drawn only into the output files (links.png): without
        # them the exact engine's flow network keeps no series (moesim.network.flow)
        result = simulate(res, progress=progress, **({} if out is not None else
                                                       {"record_series": False}))
        prog.close()
        # one memory verdict (moesim.memory.fit): a warning, or with --strict exit 2
        # before any file is written
        flag_fits(fits_of(result.summary.get("fit", {})), "run",
                  strict=getattr(args, "strict", False))
        if out is not None:
            # checked again as each file is put in place: files created meanwhile are kept
            write_run_outputs(result, out, force=args.force, quiet=True, claimed=True)
        summary = jsonable(full_summary(result)) if args.json else None
    if summary is not None:
        print(json.dumps(summary, indent=1))
        if out is not None:   # stdout is the JSON: the folder goes to stderr
            print(f"moesim run: wrote {out}/", file=sys.stderr)
    else:
        print(text_summary(result.summary, out))
    return 0


def pricing_line(kp: dict) -> str:
    """What priced the kernels: the compute section's choice and the roofline's share."""
    asked = kp.get("compute_section")
    return (f"  kernels priced by {kp['compute_model']}"
            + (f" (compute: {asked})" if asked else "")
            + f"; the roofline priced {kp['roofline_kernels']:,} of {kp['kernels']:,} "
            f"kernels, {kp['roofline_fraction']:.1%} of compute time (moesim kernels lists "
            "them)")


def text_summary(s: dict, out: Path | None) -> str:
    from moesim.memory.fit import fit_line
    b = s["breakdown_s"]
    step = s["step_time_s"]
    lines = [f"{s['scenario']}: step {step * 1e3:.3f} ms on {s['world']} GPUs, "
             f"{s['tokens_per_s']:,.0f} tokens/s, MFU {s['mfu'] * 100:.1f} %"]
    parts = [f"{k} {v * 1e3:.3f} ms ({v / step * 100:.1f} %)" for k, v in b.items()
             if v > 0 and step > 0]
    lines.append("  breakdown (mean over ranks): " + ", ".join(parts))
    kp = s.get("kernel_pricing")
    if kp:
        lines.append(pricing_line(kp))
    ex = s.get("experts", {})
    if ex.get("max_over_mean"):
        lines.append(f"  experts: max/mean load {ex['max_over_mean_max']:.2f}, "
                     f"lb loss {ex['lb_loss_mean']:.3f}, dropped {ex['dropped_total']:,} "
                     "(token, expert) assignments summed over layers and micro-batches")
    if s.get("fit") is not None:
        lines.append(fit_line(s["fit"]))
        if s["fit"]["oom"]:
            lines.append("  ** the figures above are for a step that does not fit in device "
                         "memory **")
    if out is not None:
        lines.append(f"  wrote {out}/ (summary.md, trace.json, timeline.png, ...)")
    return "\n".join(lines)
