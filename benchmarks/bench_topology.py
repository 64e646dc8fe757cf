"""Benchmark of building and routing a 2048-GPU rail fabric and laying out DeepSeek-V3's
2048 ranks (the time limits that used to sit in tests/test_topology.py and
tests/test_layout.py; tests hold no clock).

    python benchmarks/bench_topology.py [--repeats N]

Prints the median wall time and CPU time (user+sys) of: ``load_topology("dgx-h800",
nodes=256)``; 100,000 routes between random GPU pairs on it; ``Layout(world=2048, tp=1,
pp=16, dp=128, ep=64)`` (DeepSeek-V3 report §3.2); the peak Python heap (tracemalloc) and
the load average, and each against its target (build 2 s, routes 2 s, layout 1 s of CPU
time). Exit status 1 when a median misses its target.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
import tracemalloc

import numpy as np

from moesim.layout.mesh import Layout
from moesim.topology import load_topology

TARGETS_S = {"build": 2.0, "routes": 2.0, "layout": 1.0}


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _once() -> dict[str, tuple[float, float]]:
    out = {}
    w, c = time.perf_counter(), _cpu_s()
    t = load_topology("dgx-h800", nodes=256)
    out["build"] = (time.perf_counter() - w, _cpu_s() - c)
    pairs = np.random.default_rng(1).integers(0, 2048, size=(100_000, 2)).tolist()
    gpus = t.gpus
    w, c = time.perf_counter(), _cpu_s()
    for key, (s, d) in enumerate(pairs):
        t.route(gpus[s], gpus[d], key)
    out["routes"] = (time.perf_counter() - w, _cpu_s() - c)
    w, c = time.perf_counter(), _cpu_s()
    lay = Layout(world=2048, tp=1, pp=16, dp=128, ep=64)
    _ = (lay.pp_groups, lay.ep_groups, lay.edp_groups, lay.dp_groups, lay.stage_of_rank)
    out["layout"] = (time.perf_counter() - w, _cpu_s() - c)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    tracemalloc.start()
    runs = [_once() for _ in range(args.repeats)]
    peak = tracemalloc.get_traced_memory()[1]
    print(f"load average {os.getloadavg()[0]:.2f}; {args.repeats} runs; "
          f"peak Python heap {peak / 2**20:.0f} MiB")
    missed = 0
    for name, target in TARGETS_S.items():
        wall = statistics.median(r[name][0] for r in runs)
        cpu = statistics.median(r[name][1] for r in runs)
        ok = cpu <= target
        missed += not ok
        print(f"{name:7s} wall {wall:6.2f} s  cpu {cpu:6.2f} s  target {target:.1f} s cpu "
              f"{'ok' if ok else 'MISSED'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
