"""Benchmark of the flow-level network: the max-min solver and FlowNetwork growth.

    python benchmarks/bench_network.py [--quick]
    python benchmarks/bench_network.py --scaling [--write-docs]   # skewed all-to-all-v, 32-256 GPUs

``--scaling`` runs skewed all-to-all-v on 32, 64, 128 and 256 GPUs (dgx-h100), each in
a fresh process, with this tree's engine and with the engine of ``--old-rev`` (its
``moesim/network`` checked out into a temporary package, for this benchmark only), and
``mixtral-8x7b-64gpu`` on the exact engine with both trees; prints wall, CPU
(user+sys) and peak RSS, the speed-up, whether every finish time is within 1e-12
relative of the previous engine's (exit status 1 if not; ``--numpy-sizes`` also runs
this tree's numpy path), what one re-solve does (``FlowNetwork.counters()``) and the
fitted growth exponents; ``--write-docs`` regenerates docs/results/network.md with the
date and load average.

Prints wall time (median of a few runs) and peak Python heap (tracemalloc) for
1. one max-min solve of 10,000 concurrent random flows on a 256-GPU fat-tree,
2. FlowNetwork simulating an all-to-all among 256 GPUs (65,280 flows at once),
   equal sizes; then MoE-like skewed sizes, exact and with ``coalesce_rtol``,
3. FlowNetwork on uniform random flow sets from 64 to 1024 GPUs, with the fitted
   exponent of wall time against the number of flow events (starts + finishes).

The topology is ``moesim.topology.load_topology("fat-tree", ...)`` when that
package is importable, else the small leaf/spine graph of ``network_flows.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass
from functools import partial

import numpy as np
import simpy
from bench_network_scaling import OLD_REV, scaling
from network_flows import all_to_all, make_topology

from moesim.network import FlowNetwork
from moesim.network.maxmin import maxmin_pairs


@dataclass
class Measured:
    wall_s: float      # median wall time
    cpu_s: float       # median process CPU time (robust on a shared machine)
    peak_bytes: int    # peak traced Python heap (tracemalloc, one extra run)
    result: object


def measure(fn, repeats: int) -> Measured:
    walls, cpus = [], []
    result = None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return Measured(statistics.median(walls), statistics.median(cpus), peak, result)


def timing(m: Measured, repeats: int, unit: str = "s") -> str:
    k = 1e3 if unit == "ms" else 1.0
    return (f"wall {m.wall_s * k:.2f} {unit} / cpu {m.cpu_s * k:.2f} {unit} (median of {repeats}), "
            f"peak heap {m.peak_bytes / 2**20:.1f} MiB")


def bench_solver(rng: np.random.Generator, repeats: int) -> None:
    topo, how = make_topology(256)
    gpus = list(topo.gpus)
    n = 10_000
    src = rng.integers(0, len(gpus), n)
    dst = (src + rng.integers(1, len(gpus), n)) % len(gpus)
    paths = [topo.route(gpus[a], gpus[b], i) for i, (a, b) in enumerate(zip(src, dst, strict=True))]
    pf = np.repeat(np.arange(n), [len(p) for p in paths])
    pl = np.concatenate([np.asarray(p, dtype=np.int64) for p in paths])
    m = measure(lambda: maxmin_pairs(pf, pl, n, topo.capacity_Bps), repeats)
    levels = len(np.unique(m.result))
    print(f"max-min solve, {n} flows ({len(pl)} flow-link pairs) on 256 GPUs [{how}]: "
          f"{timing(m, repeats, 'ms')}, {levels} distinct rate levels")


def run_network(topo, flows: list[tuple[str, str, float]],
                coalesce_rtol: float = 0.0) -> tuple[float, FlowNetwork]:
    env = simpy.Environment()
    net = FlowNetwork(env, topo, coalesce_rtol=coalesce_rtol)
    net.transfer_many(flows)
    env.run()
    return env.now, net


def bench_all_to_all(repeats: int, preset: str) -> None:
    topo, how = make_topology(256, preset)
    flows = all_to_all(topo, None)
    m = measure(lambda: run_network(topo, flows), repeats)
    t_sim, net = m.result
    print(f"all-to-all 256 GPUs, {len(flows)} flows of 1 MiB [{how}]: {timing(m, repeats)}, "
          f"simulated {t_sim * 1e3:.4f} ms, {net.n_solves} solves")


def bench_skewed(gpus: int, rtols: list[float], repeats: int) -> None:
    topo, how = make_topology(gpus, "dgx-h100")
    flows = all_to_all(topo, np.random.default_rng(1))
    exact = None
    for rtol in rtols:
        m = measure(lambda r=rtol: run_network(topo, flows, r), repeats)
        t_sim, net = m.result
        if rtol == 0.0:
            exact = t_sim
        err = f", {abs(t_sim - exact) / exact:.1e} off exact" if exact and rtol > 0 else ""
        print(f"skewed all-to-all {gpus} GPUs, {len(flows)} flows [{how}], coalesce_rtol={rtol:g}: "
              f"{timing(m, repeats)}, simulated {t_sim * 1e3:.4f} ms{err}, {net.n_solves} solves")


def random_flows(topo, names: list[str], src: np.ndarray, dst: np.ndarray, size: np.ndarray,
                 starts: np.ndarray) -> FlowNetwork:
    """Simulate flow i from names[src[i]] to names[dst[i]] starting at starts[i] (sorted)."""
    env = simpy.Environment()
    net = FlowNetwork(env, topo)

    def launch():
        for i in range(len(starts)):
            if starts[i] > env.now:
                yield env.timeout(starts[i] - env.now)
            net.transfer(names[src[i]], names[dst[i]], size[i], key=i)

    env.process(launch())
    env.run()
    return net


def bench_growth(rng: np.random.Generator, sizes: list[int], repeats: int) -> None:
    events, walls, cpus = [], [], []
    for gpus in sizes:
        topo, how = make_topology(gpus)
        names = list(topo.gpus)
        n = 4 * gpus
        src = rng.integers(0, gpus, n)
        dst = (src + rng.integers(1, gpus, n)) % gpus
        size = rng.uniform(1e5, 1e7, n)
        starts = np.sort(rng.uniform(0, 1e-3, n))

        m = measure(partial(random_flows, topo, names, src, dst, size, starts), repeats)
        net = m.result
        events.append(2 * n)
        walls.append(m.wall_s)
        cpus.append(m.cpu_s)
        print(f"  {gpus:5d} GPUs, {n:6d} random flows (starts over 1 ms, 0.1-10 MB) [{how}]: "
              f"{timing(m, repeats)}, {net.n_solves} solves, "
              f"{net.n_resolved / net.n_solves:.0f} rates re-solved per solve")
    fit = [np.polyfit(np.log(events), np.log(t), 1)[0] for t in (walls, cpus)]
    print(f"fitted exponent of time vs flow events (starts + finishes): wall {fit[0]:.2f}, "
          f"cpu {fit[1]:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer repeats, smaller growth range")
    p.add_argument("--scaling", action="store_true",
                   help="skewed all-to-all-v 32-256 GPUs, new vs old engine (bench_network_scaling.py)")
    p.add_argument("--sizes", type=int, nargs="*", default=[32, 64, 128, 256])
    p.add_argument("--old-rev", default=OLD_REV, help="git revision of the previous engine")
    p.add_argument("--no-old", action="store_true", help="skip the previous engine")
    p.add_argument("--old-max", type=int, default=128,
                   help="run the previous engine only up to this many GPUs")
    p.add_argument("--no-scenario", action="store_true", help="skip mixtral-8x7b-64gpu exact")
    p.add_argument("--numpy-sizes", type=int, nargs="*", default=[32, 64],
                   help="sizes also run on the numpy path (MOESIM_NUMBA=0) and compared")
    p.add_argument("--write", "--write-docs", dest="write", action="store_true",
                   help="regenerate docs/results/network.md")
    args = p.parse_args(argv)
    if args.scaling:
        return scaling(args)
    rng = np.random.default_rng(0)
    repeats = 1 if args.quick else 3
    bench_solver(rng, repeats)
    for preset in ("fat-tree", "dgx-h100"):
        bench_all_to_all(repeats, preset)
    bench_skewed(64, [0.0, 1e-4, 1e-3, 1e-2], repeats)
    bench_skewed(256, [1e-2] if args.quick else [1e-3, 1e-2], 1)
    print("FlowNetwork growth, uniform random flows (4 per GPU), median of "
          f"{1 if args.quick else 3}:")
    bench_growth(rng, [64, 128, 256] if args.quick else [64, 128, 256, 512, 1024],
                 1 if args.quick else 3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
