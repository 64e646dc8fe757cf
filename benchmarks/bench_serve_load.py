"""Requests over time on a serving deployment (issue 23): the step-cost surface's build
time and error, then N requests through the event loop, with wall time, CPU time and peak
memory, and the throughput against DeepSeek's published per-node decode figure.

    python benchmarks/bench_serve_load.py                          # deepseek-v3-decode, 10,000 requests
    python benchmarks/bench_serve_load.py --requests 2000 --check 2
    python benchmarks/bench_serve_load.py --scenario mixtral-8x7b-serve --rate 20
    python benchmarks/bench_serve_load.py --write-docs             # docs/results/serving-load.md
    python benchmarks/bench_serve_load.py --capacity 500,5000 --write-docs=serving-capacity

``--capacity N1,N2,...`` runs ``--find-capacity``'s search (moesim.traffic.run.find_capacity,
steady-state window) on the scenario's own ``load:`` section (default scenario
qwen3-30b-a3b-serve-load, SLO ``--slo``) with each number of requests, and beside it the
rule it replaced (percentiles over every request of a fixed-length run, drain included),
with the CPU time of each search.

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
    ap.add_argument("--capacity", default=None, metavar="N1,N2",
                    help="capacity searches with these numbers of requests")
    ap.add_argument("--slo", default="ttft_p99=1s,tpot_p99=30ms")
    args = ap.parse_args(argv)
    if args.capacity:
        return capacity(args)

    from moesim.serve.run import resolve_serve
    from moesim.traffic.config import load_from_dict
    from moesim.traffic.deploy import build_for
    from moesim.traffic.run import run_load
    from moesim.traffic.surface import EngineStepCosts

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
    w = s["window"]
    print(f"  measurement window {w['start_s']:.1f}-{w['end_s']:.1f} s: {w['requests']:,} "
          f"requests arrive in it, {w['completed']:,} complete in it; {w['verdict']}"
          + (f" (needs {w['needs_requests']:,} requests)" if w["needs_requests"] else "")
          + f"; in flight at its end {s['in_flight_at_end']:,}")
    print(f"  simulated {s['duration_s']:.1f} s: {rq['finished']} finished, "
          f"{rq['rejected']} rejected, {s['preemptions']} preemptions, KV peak "
          f"{s['kv_peak_fraction'] * 100:.1f} %")
    for k in ("ttft_s", "tpot_s", "e2e_s"):
        x = s[k]
        print(f"  {k[:-2].upper():5s} p50 {x['p50'] * 1e3:9.1f} ms  p90 {x['p90'] * 1e3:9.1f} ms"
              f"  p99 {x['p99'] * 1e3:9.1f} ms")
    nodes = res.layout.world // (res.scenario.gpus_per_node or 8)
    run = s["run"]
    per_node = run["output_tokens_per_s"] / max(1, nodes)
    print(f"  throughput {s['throughput_rps']:.1f} requests/s, {s['output_tokens_per_s']:,.0f} "
          f"output tokens/s (completions in the window); whole run, first arrival to last "
          f"finish: {run['throughput_rps']:.1f} requests/s, {run['output_tokens_per_s']:,.0f} "
          f"output tokens/s = {per_node:,.0f} per node")
    if not args.scenario.startswith("deepseek-v3"):
        return 0
    err = (per_node - PUBLISHED_OUTPUT_TOKENS_PER_S_PER_NODE) / \
        PUBLISHED_OUTPUT_TOKENS_PER_S_PER_NODE * 100
    print(f"  DeepSeek's published decode average "
          f"{PUBLISHED_OUTPUT_TOKENS_PER_S_PER_NODE:,.0f} per node: {err:+.1f} % (colocated "
          "prefill here, disaggregated there; the whole run, ramp and drain included, at a"
          " rate that is not DeepSeek's: not like for like; that comparison is"
          " benchmarks/serving_published.py)")
    return 0


def whole_run_capacity(build, lc, slo: dict, rel_tol: float = 0.02, max_runs: int = 24):
    """The rule find_capacity replaced: the largest rate whose run of the configured
    requests meets the SLO on the percentiles of every request (warm-up and drain
    included), doubling then bisection."""
    from moesim.traffic.metrics import latencies, meets
    from moesim.traffic.run import run_load
    runs = []

    def ok(rate: float) -> bool:
        sim, s = run_load(build, lc.with_rate(rate), None, series=False)
        runs.append(rate)
        return meets(latencies(sim.finished), slo) and s["requests"]["rejected"] == 0

    lo, hi = 0.0, lc.rate
    while len(runs) < max_runs and ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > rel_tol * hi and len(runs) < max_runs:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, len(runs)


def capacity(args) -> int:
    """Capacity with each number of requests: the steady-state search and the old rule."""
    from moesim.serve.run import resolve_serve
    from moesim.traffic.deploy import build_for
    from moesim.traffic.metrics import parse_slo
    from moesim.traffic.run import find_capacity
    from moesim.traffic.session import load_config
    from moesim.traffic.surface import EngineStepCosts

    scenario = "qwen3-30b-a3b-serve-load" if args.scenario == "deepseek-v3-decode" \
        else args.scenario
    slo = parse_slo(args.slo)
    res, cfg = resolve_serve(scenario)
    c0 = _cpu()
    costs = EngineStepCosts(res, cfg, cache=args.cache)
    print(f"{scenario}: surface of {costs.sims} engine steps, {_cpu() - c0:.1f} s CPU; "
          f"SLO {args.slo}")

    def build(lc, series):
        return build_for(res, cfg, lc, costs, series=series)

    rows = []
    for n in (int(x) for x in args.capacity.split(",")):
        lc = load_config(res).with_requests(n)
        c1 = _cpu()
        cap = find_capacity(build, lc, slo)
        c2 = _cpu()
        old, old_runs = whole_run_capacity(build, lc, slo)
        c3 = _cpu()
        print(f"\n{n:,} requests: steady-state capacity {cap['capacity_rps']:.2f} requests/s "
              f"({cap['verdict']}; {len(cap['runs'])} runs, {c2 - c1:.0f} s CPU)")
        for r in cap["runs"]:
            print(f"  {r['rate_rps']:8.3f} req/s  {r['requests']:6,} requests  "
                  f"window {r['window_s'][0]:6.1f}-{r['window_s'][1]:6.1f} s  "
                  f"{r['verdict']:11s}  TTFT p99 {r['ttft_p99_s'] * 1e3:7.1f} ms  "
                  f"TPOT p99 {r['tpot_p99_s'] * 1e3:5.2f} ms  "
                  f"{'meets' if r['met'] else 'fails'}")
        print(f"  whole-run rule (every request's percentiles, {n:,} requests): "
              f"{old:.2f} requests/s ({old_runs} runs, {c3 - c2:.0f} s CPU)")
        rows.append((n, cap["capacity_rps"], old))
    print("\nrequests  steady-state capacity  whole-run rule")
    for n, new, old in rows:
        print(f"{n:8,}  {new:18.2f} req/s  {old:10.2f} req/s")
    if len(rows) > 1:
        a, b = rows[0][1], rows[-1][1]
        print(f"steady-state capacities differ by {abs(a - b) / max(a, b) * 100:.1f} % "
              "(goal <= 5 %)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "serving-load", "Serving under load (bench_serve_load.py)"))
