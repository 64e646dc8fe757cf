"""Wall time and peak memory of decode steps of the DeepSeek-V3 decode scenario (issue 16).

    python benchmarks/bench_serve.py                     # 100 decode steps, median of 3
    python benchmarks/bench_serve.py --steps 5 --repeat 1
    python benchmarks/bench_serve.py --scenario mixtral-8x7b-serve --steps 100

Each repetition runs in a fresh child process: ``--steps`` consecutive decode steps
(``serve.step`` = 0, 1, ...: routing is drawn per step, so a hot expert moves as the
popularity drifts) on the scenario's engine (the DeepSeek-V3 decode scenario runs on the
fast engine), then reports the wall time of all steps, per step, the mean simulated
TPOT and the child's peak resident set (``ru_maxrss``, MB = 10^6 bytes). The table gives
the median over ``--repeat`` children.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
from moesim.serve.run import resolve_serve, simulate_serve
name, overrides, steps = json.loads(sys.argv[1])
t = time.perf_counter()
tpot = []
for i in range(steps):
    res, cfg = resolve_serve(name, [*overrides, f"serve.step={i}"])
    tpot.append(simulate_serve(res, cfg).summary["step_time_s"])
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "wall_per_step_s": wall / steps,
                  "tpot_mean_ms": 1e3 * sum(tpot) / steps,
                  "tpot_min_ms": 1e3 * min(tpot), "tpot_max_ms": 1e3 * max(tpot),
                  "maxrss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}))
"""


def run_child(name: str, overrides: list[str], steps: int, timeout: float) -> dict:
    arg = json.dumps([name, overrides, steps])
    out = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True,
                         timeout=timeout, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="deepseek-v3-decode")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--timeout", type=float, default=24 * 3600.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rows = [run_child(a.scenario, a.overrides, a.steps, a.timeout) for _ in range(a.repeat)]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    if a.json:
        print(json.dumps({"scenario": a.scenario, "steps": a.steps, "repeat": a.repeat,
                          "median": med, "runs": rows}, indent=1))
        return 0
    print(f"{a.scenario}: {a.steps} decode steps, median of {a.repeat} children")
    print(f"  wall {med['wall_s']:.1f} s ({med['wall_per_step_s']:.2f} s per step), "
          f"peak RSS {med['maxrss_MB']:.0f} MB")
    print(f"  simulated TPOT mean {med['tpot_mean_ms']:.2f} ms "
          f"(min {med['tpot_min_ms']:.2f}, max {med['tpot_max_ms']:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
