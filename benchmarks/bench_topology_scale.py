"""Time and memory to build and route rail-optimized fat-trees of 2,048 to 131,072 GPUs
(issue 40 item 1; the figures behind moesim.topology.bounds.MAX_GPUS).

    python benchmarks/bench_topology_scale.py [--only LABEL ...] [--profile] [--write-docs]

Each size runs twice in a fresh child process: once timed (``load_topology``: the graph,
the per-link arrays and the structural router; then 100,000 routes between random GPU
pairs with distinct ECMP keys; ``ru_maxrss``, the child's resident peak), once under
``tracemalloc`` for the Python heap's peak during the build. CPU = user + sys of the
child. ``--profile`` adds the ten costliest functions (cProfile, own time) of the
largest build. ``--write-docs`` writes what it printed to docs/results/topology-scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

# label -> (preset, overrides). 32,768 and 131,072 GPUs are the 16k and 100k presets with
# more pods, their core count by the same 64-port arithmetic as the presets' (pods x 32
# spines x 32 uplinks / 64 ports).
SIZES: dict[str, tuple[str, dict[str, int]]] = {
    "dgx-h800 x256 (two tiers)": ("dgx-h800", {"nodes": 256}),
    "dgx-h100 x2048 (two tiers)": ("dgx-h100", {"nodes": 2048}),
    "superpod-h100-16k": ("superpod-h100-16k", {}),
    "superpod 32k": ("superpod-h100-16k", {"nodes": 4096, "cores": 512}),
    "superpod-h100-100k": ("superpod-h100-100k", {}),
    "superpod 131k": ("superpod-h100-100k", {"nodes": 16384, "cores": 2048}),
}
ROUTES = 100_000


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(label: str, heap: bool, profile: bool) -> dict:
    """Build (and route) one size in this process; the figures as a dict."""
    import numpy as np

    from moesim.topology import load_topology

    preset, over = SIZES[label]
    if heap:
        import tracemalloc
        tracemalloc.start()
        load_topology(preset, **over)
        return {"heap_GB": tracemalloc.get_traced_memory()[1] / 1e9}
    if profile:
        import cProfile
        import io
        import pstats
        prof = cProfile.Profile()
        prof.enable()
        load_topology(preset, **over)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime").print_stats(10)
        return {"profile": out.getvalue()}
    w, c = time.perf_counter(), _cpu_s()
    t = load_topology(preset, **over)
    build = (time.perf_counter() - w, _cpu_s() - c)
    pairs = np.random.default_rng(1).integers(0, len(t.gpus), size=(ROUTES, 2)).tolist()
    gpus = t.gpus
    c = _cpu_s()
    for key, (s, d) in enumerate(pairs):
        t.route(gpus[s], gpus[d], key)
    routes = _cpu_s() - c
    kinds: dict[str, int] = {}
    for _, k in t.graph.nodes(data="kind"):
        kinds[k] = kinds.get(k, 0) + 1
    return {"gpus": len(t.gpus), "links": len(t.links), "switches": {k: kinds.get(k, 0) for k
            in ("leaf", "spine", "core")}, "build_wall": build[0], "build_cpu": build[1],
            "routes_cpu": routes,
            "rss_GB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}


def _run_child(label: str, *flags: str) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", label, *flags], check=True,
                       capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=list(SIZES), metavar="LABEL")
    ap.add_argument("--profile", action="store_true", help="cProfile the largest build")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--heap", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.heap, args.profile)))
        return 0
    labels = args.only or list(SIZES)
    print(f"Each size in a fresh process; {ROUTES:,} routes between random GPU pairs "
          "(distinct ECMP keys). GB = 10^9 bytes.\n")
    print("| topology | GPUs | directed links | leaf / spine / core | build wall (s) | "
          "build CPU (s) | 10^5 routes CPU (s) | resident peak (GB) | Python heap peak (GB) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label in labels:
        r = _run_child(label)
        heap = _run_child(label, "--heap")["heap_GB"]
        sw = r["switches"]
        print(f"| {label} | {r['gpus']:,} | {r['links']:,} | {sw['leaf']:,} / {sw['spine']:,} / "
              f"{sw['core']:,} | {r['build_wall']:.2f} | {r['build_cpu']:.2f} | "
              f"{r['routes_cpu']:.2f} | {r['rss_GB']:.2f} | {heap:.2f} |", flush=True)
    if args.profile:
        label = labels[-1]
        print(f"\ncProfile of building {label} (own time, top 10):\n")
        print(_run_child(label, "--profile")["profile"].strip())
    return 0


if __name__ == "__main__":
    from results_page import run_benchmark
    sys.exit(run_benchmark(main, "topology-scale", "Topology build and routing at scale"))
