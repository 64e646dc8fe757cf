"""Skewed recordings predicted with and without a shape sweep (docs/validation.md).

    python benchmarks/shape_sweep_table.py                    # shipped traces and sweep
    python benchmarks/shape_sweep_table.py --sweep traces/sweep --traces traces/hot ...

Calibrates in memory as ``moesim calibrate traces/uniform traces/uniform-repeat`` does,
without ``--shape-sweep SWEEP``, with it, and with ``--shape-sweep-memory`` too (same code), validates each skewed
recording with both (``moesim validate``'s code) and prints, per phase, the median and
the worst |error| over the recordings and ranks (error = median over the traced steps
of (simulated − measured) / measured), then every recording's per-rank errors.
"""

from __future__ import annotations

import argparse

import numpy as np

from moesim.validation.calibrate import calibrate
from moesim.validation.calibration import model_from_dict
from moesim.validation.ingest import ingest
from moesim.validation.replay import kernel_of, outside_fitted_range
from moesim.validation.shape_fit import sweep_table
from moesim.validation.validate import PHASES, validate

SW = "+ shape sweep"
SHORT = {"forward_s": "forward", "backward_s": "backward", "dispatch_s": "dispatch",
         "experts_s": "experts", "combine_s": "combine"}


BUCKETS = ((0, 300, "< 300 rows"), (300, 2500, "300–2500 rows"), (2500, 1e12, "> 2500 rows"))


def gemm_table(traces: list[str], docs: dict[str, dict], table) -> str:
    """Expert GEMM time per step, simulated against measured, by the rows of the swept
    dim (m, or k for a weight gradient): (Σ simulated − Σ measured) / Σ measured per
    recording, rank and bucket, over all traced steps."""
    models = {c: model_from_dict(d) for c, d in docs.items() if "memory)" not in c}
    lines = ["| recording | rank | rows | GEMMs | measured ms/step | "
             + " | ".join(f"{c} error" for c in models) + " |",
             "|---|---|---|---|---|" + "---|" * len(models)]
    for d in traces:
        ts = ingest([d])
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
    ap.add_argument("--calibrate", nargs="+", default=["traces/uniform", "traces/uniform-repeat"])
    ap.add_argument("--sweep", nargs="+", default=["traces/sweep"])
    ap.add_argument("--traces", nargs="+", default=["traces/hot", "traces/hot-repeat",
                                                    "traces/zipf"])
    args = ap.parse_args()
    sets = [ingest([d]) for d in args.calibrate]
    docs = {"uniform fit": calibrate(sets, args.calibrate),
            SW: calibrate(sets, args.calibrate, shapes=sweep_table(args.sweep),
                          shape_sources=args.sweep),
            SW + " (+ memory)": calibrate(sets, args.calibrate,
                                          shapes=sweep_table(args.sweep, memory=True),
                                          shape_sources=args.sweep)}
    print(f"calibration: {', '.join(args.calibrate)}; sweep: {', '.join(args.sweep)} "
          "(GEMM scales to the recordings: " + ", ".join(
              f"{k} {v:.3f}" for k, v in docs[SW]["shape_sweep"]["scales"].items()) + ")")
    errs: dict[str, dict[str, list[float]]] = {c: {p: [] for p in PHASES} for c in docs}
    rows = []
    for d in args.traces:
        ts = ingest([d])
        for name, doc in docs.items():
            model = model_from_dict(doc)
            v = validate(ts, model, source=d)
            o = outside_fitted_range(ts, model)
            for r in range(v.world):
                e = v.error(r)
                for p in PHASES:
                    errs[name][p].append(abs(e[p]))
                rows.append(f"| {d} | {name} | {r} | " + " | ".join(
                    f"{e[p]:+.1%}" for p in PHASES) + f" | {o['gemm']} + {o['memory']} / {o['compute_ops']} |")
    print()
    print("| phase | " + " | ".join(f"{c}: median / worst abs error" for c in docs) + " |")
    print("|---|" + "---|" * len(docs))
    for p in [*PHASES, "all"]:
        cells = []
        for c in docs:
            v = (np.concatenate([errs[c][q] for q in PHASES]) if p == "all" else errs[c][p])
            cells.append(f"{np.median(v):.1%} / {np.max(v):.1%}")
        print(f"| {SHORT.get(p, p)} | " + " | ".join(cells) + " |")
    print()
    print(gemm_table(args.traces, docs, sweep_table(args.sweep)))
    print()
    print("| recording | calibration | rank | " + " | ".join(SHORT[p] for p in PHASES)
          + " | ops outside the fitted range (GEMM + memory-bound / all) |")
    print("|---|---|---|" + "---|" * (len(PHASES) + 1))
    print("\n".join(rows))


if __name__ == "__main__":
    main()
