"""Benchmark: a skewed all_to_all_v on dgx-h100 clusters through the network model.

    python benchmarks/bench_collectives.py                 # 256 GPUs + scaling 64..1024
    python benchmarks/bench_collectives.py --quick         # 64 + 256 GPUs, scaling to 512
    python benchmarks/bench_collectives.py --algo hierarchical --model flow
    python benchmarks/bench_collectives.py --sizes 64,128 --repeats 3 --budget 60

Every member arrives at t = 0 and the collective runs through
:class:`moesim.collectives.communicator.Communicator` (direct: pairwise transfers) on a
:class:`moesim.network.FlowNetwork` (or the analytical model).

1. Accuracy and cost of ``coalesce_rtol`` on ``--exact-gpus`` GPUs (default 64 and 128):
   process CPU time, solves, simulated end and its relative error against exact (0).
2. The headline size (default 256 GPUs = 32 nodes) with each ``--rtols`` value:
   median wall and CPU time of ``--repeats`` runs, peak resident memory.
3. The scaling series (``--sizes``) at ``--scale-rtol`` (default 1e-2): wall, CPU time,
   flows, solves, peak RSS; then the fitted exponents of CPU time against GPUs and
   against flows (log-log least squares). A run over ``--budget`` seconds is stopped
   and reported as such; larger sizes are then skipped.

The matrix: every rank sends ``--per-rank`` bytes (default 64 MiB), split over
destinations by a Zipf-like popularity (exponent 1, shuffled: a few hot ranks hold
hot experts) times log-normal noise (sigma 0.5); seed 0. Same seed, same matrix.
Peak RSS is the process's high-water mark so far (it never goes down).
"""

from __future__ import annotations

import argparse
import resource
import signal
import statistics
import sys
import time

import numpy as np
import simpy

from moesim.collectives.communicator import CollectiveSpec, Communicator
from moesim.collectives.simulate import rank_hosts
from moesim.network import AnalyticalNetwork, FlowNetwork
from moesim.topology import load_topology
from moesim.units import parse_bytes

GPUS_PER_NODE = 8  # dgx-h100: 8 GPUs per server (NVIDIA DGX H100 datasheet; docs/sources.md)


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


def one_run(n_gpus: int, args: argparse.Namespace, rtol: float) -> dict:
    """Simulate the skewed all_to_all_v among ``n_gpus``; times in seconds."""
    topo = load_topology("dgx-h100", nodes=n_gpus // GPUS_PER_NODE)
    m = skewed_matrix(n_gpus, args.per_rank, np.random.default_rng(args.seed))
    np.fill_diagonal(m, 0.0)
    signal.setitimer(signal.ITIMER_REAL, args.budget)
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        env = simpy.Environment()
        net = (FlowNetwork(env, topo, coalesce_rtol=rtol) if args.model == "flow"
               else AnalyticalNetwork(env, topo))
        comm = Communicator(env, net, topo.gpus, rank_host=rank_hosts(topo))
        spec = CollectiveSpec("all_to_all_v", tuple(range(n_gpus)), matrix=m, algo=args.algo)
        events = [comm.join("a2a", r, spec) for r in range(n_gpus)]
        env.run()
        end = max(ev.value.end_s for ev in events)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return {"time_s": end, "wall_s": wall, "cpu_s": cpu, "flows": net.n_flows,
            "solves": getattr(net, "n_solves", 0), "bytes": float(m.sum())}


def peak_rss_MiB() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def fit(xs: list[float], ys: list[float]) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0]) if len(xs) >= 2 else float("nan")


def accuracy(args: argparse.Namespace, rtols: list[float]) -> None:
    for n in args.exact_gpus:
        try:
            exact = one_run(n, args, 0.0)
        except Budget:
            print(f"{n:5d} GPUs exact: > {args.budget:.0f} s (stopped)")
            continue
        print(f"{n:5d} GPUs, {exact['flows']} flows, coalesce_rtol=0 (exact): "
              f"cpu {exact['cpu_s']:7.2f} s, {exact['solves']:6d} solves, "
              f"simulated {exact['time_s'] * 1e3:.4f} ms", flush=True)
        for rtol in rtols:
            r = one_run(n, args, rtol)
            err = (r["time_s"] - exact["time_s"]) / exact["time_s"]
            print(f"{n:5d} GPUs, {r['flows']} flows, coalesce_rtol={rtol:g}: "
                  f"cpu {r['cpu_s']:7.2f} s, {r['solves']:6d} solves, "
                  f"simulated {r['time_s'] * 1e3:.4f} ms, error {err:+.1e}", flush=True)


def headline(args: argparse.Namespace, rtols: list[float]) -> None:
    for rtol in rtols:
        walls, cpus, res = [], [], None
        for _ in range(args.repeats):
            try:
                res = one_run(args.gpus, args, rtol)
            except Budget:
                print(f"{args.gpus} GPUs, coalesce_rtol={rtol:g}: > --budget {args.budget:.0f} s")
                res = None
                break
            walls.append(res["wall_s"])
            cpus.append(res["cpu_s"])
        if res is not None:
            print(f"{args.gpus} GPUs, {res['flows']} flows, coalesce_rtol={rtol:g}: "
                  f"wall median {statistics.median(walls):.2f} s, cpu median "
                  f"{statistics.median(cpus):.2f} s of {len(walls)} runs "
                  f"[{', '.join(f'{w:.2f}' for w in walls)}], {res['solves']} solves, "
                  f"simulated {res['time_s'] * 1e3:.4f} ms, peak RSS {peak_rss_MiB():.0f} MiB",
                  flush=True)


def scaling(args: argparse.Namespace) -> None:
    gpus, flows, cpus = [], [], []
    print(f"scaling, coalesce_rtol={args.scale_rtol:g}:")
    for n in args.sizes:
        try:
            r = one_run(n, args, args.scale_rtol)
        except Budget:
            print(f"{n:5d} GPUs: > {args.budget:.0f} s (stopped); larger sizes skipped")
            break
        gpus.append(n)
        flows.append(r["flows"])
        cpus.append(r["cpu_s"])
        print(f"{n:5d} GPUs: {r['flows']:8d} flows, wall {r['wall_s']:8.2f} s, cpu "
              f"{r['cpu_s']:8.2f} s, {r['solves']:5d} solves, simulated "
              f"{r['time_s'] * 1e3:9.3f} ms, peak RSS {peak_rss_MiB():.0f} MiB", flush=True)
    if len(gpus) >= 2:
        print(f"fitted exponent: cpu ~ GPUs^{fit(gpus, cpus):.2f}, "
              f"cpu ~ flows^{fit(flows, cpus):.2f}, flows ~ GPUs^{fit(gpus, flows):.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=256, help="headline size (default 256)")
    p.add_argument("--rtols", default="1e-3,1e-2", help="coalesce_rtol values for the headline")
    p.add_argument("--exact-gpus", default="64,128", help="sizes compared against exact")
    p.add_argument("--sizes", default="64,128,256,512,1024", help="scaling series, GPUs")
    p.add_argument("--scale-rtol", type=float, default=1e-2)
    p.add_argument("--algo", default="direct", help="direct | hierarchical")
    p.add_argument("--model", default="flow", help="flow | analytical")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--per-rank", type=parse_bytes, default=parse_bytes("64MiB"))
    p.add_argument("--budget", type=float, default=120.0, help="seconds per run before giving up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="exact at 64 only, 1 repeat, up to 512")
    args = p.parse_args(argv)
    args.exact_gpus = [int(s) for s in args.exact_gpus.split(",") if s]
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick:
        args.exact_gpus, args.repeats = [64], 1
        args.sizes = [n for n in args.sizes if n <= 512]
    rtols = [float(s) for s in args.rtols.split(",")]
    signal.signal(signal.SIGALRM, _alarm)

    print(f"all_to_all_v {args.algo}, {args.model} model, dgx-h100, "
          f"{args.per_rank / 2**20:.0f} MiB per rank, skewed (seed {args.seed})")
    if args.model == "flow":
        accuracy(args, [1e-4, 1e-3, 1e-2])
    headline(args, rtols if args.model == "flow" else [0.0])
    scaling(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
