"""Routing rules: which directed links a transfer from src to dst crosses.

Rules (``ROUTINGS``):

* ``shortest`` -- fewest hops; among those, the widest bottleneck (highest
  ``bandwidth_Bps`` of the path's slowest link: NVLink before PCIe when both take
  two hops), then least total latency; remaining ties go to the lowest link id at
  each hop (deterministic).
* ``ecmp`` -- the same set of equal-cost paths (same hops, same latency); at each
  node with several equal-cost next hops, pick one by ``zlib.crc32`` of
  ``"src>dst#key@node"`` (stable across runs and machines, unlike ``hash``).
* ``rail`` -- NCCL PXN style: traffic from local GPU i to a GPU with local index
  j != i on another host first goes inside the source host to its local GPU j,
  then from there (same rail) to the destination; the rest is ``ecmp``. The relay
  is skipped when its two legs would share a node (e.g. GPUs and NICs under one
  PCIe switch: the relay would only add a loop), giving the ``ecmp`` route.

GPUs are endpoints, not forwarders: a path may start or end at a GPU but never
passes through one (unless a topology sets ``gpu_transit``); the relay GPU of
``rail`` is the one deliberate exception.

:class:`GraphRouter` works on any graph (a lexicographic (hops, latency) Dijkstra
per destination, run lazily and cached). :class:`ClusterRouter` computes the same
paths from the structure of :func:`moesim.topology.builders.build_cluster`
(NVSwitch or no intra-host links, one NIC per GPU) without any search, for
a hundred thousand GPUs: leaf, spine and (with pods) core tiers, ECMP at the leaf among
its pod's spines and at the spine among its plane's cores. Tests check that both give
identical routes.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Hashable

import networkx as nx

from moesim.topology.builders import ClusterIndex

ROUTINGS = ("shortest", "ecmp", "rail")


def ecmp_pick(n: int, label: str, at: str) -> int:
    """Index of the chosen candidate among ``n`` equal-cost next hops at node ``at``."""
    if n <= 1:
        return 0
    return zlib.crc32(f"{label}@{at}".encode()) % n


def _label(src: str, dst: str, key: int) -> str:
    return f"{src}>{dst}#{key}"


class GraphRouter:
    """Routes on an arbitrary graph; edge attr ``id`` and ``latency_s`` required."""

    def __init__(self, graph: nx.DiGraph, policy: str, gpu_transit: bool = False) -> None:
        if policy not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, got {policy!r}")
        self.policy = policy
        self._names: list[str] = list(graph.nodes)
        self._idx = {n: i for i, n in enumerate(self._names)}
        kinds = [graph.nodes[n]["kind"] for n in self._names]
        self._forwards = [gpu_transit or k != "gpu" for k in kinds]
        n = len(self._names)
        self._out: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        self._in: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self._bw: dict[int, float] = {}
        for u, v, d in graph.edges(data=True):
            self._bw[d["id"]] = float(d.get("bandwidth_Bps", 0.0))
            ps = round(d["latency_s"] * 1e12)  # integer picoseconds: exact sums
            self._out[self._idx[u]].append((d["id"], self._idx[v], ps))
            self._in[self._idx[v]].append((self._idx[u], ps))
        for row in self._out:
            row.sort()
        self._out_node = {lid: v for row in self._out for lid, v, _ in row}  # link -> head
        self._gpu_at: dict[tuple[int, int], str] = {}
        self._host_local: dict[str, tuple[int, int]] = {}
        for name, k in zip(self._names, kinds, strict=True):
            if k == "gpu":
                hl = (graph.nodes[name]["host"], graph.nodes[name]["local"])
                self._gpu_at[hl] = name
                self._host_local[name] = hl
        self._trees: dict[int, tuple[list[int], list[int]]] = {}
        self._wide: dict[int, tuple[list[float], list[int]]] = {}

    def _tree(self, d: int) -> tuple[list[int], list[int]]:
        """(hops, latency_ps) from every node to ``d``; hops -1 when unreachable."""
        tree = self._trees.get(d)
        if tree is not None:
            return tree
        n = len(self._names)
        hops, lat = [-1] * n, [0] * n
        best: dict[int, tuple[int, int]] = {d: (0, 0)}
        heap = [(0, 0, d)]
        while heap:
            h, ps, u = heapq.heappop(heap)
            if hops[u] >= 0:
                continue
            hops[u], lat[u] = h, ps
            if u != d and not self._forwards[u]:
                continue  # a GPU can start a path towards d but not relay one
            for w, wps in self._in[u]:
                cand = (h + 1, ps + wps)
                if hops[w] < 0 and cand < best.get(w, (1 << 62, 0)):
                    best[w] = cand
                    heapq.heappush(heap, (cand[0], cand[1], w))
        self._trees[d] = (hops, lat)
        return hops, lat

    def _widest(self, d: int) -> tuple[list[float], list[int]]:
        """Over the fewest-hop paths to ``d``: the widest bottleneck (bytes/s) from every
        node, and the least latency (ps) among the widest (layer by layer in hops)."""
        hit = self._wide.get(d)
        if hit is not None:
            return hit
        hops, _ = self._tree(d)
        n = len(self._names)
        width, lat = [0.0] * n, [0] * n
        width[d] = float("inf")
        for u in sorted((u for u in range(n) if hops[u] > 0), key=lambda u: hops[u]):
            best = (-1.0, 0)
            for lid, v, ps in self._out[u]:
                if hops[v] == hops[u] - 1 and (v == d or self._forwards[v]):
                    cand = (min(self._bw[lid], width[v]), -(lat[v] + ps))
                    if cand > best:
                        best = cand
            width[u], lat[u] = best[0], -best[1]
        hit = self._wide[d] = (width, lat)
        return hit

    def _walk(self, src: str, dst: str, label: str, ecmp: bool) -> list[int]:
        s, d = self._idx[src], self._idx[dst]
        hops, lat = self._tree(d)
        if hops[s] < 0:
            raise ValueError(f"no path from {src} to {dst}")
        path: list[int] = []
        u = s
        if not ecmp and self.policy == "shortest":
            width, wlat = self._widest(d)
            while u != d:
                lid, u = next((lid, v) for lid, v, ps in self._out[u]
                              if hops[v] == hops[u] - 1 and (v == d or self._forwards[v])
                              and min(self._bw[lid], width[v]) == width[u]
                              and wlat[v] + ps == wlat[u])
                path.append(lid)
            return path
        while u != d:
            cands = [(lid, v) for lid, v, ps in self._out[u]
                     if hops[v] == hops[u] - 1 and lat[v] + ps == lat[u]
                     and (v == d or self._forwards[v])]
            lid, u = cands[ecmp_pick(len(cands), label, self._names[u]) if ecmp else 0]
            path.append(lid)
        return path

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        if src == dst:
            return ()
        label = _label(src, dst, key)
        if self.policy == "rail":
            a, b = self._host_local.get(src), self._host_local.get(dst)
            if a and b and a[0] != b[0] and a[1] != b[1]:
                relay = self._gpu_at.get((a[0], b[1]))
                if relay is not None:
                    first = self._walk(src, relay, label, True)
                    second = self._walk(relay, dst, label, True)
                    seen = {self._idx[src]} | {self._out_node[lid] for lid in first}
                    if not any(self._out_node[lid] in seen for lid in second):
                        return tuple(first + second)  # loop-free relay only
        return tuple(self._walk(src, dst, label, self.policy != "shortest"))


class ClusterRouter:
    """Structural routes of a ``build_cluster`` graph (intra nvswitch or none, NICs on
    GPUs: one per GPU, or shared by consecutive GPUs with ``nics_per_node``; rail
    relays only where the source's NIC is not the destination's rail). Falls back to
    ``GraphRouter`` for any other endpoint pair."""

    def __init__(self, graph: nx.DiGraph, index: ClusterIndex, policy: str,
                 link_id: dict[tuple[str, str], int]) -> None:
        spec = index.spec
        assert spec.intra in ("nvswitch", "none") and spec.nic_attach == "gpu"
        self.policy = policy
        self._graph = graph
        self._fallback: GraphRouter | None = None
        self._ix = index
        self._pos = {name: (h, i) for h, row in enumerate(index.gpu) for i, name in enumerate(row)}
        lid = link_id
        self._up = [[lid[(g, index.nvswitch[h])] for g in row] if index.nvswitch[h] else []
                    for h, row in enumerate(index.gpu)]
        self._down = [[lid[(index.nvswitch[h], g)] for g in row] if index.nvswitch[h] else []
                      for h, row in enumerate(index.gpu)]
        self._nic = [spec.nic_of(i) for i in range(spec.gpus_per_node)]   # GPU -> its NIC
        self._g2n = [[lid[(g, index.nic[h][self._nic[i]])] for i, g in enumerate(row)]
                     for h, row in enumerate(index.gpu)] if spec.has_fabric else []
        self._n2g = [[lid[(index.nic[h][self._nic[i]], g)] for i, g in enumerate(row)]
                     for h, row in enumerate(index.gpu)] if spec.has_fabric else []
        self._n2l = [[lid[(nic, index.leaf[index.leaf_of(h, k)])] for k, nic in enumerate(nics)]
                     for h, nics in enumerate(index.nic)]
        self._l2n = [[lid[(index.leaf[index.leaf_of(h, k)], nic)] for k, nic in enumerate(nics)]
                     for h, nics in enumerate(index.nic)]
        spp, cpp = spec.spines_per_pod, spec.cores_per_plane
        self._spp, self._cpp = spp, cpp
        pod = [index.pod_of_leaf(i) for i in range(len(index.leaf))]
        first: list[int] = []  # pod -> its first leaf (a pod's leaves are consecutive)
        for i, p in enumerate(pod):
            if p == len(first):
                first.append(i)
        ends = first[1:] + [len(pod)]
        self._pod, self._first = pod, first
        # leaf -> the spines of its pod; spine (pod * spp + k) -> the leaves of its pod
        self._l2s = [[lid[(leaf, sp)] for sp in index.spine[pod[i] * spp:(pod[i] + 1) * spp]]
                     for i, leaf in enumerate(index.leaf)]
        self._s2l = [[lid[(sp, leaf)] for leaf in index.leaf[first[j // spp]:ends[j // spp]]]
                     for j, sp in enumerate(index.spine)] if spp else []
        # spine -> the cores of its plane; core (k * cpp + m) -> spine k of every pod
        self._s2c = [[lid[(sp, c)] for c in index.core[(j % spp) * cpp:(j % spp + 1) * cpp]]
                     for j, sp in enumerate(index.spine)] if cpp else []
        self._c2s = [[lid[(c, index.spine[p * spp + ci // cpp])] for p in range(spec.n_pods)]
                     for ci, c in enumerate(index.core)] if cpp else []
        self._leaf = [[index.leaf_of(h, k) for k in range(len(nics))]
                      for h, nics in enumerate(index.nic)]
        self._nvswitch = spec.intra == "nvswitch"
        self._rail, self._ecmp = policy == "rail", policy != "shortest"
        # "@node" of each ECMP choice point, as ecmp_pick appends it to the label
        self._leaf_at = [f"@{name}".encode() for name in index.leaf]
        self._spine_at = [f"@{name}".encode() for name in index.spine]

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        """GPU -> (NVSwitch -> relay GPU ->) NIC -> leaf (-> spine (-> core -> spine)
        -> leaf) -> NIC -> GPU, by table lookups; ECMP hashes ``src>dst#key`` once and
        extends the CRC with ``@node`` at each choice (= ``ecmp_pick``)."""
        if src == dst:
            return ()
        ps, pd = self._pos.get(src), self._pos.get(dst)
        if ps is None or pd is None:
            if self._fallback is None:
                self._fallback = GraphRouter(self._graph, self.policy)
            return self._fallback.route(src, dst, key)
        a, i = ps
        b, j = pd
        ka, kb = self._nic[i], self._nic[j]
        head: tuple[int, ...] = ()
        if a == b:
            if self._nvswitch:
                return (self._up[a][i], self._down[a][j])
            if ka == kb:             # GPUs sharing a NIC (no NVSwitch): through the NIC
                return (self._g2n[a][i], self._n2g[b][j])
        elif self._rail and ka != kb and self._nvswitch:
            # PXN: over NVSwitch to the local GPU on the destination's rail (without
            # NVSwitch the relay leg would end on the relay's own NIC: a loop, skipped)
            head = (self._up[a][i], self._down[a][j])
            i, ka = j, kb
        la, lb = self._leaf[a][ka], self._leaf[b][kb]
        ends = (self._l2n[b][kb], self._n2g[b][j])
        if la == lb:
            return (*head, self._g2n[a][i], self._n2l[a][ka], *ends)
        spp, cpp = self._spp, self._cpp
        base = zlib.crc32(_label(src, dst, key).encode()) if self._ecmp else 0
        k = zlib.crc32(self._leaf_at[la], base) % spp if self._ecmp and spp > 1 else 0
        pa, pb = self._pod[la], self._pod[lb]
        sa = pa * spp + k
        down = lb - self._first[pb]
        if pa == pb:
            return (*head, self._g2n[a][i], self._n2l[a][ka], self._l2s[la][k],
                    self._s2l[sa][down], *ends)
        # up to a core of plane k, down through spine k of the other pod
        m = zlib.crc32(self._spine_at[sa], base) % cpp if self._ecmp and cpp > 1 else 0
        return (*head, self._g2n[a][i], self._n2l[a][ka], self._l2s[la][k], self._s2c[sa][m],
                self._c2s[k * cpp + m][pb], self._s2l[pb * spp + k][down], *ends)


def find_unreachable(graph: nx.DiGraph, gpus: list[str], gpu_transit: bool) -> tuple[str, str] | None:
    """A GPU pair (src, dst) with no path under the no-GPU-transit rule, or None.

    Reachability between strongly connected components of the forwarding nodes,
    as bitsets: O(nodes + links) plus one check per distinct (out, in) signature.
    """
    fwd = graph if gpu_transit else graph.subgraph(
        [n for n, k in graph.nodes(data="kind") if k != "gpu"])
    comp: dict[Hashable, int] = {}
    sccs = list(nx.strongly_connected_components(fwd))
    for c, members in enumerate(sccs):
        for n in members:
            comp[n] = c
    cond = nx.condensation(fwd, sccs)
    reach = [0] * len(sccs)
    for c in reversed(list(nx.topological_sort(cond))):
        bits = 1 << c
        for nxt in cond.successors(c):
            bits |= reach[nxt]
        reach[c] = bits

    def out_bits(gpu: str) -> int:
        if gpu_transit:
            return reach[comp[gpu]]
        bits = 0
        for v in graph.successors(gpu):
            if v in comp:
                bits |= reach[comp[v]]
        return bits

    def in_bits(gpu: str) -> int:
        if gpu_transit:
            return 1 << comp[gpu]
        bits = 0
        for w in graph.predecessors(gpu):
            if w in comp:
                bits |= 1 << comp[w]
        return bits

    outs = {g: out_bits(g) for g in gpus}
    ins = {g: in_bits(g) for g in gpus}
    by_out: dict[int, list[str]] = {}
    by_in: dict[int, list[str]] = {}
    for g in gpus:
        by_out.setdefault(outs[g], []).append(g)
        by_in.setdefault(ins[g], []).append(g)
    for ob, srcs in by_out.items():
        for ib, dsts in by_in.items():
            if ob & ib:
                continue
            for s in srcs:  # no path through the fabric: only a direct link helps
                for d in dsts:
                    if s != d and not graph.has_edge(s, d):
                        return s, d
    return None
