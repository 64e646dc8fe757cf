"""Requests over time on a serving deployment (issue 23): the step-cost surface's build
time and error, then N requests through the event loop, with wall time, CPU time and peak
memory, and the throughput against DeepSeek's published per-node decode figure.

    python benchmarks/bench_serve_load.py                          # deepseek-v3-decode, 10,000 requests
    python benchmarks/bench_serve_load.py --requests 2000 --check 2
    python benchmarks/bench_serve_load.py --scenario mixtral-8x7b-serve --rate 20
    python benchmarks/bench_serve_load.py --write-docs             # docs/results/serving-load.md

The surface is built in a fresh temporary cache (its build time is measured) unless
``--cache`` reads the user's. Workload: Poisson arrivals at ``--rate`` requests/s,
lognormal prompts (mean ``--prompt``, sigma 0.8, at most 16K) and outputs (mean
``--output``, sigma 0.8, at most 4K), vLLM continuous batching (``--scheduler``). Nothing is fitted to the
published figure: it is printed beside the simulated one with the error.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

#: "Each H800 node delivers an average throughput of ~14.8k tokens/s output during
#: decoding" (deepseek-ai/open-infra-index, 202502OpenSourceWeek/
#: day_6_one_more_thing_deepseekV3R1_inference_system_overview.md: production averages,
#: average KV length 4,989 tokens, decode disaggregated from prefill, EP144)
PUBLISHED_OUTPUT_TOKENS_PER_S_PER_NODE = 14.8e3


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="deepseek-v3-decode")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=12.0, help="arrivals per second")
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--output", type=int, default=512)
    ap.add_argument("--check", type=int, default=3, help="surface check points per phase")
    ap.add_argument("--cache", action="store_true", help="use the user's surface cache")
    ap.add_argument("--scheduler", default="vllm", choices=("vllm", "sarathi"))
    args = ap.parse_args(argv)

    from moesim.load.config import load_from_dict
    from moesim.load.deploy import build_for
    from moesim.load.run import run_load
    from moesim.load.surface import EngineStepCosts
    from moesim.serve.run import resolve_serve

    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    res, cfg = resolve_serve(args.scenario)
    tmp = None if args.cache else tempfile.TemporaryDirectory()
    cache = True if args.cache else __import__("pathlib").Path(tmp.name)
    w0, c0 = time.perf_counter(), _cpu()
    costs = EngineStepCosts(res, cfg, cache=cache)
    w1, c1 = time.perf_counter(), _cpu()
    print(f"surface: {costs.sims} engine steps, {w1 - w0:.1f} s wall, {c1 - c0:.1f} s CPU"
          + (" (read from the cache)" if costs.from_cache else ""))
    if args.check:
        chk = costs.check(args.check)
        for p in chk["points"]:
            err = (p["surface_s"] - p["direct_s"]) / p["direct_s"] * 100
            print(f"  check {p['phase']:7s} at ({p['x']:g}, {p['y']:g}): surface "
                  f"{p['surface_s'] * 1e3:.3f} ms, direct {p['direct_s'] * 1e3:.3f} ms, "
                  f"{err:+.2f} %")
        print(f"surface worst error {chk['worst_error'] * 100:.2f} % (goal <= 2 %)")
    lc = load_from_dict({"arrival": {"kind": "poisson", "rate_rps": args.rate},
                         "requests": args.requests,
                         "prompt_tokens": {"dist": "lognormal", "mean": args.prompt,
                                           "sigma": 0.8, "max": 16384},
                         "output_tokens": {"dist": "lognormal", "mean": args.output,
                                           "sigma": 0.8, "max": 4096},
                         "scheduler": args.scheduler},
                        "bench", seed=0)
    w2, c2 = time.perf_counter(), _cpu()
    sim, s = run_load(lambda c, series: build_for(res, cfg, c, costs, series=series), lc,
                      {"ttft_p99": 2.0, "tpot_p99": 0.05})
    w3, c3 = time.perf_counter(), _cpu()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    print(f"{args.requests} requests on {args.scenario} ({len(sim.members)} attention-DP "
          f"ranks, {len(sim.groups)} lockstep group(s)): {w3 - w2:.1f} s wall, "
          f"{c3 - c2:.1f} s CPU, {sim.steps} steps, peak RSS {peak:.0f} MB (goal <= 60 s)")
    rq = s["requests"]
    print(f"  simulated {s['duration_s']:.1f} s: {rq['finished']} finished, "
          f"{rq['rejected']} rejected, {s['preemptions']} preemptions, KV peak "
          f"{s['kv_peak_fraction'] * 100:.1f} %")
    for k in ("ttft_s", "tpot_s", "e2e_s"):
        x = s[k]
        print(f"  {k[:-2].upper():5s} p50 {x['p50'] * 1e3:9.1f} ms  p90 {x['p90'] * 1e3:9.1f} ms"
              f"  p99 {x['p99'] * 1e3:9.1f} ms")
    nodes = res.layout.world // (res.scenario.gpus_per_node or 8)
    per_node = s["output_tokens_per_s"] / max(1, nodes)
    print(f"  throughput {s['throughput_rps']:.1f} requests/s, {s['output_tokens_per_s']:,.0f} "
          f"output tokens/s = {per_node:,.0f} per node")
    if not args.scenario.startswith("deepseek-v3"):
        return 0
    err = (per_node - PUBLISHED_OUTPUT_TOKENS_PER_S_PER_NODE) / \
        PUBLISHED_OUTPUT_TOKENS_PER_S_PER_NODE * 100
    print(f"  DeepSeek's published decode average "
          f"{PUBLISHED_OUTPUT_TOKENS_PER_S_PER_NODE:,.0f} per node: {err:+.1f} % (colocated "
          "prefill here, disaggregated there; first arrival to last finish, ramp included:"
          " not like for like; that comparison is benchmarks/serving_published.py)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "serving-load", "Serving under load (bench_serve_load.py)"))
