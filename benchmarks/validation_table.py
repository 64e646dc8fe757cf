"""Regenerate the validation-study table of docs/validation.md.

    python benchmarks/validation_table.py      # calibrate on the two uniform recordings;
                                               # validate all five; noise from DIR-repeat
    python benchmarks/validation_table.py --repeat traces/hot traces/hot-repeat

Calibrates in memory exactly as ``moesim calibrate traces/uniform traces/uniform-repeat
-o calib.json`` does
(same code), then runs ``moesim validate``'s code on each trace directory and prints a
Markdown table: per rank the signed error of each phase (median over the traced steps
of (simulated − measured) / measured), the median |error| per trace, the measured
step-to-step variation (std/mean over steps, forward and backward), and the run-to-run
noise: for a trace given with ``--repeat TRACE OTHER`` (a second recording of the same
configuration), the median over steps of (OTHER − TRACE) / TRACE of the measured
forward / backward — the same statistic as the error, which cannot be smaller.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moesim.compute.calibrated import model_from_dict
from moesim.validation.calibration.calibrate import calibrate
from moesim.validation.cpu.ingest import ingest
from moesim.validation.cpu.noise import run_to_run_noise
from moesim.validation.cpu.validate import PHASES, validate

SHORT = {"forward_s": "forward", "backward_s": "backward", "dispatch_s": "dispatch",
         "experts_s": "experts", "combine_s": "combine"}


def _backend(trace_dir: str) -> str:
    try:
        return str(json.loads((Path(trace_dir) / "routing.json").read_text())["args"]["backend"])
    except (OSError, ValueError, KeyError, TypeError):
        return "gloo"


def table(calib_dirs: list[str], trace_dirs: list[str],
          repeats: dict[str, str] | None = None) -> str:
    repeats = repeats or {}
    doc = calibrate([ingest([d]) for d in calib_dirs], calib_dirs, backend=_backend(calib_dirs[0]))
    model = model_from_dict(doc)
    head = ("| trace | role | rank | " + " | ".join(SHORT[p] for p in PHASES)
            + " | median abs error | step cv fwd / bwd | noise fwd / bwd |")
    lines = [f"calibration: {', '.join(calib_dirs)} ({describe(doc)})", "",
             head, "|" + "---|" * (head.count("|") - 1)]
    for d in trace_dirs:
        ts = ingest([d])
        v = validate(ts, model, source=d)
        noise = run_to_run_noise(ts, ingest([repeats[d]]), repeats[d]) if d in repeats else None
        role = "fit" if d in calib_dirs else "prediction"
        med = v.median_abs_error()
        for r in range(v.world):
            err = v.error(r)
            cv = v.to_json()["ranks"][r]["measured_step_cv"]
            cells = " | ".join(f"{err[p]:+.1%}" for p in PHASES)
            nz = ("—" if noise is None else
                  f"{noise[r]['forward_s']:+.1%} / {noise[r]['backward_s']:+.1%}")
            lines.append(f"| {d if r == 0 else ''} | {role if r == 0 else ''} | {r} | {cells} | "
                         f"{f'{med:.1%}' if r == 0 else ''} | "
                         f"{cv['forward_s']:.0%} / {cv['backward_s']:.0%} | {nz} |")
    for d, other in repeats.items():
        lines.append("")
        lines.append(repeat(d, other))
    return "\n".join(lines)


def describe(doc: dict) -> str:
    """One line of the calibration's coefficients, with units."""
    g, m, c, h = doc["gemm"], doc["memory"], doc["comm"], doc["host"]
    traffic = (f" + operand bytes / {g['bytes_per_s'] / 1e9:.2f} GB/s"
               if g.get("bytes_per_s") else "")
    return (f"gemm {g['overhead_s'] * 1e6:.0f} µs + FLOPs / {g['flops_per_s'] / 1e9:.1f} GFLOP/s"
            f"{traffic}; "
            f"memory {m['bytes_per_s'] / 1e9:.2f} GB/s + {m['overhead_s'] * 1e6:.2f} µs; "
            f"comm {c['latency_s'] * 1e6:.0f} µs + bytes / {c['bandwidth_Bps'] / 1e9:.2f} GB/s; "
            + ", ".join(f"host {k} {v * 1e6:.0f} µs" for k, v in h.items()))


def repeat(a: str, b: str) -> str:
    """Run-to-run noise of every phase: median over steps of (b − a) / a, measured."""
    noise = run_to_run_noise(ingest([a]), ingest([b]), b)
    lines = [f"run-to-run noise: {b} against {a} (median over steps of (b - a) / a, measured)"]
    for r, nz in enumerate(noise):
        lines.append(f"  rank {r}: " + ", ".join(f"{SHORT[p]} {nz[p]:+.1%}" for p in PHASES))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", nargs="+", default=["traces/uniform", "traces/uniform-repeat"],
                    metavar="DIR", help="calibration recordings (default: both uniform ones)")
    ap.add_argument("--traces", nargs="+", default=["traces/uniform", "traces/uniform-repeat",
                                                    "traces/zipf", "traces/hot",
                                                    "traces/hot-repeat"], metavar="DIR")
    ap.add_argument("--repeat", nargs=2, action="append", metavar=("DIR", "OTHER_DIR"),
                    help="a second recording of DIR's configuration (noise); repeatable")
    args = ap.parse_args()
    repeats = dict(args.repeat) if args.repeat else {
        d: f"{d}-repeat" for d in args.traces if Path(f"{d}-repeat").is_dir()}
    print(table(args.calibrate, args.traces, repeats))


if __name__ == "__main__":
    import sys

    from results_page import run_benchmark  # this folder
    sys.exit(run_benchmark(main, "validation", "Validation study: CPU recordings"))
