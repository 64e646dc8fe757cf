"""Topologies and flow sets the network benchmarks share (``bench_network.py``, its
``--scaling`` part ``bench_network_scaling.py`` and ``network_levels.py``): a fat-tree
or dgx-h100 fabric of a given number of GPUs (a small leaf/spine graph when
``moesim.topology`` is not importable) and the all-to-all among its GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Link figures for the fallback graph (docs/sources.md): H100 NVSwitch 450 GB/s per
# direction line rate (H100 whitepaper: 900 GB/s bidirectional); NDR 400 Gb/s IB NIC
# 50 GB/s line rate (46-49 GB/s achieved);
# NVLink latency 3.33 µs, IB 2.8 µs same leaf (DeepSeek ISCA'25 Table 5).
NVLINK_BPS = 450e9
NIC_BPS = 50e9
NVLINK_LAT_S = 3.33e-6
IB_LAT_S = 2.8e-6


@dataclass
class LeafSpine:
    """Fallback two-level fat-tree: 8 GPUs per node on an NVSwitch; rail-optimized
    NICs (GPU i of every node on leaf i); every leaf wired to every spine."""

    nodes: int
    gpus_per_node: int = 8
    spines: int = 8
    capacity_Bps: np.ndarray = field(init=False)
    latency_s: np.ndarray = field(init=False)
    link_names: list[str] = field(init=False)
    link_kinds: list[str] = field(init=False)

    def __post_init__(self) -> None:
        g, n, s = self.gpus_per_node, self.nodes, self.spines
        self.gpus = [f"n{i}.gpu{j}" for i in range(n) for j in range(g)]
        self._rank = {name: r for r, name in enumerate(self.gpus)}
        names, kinds, caps, lats = [], [], [], []

        def add(u: str, v: str, kind: str, cap: float, lat: float) -> int:
            names.append(f"{u}->{v}")
            kinds.append(kind)
            caps.append(cap)
            lats.append(lat)
            return len(names) - 1

        self._up_sw = [add(x, f"n{r // g}.nvsw", "nvlink", NVLINK_BPS, NVLINK_LAT_S / 2)
                       for r, x in enumerate(self.gpus)]
        self._dn_sw = [add(f"n{r // g}.nvsw", x, "nvlink", NVLINK_BPS, NVLINK_LAT_S / 2)
                       for r, x in enumerate(self.gpus)]
        self._up_leaf = [add(x, f"leaf{r % g}", "ib", NIC_BPS, IB_LAT_S / 2)
                         for r, x in enumerate(self.gpus)]
        self._dn_leaf = [add(f"leaf{r % g}", x, "ib", NIC_BPS, IB_LAT_S / 2)
                         for r, x in enumerate(self.gpus)]
        # leaf-spine links sized for full bisection: n NICs per leaf over s spines
        ls = n * NIC_BPS / s
        self._leaf_spine = [[add(f"leaf{i}", f"spine{k}", "ib", ls, 0.0) for k in range(s)]
                            for i in range(g)]
        self._spine_leaf = [[add(f"spine{k}", f"leaf{i}", "ib", ls, 0.0) for k in range(s)]
                            for i in range(g)]
        self.link_names, self.link_kinds = names, kinds
        self.capacity_Bps = np.array(caps)
        self.latency_s = np.array(lats)

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        a, b = self._rank[src], self._rank[dst]
        g = self.gpus_per_node
        if a == b:
            return ()
        if a // g == b // g:
            return (self._up_sw[a], self._dn_sw[b])
        if a % g == b % g:
            return (self._up_leaf[a], self._dn_leaf[b])
        k = (a + b + key) % self.spines  # deterministic ECMP choice
        return (self._up_leaf[a], self._leaf_spine[a % g][k], self._spine_leaf[b % g][k],
                self._dn_leaf[b])


def make_topology(gpus: int, preset: str = "fat-tree"):
    """A non-blocking fat-tree of ``gpus`` single-GPU hosts, 16 per leaf (or, with
    ``preset="dgx-h100"``, gpus / 8 DGX servers on their rail-optimized fabric)."""
    try:
        from moesim.topology import load_topology
    except ImportError:
        return LeafSpine(nodes=max(1, gpus // 8)), "fallback leaf/spine, 8 GPUs per node"
    if preset == "dgx-h100":
        return load_topology("dgx-h100", nodes=gpus // 8), f"dgx-h100 x {gpus // 8}"
    leaves = max(1, gpus // 16)
    topo = load_topology("fat-tree", nodes=gpus, nodes_per_leaf=16, spines=max(1, leaves // 2),
                         oversubscription=1.0)
    return topo, f"fat-tree, {leaves} leaves"


def all_to_all(topo, rng: np.random.Generator | None) -> list[tuple[str, str, float]]:
    """Every GPU to every other: 1 MiB each, or (rng given) MoE-like skewed sizes:
    tokens per pair ~ Poisson(128), 7392 B per token (DeepSeek-V3 fp8 dispatch:
    7168 + 224 scale bytes, DeepSeek-V3 report §3.3)."""
    gpus = list(topo.gpus)
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    if rng is None:
        return [(a, b, float(1 << 20)) for a, b in pairs]
    sizes = rng.poisson(128, len(pairs)) * 7392.0
    return [(a, b, s) for (a, b), s in zip(pairs, sizes, strict=True)]
