"""``moesim validate``: replay recorded MoE steps in the simulator; measured vs simulated."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

OUT_FILES = ("validation.json", "overlay.png")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_dir", metavar="TRACE_DIR",
                        help="rank traces of one recording (a directory, as moesim ingest "
                             "reads), or one GPU trace file (with --scenario)")
    parser.add_argument("--calibration", metavar="CALIB_JSON",
                        help="calibration file (moesim calibrate -o); every simulated duration "
                             "comes from it (required for CPU recordings; for a GPU trace it "
                             "replaces the scenario's compute model)")
    parser.add_argument("--scenario", metavar="SCENARIO",
                        help="GPU trace: the scenario (model, parallelism, sequence, device, "
                             "compute model) whose per-layer kernel times are compared; a "
                             "DualPipe(V) scenario is simulated and one rank's overlapped F&B "
                             "pair compared with the trace (span, stream busy, dispatch/"
                             "combine per layer)")
    parser.add_argument("--fit-forward", action="store_true",
                        help="GPU trace: price GEMMs and attention at the rates measured on "
                             "the forward (F) phases, to predict the B and W phases")
    parser.add_argument("-o", "--output", metavar="OUTDIR",
                        help="write validation.json and overlay.png (timeline) here")
    parser.add_argument("--force", action="store_true",
                        help="overwrite validation.json / overlay.png in OUTDIR")
    parser.add_argument("--step", type=int, default=None,
                        help="traced step drawn in overlay.png (default: the first)")
    parser.add_argument("--json", action="store_true",
                        help="print per-rank measured/simulated/error as JSON (seconds)")


def text_table(doc: dict, trace_dir: str, calib: str) -> str:
    from moesim.validation.cpu.validate import PHASES

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:+.1%}"

    lines = [f"{trace_dir} vs simulation with {calib}: {len(doc['ranks'])} ranks, "
             f"steps {doc['steps']} (medians over steps)",
             f"{'rank':>4}  {'phase':<11}{'measured ms':>12}{'simulated ms':>14}{'error':>9}"
             f"{'mean err':>10}{'step cv':>9}"]
    for r in doc["ranks"]:
        for p in PHASES:
            cv = r["measured_step_cv"][p]
            lines.append(f"{r['rank']:>4}  {p:<11}{r['measured'][p] * 1e3:>12.3f}"
                         f"{r['simulated'][p] * 1e3:>14.3f}{pct(r['error'][p]):>9}"
                         f"{pct(r['mean']['error'][p]):>10}"
                         f"{'n/a' if cv is None else f'{cv:.1%}':>9}")
    med = doc["median_abs_error"]
    lines.append(f"median |error| over ranks and phases: {'n/a' if med is None else f'{med:.1%}'}")
    lines.append("measured, simulated: medians over steps; error: median over steps of "
                 "(simulated - measured) / measured; mean err: the same for the means; "
                 "step cv: std/mean of the measured phase over steps")
    return "\n".join(lines)


def _overlay(v, step: int, path: Path, title: str, force: bool) -> None:
    from moesim.outputs import save_figure
    from moesim.trace.plots import new_figure
    from moesim.validation.cpu.overlay import plot_overlay

    rows = [c for c in v.per_step if c.step == step]
    meas = [s for c in rows for s in c.measured_spans]
    sim = [s for c in rows for s in c.simulated_spans]
    first = min((s.start_s for s in meas), default=0.0)
    fig = new_figure(14.0, 1.6 + 0.9 * v.world)
    ax = fig.add_subplot(1, 1, 1)
    plot_overlay(meas, sim, ax, v.world, title=title, sim_offset_s=first)
    fig.tight_layout()
    save_figure(fig, path, force=force)


def warn_outside_range(o: dict, calib: str) -> dict:
    """One warning line on stderr when simulated compute ops fall outside the range the
    calibration was fitted on (their times are extrapolated; ``o``:
    :func:`moesim.validation.cpu.replay.outside_fitted_range`)."""
    n = o["gemm"] + o["memory"]
    if n:
        print(f"moesim validate: warning: {n} of {o['compute_ops']} simulated compute ops "
              f"({o['gemm']} GEMMs, {o['memory']} memory-bound) fall outside the fitted range "
              f"of {calib}, their times extrapolated (largest: {o['largest']}); moesim record "
              "--shape-sweep and moesim calibrate --shape-sweep [--shape-sweep-memory] cover "
              "them", file=sys.stderr)
    return o


def run(args: argparse.Namespace) -> int:
    from moesim.compute.calibrated import load_calibration
    from moesim.errors import InputError
    from moesim.outputs import check_dir_target, claim, make_dir, write_text
    from moesim.validation.cpu.ingest import trace_files
    from moesim.validation.gpu.trace import gpu_traces
    from moesim.validation.runs import validate_recording

    gpu = gpu_traces(trace_files([args.trace_dir]))
    if gpu is not None:
        return _run_gpu(args, gpu)
    if args.calibration is None:
        raise InputError("command line", "--calibration", "a calibration file (moesim "
                         "calibrate -o) to validate a CPU recording", "none")
    model = load_calibration(args.calibration)
    out = Path(args.output) if args.output else None
    if out is not None:
        check_dir_target(out)   # before ingesting and replaying
        clash = [f for f in OUT_FILES if (out / f).exists()]
        if clash and not args.force:
            raise InputError(str(out / clash[0]), "-o", "an OUTDIR without validation.json / "
                             "overlay.png (or --force)", "exists")
    v, doc = validate_recording(args.trace_dir, args.calibration, model)
    warn_outside_range(doc["outside_fitted_range"], args.calibration)
    step = v.steps[0] if args.step is None else args.step
    if step not in v.steps:
        raise InputError(args.trace_dir, "--step", f"one of the traced steps {list(v.steps)}",
                         args.step)
    if doc["host_warning"]:
        print(doc["host_warning"], file=sys.stderr)
    if out is not None:
        make_dir(out)
        with claim(out):    # one run writes the folder at a time (moesim.outputs)
            write_text(out / "validation.json", json.dumps(doc, indent=1) + "\n",
                       force=args.force)
            med = doc["median_abs_error"]
            _overlay(v, step, out / "overlay.png",
                     f"{args.trace_dir} step {step}: measured vs simulated "
                     f"({Path(args.calibration).name}; median |error| {med:.1%})"
                     if med is not None and math.isfinite(med)
                     else f"{args.trace_dir} step {step}", args.force)
    if args.json:
        print(json.dumps({k: doc[k] for k in ("ranks", "median_abs_error", "steps", "averaging",
                                              "units", "source", "calibration",
                                              "host_warning", "outside_fitted_range")}, indent=1))
    else:
        print(text_table(doc, args.trace_dir, args.calibration))
        if out is not None:
            print(f"wrote {out / 'validation.json'} and {out / 'overlay.png'}")
    return 0


def _check_gpu_out(out: Path, force: bool) -> None:
    from moesim.errors import InputError

    if out.exists() and not out.is_dir():
        raise InputError(str(out), "-o", "a directory (or a path to create)", "a file")
    if (out / "validation.json").exists() and not force:
        raise InputError(str(out / "validation.json"), "-o", "an OUTDIR without "
                         "validation.json (or --force)", "exists")


def _run_gpu(args: argparse.Namespace, gpu: list) -> int:
    from moesim.errors import InputError
    from moesim.scenario.read import load_scenario
    from moesim.validation.gpu.classes import class_table
    from moesim.validation.gpu.summary import summarize
    from moesim.validation.gpu.validate import text_table
    from moesim.validation.runs import gpu_compute_model, validate_gpu_trace
    from moesim.wiring import resolve

    if args.scenario is None:
        raise InputError("command line", "--scenario", "a scenario to compare a GPU trace "
                         "with", "none")
    if len(gpu) != 1:
        raise InputError(args.trace_dir, "", "one GPU trace file", f"{len(gpu)} traces")
    res = resolve(load_scenario(args.scenario))
    scn = res.scenario
    tokens = scn.schedule.micro_batch_size * scn.schedule.seq_len
    g = summarize(gpu[0])
    model, fit_doc = gpu_compute_model(gpu[0], res, args.calibration, args.fit_forward,
                                       source=args.trace_dir, summary=g)
    if args.output:
        _check_gpu_out(Path(args.output), args.force)   # before the simulation
    doc, priced = validate_gpu_trace(gpu[0], res, model, summary=g, about=dict(
        source=args.trace_dir, scenario=args.scenario,
        compute_model=args.calibration or getattr(model, "name", "scenario")))
    if fit_doc is not None:
        doc["forward_fit"] = fit_doc
    if args.output:
        from moesim.outputs import claim, write_text
        out = Path(args.output)
        with claim(out):    # held while the file goes in place, written atomically
            write_text(out / "validation.json", json.dumps(doc, indent=1) + "\n",
                       force=args.force)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(f"{args.trace_dir} vs {args.scenario} ({doc['compute_model']}), "
              f"{tokens} tokens per rank")
        if fit_doc is not None:
            print(f"fitted on the forward phases: GEMMs "
                  f"{fit_doc['gemm_flops_per_s'] / 1e12:.1f} TFLOP/s, core attention "
                  f"{fit_doc['attention_flops_per_s'] / 1e12:.1f} TFLOP/s")
        print(text_table(doc))
        kc = doc["kernel_classes"]
        print(f"\nkernel time per layer by pass and class ({kc['layers_traced']} layers "
              "traced; simulated: one layer's kernels, moesim kernels, "
              f"{getattr(priced, 'name', 'the compute model')}):")
        print("\n".join(class_table(kc)))
        if args.output:
            print(f"wrote {Path(args.output) / 'validation.json'}")
    return 0
