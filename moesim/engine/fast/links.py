"""Bytes carried by every link on the fast path (pure: no simpy).

The fast path times its transfers in closed form but knows every flow it charges:
the byte matrices of the EP all-to-alls, the pipeline sends, the TP all-reduces and
the gradient/ZeRO ring collectives. :class:`LinkBytes` adds each flow's bytes to
every link of its routed path (``topo.route``, the path the fast path times it on),
so ``result.links.bytes`` holds the step's per-link traffic as the exact engine's
flow network counts it. With identical replicas, a representative's all-to-alls,
sends and TP all-reduces are counted again between its mirrors (their flows cross
other links); collectives whose groups hold the mirrors already are counted once.

Units: bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moesim.collectives.algorithms import expand


class LinkBytes:
    """Per-link byte counters over ``topo`` for ranks mapped to ``gpus``. ``mirrors``:
    representative rank -> the ranks it stands for (identical replicas), or None.
    ``enabled`` False ignores every call (a chain run again only for its spans)."""

    def __init__(self, topo, gpus: Sequence[str], rank_host: Sequence[int],
                 mirrors: dict[int, tuple[int, ...]] | None = None) -> None:
        self.topo = topo
        self.gpus = list(gpus)
        self.rank_host = list(rank_host)
        self.mirrors = mirrors or {}
        self.bytes = np.zeros(len(topo.link_names))
        self.enabled = True
        self._pairs: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._per_byte: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def _copies(self, group: Sequence[int]) -> list[tuple[int, ...]]:
        """``group`` and, with identical replicas, the same group in every mirror."""
        group = tuple(int(r) for r in group)
        ms = [self.mirrors.get(r, ()) for r in group]
        n = min((len(m) for m in ms), default=0)
        return [group, *(tuple(m[e] for m in ms) for e in range(n))]

    def _pair_links(self, group: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(flat pair index i*n+j, link id) of every hop of every ordered pair."""
        hit = self._pairs.get(group)
        if hit is None:
            n = len(group)
            pair, link = [], []
            for i, a in enumerate(group):
                for j, b in enumerate(group):
                    if i != j:
                        path = self.topo.route(self.gpus[a], self.gpus[b])
                        pair += [i * n + j] * len(path)
                        link += list(path)
            hit = self._pairs[group] = (np.asarray(pair, dtype=np.int64),
                                        np.asarray(link, dtype=np.int64))
        return hit

    def a2a(self, group: Sequence[int], matrix: np.ndarray, algo: str = "direct") -> None:
        """A direct all-to-all-v (``matrix[i, j]`` bytes from member i to j), or its
        phased form (``algo`` hierarchical) expanded as the exact engine expands it."""
        if not self.enabled:
            return
        m = np.asarray(matrix, dtype=float)
        for g in self._copies(group):
            if algo == "direct":
                pair, link = self._pair_links(g)
                if len(pair):
                    self.bytes += np.bincount(link, weights=m.ravel()[pair],
                                              minlength=len(self.bytes))
            else:
                for ph in expand("all_to_all_v", g, 0.0, algo=algo, matrix=m,
                                 rank_host=self.rank_host):
                    for s, d, b in ph:
                        self._add(s, d, b)

    def p2p(self, src: int, dst: int, nbytes: float) -> None:
        """One send (pipeline activations or gradients), and its mirrors' copies."""
        if not self.enabled:
            return
        for s, d in self._copies((src, dst)):
            self._add(s, d, nbytes)

    def collective(self, op: str, group: Sequence[int], nbytes: float,
                   algo: str | None = None, mirrored: bool = False) -> None:
        """A ring/tree collective of ``nbytes`` on ``group`` (flows as ``expand`` makes
        them; bytes scale linearly, so one expansion per (op, group, algo) serves every
        size). ``mirrored``: count it again in every mirror group (TP all-reduces)."""
        if not self.enabled or nbytes <= 0 or len(group) < 2:
            return
        for g in self._copies(group) if mirrored else [tuple(int(r) for r in group)]:
            key = (op, g, algo)
            hit = self._per_byte.get(key)
            if hit is None:
                acc = np.zeros(len(self.bytes))
                for ph in expand(op, g, 1.0, algo=algo, rank_host=self.rank_host):
                    for s, d, b in ph:
                        for lk in self.topo.route(self.gpus[s], self.gpus[d]):
                            acc[lk] += b
                nz = np.flatnonzero(acc)
                hit = self._per_byte[key] = (nz, acc[nz])
            self.bytes[hit[0]] += hit[1] * nbytes

    def _add(self, src: int, dst: int, nbytes: float) -> None:
        if nbytes > 0:
            for lk in self.topo.route(self.gpus[src], self.gpus[dst]):
                self.bytes[lk] += nbytes
