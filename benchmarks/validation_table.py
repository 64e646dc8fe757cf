"""Regenerate the validation-study table of docs/validation.md.

    python benchmarks/validation_table.py                 # calibrate on traces/uniform,
                                                          # validate uniform, zipf, hot
    python benchmarks/validation_table.py --repeat traces/uniform /tmp/uniform2

Calibrates in memory exactly as ``moesim calibrate traces/uniform -o calib.json`` does
(same code), then runs ``moesim validate``'s code on each trace directory and prints a
Markdown table: the signed error of each phase per rank ((simulated − measured) /
measured of the means over the traced steps), the median |error| per trace, and the
measured step-to-step variation (std/mean over steps, forward and backward).
``--repeat A B`` also prints how much the measured phases of two recordings of the
same configuration differ (the run-to-run noise, which bounds any error).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from moesim.validation.calibrate import calibrate
from moesim.validation.calibration import model_from_dict
from moesim.validation.ingest import ingest
from moesim.validation.validate import PHASES, validate

SHORT = {"forward_s": "forward", "backward_s": "backward", "dispatch_s": "dispatch",
         "experts_s": "experts", "combine_s": "combine"}


def _backend(trace_dir: str) -> str:
    try:
        return str(json.loads((Path(trace_dir) / "routing.json").read_text())["args"]["backend"])
    except (OSError, ValueError, KeyError, TypeError):
        return "gloo"


def table(calib_dirs: list[str], trace_dirs: list[str]) -> str:
    doc = calibrate([ingest([d]) for d in calib_dirs], calib_dirs, backend=_backend(calib_dirs[0]))
    model = model_from_dict(doc)
    head = ("| trace | role | rank | " + " | ".join(SHORT[p] for p in PHASES)
            + " | median abs error | step cv fwd / bwd |")
    lines = [f"calibration: {', '.join(calib_dirs)} (gemm {doc['gemm']['flops_per_s'] / 1e9:.1f}"
             f" GFLOP/s + {doc['gemm']['overhead_s'] * 1e6:.0f} µs; memory "
             f"{doc['memory']['bytes_per_s'] / 1e9:.2f} GB/s + "
             f"{doc['memory']['overhead_s'] * 1e6:.2f} µs; comm "
             f"{doc['comm']['latency_s'] * 1e6:.0f} µs + bytes / "
             f"{doc['comm']['bandwidth_Bps'] / 1e9:.2f} GB/s; host gap "
             f"{doc['host']['op_gap_s'] * 1e6:.0f} µs/op)", "",
             head, "|" + "---|" * (head.count("|") - 1)]
    for d in trace_dirs:
        v = validate(ingest([d]), model, source=d)
        role = "fit" if d in calib_dirs else "prediction"
        med = v.median_abs_error()
        for r in range(v.world):
            err = v.error(r)
            cv = v.to_json()["ranks"][r]["measured_step_cv"]
            cells = " | ".join(f"{err[p]:+.1%}" for p in PHASES)
            lines.append(f"| {d if r == 0 else ''} | {role if r == 0 else ''} | {r} | {cells} | "
                         f"{f'{med:.1%}' if r == 0 else ''} | "
                         f"{cv['forward_s']:.0%} / {cv['backward_s']:.0%} |")
    return "\n".join(lines)


def repeat(a: str, b: str) -> str:
    """Measured phases (mean over steps) of recording b relative to recording a."""
    va, vb = (validate(ingest([d]), _null_model(d)) for d in (a, b))
    lines = [f"run-to-run: measured phases of {b} relative to {a} (mean over steps)"]
    for r in range(va.world):
        ma, mb = va.mean(r, "measured"), vb.mean(r, "measured")
        lines.append(f"  rank {r}: " + ", ".join(f"{SHORT[p]} {(mb[p] - ma[p]) / ma[p]:+.1%}"
                                                 for p in PHASES))
    return "\n".join(lines)


def _null_model(d: str):
    # measured phases do not depend on the model; any valid calibration will do
    return model_from_dict(calibrate([ingest([d])], [d]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", nargs="+", default=["traces/uniform"], metavar="DIR")
    ap.add_argument("--traces", nargs="+", default=["traces/uniform", "traces/zipf",
                                                    "traces/hot"], metavar="DIR")
    ap.add_argument("--repeat", nargs=2, metavar=("DIR_A", "DIR_B"))
    args = ap.parse_args()
    print(table(args.calibrate, args.traces))
    if args.repeat:
        print()
        print(repeat(*args.repeat))


if __name__ == "__main__":
    main()
