"""CPU time, wall time and peak memory of decode steps of the DeepSeek-V3 decode scenario
(issues 16 and 23).

    python benchmarks/bench_serve.py                     # 100 decode steps, median of 3
    python benchmarks/bench_serve.py --steps 5 --repeat 1
    python benchmarks/bench_serve.py --fresh --steps 5   # each step resolved afresh (before)
    python benchmarks/bench_serve.py --scenario mixtral-8x7b-serve --steps 100

Each repetition runs in a fresh child process: the scenario is resolved once, then
``--steps`` consecutive decode steps run (``serve.step`` = 0, 1, ...: routing is drawn per
step, so a hot expert moves as the popularity drifts) on the scenario's engine (the
DeepSeek-V3 decode scenario runs on the fast engine) through
:class:`moesim.serve.steps.ServeSteps`, the direct step a step-cost surface takes: network,
expert prices and routing law kept across steps, no spans, no summary. ``--fresh`` prices
each step as before issue 23's reuse (resolved and simulated afresh, no spans, no summary).
It reports the CPU time (user + sys) of every step (median, min, max), the wall time of
all steps, the mean simulated TPOT, the child's peak resident set (``ru_maxrss``, MB =
10^6 bytes) and the load average. The table gives the median over ``--repeat`` children.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

#: published decode throughput to compare with: "Each H800 node delivers an average
#: throughput of ~14.8k tokens/s output during decoding" (DeepSeek, open-infra-index,
#: 202502OpenSourceWeek/day_6_one_more_thing_deepseekV3R1_inference_system_overview.md;
#: a production average over its batches and contexts, average KV length 4,989 tokens)
PUBLISHED_TOKENS_PER_S_PER_NODE = {"deepseek-v3-decode": 14.8e3}

CHILD = r"""
import json, resource, statistics, sys, time
from moesim.serve.run import resolve_serve
from moesim.serve.steps import ServeSteps
name, overrides, steps, fresh = json.loads(sys.argv[1])
t = time.perf_counter()
res, cfg0 = resolve_serve(name, overrides)
tpot, cpu = [], []
pricer = ServeSteps(res, cfg0)
for i in range(steps):
    if fresh:
        pricer = ServeSteps(res, cfg0)      # nothing kept: resolved and simulated afresh
    c = time.process_time()
    tpot.append(pricer.step_s(step=cfg0.step + i))   # routing drawn per step
    cpu.append(time.process_time() - c)
wall = time.perf_counter() - t
world = res.layout.world
tokens = cfg0.batch_per_gpu * world                  # one token per request per step
gpn = res.scenario.gpus_per_node or 1
print(json.dumps({"wall_s": wall, "wall_per_step_s": wall / steps,
                  "cpu_per_step_s": statistics.median(cpu), "cpu_min_s": min(cpu),
                  "cpu_max_s": max(cpu),
                  "tokens_per_s_per_node": statistics.fmean(tokens / x / world * gpn
                                                            for x in tpot),
                  "tpot_mean_ms": 1e3 * sum(tpot) / steps,
                  "tpot_min_ms": 1e3 * min(tpot), "tpot_max_ms": 1e3 * max(tpot),
                  "maxrss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}))
"""


def run_child(name: str, overrides: list[str], steps: int, timeout: float,
              fresh: bool = False) -> dict:
    arg = json.dumps([name, overrides, steps, fresh])
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
    p.add_argument("--fresh", action="store_true",
                   help="resolve and simulate every step afresh (the cost before reuse)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    load0 = os.getloadavg()[0]
    rows = [run_child(a.scenario, a.overrides, a.steps, a.timeout, a.fresh)
            for _ in range(a.repeat)]
    load1 = os.getloadavg()[0]
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    if a.json:
        print(json.dumps({"scenario": a.scenario, "steps": a.steps, "repeat": a.repeat,
                          "fresh": a.fresh, "load_average": [load0, load1],
                          "median": med, "runs": rows}, indent=1))
        return 0
    how = "each resolved afresh" if a.fresh else "state kept across steps"
    print(f"{a.scenario}: {a.steps} decode steps ({how}), median of {a.repeat} children, "
          f"load average {load0:.2f} -> {load1:.2f}")
    print(f"  CPU per step {med['cpu_per_step_s']:.3f} s (median; min {med['cpu_min_s']:.3f}, "
          f"max {med['cpu_max_s']:.3f} s)")
    print(f"  wall {med['wall_s']:.1f} s ({med['wall_per_step_s']:.2f} s per step, resolve "
          f"included), peak RSS {med['maxrss_MB']:.0f} MB")
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
