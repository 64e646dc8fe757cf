"""CPU time, wall time and peak memory of decode steps of the DeepSeek-V3 decode scenario
(issues 16 and 23).

    python benchmarks/bench_serve.py                     # 20 decode steps, both modes, median of 3
    python benchmarks/bench_serve.py --steps 5 --repeat 1
    python benchmarks/bench_serve.py --kept --steps 5    # one mode only (--fresh: the other)
    python benchmarks/bench_serve.py --write-docs        # docs/results/serving-steps.md
    python benchmarks/bench_serve.py --scenario mixtral-8x7b-serve --steps 100

Each repetition runs in a fresh child process: the scenario is resolved once, then
``--steps`` consecutive decode steps run (``serve.step`` = 0, 1, ...: routing is drawn per
step, so a hot expert moves as the popularity drifts) on the scenario's engine (the
DeepSeek-V3 decode scenario runs on the fast engine) through
:class:`moesim.serve.steps.ServeSteps`, the direct step a step-cost surface takes: network,
expert prices and routing law kept across steps, no spans, no summary ("kept"). The
"fresh" mode prices each step as before issue 23's reuse: resolved and simulated afresh,
numba off (``MOESIM_NUMBA=0``: numpy's form of today's sampler, whose circle orders are
built in a Python loop, slower than the sampler before 2026-12-02, so this mode stands for
the old cost only roughly; the issue measured 1.6-1.9 s then), no spans, no summary. Both
modes give the same step times (printed).
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
    """One child process; ``fresh``: every step afresh and numba off (numpy's form of the
    sampler): roughly the cost of a direct step before issue 23's reuse."""
    arg = json.dumps([name, overrides, steps, fresh])
    env = {**os.environ, **({"MOESIM_NUMBA": "0"} if fresh else {})}
    out = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True,
                         timeout=timeout, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", default="deepseek-v3-decode")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--timeout", type=float, default=24 * 3600.0)
    p.add_argument("--fresh", action="store_true",
                   help="only the fresh mode (each step resolved afresh, numpy sampler)")
    p.add_argument("--kept", action="store_true", help="only the kept-state mode")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    modes = [m for m, on in (("kept", not a.fresh), ("fresh", not a.kept)) if on]
    out = {}
    for mode in modes:
        load0 = os.getloadavg()[0]
        rows = [run_child(a.scenario, a.overrides, a.steps, a.timeout, mode == "fresh")
                for _ in range(a.repeat)]
        load1 = os.getloadavg()[0]
        out[mode] = {"load_average": [load0, load1], "runs": rows,
                     "median": {k: statistics.median(r[k] for r in rows) for k in rows[0]}}
    if a.json:
        print(json.dumps({"scenario": a.scenario, "steps": a.steps, "repeat": a.repeat,
                          **out}, indent=1))
        return 0
    print(f"{a.scenario}: {a.steps} consecutive decode steps (routing drawn per step) per "
          f"child process, median of {a.repeat} children; CPU = user + sys of the step "
          "alone; wall includes resolving the scenario (and importing numba); MB = 10^6 "
          "bytes")
    print()
    print("| mode | CPU per step (median, min-max) | wall, all steps | peak RSS | "
          "simulated TPOT (mean, min-max) | load average (start, end) |")
    print("|---|---|---|---|---|---|")
    what = {"kept": "state kept (`ServeSteps`; sampler's compiled loop)",
            "fresh": "each step afresh, numba off (about the cost before issue 23's reuse)"}
    for mode, o in out.items():
        m = o["median"]
        print(f"| {what[mode]} | {m['cpu_per_step_s']:.3f} s ({m['cpu_min_s']:.3f}-"
              f"{m['cpu_max_s']:.3f}) | {m['wall_s']:.1f} s | {m['maxrss_MB']:.0f} MB | "
              f"{m['tpot_mean_ms']:.2f} ms ({m['tpot_min_ms']:.2f}-{m['tpot_max_ms']:.2f}) | "
              f"{o['load_average'][0]:.2f}, {o['load_average'][1]:.2f} |")
    if len(out) == 2:
        same = out["kept"]["median"]["tpot_mean_ms"] == out["fresh"]["median"]["tpot_mean_ms"]
        print()
        print(f"Same simulated step times in both modes: {'yes' if same else 'NO'}.")
    m = next(iter(out.values()))["median"]
    ref = PUBLISHED_TOKENS_PER_S_PER_NODE.get(a.scenario)
    if ref:
        err = m["tokens_per_s_per_node"] / ref - 1
        print()
        print(f"Simulated {m['tokens_per_s_per_node']:,.0f} output tokens/s per node; DeepSeek's "
              f"production average {ref:,.0f} ({err * 100:+.1f} %; not the same operating "
              "point: see serving-published.md).")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "serving-steps", "Serving steps: CPU per direct decode step"))
