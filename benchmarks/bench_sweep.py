"""Benchmark: a 100-point sweep of the hot-expert scenario with 1 and 2 Dask workers.

    python benchmarks/bench_sweep.py              # the shipped hot-expert (4 layers, 2 mb)
    python benchmarks/bench_sweep.py --small      # one layer, one micro-batch per point
    python benchmarks/bench_sweep.py --workers 1 2 4 --json bench.json

100 points = 10 hot-expert shares (0.125..0.5) x 10 seeds. For each worker count, a new
LocalCluster of single-threaded worker processes runs the sweep into a fresh temporary
directory. Reported: wall time with cluster start-up (what a user waits) and without,
speed-up against the first worker count, the simulator's own time summed over points,
and peak resident memory (max over workers, and of this driver process).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

from moesim.sweep.runner import _close, make_client, run_sweep
from moesim.sweep.spec import expand, parse_sweep


def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux (getrusage(2))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def spec_for(small: bool):
    base = ["model.layers=1", "schedule.microbatches=1"] if small else []
    fractions = [round(0.125 + i * (0.5 - 0.125) / 9, 6) for i in range(10)]
    return parse_sweep({"name": "bench-hot-expert", "scenario": "hot-expert", "set": base,
                        "axes": {"routing.hot_fraction": fractions},
                        "seeds": list(range(10))}, "<bench>")


def bench(spec, workers: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="moesim-bench-") as d:
        t0 = time.perf_counter()
        client = make_client(workers=workers, processes=True)
        t1 = time.perf_counter()
        try:
            rep = run_sweep(spec, Path(d) / "out", client=client, quiet=True)
            t2 = time.perf_counter()
            peaks = client.run(_peak_rss_bytes)
        finally:
            _close(client, own=True)
        from moesim.sweep.results import load_results

        df = load_results(Path(d) / "out")
    return {"workers": workers, "points": rep.total, "ok": rep.counts.get("ok", 0),
            "wall_s": time.perf_counter() - t0, "startup_s": t1 - t0, "run_s": t2 - t1,
            "sim_s_sum": float(df["sim_wall_s"].sum()),
            "worker_peak_rss_bytes": max(peaks.values()),
            "driver_peak_rss_bytes": _peak_rss_bytes()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="one layer, one micro-batch")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    spec = spec_for(args.small)
    n = len(expand(spec))
    print(f"hot-expert sweep, {n} points ({'small' if args.small else 'shipped'} scenario), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    rows = []
    for w in args.workers:
        rows.append(bench(spec, w))
        r = rows[-1]
        print(f"workers {w}: wall {r['wall_s']:.1f} s (start-up {r['startup_s']:.1f} s, "
              f"sweep {r['run_s']:.1f} s), simulator time summed {r['sim_s_sum']:.1f} s, "
              f"peak RSS worker {r['worker_peak_rss_bytes'] / 2**20:.0f} MiB, "
              f"driver {r['driver_peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
    base = rows[0]
    print("\n| workers | wall (s) | sweep only (s) | speed-up (wall) | speed-up (sweep) |"
          " peak RSS/worker (MiB) |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['wall_s']:.1f} | {r['run_s']:.1f} | "
              f"{base['wall_s'] / r['wall_s']:.2f} | {base['run_s'] / r['run_s']:.2f} | "
              f"{r['worker_peak_rss_bytes'] / 2**20:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":   # worker processes re-import this file: keep the guard
    sys.exit(main())
