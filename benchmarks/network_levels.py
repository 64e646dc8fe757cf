"""How much an exact flow engine must recompute per event: the skewed all-to-all-v of
``bench_network.py --scaling`` (every GPU to every other, tokens ~ Poisson(128) x 7392 B,
dgx-h100, all flows started at t = 0), watched through ``FlowNetwork(on_solve=...)``.

    python benchmarks/network_levels.py                 # 32, 64 and 128 GPUs
    python benchmarks/network_levels.py --gpus 32 64

Between consecutive re-solves it counts the running flows whose max-min rate changed
(by more than 1e-12 relative), the distinct new rates among them (values within 1e-12
relative counted once) and the distinct links those flows are now bottlenecked on (a
saturated link on their path where their rate is the largest). Any exact engine, however
it stores rates, must compute each distinct new rate at each event, so the sum over
events of the distinct new rates is a lower bound on its work; the script prints how
that grows with GPUs (least squares, log-log) next to the events alone. Solves across a
compaction of the network's slots are skipped (slots are renumbered then; with every
flow started at t = 0 that is the only renumbering).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import simpy
from network_flows import all_to_all, make_topology

from moesim.network import FlowNetwork

#: relative tolerance under which two rates count as equal
RTOL = 1e-12


def watch(gpus: int) -> dict[str, float]:
    """Means per re-solve of what changed, for the skewed all-to-all-v among ``gpus``."""
    topo, _ = make_topology(gpus, "dgx-h100")
    flows = all_to_all(topo, np.random.default_rng(1))
    cap = np.asarray(topo.capacity_Bps, dtype=float)
    env = simpy.Environment()
    prev: list[np.ndarray] = []
    rows: list[tuple[int, int, int]] = []

    def hook(_now: float, pf: np.ndarray, pl: np.ndarray, rate: np.ndarray) -> None:
        r = rate[pf]
        load = np.bincount(pl, weights=r, minlength=len(cap))
        top = np.zeros(len(cap))
        np.maximum.at(top, pl, r)
        on = (load >= cap * (1 - 1e-9))[pl] & (r >= top[pl] * (1 - 1e-9))
        bottleneck = np.full(len(rate), -1)
        bottleneck[pf[on]] = pl[on]
        if prev and len(prev[0]) == len(rate):
            old = prev[0]
            changed = (old > 0) & (rate > 0) & (np.abs(rate - old) > RTOL * np.maximum(old, rate))
            v = np.sort(rate[changed])
            levels = 1 + int(np.count_nonzero(np.diff(v) > RTOL * v[1:])) if len(v) else 0
            links = np.unique(bottleneck[changed])
            rows.append((int(changed.sum()), levels, int(np.count_nonzero(links >= 0))))
        prev[:] = [rate.copy()]

    net = FlowNetwork(env, topo, on_solve=hook)
    for i, f in enumerate(flows):
        net.transfer(*f, tag=i)
    env.run()
    a = np.array(rows, dtype=float)
    return {"gpus": gpus, "solves": net.n_solves, "compared": len(rows),
            "changed": a[:, 0].mean(), "levels": a[:, 1].mean(), "links": a[:, 2].mean()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[32, 64, 128])
    args = ap.parse_args(argv)
    out = []
    for g in args.gpus:
        t = time.process_time()
        r = watch(g)
        out.append(r)
        print(f"{g:4d} GPUs: {r['solves']:6d} re-solves ({r['compared']} compared); per re-solve "
              f"{r['changed']:7.1f} rates changed, {r['levels']:5.1f} distinct new rates, "
              f"{r['links']:5.1f} bottleneck links of the changed flows "
              f"({time.process_time() - t:.1f} s CPU)", flush=True)
    if len(out) > 1:
        x = np.log([r["gpus"] for r in out])

        def slope(v: list[float]) -> float:
            return float(np.polyfit(x, np.log(v), 1)[0])

        print(f"growth against GPUs: re-solves^{slope([r['solves'] for r in out]):.2f}, "
              f"rates changed per re-solve^{slope([r['changed'] for r in out]):.2f}, "
              f"distinct new rates per re-solve^{slope([r['levels'] for r in out]):.2f}; "
              "lower bound on an exact engine's work (re-solves x distinct new rates)^"
              f"{slope([r['solves'] * r['levels'] for r in out]):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
