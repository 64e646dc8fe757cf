"""Wall time and peak memory of decode steps of the DeepSeek-V3 decode scenario (issue 16).

    python benchmarks/bench_serve.py                     # 100 decode steps, median of 3
    python benchmarks/bench_serve.py --steps 5 --repeat 1
    python benchmarks/bench_serve.py --scenario mixtral-8x7b-serve --steps 100

Each repetition runs in a fresh child process: the scenario is resolved once, then
``--steps`` consecutive decode steps run (``serve.step`` = 0, 1, ...: routing is drawn per
step, so a hot expert moves as the popularity drifts) on the scenario's engine (the DeepSeek-V3 decode scenario runs on the
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

#: published decode throughput to compare with: "Each H800 node delivers an average
#: throughput of ~14.8k tokens/s output during decoding" (DeepSeek, open-infra-index,
#: 202502OpenSourceWeek/day_6_one_more_thing_deepseekV3R1_inference_system_overview.md;
#: a production average over its batches and contexts, average KV length 4,989 tokens)
PUBLISHED_TOKENS_PER_S_PER_NODE = {"deepseek-v3-decode": 14.8e3}

CHILD = r"""
import dataclasses, json, resource, sys, time
from moesim.serve.run import resolve_serve, simulate_serve
name, overrides, steps = json.loads(sys.argv[1])
t = time.perf_counter()
res, cfg0 = resolve_serve(name, overrides)
tpot, tps = [], []
for i in range(steps):
    cfg = dataclasses.replace(cfg0, step=cfg0.step + i)   # routing drawn per step
    s = simulate_serve(res, cfg).summary
    tpot.append(s["step_time_s"])
    tps.append(s["tokens_per_s_per_gpu"] * (res.scenario.gpus_per_node or 1))
wall = time.perf_counter() - t
print(json.dumps({"wall_s": wall, "wall_per_step_s": wall / steps,
                  "tokens_per_s_per_node": sum(tps) / steps,
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
          f"(min {med['tpot_min_ms']:.2f}, max {med['tpot_max_ms']:.2f} ms), "
          f"{med['tokens_per_s_per_node']:,.0f} tokens/s per node")
    ref = PUBLISHED_TOKENS_PER_S_PER_NODE.get(a.scenario)
    if ref:
        err = med["tokens_per_s_per_node"] / ref - 1
        print(f"  published (DeepSeek production decode, per H800 node): {ref:,.0f} tokens/s; "
              f"simulated {err * 100:+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
