"""``moesim sweep FILE -o OUTDIR``: run a what-if grid on Dask and plot it.

Runs every point of the sweep file on a local Dask cluster (worker processes, one per
CPU unless ``--workers N``) or on an existing cluster (``--scheduler tcp://host:port``).
Finished points are appended to ``OUTDIR/points.jsonl`` as they finish; the end
result is ``results.parquet``, ``means.csv`` and PNG plots. Re-running resumes,
skipping finished points. ``--plot-only`` redraws the plots from saved results.
"""

from __future__ import annotations

import argparse
import sys
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
                   help="redraw the plots from OUTDIR/results.parquet, run nothing")
    p.add_argument("--no-plots", action="store_true", help="write no PNG files")
    add_output_flags(p, out_default="out/sweeps/<sweep name>",
                     json_help="print the sweep's summary.json on stdout")


def run(args: argparse.Namespace) -> int:
    from moesim.errors import InputError
    from moesim.outputs import check_dir_target, claim
    from moesim.scenario.blame import named_by
    from moesim.sweep.plots import write_sweep_plots
    from moesim.sweep.results import load_results
    from moesim.sweep.runner import run_sweep
    from moesim.sweep.spec import expand, load_sweep

    try:
        spec = load_sweep(args.file)
    except InputError as err:   # an error of the scenario it names names the sweep too
        raise named_by(err, args.file, "scenario of") from None
    out = Path(args.out) if args.out else Path("out") / "sweeps" / spec.name
    if args.workers is not None and args.workers < 1:
        raise InputError("command line", "--workers", "an integer >= 1", args.workers)
    if args.scheduler and (args.workers is not None or args.threads):
        raise InputError("command line", "--scheduler", "no --workers/--threads with an existing "
                         "cluster (its workers are its own)", args.scheduler)
    if args.plot_only:
        df = load_results(out)
        paths = write_sweep_plots(out, df, spec)
        print(f"moesim sweep: redrew {len(paths)} plots from {out}/results.parquet: "
              + ", ".join(p.name for p in paths))
        return 0
    if not args.quiet:
        print(f"moesim sweep: {spec.name}: {len(expand(spec))} points "
              f"({spec.mode} over {', '.join(spec.axis_keys)}; {len(spec.seeds)} seed(s)) "
              f"-> {out}", file=sys.stderr)
    check_dir_target(out)
    with claim(out):   # one sweep at a time writes into a folder (issue 20 item 7)
        rep = run_sweep(spec, out, scheduler=args.scheduler, workers=args.workers,
                        processes=not args.threads, quiet=args.quiet, force=args.force)
    paths = [] if args.no_plots else write_sweep_plots(out, load_results(out), spec)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(rep.counts.items()))
    print(f"moesim sweep: {rep.total} points ({counts}); ran {rep.ran}, "
          f"{rep.reused} already done; {rep.wall_s:.1f} s")
    for reason, n in rep.skipped_reasons.items():
        print(f"  skipped {n}: {reason}")
    for err, n in rep.failed_errors.items():
        print(f"  failed {n}: {err}")
    files = ["results.parquet", "means.csv", *(p.name for p in paths)]
    print(f"  wrote {out}/ ({', '.join(files)})")
    return 1 if rep.failed_errors else 0
