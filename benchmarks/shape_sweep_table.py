"""Skewed recordings predicted with and without a shape sweep (docs/validation.md).

    python benchmarks/shape_sweep_table.py                      # shipped traces and sweep
    python benchmarks/shape_sweep_table.py --study traces/sweep-study
    python benchmarks/shape_sweep_table.py --calibrate U... --sweep S... --traces T...

``--study DIR`` takes a folder written by ``benchmarks/record_sweep_study.py``
(calibrate on every ``uniform-R``, sweep ``sweep``, validate every ``hot-R`` and
``zipf-R``). The comparison is :func:`moesim.validation.calibration.shape_study.compare` (the same
code as ``moesim calibrate`` and ``moesim validate``); this prints, per phase, the
median and the worst |error| over the recordings and ranks (error = median over the
traced steps of (simulated − measured) / measured), the expert GEMMs by size, then
every recording's per-rank errors.
"""

from __future__ import annotations

import argparse

import numpy as np

from moesim.compute.calibrated import model_from_dict
from moesim.validation.calibration.shape_fit import sweep_table
from moesim.validation.calibration.shape_study import SWEPT, SWEPT_MEMORY, compare, study_dirs
from moesim.validation.cpu.replay import kernel_of
from moesim.validation.cpu.validate import PHASES

SHORT = {"forward_s": "forward", "backward_s": "backward", "dispatch_s": "dispatch",
         "experts_s": "experts", "combine_s": "combine"}
BUCKETS = ((0, 300, "< 300 rows"), (300, 2500, "300–2500 rows"), (2500, 1e12, "> 2500 rows"))


def gemm_table(traces: dict, docs: dict[str, dict], table) -> str:
    """Expert GEMM time per step, simulated against measured, by the rows of the swept
    dim (m, or k for a weight gradient): (Σ simulated − Σ measured) / Σ measured per
    recording, rank and bucket, over all traced steps (``traces``: path -> TraceSet)."""
    models = {c: model_from_dict(d) for c, d in docs.items() if c != SWEPT_MEMORY}
    lines = ["| recording | rank | rows | GEMMs | measured ms/step | "
             + " | ".join(f"{c} error" for c in models) + " |",
             "|---|---|---|---|---|" + "---|" * len(models)]
    for d, ts in traces.items():
        for r in ts.ranks:
            acc: dict[str, list] = {}
            for s in r.steps:
                for o in s.ops:
                    hit = table.gemm_family(o.m, o.k, o.n) if o.kind == "gemm" else None
                    if hit is None:
                        continue
                    name = next(b for lo, hi, b in BUCKETS if lo <= hit[1] < hi)
                    a = acc.setdefault(name, [0, 0.0] + [0.0] * len(models))
                    a[0] += 1
                    a[1] += o.dur_s
                    for i, m in enumerate(models.values()):
                        a[2 + i] += m.time_s(kernel_of(o))
            for _, _, b in BUCKETS:
                if b in acc:
                    a = acc[b]
                    lines.append(f"| {d} | {r.rank} | {b} | {a[0]} | "
                                 f"{a[1] / len(r.steps) * 1e3:.1f} | " + " | ".join(
                                     f"{x / a[1] - 1:+.1%}" for x in a[2:]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", help="a folder written by benchmarks/record_sweep_study.py")
    ap.add_argument("--calibrate", nargs="+", default=["traces/uniform", "traces/uniform-repeat"])
    ap.add_argument("--sweep", nargs="+", default=["traces/sweep"])
    ap.add_argument("--traces", nargs="+", default=["traces/hot", "traces/hot-repeat",
                                                    "traces/zipf"])
    args = ap.parse_args()
    if args.study:
        args.calibrate, args.sweep, args.traces = study_dirs(args.study)
    study = compare(args.calibrate, args.sweep, args.traces)
    docs = study.calibrations
    print(f"calibration: {', '.join(args.calibrate)}; sweep: {', '.join(args.sweep)} "
          "(GEMM scales to the recordings: " + ", ".join(
              f"{k} {v:.3f}" for k, v in docs[SWEPT]["shape_sweep"]["scales"].items()) + ")")
    print()
    print("| phase | " + " | ".join(f"{c}: median / worst abs error" for c in docs) + " |")
    print("|---|" + "---|" * len(docs))
    for p in [*PHASES, "all"]:
        cells = []
        for c in docs:
            v = [e for q in PHASES for e in study.abs_errors(c, q)] if p == "all" \
                else study.abs_errors(c, p)
            cells.append(f"{np.median(v):.1%} / {np.max(v):.1%}")
        print(f"| {SHORT.get(p, p)} | " + " | ".join(cells) + " |")
    print()
    print(gemm_table(study.traces, docs, sweep_table(args.sweep)))
    print()
    print("| recording | calibration | rank | " + " | ".join(SHORT[p] for p in PHASES)
          + " | ops outside the fitted range (GEMM + memory-bound / all) |")
    print("|---|---|---|" + "---|" * (len(PHASES) + 1))
    for r in study.rows:
        o = r.outside
        print(f"| {r.trace} | {r.calibration} | {r.rank} | " + " | ".join(
            f"{r.error[p]:+.1%}" for p in PHASES)
            + f" | {o['gemm']} + {o['memory']} / {o['compute_ops']} |")


if __name__ == "__main__":
    import sys

    from results_page import run_benchmark  # this folder
    sys.exit(run_benchmark(main, "shape-sweep", "Skewed recordings with and without a shape sweep"))
