"""Wall time and peak memory of the fast path (moesim.engine.fast.engine.simulate_fast).

    python benchmarks/bench_fast.py                  # shipped scenarios + scaling tables
    python benchmarks/bench_fast.py --no-scaling     # shipped scenarios only
    python benchmarks/bench_fast.py --scenarios mixtral-8x7b-64gpu --repeat 3

Every row runs in a fresh child process: ``--repeat`` timed runs (median wall and CPU
time reported), then one more run under ``tracemalloc`` (skipped with
``--no-tracemalloc`` or for rows marked heavy, where tracing would triple the time);
``ru_maxrss`` is the child's peak resident set (of its largest process: the chain
workers it forks, moesim.engine.fast.workers, count in CPU time and in this). MB = 10^6 bytes. Scaling exponents
are least-squares slopes of log(wall) against log(GPUs) or log(micro-batches).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import numpy as np

SCENARIOS = ["toy-cpu", "hot-expert", "mixtral-8x7b-ep8", "mixtral-8x7b-64gpu",
             "deepseek-v3-2048"]
# DeepSeek-V3 shape with a fixed slice of work per replica (as benchmarks/bench_scenarios.py):
# PP4, EP8 (one node per EP group), 4 MoE layers, 4 micro-batches; GPUs grow with nodes
# (1F1B, without the shipped scenario's MTP module and its 3 | ... | 2 stage split)
GPU_SCALING = [(n * 8, [f"cluster.nodes={n}", "parallel.pp=4", "parallel.ep=8",
                        "model.layers=4", "model.first_dense_layers=0",
                        "schedule.microbatches=4", "routing.max_nodes=null",
                        "schedule.kind=1f1b", "model.mtp_layers=0",
                        "parallel.decoder_first_pipeline_num_layers=null",
                        "parallel.decoder_last_pipeline_num_layers=null"])
               for n in (8, 16, 32, 64, 128, 256)]
MB_SCALING = [(m, ["model.layers=8", f"schedule.microbatches={m}"]) for m in (2, 4, 8, 16, 32)]

CHILD = r"""
import json, resource, statistics, sys, time, tracemalloc
from moesim.wiring import resolve_path
from moesim.engine.fast.engine import simulate_fast
name, overrides, repeat, trace, replicas = json.loads(sys.argv[1])
res = resolve_path(name, overrides)
walls, cpus = [], []
def cpu():    # this process and the chain workers it forked and joined
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
for _ in range(repeat):
    t, c = time.perf_counter(), cpu()
    out = simulate_fast(res, replicas=replicas)
    walls.append(time.perf_counter() - t)
    cpus.append(cpu() - c)
peak = None
if trace:
    tracemalloc.start()
    simulate_fast(res, replicas=replicas)
    peak = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
print(json.dumps({"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus),
                  "tracemalloc_MB": peak, "maxrss_MB": max(
                  resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1e3,
                  "step_ms": out.step_time_s * 1e3, "world": out.n_ranks,
                  "spans": len(out.spans)}))
"""


def run_child(name: str, overrides: list[str], repeat: int, trace: bool,
              replicas: str | None, timeout: float) -> dict:
    arg = json.dumps([name, overrides, repeat, trace, replicas])
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, arg], capture_output=True, text=True,
                           timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def fmt(x, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def row(label: str, r: dict) -> str:
    if "error" in r:
        return f"| {label} | – | – | – | – | – | – | {r['error']} |"
    return (f"| {label} | {r['world']} | {r['step_ms']:.1f} | {r['wall_s']:.2f} | "
            f"{r['cpu_s']:.2f} | {fmt(r['tracemalloc_MB'], '.0f')} | {r['maxrss_MB']:.0f} | "
            f"{r['spans']} |")


HEADER = ("| {0} | GPUs | step (ms) | wall median (s) | CPU (s) | tracemalloc peak (MB) | "
          "ru_maxrss (MB) | spans kept |\n|---|---|---|---|---|---|---|---|")


def slope(xs, ys) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", nargs="*", default=SCENARIOS)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--replicas", choices=["independent", "identical"], default=None,
                    help="override routing.replicas (default: the scenario's)")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--no-tracemalloc", action="store_true")
    ap.add_argument("--timeout", type=float, default=900.0)
    a = ap.parse_args(argv)
    print(HEADER.format("scenario"))
    for name in a.scenarios:
        heavy = name == "deepseek-v3-2048"
        r = run_child(name, [], 1 if heavy else a.repeat, not (a.no_tracemalloc or heavy),
                      a.replicas, a.timeout)
        print(row(name + (f" ({a.replicas})" if a.replicas else ""), r), flush=True)
    if a.no_scaling:
        return 0
    for title, base, cases in (("GPUs", "deepseek-v3-2048", GPU_SCALING),
                               ("micro-batches", "mixtral-8x7b-ep8", MB_SCALING)):
        vary = "cluster.nodes" if title == "GPUs" else "schedule.microbatches"
        fixed = " ".join(o for o in cases[0][1] if not o.startswith(vary))
        print(f"\nScaling with {title} ({base} {fixed}):\n")
        print(HEADER.format("run" if title == "GPUs" else title))
        xs, ys = [], []
        for x, ov in cases:
            r = run_child(base, ov, a.repeat, not a.no_tracemalloc, a.replicas, a.timeout)
            print(row(str(x), r), flush=True)
            if "error" not in r:
                xs.append(x)
                ys.append(r["wall_s"])
        if len(xs) > 1:
            print(f"\nexponent of wall time against {title}: {slope(xs, ys):.2f}")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark  # this folder
    raise SystemExit(run_benchmark(main, "fast-path", "Fast path: wall time and memory"))
