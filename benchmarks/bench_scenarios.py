"""Wall time and peak memory of one simulated step per shipped scenario, and how wall
time scales with GPUs and with micro-batches.

    python benchmarks/bench_scenarios.py                 # table + scaling, defaults
    python benchmarks/bench_scenarios.py --repeat 3 --timeout 900 --gpus 64,128,256,512

Every measurement runs in a fresh child process (so ``ru_maxrss`` is that run's
peak resident set): ``--repeat`` timed runs of ``moesim.engine.api.simulate`` (median
wall time and CPU time reported), then one more under ``tracemalloc`` for the peak
of Python allocations. Every row measures the exact engine: ``engine.mode=exact`` is
passed explicitly, also to the scenarios that ship with the fast path
(mixtral-8x7b-64gpu, deepseek-v3-2048); ``benchmarks/bench_fast.py`` measures that. A child past ``--timeout`` seconds is stopped and reported as
not finished. Times are seconds of this machine's wall clock, memory in MB (10^6 B).

Scaling exponents are least-squares slopes of log(wall) against log(GPUs) and
log(micro-batches): 1.0 is linear.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

SCENARIOS = ["toy-cpu", "hot-expert", "mixtral-8x7b-ep8", "mixtral-8x7b-64gpu",
             "deepseek-v3-2048"]
TARGETS_S = {"mixtral-8x7b-ep8": 5.0, "mixtral-8x7b-64gpu": 5.0, "deepseek-v3-2048": 60.0}

# DeepSeek-V3 shape (H800, fp8 dispatch, node-limited routing, EP overlap, ZeRO-1) with
# a fixed slice of work per replica: PP4, EP8 (one node per EP group), 4 MoE layers,
# 4 micro-batches; GPUs grow by adding data-parallel replicas (dp = GPUs / 4).
# 1F1B, without the shipped scenario's MTP module and its 3 | ... | 2 stage split.
GPU_FAMILY = ("deepseek-v3-2048", ["parallel.pp=4", "parallel.ep=8", "model.layers=4",
                                   "model.first_dense_layers=0", "schedule.microbatches=4",
                                   "routing.max_nodes=null", "schedule.kind=1f1b",
                                   "model.mtp_layers=0",
                                   "parallel.decoder_first_pipeline_num_layers=null",
                                   "parallel.decoder_last_pipeline_num_layers=null"])
# Mixtral on 16 GPUs (PP2, EP8 per node), 8 layers, growing micro-batches
MB_FAMILY = ("mixtral-8x7b-ep8", ["model.layers=8"])


def child(spec: dict) -> dict:
    """Runs in the child process: time ``repeat`` runs, then one under tracemalloc."""
    import resource
    import tracemalloc

    from moesim.wiring import simulate

    if spec.get("mem_limit_GB"):   # fail cleanly instead of swapping a shared machine
        lim = int(spec["mem_limit_GB"] * 1e9)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    kw = {"replicas": spec["replicas"], "record_series": False}
    walls, cpus, out = [], [], {}
    for _ in range(spec["repeat"]):
        t0, c0 = time.perf_counter(), time.process_time()
        r = simulate(spec["scenario"], ["engine.mode=exact", *spec["overrides"]], **kw)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        sc = r.summary["shortcuts"]
        out = {"world": r.n_ranks, "step_time_s": r.step_time_s,
               "simulated_ranks": sc[0]["simulated_ranks"] if sc else r.n_ranks,
               "spans": len(r.spans)}
        del r
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # KiB on Linux
    peak_mb = None
    if spec["tracemalloc"]:
        tracemalloc.start()
        r = simulate(spec["scenario"], ["engine.mode=exact", *spec["overrides"]], **kw)
        peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
        del r
    return {**out, "walls_s": walls, "wall_s": statistics.median(walls),
            "cpu_s": statistics.median(cpus), "tracemalloc_peak_MB": peak_mb,
            "ru_maxrss_MB": rss_mb}


def measure(scenario: str, overrides: list[str], args, replicas: str | None = None) -> dict:
    spec = {"scenario": scenario, "overrides": overrides, "repeat": args.repeat,
            "replicas": replicas or args.replicas, "tracemalloc": not args.no_tracemalloc,
            "mem_limit_GB": args.mem_limit_GB}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish in {args.timeout:.0f} s",
                "elapsed_s": time.perf_counter() - t0}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:160]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def fmt(v, f: str) -> str:
    return "-" if v is None else format(v, f)


def table(rows: list[tuple[str, list[str], str, dict]]) -> str:
    head = ("| scenario | GPUs | replicas | simulated ranks | step (ms) | wall median (s) | "
            "CPU (s) | tracemalloc peak (MB) | ru_maxrss (MB) | target |")
    lines = [head, "|" + "---|" * 10]
    for name, over, rep, m in rows:
        label = name + (" " + " ".join(over) if over else "")
        tgt = TARGETS_S.get(name) if not over else None
        if "error" in m:
            miss = f"< {tgt:g} s: no" if tgt else ""
            lines.append(f"| {label} | | {rep} | | | {m['error']} | | | | {miss} |")
            continue
        ok = "" if tgt is None else (f"< {tgt:g} s: " + ("yes" if m["wall_s"] < tgt else "no"))
        lines.append(
            f"| {label} | {m['world']} | {rep} | {m['simulated_ranks']} | "
            f"{m['step_time_s'] * 1e3:.1f} | {m['wall_s']:.2f} | {m['cpu_s']:.2f} | "
            f"{fmt(m['tracemalloc_peak_MB'], '.0f')} | {m['ru_maxrss_MB']:.0f} | {ok} |")
    return "\n".join(lines)


def exponent(xs: list[int], walls: list[float | None]) -> float | None:
    ok = [(x, w) for x, w in zip(xs, walls, strict=True) if w is not None]
    if len(ok) < 2:
        return None
    x, w = np.log([o[0] for o in ok]), np.log([o[1] for o in ok])
    return float(np.polyfit(x, w, 1)[0])


def scaling(args) -> str:
    out = []
    name, base = GPU_FAMILY
    gpus = [int(g) for g in args.gpus.split(",") if g]
    for rep in ("independent", "identical"):
        rows, walls, cpus = [], [], []
        for g in gpus:
            over = [*base, f"cluster.nodes={g // 8}"]
            m = measure(name, over, args, replicas=rep)
            rows.append((name, over, rep, m))
            walls.append(m.get("wall_s"))
            cpus.append(m.get("cpu_s"))
            print(f"  gpus {g} {rep}: {m.get('wall_s', m.get('error'))}", file=sys.stderr)
        out += [f"vs GPUs ({rep} replicas), GPUs {gpus}: exponent wall "
                f"{fmt(exponent(gpus, walls), '.2f')}, CPU {fmt(exponent(gpus, cpus), '.2f')}",
                "", table(rows), ""]
    name, base = MB_FAMILY
    mbs = [int(m) for m in args.microbatches.split(",") if m]
    rows, walls, cpus = [], [], []
    for mb in mbs:
        over = [*base, f"schedule.microbatches={mb}"]
        m = measure(name, over, args)
        rows.append((name, over, args.replicas, m))
        walls.append(m.get("wall_s"))
        cpus.append(m.get("cpu_s"))
        print(f"  microbatches {mb}: {m.get('wall_s', m.get('error'))}", file=sys.stderr)
    out += [f"vs micro-batches {mbs}: exponent wall {fmt(exponent(mbs, walls), '.2f')}, "
            f"CPU {fmt(exponent(mbs, cpus), '.2f')}", "", table(rows)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per row (median)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per child")
    ap.add_argument("--replicas", default="independent", choices=["independent", "identical"],
                    help="replica mode for the scenario table")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--gpus", default="64,128,256,512", help="GPU counts of the scaling family")
    ap.add_argument("--microbatches", default="2,4,8,16")
    ap.add_argument("--no-tracemalloc", action="store_true")
    ap.add_argument("--mem-limit-GB", type=float, default=8.0,
                    help="address-space limit of each child (MemoryError past it)")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--no-table", action="store_true")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if not args.no_table:
        rows = []
        for name in [s for s in args.scenarios.split(",") if s]:
            m = measure(name, [], args)
            rows.append((name, [], args.replicas, m))
            print(f"  {name}: {m.get('wall_s', m.get('error'))}", file=sys.stderr)
        print(f"one simulated step per shipped scenario (median of {args.repeat})\n")
        print(table(rows))
        print()
    if not args.no_scaling:
        print(scaling(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
