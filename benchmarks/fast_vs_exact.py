"""Fast path against the exact engine on a fixed list of comparison configurations.

    python benchmarks/fast_vs_exact.py                 # every row (the 128-GPU ones take minutes)
    python benchmarks/fast_vs_exact.py --quick         # the small rows only
    python benchmarks/fast_vs_exact.py --only ds32-a2a-1f1b hot-expert
    python benchmarks/fast_vs_exact.py --json out.json # also write the figures
    python benchmarks/fast_vs_exact.py --write-docs    # also docs/results/fast-vs-exact.md

Each row runs ``moesim.wiring.simulate(name, overrides, engine=...)`` with the exact
engine (the reference: every flow on the max-min network) and with the fast path, one
after the other in this process, and prints: the exact step, the fast step, the step
error, the category (``moesim.engine.breakdown.CATEGORIES``, mean over ranks as the
summary's ``breakdown_s`` gives it) with the largest gap as a fraction of the exact step,
the largest per-rank stall gap (same unit), and each engine's wall time. A row passes
when the step is within 0.5 % and every category within 1 % of the exact step (the
issue's bounds); the process exits 1 when any row fails.

The rows: shipped scenarios small enough for the exact engine, and the cases of
docs/results/fast-path-history.md (DeepSeek-V3 cut to 32, 64 and 128 GPUs; the shipped
64-GPU Mixtral with static pairs), the interleaved EP16 case of docs/fast-path.md and
the EP-overlap case of tests/test_fast_path.py on the routing the scenario ships.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from moesim.engine.breakdown import CATEGORIES
from moesim.wiring import simulate

STEP_BOUND = 0.005
CATEGORY_BOUND = 0.01

#: DeepSeek-V3 cut down: every ``ds*`` row starts from these
DS = ["model.layers=4", "model.first_dense_layers=0", "schedule.microbatches=4",
      # without the shipped scenario's MTP module and its 3 | ... | 2 stage split
      "model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
      "parallel.decoder_last_pipeline_num_layers=null"]
DS32 = [*DS, "cluster.nodes=4", "parallel.pp=2", "parallel.ep=16", "routing.max_nodes=null",
        "parallel.ep_backend.kind=nccl"]
DS128 = [*DS, "cluster.nodes=16", "parallel.pp=2", "parallel.ep=16", "routing.max_nodes=null"]

#: name -> (scenario, overrides, quick)
ROWS: dict[str, tuple[str, list[str], bool]] = {
    "toy-cpu": ("toy-cpu", [], True),
    "hot-expert": ("hot-expert", [], True),
    "mixtral-8x7b-ep8": ("mixtral-8x7b-ep8", [], True),
    "mixtral-8x7b-64gpu": ("mixtral-8x7b-64gpu", [], False),
    "mixtral-64gpu-static": ("mixtral-8x7b-64gpu", ["overlap.kind=static"], False),
    "ds128-dualpipe-static": ("deepseek-v3-2048", DS128, False),
    "ds128-dualpipe-none": ("deepseek-v3-2048",
                            [*DS128, "overlap.kind=none"], False),
    "ds128-1f1b-static": ("deepseek-v3-2048", [*DS128, "schedule.kind=1f1b"], False),
    "ds128-1f1b-nccl-overlap": ("deepseek-v3-2048",
                                [*DS128, "schedule.kind=1f1b", "overlap.kind=none",
                                 "parallel.ep_backend.kind=nccl",
                                 "overlap.ep_comm_overlap=true"], False),
    "ds64-pp8-dualpipe": ("deepseek-v3-2048",
                          [*DS[3:], "model.first_dense_layers=0", "cluster.nodes=8",
                           "parallel.pp=8", "parallel.ep=8", "model.layers=8",
                           "schedule.microbatches=16", "routing.max_nodes=null"],
                          False),
    "ds32-dualpipe-static": ("deepseek-v3-2048", DS32, True),
    "ds32-dualpipe-none": ("deepseek-v3-2048", [*DS32, "overlap.kind=none"], True),
    "ds32-1f1b-static": ("deepseek-v3-2048", [*DS32, "schedule.kind=1f1b"], True),
    "ds32-a2a-1f1b": ("deepseek-v3-2048",
                      [*DS32, "schedule.kind=interleaved", "parallel.vpp=2",
                       "overlap.kind=a2a-1f1b"], True),
    "ds32-interleaved": ("deepseek-v3-2048",
                         [*DS32, "schedule.kind=interleaved", "parallel.vpp=2",
                          "overlap.kind=none", "overlap.ep_comm_overlap=false"], True),
}


def run(scenario: str, overrides: list[str], engine: str):
    """One simulation and its wall time."""
    t0 = time.perf_counter()
    out = simulate(scenario, overrides, engine=engine)
    return out, time.perf_counter() - t0


def compare(exact, fast) -> dict:
    """Step error, worst category and worst per-rank stall gap, as fractions of the
    exact step."""
    step = exact.step_time_s
    be, bf = exact.summary["breakdown_s"], fast.summary["breakdown_s"]
    gaps = {k: (bf.get(k, 0.0) - be.get(k, 0.0)) / step for k in CATEGORIES}
    worst = max(gaps, key=lambda k: abs(gaps[k]))
    se = np.array([r["breakdown_s"]["stall"] for r in exact.summary["per_rank"]])
    sf = np.array([r["breakdown_s"]["stall"] for r in fast.summary["per_rank"]])
    stall = (sf - se) / step
    i = int(np.argmax(np.abs(stall)))
    return {"exact_ms": step * 1e3, "fast_ms": fast.step_time_s * 1e3,
            "step_err": fast.step_time_s / step - 1, "worst_cat": worst,
            "worst_cat_gap": gaps[worst], "gaps": gaps, "worst_stall_gap": float(stall[i]),
            "ok": abs(fast.step_time_s / step - 1) <= STEP_BOUND
            and abs(gaps[worst]) <= CATEGORY_BOUND}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", choices=sorted(ROWS), metavar="ROW",
                    help="rows to run: " + ", ".join(ROWS))
    ap.add_argument("--quick", action="store_true", help="the small rows only")
    ap.add_argument("--json", help="write every row's figures to this file")
    a = ap.parse_args(argv)
    names = a.only or [n for n, r in ROWS.items() if r[2] or not a.quick]
    print("Each row: the exact step, the fast step, the step error, the category with the\n"
          "largest gap and the largest per-rank stall gap (both as a fraction of the exact\n"
          "step), and each engine's wall time in seconds (one run each, at the machine's\n"
          "load of the moment). Overrides per row: ROWS in benchmarks/fast_vs_exact.py.\n")
    print("| configuration | exact step (ms) | fast step (ms) | step error | worst category "
          "| worst stall gap | exact wall (s) | fast wall (s) | bounds |")
    print("|---|---|---|---|---|---|---|---|---|")
    results, ok = {}, True
    for name in names:
        scenario, overrides, _ = ROWS[name]
        exact, te = run(scenario, overrides, "exact")
        fast, tf = run(scenario, overrides, "fast")
        r = compare(exact, fast) | {"exact_wall_s": te, "fast_wall_s": tf,
                                    "scenario": scenario, "overrides": overrides}
        results[name] = r
        ok &= r["ok"]
        cat = f"{r['worst_cat']} {100 * r['worst_cat_gap']:+.2f} %"
        print(f"| {name} | {r['exact_ms']:.3f} | {r['fast_ms']:.3f} | "
              f"{100 * r['step_err']:+.2f} % | {cat} | {100 * r['worst_stall_gap']:+.2f} % | "
              f"{te:.1f} | {tf:.1f} | {'ok' if r['ok'] else 'MISS'} |", flush=True)
    print()
    print(("PASS" if ok else "FAIL") + f": step within {100 * STEP_BOUND:.1f} %, every "
          f"category within {100 * CATEGORY_BOUND:.0f} % of the exact step")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "fast-vs-exact",
                           "Fast path against the exact engine: the comparison configurations"))
