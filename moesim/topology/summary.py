"""Numbers that summarize a topology: link classes, per-GPU bandwidth, bisection."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import networkx as nx

from moesim.topology.graph import Topology


@dataclass(frozen=True)
class LinkClass:
    """Directed links sharing kind, endpoints' kinds, line rate, efficiency, latency."""

    kind: str
    between: str           # e.g. "gpu-nvswitch"
    count: int             # directed links
    line_rate_Bps: float
    efficiency: float
    bandwidth_Bps: float   # line rate x efficiency
    latency_s: float


def link_classes(topo: Topology) -> list[LinkClass]:
    g = topo.graph
    groups: Counter[tuple[str, str, float, float, float]] = Counter()
    for u, v, d in g.edges(data=True):
        ends = "-".join(sorted((g.nodes[u]["kind"], g.nodes[v]["kind"])))
        groups[(d["kind"], ends, d["line_rate_Bps"], d["efficiency"], d["latency_s"])] += 1
    return [LinkClass(k, ends, n, line, eff, line * eff, lat)
            for (k, ends, line, eff, lat), n in groups.items()]


def node_counts(topo: Topology) -> dict[str, int]:
    return dict(Counter(k for _, k in topo.graph.nodes(data="kind")))


def gpu_egress_Bps(topo: Topology, gpu: str) -> dict[str, float]:
    """Achievable bandwidth out of one GPU, per link kind (bytes/s)."""
    out: dict[str, float] = {}
    for _, _, d in topo.graph.out_edges(gpu, data=True):
        out[d["kind"]] = out.get(d["kind"], 0.0) + d["bandwidth_Bps"]
    return out


def host_uplink_Bps(topo: Topology, host: int = 0) -> tuple[int, float]:
    """(links, achievable bytes/s) from a server's nodes to shared switches (leaves)."""
    g = topo.graph
    n, total = 0, 0.0
    for u, v, d in g.edges(data=True):
        if g.nodes[u]["host"] == host and g.nodes[v]["host"] < 0:
            n += 1
            total += d["bandwidth_Bps"]
    return n, total


def bisection_Bps(topo: Topology) -> float:
    """Max flow (achievable bytes/s, one direction) from the first half of the GPUs
    in rank order to the second half: hosts 0..n/2-1 to the rest when the node count
    is even. Ignores routing rules (a flow may relay through any node)."""
    half = len(topo.gpus) // 2
    if half == 0:
        return 0.0
    g = nx.DiGraph()
    for u, v, d in topo.graph.edges(data=True):
        g.add_edge(u, v, capacity=d["bandwidth_Bps"])
    for gpu in topo.gpus[:half]:
        g.add_edge("__src__", gpu)  # no capacity attribute: unbounded
    for gpu in topo.gpus[half:]:
        g.add_edge(gpu, "__dst__")
    return float(nx.maximum_flow_value(g, "__src__", "__dst__"))
