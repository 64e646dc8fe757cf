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
(``ru_maxrss``, 10^6 bytes). The last rows run on the three-tier rail-optimised
fat-trees ``superpod-h100-16k`` and ``superpod-h100-100k`` (``--set
cluster.topology=...``), the latter at 12,288 of its nodes: 98,304 GPUs, the largest
multiple of PP16 x EP64 = 1,024 GPUs up to 100,000 (DeepSeek-V3's layout cannot fill
100,000: 100,000 / 16 = 6,250 ranks per stage is no multiple of 64).

Skew table: ``deepseek-v3-2048`` cut to PP4 (2,048 GPUs, EP64, 8 replicas), 8 MoE
layers, 16 micro-batches, ``routing.kind=zipf`` with ``zipf_s`` 0.3 and 1.0, drawn per
replica;
``engine.replicas=sampled`` with N = 8 (every replica: the independent step), 4 (the
automatic rule), 2 and 1; error = (sampled − all) / all.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

#: (GPUs, topology or None for the shipped dgx-h800 fabric, engine.replicas)
ROWS = [(2048, None, "independent"), (2048, None, "identical"), (4096, None, "identical"),
        (8192, None, "identical"), (16384, None, "identical"),
        (16384, "superpod-h100-16k", "identical"), (98304, "superpod-h100-100k", "identical")]
SKEW = ["parallel.pp=4", "model.layers=8", "model.first_dense_layers=0",
        "schedule.microbatches=16", "routing.kind=zipf",
        # without the shipped scenario's MTP module and its 3 | ... | 2 stage split
        "model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
        "parallel.decoder_last_pipeline_num_layers=null"]
#: routing.zipf_s of the skew table: the guide's what-if (hottest expert 3.7x the mean)
#: and a heavier skew
ZIPF_S = [0.3, 1.0]
SAMPLED = [8, 4, 2, 1]

CHILD = r"""
import json, resource, sys, time
name, overrides = json.loads(sys.argv[1])
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


def child(name: str, overrides: list[str], timeout: float) -> dict:
    """One run in a fresh process; {"error": ...} when it fails or runs out of time."""
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, json.dumps([name, overrides])],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s wall"}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {p.returncode}: {last[:160]}", "wall_s": time.perf_counter() - t}
    return json.loads(p.stdout.strip().splitlines()[-1])


def scale_table(gpus: list[int], timeout: float) -> None:
    print("## DeepSeek-V3 step, balanced routing, by GPUs\n")
    print("| GPUs | fabric | replicas | replicas run | CPU s | engine s | wall s | peak MB "
          "| step s |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = None
    for n, topo, mode in ROWS:
        if n not in gpus:
            continue
        over = ([f"cluster.topology={topo}"] if topo else []) + [
            f"cluster.nodes={n // 8}", "engine.workers=1", f"engine.replicas={mode}"]
        r = child("deepseek-v3-2048", over, timeout)
        edp = n // 16 // 64
        run = edp if mode == "independent" else 1
        fabric = topo or "dgx-h800"
        if "error" in r:
            print(f"| {n:,} | {fabric} | {mode} | {run} of {edp} | {r['error']} | | | | |")
            continue
        if mode == "independent" and n == 2048:
            base = r["cpu_s"]
        ratio = f" ({r['cpu_s'] / base:.2f}x)" if base and r["cpu_s"] != base else ""
        print(f"| {n:,} | {fabric} | {mode} | {run} of {edp} | {r['cpu_s']:.1f}{ratio} | "
              f"{r['engine_s']:.1f} | {r['wall_s']:.1f} | {r['maxrss_MB']:.0f} | "
              f"{r['step_s']:.6f} |", flush=True)
    print("\n(x): CPU against the shipped 2,048-GPU step (first row).\n")


def skew_table(timeout: float) -> None:
    print("## Sampled replicas against every replica, skewed routing, 2,048 GPUs\n")
    print("`deepseek-v3-2048 --set " + " ".join(SKEW) + " routing.zipf_s=S` (PP4, EP64: 8 "
          "replicas, each drawing its own tokens)\n")
    print("| zipf_s | replicas simulated | CPU s | step s | error % | the shortcut's bound |")
    print("|---|---|---|---|---|---|")
    for zs in ZIPF_S:
        full = None
        for n in SAMPLED:
            over = SKEW + [f"routing.zipf_s={zs}", "engine.workers=1",
                           "engine.replicas=sampled", f"engine.sampled_replicas={n}"]
            r = child("deepseek-v3-2048", over, timeout)
            if "error" in r:
                print(f"| {zs} | {n} | {r['error']} | | | |")
                continue
            if full is None:
                full = r["step_s"]
            err = 100 * (r["step_s"] - full) / full
            bound = r["shortcut"][0]["bound"] if r["shortcut"] else ""
            print(f"| {zs} | {n}{' (all)' if n == SAMPLED[0] else ''} | {r['cpu_s']:.1f} | "
                  f"{r['step_s']:.6f} | {err:+.4f} | {bound} |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=sorted({r[0] for r in ROWS}))
    ap.add_argument("--no-skew", action="store_true")
    ap.add_argument("--no-scale", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800.0, help="wall seconds per run")
    args = ap.parse_args()
    t = time.perf_counter()
    if not args.no_scale:
        scale_table(args.gpus, args.timeout)
    if not args.no_skew:
        skew_table(args.timeout)
    print(f"\nbench_scale: {time.perf_counter() - t:.0f} s wall")
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "scale-any", "Steps at any scale: CPU and memory by GPUs, "
                           "sampled replicas under skew"))
