"""moesim sweep FILE: run a what-if grid of scenarios on Dask and summarise it.

Runs every point of the sweep file on a local Dask cluster (worker processes, one per
CPU unless --workers N) or on an existing cluster (--scheduler tcp://host:port). The
output folder (-o, default out/sweeps/<sweep name>) gets summary.md and summary.json
(counts, the points whose layout does not fit in device memory, means per
combination), results.parquet (one row per point), means.csv, points.jsonl (appended
as points finish) and PNG plots. Re-running resumes, skipping finished points.
--plot-only redraws the plots from saved results.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from moesim.cli.common import add_output_flags


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="sweep YAML file (see scenarios/sweeps/)")
    p.add_argument("--scheduler", default=None, metavar="ADDR",
                   help="address of an existing Dask scheduler, e.g. tcp://host:8786")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes of the local cluster (default: one per CPU)")
    p.add_argument("--threads", action="store_true",
                   help="local cluster of threads in this process instead of processes")
    p.add_argument("--plot-only", action="store_true",
                   help="redraw the plots from the folder's results.parquet, run nothing")
    p.add_argument("--no-plots", action="store_true", help="write no PNG files")
    add_output_flags(p, out_default="out/sweeps/<sweep name>",
                     json_help="print the sweep's summary.json on stdout")


def run(args: argparse.Namespace) -> int:
    from moesim.cli.common import output_folder
    from moesim.errors import InputError
    from moesim.scenario.blame import named_by
    from moesim.sweep.spec import load_sweep

    try:
        spec = load_sweep(args.file)
    except InputError as err:   # an error of the scenario it names names the sweep too
        raise named_by(err, args.file, "scenario of") from None
    if args.workers is not None and args.workers < 1:
        raise InputError("command line", "--workers", "an integer >= 1", args.workers)
    if args.scheduler and (args.workers is not None or args.threads):
        raise InputError("command line", "--scheduler", "no --workers/--threads with an existing "
                         "cluster (its workers are its own)", args.scheduler)
    if args.plot_only:
        if args.no_files:
            raise InputError("command line", "--plot-only", "either --plot-only (which "
                             "writes plots) or --no-files", "both")
        return _plot_only(args, spec, output_folder(args, spec.name, root=SWEEPS_ROOT))
    out = output_folder(args, spec.name, root=SWEEPS_ROOT)
    if out is not None:
        return _sweep(args, spec, out)
    with tempfile.TemporaryDirectory(prefix="moesim-sweep-") as tmp:   # --no-files
        return _sweep(args, spec, Path(tmp) / spec.name)


#: where sweeps write without -o: out/sweeps/<sweep name>
SWEEPS_ROOT = "out/sweeps"


def _plot_only(args: argparse.Namespace, spec, out: Path) -> int:
    from moesim.outputs import claim, register
    from moesim.sweep.plots import write_sweep_plots
    from moesim.sweep.results import load_results
    from moesim.sweep.runner import check_sweep_folder

    df = load_results(out)
    check_sweep_folder(spec, out, args.force)
    with claim(out):
        paths = write_sweep_plots(out, df, spec)
        for p in paths:
            register(out, p.name)      # the sweep's own files: a rerun replaces them
    print(f"moesim sweep: redrew {len(paths)} plots from {out}/results.parquet: "
          + ", ".join(p.name for p in paths))
    return 0


def _sweep(args: argparse.Namespace, spec, out: Path) -> int:
    from moesim.errors import InputError
    from moesim.outputs import Outputs, claim
    from moesim.sweep.plots import write_sweep_plots
    from moesim.sweep.results import MEANS_FILE, POINTS_FILE, RESULTS_FILE, SPEC_FILE, aggregate
    from moesim.sweep.runner import check_sweep_folder, run_sweep, sweep_identity
    from moesim.sweep.spec import expand
    from moesim.sweep.summary import summary_markdown, sweep_summary

    quiet = args.quiet or args.json
    files = not args.no_files
    check_sweep_folder(spec, out, args.force)     # before the long part
    if not quiet:
        print(f"moesim sweep: {spec.name}: {len(expand(spec))} points "
              f"({spec.mode} over {', '.join(spec.axis_keys)}; {len(spec.seeds)} seed(s))"
              + (f" -> {out}/" if files else ""), file=sys.stderr)
    # one run at a time; checked again under the claim by run_sweep (prepare_outdir)
    with claim(out, identity=sweep_identity(spec)):
        rep = run_sweep(spec, out, scheduler=args.scheduler, workers=args.workers,
                        processes=not args.threads, quiet=quiet, force=args.force)
        df = rep.frame
        paths = [] if args.no_plots or not files else write_sweep_plots(out, df, spec)
        names = [POINTS_FILE, SPEC_FILE, RESULTS_FILE, MEANS_FILE, *(p.name for p in paths)]
        summary = sweep_summary(spec, df, aggregate(df), ran=rep.ran, reused=rep.reused,
                                files=[*names, "summary.json", "summary.md"])
        if files:
            outs = Outputs(out, force=args.force)
            outs.adopt(*names)
            outs.commit(summary, summary_markdown)
    if summary["oom"]:     # one line, however many points
        n, total = summary["oom_points"], summary["counts"].get("ok", 0)
        if args.strict:
            raise InputError("command line", "--strict", "every point's layout to fit in "
                             "device memory", f"{n} of {total} points do not fit"
                             + (f" (listed in {out}/summary.md)" if files else ""))
        print(f"moesim sweep: warning: {n} of {total} points do not fit in device memory "
              "(oom in summary.json and results.parquet; --strict makes this exit 2)",
              file=sys.stderr)
    if args.json:
        import json

        print(json.dumps(summary, indent=1))
        return 1 if rep.failed_errors else 0
    counts = ", ".join(f"{k} {v}" for k, v in sorted(rep.counts.items()))
    print(f"moesim sweep: {rep.total} points ({counts}); ran {rep.ran}, "
          f"{rep.reused} already done; {rep.wall_s:.1f} s")
    for reason, n in rep.skipped_reasons.items():
        print(f"  skipped {n}: {reason}")
    for err, n in rep.failed_errors.items():
        print(f"  failed {n}: {err}")
    if files:
        print(f"  wrote {out}/ (summary.md, summary.json, {RESULTS_FILE}, {MEANS_FILE}"
              + "".join(f", {p.name}" for p in paths) + ")")
    return 1 if rep.failed_errors else 0
