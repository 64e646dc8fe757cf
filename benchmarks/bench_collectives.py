"""Benchmark: a skewed all_to_all_v on dgx-h100 clusters through the network model.

    python benchmarks/bench_collectives.py                 # 256 GPUs + scaling 64..1024
    python benchmarks/bench_collectives.py --algo hierarchical --model flow
    python benchmarks/bench_collectives.py --sizes 64,128 --repeats 3 --budget 60

Prints, for the headline size (default 256 GPUs = 32 nodes), the median wall time of
``--repeats`` runs and the process's peak resident memory; then, for each size of
the scaling series, wall time and flow count, and the fitted exponents of wall time
against GPUs and against flows (log-log least squares). A run that exceeds
``--budget`` seconds is stopped and reported as such; larger sizes are then skipped.

The matrix: every rank sends ``--per-rank`` bytes (default 64 MiB), split over
destinations by a Zipf-like popularity (exponent 1, shuffled: a few hot ranks hold
hot experts) times log-normal noise (sigma 0.5); seed 0. Same seed, same matrix.
"""

from __future__ import annotations

import argparse
import resource
import signal
import statistics
import sys
import time

import numpy as np

from moesim.collectives import simulate_collective
from moesim.topology import load_topology
from moesim.units import parse_bytes

GPUS_PER_NODE = 8  # dgx-h100: 8 GPUs per server (REFERENCE.md, Devices)


def skewed_matrix(n: int, per_rank: float, rng: np.random.Generator) -> np.ndarray:
    """n×n byte matrix, rows summing to ``per_rank``, hot destinations (Zipf, shuffled)."""
    pop = 1.0 / np.arange(1, n + 1)
    rng.shuffle(pop)
    w = pop[None, :] * rng.lognormal(0.0, 0.5, size=(n, n))
    return w / w.sum(axis=1, keepdims=True) * per_rank


class Budget(Exception):
    pass


def _alarm(_sig, _frame):
    raise Budget()


def one_run(n_gpus: int, args: argparse.Namespace) -> dict:
    topo = load_topology("dgx-h100", nodes=n_gpus // GPUS_PER_NODE)
    m = skewed_matrix(n_gpus, args.per_rank, np.random.default_rng(args.seed))
    signal.setitimer(signal.ITIMER_REAL, args.budget)
    try:
        t0 = time.perf_counter()
        res = simulate_collective(topo, "all_to_all", algo=args.algo, model=args.model, matrix=m)
        res["wall_s"] = time.perf_counter() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return res


def peak_rss_MiB() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def fit(xs: list[float], ys: list[float]) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0]) if len(xs) >= 2 else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=256, help="headline size (default 256)")
    p.add_argument("--sizes", default="64,128,256,512,1024", help="scaling series, GPUs")
    p.add_argument("--algo", default="direct", help="direct | hierarchical")
    p.add_argument("--model", default="flow", help="flow | analytical")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--per-rank", type=parse_bytes, default=parse_bytes("64MiB"))
    p.add_argument("--budget", type=float, default=120.0, help="seconds per run before giving up")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    signal.signal(signal.SIGALRM, _alarm)

    print(f"all_to_all_v {args.algo}, {args.model} model, dgx-h100, "
          f"{args.per_rank / 2**20:.0f} MiB per rank, skewed (seed {args.seed})")
    walls = []
    res = None
    for _ in range(args.repeats):
        try:
            res = one_run(args.gpus, args)
        except Budget:
            print(f"{args.gpus} GPUs: did not finish within --budget {args.budget:.0f} s")
            break
        walls.append(res["wall_s"])
    if res is not None and walls:
        print(f"{args.gpus} GPUs: {res['flows']} flows, simulated {res['time_s'] * 1e3:.3f} ms, "
              f"busbw {res['busbw_GBps']:.1f} GB/s; wall median {statistics.median(walls):.2f} s "
              f"of {len(walls)} runs [{', '.join(f'{w:.2f}' for w in walls)}]; "
              f"peak RSS {peak_rss_MiB():.0f} MiB")

    gpus, flows, times = [], [], []
    for n in (int(s) for s in args.sizes.split(",")):
        try:
            r = one_run(n, args)
        except Budget:
            print(f"{n:5d} GPUs: > {args.budget:.0f} s (stopped); larger sizes skipped")
            break
        gpus.append(n)
        flows.append(r["flows"])
        times.append(r["wall_s"])
        print(f"{n:5d} GPUs: {r['flows']:8d} flows, wall {r['wall_s']:8.2f} s, "
              f"simulated {r['time_s'] * 1e3:9.3f} ms, peak RSS {peak_rss_MiB():.0f} MiB",
              flush=True)
    if len(gpus) >= 2:
        print(f"fitted exponent: wall ~ GPUs^{fit(gpus, times):.2f}, "
              f"wall ~ flows^{fit(flows, times):.2f}, flows ~ GPUs^{fit(gpus, flows):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
