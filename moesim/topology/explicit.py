"""Explicit-graph topologies: a YAML list of nodes and links a user writes.

    nodes:
      - {id: gpu0, kind: gpu, host: 0, local: 0}   # host (any node), local (GPUs): optional
      - {id: sw0, kind: pcie_switch}
    links:                                          # both directions unless bidirectional: false
      - {src: gpu0, dst: sw0, kind: pcie, bandwidth_GBps: 32, latency_us: 0.5}
    efficiency: {pcie: 0.8}                         # achievable / line rate per link kind

``bandwidth_GBps`` is the line rate per direction; a link's ``efficiency`` (or its
kind's entry in ``efficiency``, else 1.0) scales it to the achievable rate.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from moesim.errors import InputError
from moesim.topology.bounds import (
    MAX_SEARCHED_GPUS,
    check_bandwidth,
    check_efficiency,
    check_latency,
)
from moesim.topology.graph import NODE_KINDS
from moesim.units import gbps_to_Bps, us_to_s

_NODE_FIELDS = {"id", "kind", "host", "local"}
_LINK_FIELDS = {"src", "dst", "kind", "bandwidth_GBps", "latency_us", "efficiency", "bidirectional"}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _efficiencies(data: dict[str, Any], source: str) -> dict[str, float]:
    eff = data.get("efficiency", {})
    if not isinstance(eff, dict):
        raise InputError(source, "efficiency", "a mapping of link kind to achievable/line rate", eff)
    for kind, value in eff.items():
        if not _number(value) or not 0 < value <= 1:
            raise InputError(source, f"efficiency.{kind}", "a number in (0, 1]", value)
    return {str(k): float(v) for k, v in eff.items()}


def _add_nodes(g: nx.DiGraph, nodes: Any, source: str) -> None:
    if not isinstance(nodes, list) or not nodes:
        raise InputError(source, "nodes", "a non-empty list of {id, kind} mappings", nodes)
    gpus = sum(1 for item in nodes if isinstance(item, dict) and item.get("kind") == "gpu")
    if gpus > MAX_SEARCHED_GPUS:
        raise InputError(source, "nodes", f"at most {MAX_SEARCHED_GPUS} GPUs (an explicit "
                         "graph is routed by search, one per destination; docs/scenarios.md, "
                         "Size limits)", gpus)
    count: dict[int, int] = {}
    for n, item in enumerate(nodes):
        where = f"nodes[{n}]"
        if not isinstance(item, dict):
            raise InputError(source, where, "a mapping with id and kind", item)
        extra = set(item) - _NODE_FIELDS
        if extra:
            raise InputError(source, f"{where}.{sorted(extra)[0]}", f"only {sorted(_NODE_FIELDS)}",
                             sorted(extra)[0])
        for key in ("id", "kind"):
            if key not in item:
                raise InputError(source, f"{where}.{key}", "a value (field is required)", None)
        nid, kind = str(item["id"]), item["kind"]
        if kind not in NODE_KINDS:
            raise InputError(source, f"{where}.kind", f"one of {', '.join(NODE_KINDS)}", kind)
        if nid in g:
            raise InputError(source, f"{where}.id", "a unique node id", nid)
        host, local = item.get("host", 0 if kind == "gpu" else -1), item.get("local")
        if not _int(host) or (kind == "gpu" and host < 0):
            raise InputError(source, f"{where}.host", "a host index >= 0", host)
        if kind == "gpu":
            if local is None:
                local = count.get(host, 0)
            if not _int(local) or local < 0:
                raise InputError(source, f"{where}.local", "a GPU index in its host >= 0", local)
            count[host] = count.get(host, 0) + 1
        else:
            local = -1
        g.add_node(nid, kind=kind, host=host, local=local)


def _check_gpu_grid(g: nx.DiGraph, source: str) -> None:
    """Hosts 0..H-1, each with GPUs local 0..G-1 (same G everywhere)."""
    slots: dict[int, set[int]] = {}
    for n, d in g.nodes(data=True):
        if d["kind"] == "gpu":
            if d["local"] in slots.setdefault(d["host"], set()):
                raise InputError(source, f"nodes.{n}.local", "a unique (host, local) per GPU",
                                 (d["host"], d["local"]))
            slots[d["host"]].add(d["local"])
    if not slots:
        raise InputError(source, "nodes", "at least one node of kind gpu", 0)
    per = len(next(iter(slots.values())))
    if sorted(slots) != list(range(len(slots))):
        raise InputError(source, "nodes.host", "GPU hosts numbered 0, 1, ... without gaps",
                         sorted(slots))
    for host, locs in sorted(slots.items()):
        if sorted(locs) != list(range(per)):
            raise InputError(source, f"nodes.host={host}",
                             f"GPUs with local 0..{per - 1} (the same count on every host)",
                             sorted(locs))


def _add_links(g: nx.DiGraph, links: Any, eff: dict[str, float], source: str) -> None:
    if not isinstance(links, list) or not links:
        raise InputError(source, "links", "a non-empty list of links", links)
    for n, item in enumerate(links):
        where = f"links[{n}]"
        if not isinstance(item, dict):
            raise InputError(source, where, "a mapping with src, dst, kind, bandwidth_GBps, latency_us", item)
        extra = set(item) - _LINK_FIELDS
        if extra:
            raise InputError(source, f"{where}.{sorted(extra)[0]}", f"only {sorted(_LINK_FIELDS)}",
                             sorted(extra)[0])
        for key in ("src", "dst", "kind", "bandwidth_GBps", "latency_us"):
            if key not in item:
                raise InputError(source, f"{where}.{key}", "a value (field is required)", None)
        u, v = str(item["src"]), str(item["dst"])
        for key, node in (("src", u), ("dst", v)):
            if node not in g:
                raise InputError(source, f"{where}.{key}", "the id of a node listed in nodes", node)
        if u == v:
            raise InputError(source, f"{where}.dst", "a node other than src", v)
        bw = check_bandwidth(item["bandwidth_GBps"], source, f"{where}.bandwidth_GBps")
        lat = check_latency(item["latency_us"], source, f"{where}.latency_us")
        kind = str(item["kind"])
        e = check_efficiency(item.get("efficiency", eff.get(kind, 1.0)), source,
                             f"{where}.efficiency")
        both = item.get("bidirectional", True)
        if not isinstance(both, bool):
            raise InputError(source, f"{where}.bidirectional", "true or false", both)
        for a, b in ((u, v), (v, u)) if both else ((u, v),):
            if g.has_edge(a, b):
                raise InputError(source, where, "one link per direction between two nodes", f"{a}->{b}")
            g.add_edge(a, b, kind=kind, line_rate_Bps=gbps_to_Bps(bw), efficiency=float(e),
                       bandwidth_Bps=gbps_to_Bps(bw) * e, latency_s=us_to_s(lat))


def build_explicit(data: dict[str, Any], source: str) -> nx.DiGraph:
    """The graph of an explicit-graph YAML mapping; InputError on any bad field."""
    g = nx.DiGraph()
    _add_nodes(g, data.get("nodes"), source)
    _check_gpu_grid(g, source)
    _add_links(g, data.get("links"), _efficiencies(data, source), source)
    return g
