"""``moesim plot RUN_DIR``: redraw the timeline (or experts / links) of a run directory
from its trace.json and summary.json, optionally zoomed on ranks and layers."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from moesim.errors import InputError
from moesim.outputs import check_figure_target, register, save_figure
from moesim.trace.chrome import load_chrome_trace_file
from moesim.trace.compare import load_summary
from moesim.trace.result import SimResult


def parse_range(text: str, flag: str) -> list[int]:
    """``"0-7"``, ``"3"``, ``"0-3,8,12-15"`` → sorted list of ints."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise InputError("command line", flag, "a range like 0-7 or 0-3,8", text) from None
        if a < 0 or b < a:
            raise InputError("command line", flag, "a range like 0-7 with 0 <= first <= last", text)
        out.update(range(a, b + 1))
    return sorted(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="run folder written by moesim run or moesim serve "
                   "(trace.json, summary.json)")
    p.add_argument("--ranks", help="ranks to show, e.g. 0-7 or 0-3,8 (default: all)")
    p.add_argument("--layers", help="layers to show, e.g. 3-4 (default: all)")
    p.add_argument("--what", choices=("timeline", "experts"), default="timeline",
                   help="which plot (default timeline)")
    p.add_argument("-o", "--output", help="image to write, its format from the extension "
                   "(default RUN_DIR/zoom.png; .png is added to a name without one; an "
                   "existing folder gets zoom.png inside it)")
    p.add_argument("--force", action="store_true", help="overwrite the output if it exists")


def result_from_run_dir(run_dir: Path) -> SimResult:
    """A SimResult rebuilt from trace.json and summary.json (no link statistics)."""
    if not run_dir.is_dir():
        raise InputError(str(run_dir), "", "a run directory written by `moesim run`", "not a directory")
    summary = load_summary(run_dir)
    spans, other = load_chrome_trace_file(run_dir / "trace.json")
    n_ranks = int(other.get("n_ranks") or summary.get("n_ranks") or
                  (max((s.rank for s in spans), default=-1) + 1))
    ex = summary.get("experts") or {}
    tok = ex.get("tokens_per_expert")
    dropped = ex.get("dropped")
    cap = ex.get("capacity_per_expert")
    return SimResult(
        spans=spans, summary=summary, scenario=summary.get("scenario") or {}, n_ranks=n_ranks,
        ranks_per_node=int(other.get("ranks_per_node") or summary.get("ranks_per_node") or 1),
        step_time_s=float(other.get("step_time_s") or summary["step_time_s"]),
        hot_ranks=list(other.get("hot_ranks") or summary.get("hot_ranks") or []),
        expert_tokens=None if tok is None else np.asarray(tok, float),
        expert_dropped=np.asarray(dropped, float) if isinstance(dropped, list) else None,
        expert_capacity=None if cap is None else np.array(
            [np.inf if c is None else float(c) for c in cap]),
    )


def run(args: argparse.Namespace) -> int:
    from moesim.trace.plots import new_figure, plot_experts, plot_timeline, timeline_figsize
    run_dir = Path(args.run_dir)
    ranks = parse_range(args.ranks, "--ranks") if args.ranks else None
    layers = parse_range(args.layers, "--layers") if args.layers else None
    out = Path(args.output) if args.output else run_dir / "zoom.png"
    if args.output and out.is_dir():   # a folder: the picture goes into it
        out = out / "zoom.png"
    elif not out.suffix:   # the file really written (savefig adds .png), checked as such
        out = out.with_name(out.name + ".png")
    check_figure_target(out, args.force)   # before reading the run
    result = result_from_run_dir(run_dir)
    if ranks is not None:
        bad = [r for r in ranks if r >= result.n_ranks]
        if bad:
            raise InputError("command line", "--ranks", f"ranks below {result.n_ranks}", args.ranks)
    if layers is not None:
        n_layers = max((s.layer for s in result.spans), default=-1) + 1
        if all(x >= n_layers for x in layers):  # nothing to draw
            raise InputError("command line", "--layers", f"layers below {n_layers} (the run's "
                             "trace has layers 0.." f"{n_layers - 1})" if n_layers else
                             "no --layers (the run's trace has no per-layer spans)", args.layers)
    if args.what == "experts":
        fig = new_figure(10, 5)
        plot_experts(result, fig.add_subplot())
    else:
        n = len(ranks) if ranks is not None else result.n_ranks
        fig = new_figure(*timeline_figsize(n, result.ranks_per_node))
        plot_timeline(result, fig.add_subplot(), ranks=ranks, layers=layers)
    save_figure(fig, out, force=args.force, bbox_inches="tight")
    if out.parent.resolve() == run_dir.resolve():
        register(run_dir, out.name)   # part of that run: replaced with it when it is rerun
    print(f"wrote {out}")
    return 0
