"""Steps at any scale: CPU, wall time and memory of a DeepSeek-V3 step from 2,048 GPUs up,
and sampled replicas against simulating every replica under skewed routing.

    python benchmarks/bench_scale.py                     # both tables
    python benchmarks/bench_scale.py --gpus 2048 16384   # some sizes only
    python benchmarks/bench_scale.py --no-skew           # the scale table only
    python benchmarks/bench_scale.py --write-docs        # also docs/results/scale-any.md

Scale table: ``deepseek-v3-2048`` as shipped (balanced routing, ``routing.kind:
uniform``), more nodes with ``--set cluster.nodes=N``; the 2,048-GPU row as shipped
(independent replicas: both of its replicas run) and every row with
``engine.replicas=identical`` (one replica runs, the others copy it and join the
gradient collectives). Each row runs in a fresh child process with one chain process
(``engine.workers=1``): CPU s is the child's user + system time (resolving the scenario,
topology included, and the step), ``engine s`` the step alone, MB its peak resident set
(``ru_maxrss``, 10^6 bytes). Sizes beyond ``moesim.topology.bounds.MAX_GPUS`` run with
the limit lifted in the child (``--lift``, on by default) and are marked.

Skew table: ``deepseek-v3-2048`` cut to PP4 (2,048 GPUs, EP64, 8 replicas), 8 MoE
layers, 16 micro-batches, ``routing.kind=zipf routing.zipf_s=0.3`` drawn per replica;
``engine.replicas=sampled`` with N = 8 (every replica: the independent step), 4 (the
automatic rule), 2 and 1; error = (sampled − all) / all.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

GPUS = [2048, 4096, 8192, 16384, 98304]
SKEW = ["parallel.pp=4", "model.layers=8", "model.first_dense_layers=0",
        "schedule.microbatches=16", "routing.kind=zipf", "routing.zipf_s=0.3"]
SAMPLED = [8, 4, 2, 1]

CHILD = r"""
import json, resource, sys, time
name, overrides, lift = json.loads(sys.argv[1])
if lift:     # sizes beyond the topology's MAX_GPUS: lift it in this process only
    import moesim.topology.bounds as bounds
    bounds.MAX_GPUS = max(bounds.MAX_GPUS, 1 << 20)
    import moesim.topology.explicit as explicit
    if hasattr(explicit, "MAX_GPUS"):
        explicit.MAX_GPUS = bounds.MAX_GPUS
from moesim.wiring import resolve_path, simulate
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
c0, w0 = cpu(), time.perf_counter()
res = resolve_path(name, overrides)
c1 = cpu()
out = simulate(res)
c2 = cpu()
sc = [s for s in out.summary["shortcuts"] if s["name"] in ("sampled_replicas", "identical_replicas")]
print(json.dumps({"cpu_s": c2 - c0, "engine_s": c2 - c1, "wall_s": time.perf_counter() - w0,
                  "maxrss_MB": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                                   resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1e3,
                  "step_s": out.step_time_s, "world": out.n_ranks, "shortcut": sc}))
"""


def child(name: str, overrides: list[str], lift: bool, timeout: float) -> dict:
    """One run in a fresh process; {"error": ...} when it fails or runs out of time."""
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, json.dumps([name, overrides, lift])],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s wall"}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {p.returncode}: {last[:160]}", "wall_s": time.perf_counter() - t}
    return json.loads(p.stdout.strip().splitlines()[-1])


def scale_table(gpus: list[int], lift: bool, timeout: float) -> None:
    print("## DeepSeek-V3 step, balanced routing, by GPUs\n")
    print("| GPUs | replicas | replicas run | CPU s | engine s | wall s | peak MB | step s |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [(2048, "independent")] + [(n, "identical") for n in gpus]
    base = None
    for n, mode in rows:
        if n == 2048 and mode == "independent" and 2048 not in gpus:
            continue
        over = [f"cluster.nodes={n // 8}", "engine.workers=1", f"engine.replicas={mode}"]
        r = child("deepseek-v3-2048", over, lift and n > 8192, timeout)
        edp = n // 16 // 64
        run = edp if mode == "independent" else 1
        if "error" in r:
            print(f"| {n:,} | {mode} | {run} of {edp} | {r['error']} | | | | |")
            continue
        if mode == "independent":
            base = r["cpu_s"]
        print(f"| {n:,}{' (limit lifted)' if lift and n > 8192 else ''} | {mode} | {run} of "
              f"{edp} | {r['cpu_s']:.1f} | {r['engine_s']:.1f} | {r['wall_s']:.1f} | "
              f"{r['maxrss_MB']:.0f} | {r['step_s']:.6f} |", flush=True)
    if base is not None:
        print(f"\nCPU of each row against the shipped 2,048-GPU step: {base:.1f} s.\n")


def skew_table(timeout: float) -> None:
    print("## Sampled replicas against every replica, skewed routing, 2,048 GPUs\n")
    print("`deepseek-v3-2048 --set " + " ".join(SKEW) + "` (PP4, EP64: 8 replicas)\n")
    print("| replicas simulated | CPU s | step s | error % | the shortcut's bound |")
    print("|---|---|---|---|---|")
    full = None
    for n in SAMPLED:
        over = SKEW + ["engine.workers=1", "engine.replicas=sampled",
                       f"engine.sampled_replicas={n}"]
        r = child("deepseek-v3-2048", over, False, timeout)
        if "error" in r:
            print(f"| {n} | {r['error']} | | | |")
            continue
        if full is None:
            full = r["step_s"]
        err = 100 * (r["step_s"] - full) / full
        bound = r["shortcut"][0]["bound"] if r["shortcut"] else ""
        print(f"| {n}{' (all)' if n == SAMPLED[0] else ''} | {r['cpu_s']:.1f} | "
              f"{r['step_s']:.6f} | {err:+.4f} | {bound} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=GPUS)
    ap.add_argument("--no-skew", action="store_true")
    ap.add_argument("--no-scale", action="store_true")
    ap.add_argument("--no-lift", action="store_true", help="keep MAX_GPUS as shipped")
    ap.add_argument("--timeout", type=float, default=1800.0, help="wall seconds per run")
    args = ap.parse_args()
    t = time.perf_counter()
    if not args.no_scale:
        scale_table(sorted(args.gpus), not args.no_lift, args.timeout)
    if not args.no_skew:
        skew_table(args.timeout)
    print(f"\nbench_scale: {time.perf_counter() - t:.0f} s wall")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "scale-any", "Steps at any scale: CPU and memory by GPUs, "
                           "sampled replicas under skew"))
