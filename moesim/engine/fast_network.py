"""Closed-form, contention-aware times of collectives for the fast path (pure: no simpy).

A phase of flows is charged the *link bound*: every link carries the bytes of the
phase's flows routed over it, a flow is done when the most loaded link on its path
has drained at that link's capacity (``bytes on link / capacity``), plus its path's
latency. A rank is done with a phase when all flows it sends or receives are done.
With equal flows on one link this is exactly max-min sharing (each gets 1/k of the
link, all finish together); with uneven flows it is the time the busiest link needs,
which the flow-level engine reaches when that link stays saturated (measured against
it in tests/test_fast_path.py and docs/fast-path.md).

Units: seconds, bytes, bytes/s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moesim.collectives.algorithms import expand


class _Incidence:
    """Routes of every ordered pair of a group, as flat (pair, link) arrays."""

    def __init__(self, topo, gpus: Sequence[str], group: Sequence[int]) -> None:
        n = len(group)
        pair_of: list[int] = []
        link_of: list[int] = []
        lat = np.zeros(n * n)
        lat_all = topo.latency_s
        for i, a in enumerate(group):
            for j, b in enumerate(group):
                if i == j:
                    continue
                path = topo.route(gpus[a], gpus[b])
                p = i * n + j
                pair_of.extend([p] * len(path))
                link_of.extend(path)
                lat[p] = float(lat_all[list(path)].sum()) if path else 0.0
        links, local = np.unique(np.asarray(link_of, dtype=np.int64), return_inverse=True)
        self.n = n
        self.pair = np.asarray(pair_of, dtype=np.int64)
        self.link = local.astype(np.int64)
        self.cap = np.asarray(topo.capacity_Bps, dtype=float)[links]
        self.lat = lat
        self.n_links = len(links)
        # (n*n, hops) local link ids, padded with n_links (a slot that is never busy)
        hops = np.bincount(self.pair, minlength=n * n)
        pad = np.full((n * n, max(int(hops.max(initial=0)), 1)), self.n_links, dtype=np.int64)
        col = np.arange(len(self.pair)) - np.repeat(np.cumsum(hops) - hops, hops)
        pad[self.pair, col] = self.link
        self.pad_t = np.ascontiguousarray(pad.T).astype(np.intp)   # (hops, n*n)

    def finish(self, matrix: np.ndarray, arrivals: np.ndarray, k_max: int = 6) -> np.ndarray:
        """Per member: when all its flows are done, flow i→j starting at
        max(arrival_i, arrival_j). Each link drains like a work-conserving queue:
        it is done at max over start thresholds τ of τ + (bytes of its flows starting
        at or after τ) / capacity (``k_max`` thresholds: the distinct starts, or that
        many quantiles of them including the first and the last); a flow is done when
        the links of its path are, plus its path latency."""
        n = self.n
        flat = np.asarray(matrix, dtype=float).ravel()
        a = np.asarray(arrivals, dtype=float)
        start = np.maximum(a[:, None], a[None, :]).ravel()
        live = flat > 0
        if not live.any():
            return a.copy()
        taus = np.unique(a)                 # every start max(a_i, a_j) is an arrival
        taus = taus[taus >= start[live].min()]
        if len(taus) > k_max:
            taus = taus[np.unique(np.linspace(0, len(taus) - 1, k_max).round().astype(int))]
        w = np.where(start[None, :] >= taus[:, None], flat[None, :], 0.0)   # (K, n*n)
        load = np.stack([np.bincount(self.link, weights=wk[self.pair], minlength=self.n_links)
                         for wk in w], axis=1)                               # (links, K)
        drain = np.where(load > 0, taus[None, :] + load / self.cap[:, None], -np.inf)
        f_link = np.append(drain.max(axis=1), -np.inf)
        f_pair = f_link.take(self.pad_t[0])
        for row in self.pad_t[1:]:      # max over the hops of each pair's path
            np.maximum(f_pair, f_link.take(row), out=f_pair)
        f_pair = np.maximum(f_pair, start) + self.lat
        f_pair = np.where(live, f_pair, -np.inf).reshape(n, n)
        end = np.maximum(f_pair.max(axis=1), f_pair.max(axis=0))
        return np.maximum(end, a)

    def pair_times(self, matrix: np.ndarray) -> np.ndarray:
        """(n, n) seconds until flow i→j is done under the link bound (0: no flow)."""
        flat = np.asarray(matrix, dtype=float).ravel()
        load = np.bincount(self.link, weights=flat[self.pair], minlength=self.n_links)
        t_link = load / self.cap
        t_pair = np.zeros(self.n * self.n)
        np.maximum.at(t_pair, self.pair, t_link[self.link])
        out = np.where(flat > 0, t_pair + self.lat, 0.0)
        return out.reshape(self.n, self.n)


class FastNetwork:
    """Link-bound times over ``topo`` (a :class:`moesim.topology.Topology`) for ranks
    mapped to ``gpus``; incidences and collective times are memoized per group."""

    def __init__(self, topo, gpus: Sequence[str], rank_host: Sequence[int]) -> None:
        self.topo = topo
        self.gpus = list(gpus)
        self.rank_host = list(rank_host)
        self._inc: dict[tuple[int, ...], _Incidence] = {}
        self._coll: dict[tuple, float] = {}
        self._p2p: dict[tuple[int, int], tuple[float, float]] = {}

    def incidence(self, group: Sequence[int]) -> _Incidence:
        key = tuple(int(r) for r in group)
        inc = self._inc.get(key)
        if inc is None:
            inc = self._inc[key] = _Incidence(self.topo, self.gpus, key)
        return inc

    def a2a_rank_times(self, group: Sequence[int], matrix: np.ndarray) -> np.ndarray:
        """Per member (group order): seconds from a common start until all of its
        sends and receives of a direct all-to-all-v with ``matrix`` are done."""
        t = self.incidence(group).pair_times(matrix)
        return np.maximum(t.max(axis=1), t.max(axis=0))

    def a2a_finish(self, group: Sequence[int], matrix: np.ndarray,
                   arrivals: np.ndarray) -> np.ndarray:
        """Per member: end of a direct all-to-all-v whose members arrive at ``arrivals``
        (see :meth:`_Incidence.finish`)."""
        return self.incidence(group).finish(matrix, arrivals)

    def phases_time(self, phases) -> float:
        """Seconds of phases run one after the other, each charged its link bound."""
        total = 0.0
        topo, gpus = self.topo, self.gpus
        cap, lat_all = np.asarray(topo.capacity_Bps, float), topo.latency_s
        seen: dict[tuple, float] = {}
        for ph in phases:
            sig = tuple(ph)
            hit = seen.get(sig)
            if hit is None:
                load: dict[int, float] = {}
                paths = []
                for s, d, b in ph:
                    path = topo.route(gpus[s], gpus[d])
                    paths.append((path, b))
                    for lk in path:
                        load[lk] = load.get(lk, 0.0) + b
                hit = 0.0
                for path, _b in paths:
                    if path:
                        t = max(load[lk] / cap[lk] for lk in path)
                        hit = max(hit, t + float(lat_all[list(path)].sum()))
                seen[sig] = hit
            total += hit
        return total

    def collective_time(self, op: str, group: Sequence[int], nbytes: float,
                        algo: str | None = None, matrix: np.ndarray | None = None) -> float:
        """Seconds of a phased collective (ring/tree/hierarchical) started together."""
        key = (op, tuple(group), float(nbytes), algo)
        hit = self._coll.get(key) if matrix is None else None
        if hit is None:
            hit = self.phases_time(expand(op, group, nbytes, algo=algo, matrix=matrix,
                                          rank_host=self.rank_host))
            if matrix is None:
                self._coll[key] = hit
        return hit

    def p2p_time(self, src: int, dst: int, nbytes: float) -> float:
        """One flow alone on its path: latency + bytes / bottleneck capacity."""
        hit = self._p2p.get((src, dst))
        if hit is None:
            path = list(self.topo.route(self.gpus[src], self.gpus[dst]))
            if not path:
                hit = (0.0, np.inf)
            else:
                hit = (float(self.topo.latency_s[path].sum()),
                       float(np.asarray(self.topo.capacity_Bps, float)[path].min()))
            self._p2p[(src, dst)] = hit
        return 0.0 if not np.isfinite(hit[1]) else hit[0] + nbytes / hit[1]
