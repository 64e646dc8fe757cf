"""The Topology: a directed graph of GPUs, switches and links, plus its routing.

Built by :func:`moesim.topology.load_topology`; read by the network models,
collectives and the step engine. SI units inside: bytes/s and seconds.

Node attributes: ``kind`` (one of :data:`NODE_KINDS`), ``host`` (server index or
-1), ``local`` (GPU index in its server or -1). Edge attributes: ``kind``
(nvlink, pcie, ib, ethernet, cpu, any string), ``bandwidth_Bps`` (line rate times
efficiency), ``line_rate_Bps``, ``efficiency``, ``latency_s``, ``id`` (link id).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import networkx as nx
import numpy as np

from moesim.units import Bps_to_gbps, s_to_us

NODE_KINDS = ("gpu", "nvswitch", "pcie_switch", "cpu", "nic", "leaf", "spine", "core")

#: route() results kept per topology before the cache is cleared (memory bound)
ROUTE_CACHE_MAX = 1 << 21


class Router(Protocol):
    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]: ...


class Topology:
    """A cluster: ``graph`` plus per-link arrays indexed by link id and ``route``.

    ``router_factory(graph, link_id)`` builds the router once link ids exist.
    """

    def __init__(self, name: str, graph: nx.DiGraph, routing: str,
                 router_factory: Callable[[nx.DiGraph, dict[tuple[str, str], int]], Router],
                 source: str = "", params: dict[str, Any] | None = None) -> None:
        self.name = name
        self.graph = graph
        self.routing = routing
        self.source = source
        self.params: dict[str, Any] = dict(params or {})
        self.device: str | None = None  # GPU model (moesim.compute.devices name), if the file says
        gpus = [n for n, k in graph.nodes(data="kind") if k == "gpu"]
        gpus.sort(key=lambda n: (graph.nodes[n]["host"], graph.nodes[n]["local"]))
        self.gpus: list[str] = gpus
        hosts = {graph.nodes[n]["host"] for n in gpus}
        self.n_nodes = len(hosts)
        self.gpus_per_node = len(gpus) // max(self.n_nodes, 1)
        self.links: list[tuple[str, str]] = []
        self.link_kinds: list[str] = []
        cap, line, lat = [], [], []
        for lid, (u, v, d) in enumerate(graph.edges(data=True)):
            d["id"] = lid
            self.links.append((u, v))
            self.link_kinds.append(str(d["kind"]))
            cap.append(d["bandwidth_Bps"])
            line.append(d["line_rate_Bps"])
            lat.append(d["latency_s"])
        self.link_names = [f"{u}->{v}" for u, v in self.links]
        self.link_id: dict[tuple[str, str], int] = {uv: i for i, uv in enumerate(self.links)}
        self.capacity_Bps = np.asarray(cap, dtype=np.float64)
        self.line_rate_Bps = np.asarray(line, dtype=np.float64)
        self.latency_s = np.asarray(lat, dtype=np.float64)
        self._router: Router = router_factory(graph, self.link_id)
        self._cache: dict[tuple[str, str, int], tuple[int, ...]] = {}
        self._keyed = routing != "shortest"

    def __repr__(self) -> str:
        return (f"Topology({self.name!r}, {len(self.gpus)} GPUs = {self.n_nodes} x "
                f"{self.gpus_per_node}, {len(self.links)} links, routing={self.routing!r})")

    @property
    def n_gpus(self) -> int:
        return len(self.gpus)

    def host_of(self, gpu: str) -> int:
        return int(self.graph.nodes[gpu]["host"])

    def local_of(self, gpu: str) -> int:
        return int(self.graph.nodes[gpu]["local"])

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        """Link ids from ``src`` to ``dst`` (``()`` when equal); ``key`` selects
        among equal-cost paths for ``ecmp`` and ``rail`` (ignored by ``shortest``)."""
        ck = (src, dst, key if self._keyed else 0)
        path = self._cache.get(ck)
        if path is None:
            if len(self._cache) >= ROUTE_CACHE_MAX:
                self._cache.clear()
            path = self._cache[ck] = self._router.route(src, dst, ck[2])
        return path

    def path_nodes(self, src: str, dst: str, key: int = 0) -> list[str]:
        """The node names along ``route(src, dst, key)``, src first."""
        nodes = [src]
        for lid in self.route(src, dst, key):
            nodes.append(self.links[lid][1])
        return nodes

    def describe(self) -> dict[str, Any]:
        """JSON-able description (GB/s per direction after efficiency, µs)."""
        return {
            "name": self.name,
            "routing": self.routing,
            "device": self.device,
            "n_gpus": len(self.gpus),
            "n_nodes": self.n_nodes,
            "gpus_per_node": self.gpus_per_node,
            "nodes": [{"id": n, "kind": k} for n, k in self.graph.nodes(data="kind")],
            "links": [
                {"src": u, "dst": v, "kind": self.link_kinds[i],
                 "bandwidth_GBps": Bps_to_gbps(self.capacity_Bps[i]),
                 "line_rate_GBps": Bps_to_gbps(self.line_rate_Bps[i]),
                 "latency_us": s_to_us(self.latency_s[i])}
                for i, (u, v) in enumerate(self.links)
            ],
        }
