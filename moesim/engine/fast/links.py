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

from moesim.collectives.algorithms import expand, ring_repeats


class LinkBytes:
    """Per-link byte counters over ``topo`` for ranks mapped to ``gpus``. ``mirrors``:
    representative rank -> the ranks it stands for (identical replicas), or None.
    ``enabled`` False ignores every call (a chain run again only for its spans)."""

    def __init__(self, topo, gpus: Sequence[str], rank_host: Sequence[int],
                 mirrors: dict[int, tuple[int, ...]] | None = None, nccl=None) -> None:
        self.topo = topo
        self.nccl = nccl      # NCCL's choice (overlap.nccl_tuning): LL/LL128 move more bytes
        self.gpus = list(gpus)
        self.rank_host = list(rank_host)
        self.mirrors = mirrors or {}
        self._bytes = np.zeros(len(topo.link_names))
        self.enabled = True
        self._pairs: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        self._per_byte: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._copy_of: dict[tuple, list[tuple[int, ...]]] = {}
        # Direct all-to-all matrices (per group) and sends (per pair) are summed and put
        # on the links when the counters are read: while every count is a whole number
        # of bytes and all of them together stay below 2**53, float64 sums are exact in
        # any order, so the counters come out bit for bit as if added call by call.
        self._pending: dict[tuple[int, ...], np.ndarray] = {}
        self._whole_total = 0.0     # bytes held back so far (this run of held sums)
        self._runs = 0              # runs of held sums put on the links at 2**53 bytes
        self._sends: dict[tuple, float] = {}     # pipeline sends, likewise
        self._send_paths: dict[tuple, tuple[list, int]] = {}
        self._send_links: dict[tuple, np.ndarray] = {}   # sends added at once: their links
        self._fractional = False    # a count with a fraction of a byte was added

    @property
    def bytes(self) -> np.ndarray:
        """Bytes per link id so far."""
        self._flush()
        return self._bytes

    def _flush(self) -> None:
        for g, m in self._pending.items():
            for c in self._copy_of[g]:
                self._add_matrix(c, m)
        self._pending.clear()
        for key, b in self._sends.items():
            for path in self._send_paths[key][0]:
                for lk in path:
                    self._bytes[lk] += b
        self._sends.clear()

    def restart(self) -> None:
        """Forget every count (the routes and paths stay): a chain run in another
        process counts from zero, and :meth:`merge` adds its :meth:`export` here."""
        self._bytes = np.zeros(len(self._bytes))
        self._pending, self._sends = {}, {}
        self._whole_total, self._fractional, self._runs = 0.0, False, 0

    def export(self) -> dict | None:
        """The counts since :meth:`restart`, while every one was a whole number of bytes
        held back (None otherwise: they cannot be merged exactly)."""
        if self._fractional or self._bytes.any():
            return None
        return {"pending": [(g, m, self._copy_of[g]) for g, m in self._pending.items()],
                "sends": [(k, b, self._send_paths[k]) for k, b in self._sends.items()],
                "total": self._whole_total}

    def merge(self, part: dict | None) -> bool:
        """Add another counter's :meth:`export` as if its calls had been made here, after
        this counter's own: exact while both hold only whole bytes below 2**53 in all
        (every sum is then exact in any order). False, adding nothing, otherwise."""
        if (part is None or self._fractional or self._runs
                or self._whole_total + part["total"] >= _EXACT_SUM):
            return False
        for g, m, copies in part["pending"]:
            self._copy_of.setdefault(g, copies)
            acc = self._pending.get(g)
            if acc is None:
                self._pending[g] = m.copy()
            else:
                acc += m
        for key, b, paths in part["sends"]:
            self._send_paths.setdefault(key, paths)
            self._sends[key] = self._sends.get(key, 0.0) + b
        self._whole_total += part["total"]
        return True

    def _copies(self, group: Sequence[int]) -> list[tuple[int, ...]]:
        """``group`` and, with identical replicas, the same group in every mirror."""
        key = group if isinstance(group, tuple) else tuple(group)
        hit = self._copy_of.get(key)
        if hit is None:
            g = tuple(int(r) for r in group)
            ms = [self.mirrors.get(r, ()) for r in g]
            n = min((len(m) for m in ms), default=0)
            hit = self._copy_of[key] = [g, *(tuple(m[e] for m in ms) for e in range(n))]
        return hit

    def _pair_links(self, group: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(flat pair index i*n+j, position of its link in ``links``, ``links``: the
        distinct link ids) of every hop of every ordered pair."""
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
            ids, local = np.unique(np.asarray(link, dtype=np.int64), return_inverse=True)
            hit = self._pairs[group] = (np.asarray(pair, dtype=np.int64),
                                        local.ravel().astype(np.int64), ids)
        return hit

    def _add_matrix(self, group: tuple[int, ...], m: np.ndarray) -> None:
        """Add all-to-all matrix ``m`` of ``group`` onto its links: per link the sum of
        its hops' bytes in hop order, then added to the link's count (as a bincount over
        every link would, touching only the group's links)."""
        pair, local, ids = self._pair_links(group)
        if len(pair):
            self._bytes[ids] += np.bincount(local, weights=m.ravel()[pair], minlength=len(ids))

    def a2a(self, group: Sequence[int], matrix: np.ndarray, algo: str = "direct") -> None:
        """A direct all-to-all-v (``matrix[i, j]`` bytes from member i to j), or its
        phased form (``algo`` hierarchical) expanded as the exact engine expands it."""
        if not self.enabled:
            return
        m = np.asarray(matrix, dtype=float)
        copies = self._copies(group)
        if algo == "direct" and self._defer(m, len(copies)):
            acc = self._pending.get(copies[0])
            if acc is None:
                self._copy_of.setdefault(copies[0], copies)
                self._pending[copies[0]] = m.copy()
            elif acc.shape == m.shape:
                acc += m
            else:
                raise ValueError(f"all-to-all matrix {m.shape} for a group of {len(acc)}")
            return
        self._flush()
        for g in copies:
            if algo == "direct":
                self._add_matrix(g, m)
            else:
                self._fractional = True
                for ph in expand("all_to_all_v", g, 0.0, algo=algo, matrix=m,
                                 rank_host=self.rank_host):
                    for s, d, b in ph:
                        self._add(s, d, b)

    def _defer(self, m: np.ndarray, copies: int) -> bool:
        """Whether ``m`` (counted ``copies`` times) may wait in ``_pending``: whole
        non-negative bytes, nothing fractional counted before, room in the run of held
        sums (:meth:`_room`). Otherwise the pending sums go onto the links first, and the
        caller adds ``m`` at once."""
        if (not self._fractional and m.size and m.min() >= 0
                and np.array_equal(m, np.trunc(m)) and self._room(float(m.sum()) * copies)):
            return True
        self._flush()
        self._fractional = True    # from here on every call adds at once
        return False

    def _room(self, nbytes: float) -> bool:
        """Whether ``nbytes`` more whole bytes may be held back: while all held bytes
        stay below 2**53 (every sum exact in any order); past that, what is held goes
        onto the links and a new run of held sums starts (beyond 2**53 bytes no order of
        adds is exact; adding call by call would cost a pass per mirror and call)."""
        if self._whole_total + nbytes < _EXACT_SUM:
            self._whole_total += nbytes
            return True
        if nbytes >= _EXACT_SUM:
            return False
        self._flush()
        self._runs += 1
        self._whole_total = nbytes
        return True

    def _summed_send(self, key: tuple, pairs, nbytes: float) -> bool:
        """Whole-byte sends are summed per ``key`` until read, their paths (of the
        (src, dst) GPU ``pairs()``) routed once per key; False when they must be added
        now instead (fractional bytes, or the exact-sum bound reached)."""
        if not (nbytes > 0 and not self._fractional and nbytes == int(nbytes)):
            return False
        hit = self._send_paths.get(key)
        if hit is None:
            paths = [self.topo.route(self.gpus[s], self.gpus[d]) for s, d in pairs()]
            hit = self._send_paths[key] = (paths, sum(len(p) for p in paths))
        if not self._room(nbytes * hit[1]):
            return False
        self._sends[key] = self._sends.get(key, 0.0) + nbytes
        return True

    def p2p(self, src: int, dst: int, nbytes: float) -> None:
        """One send (pipeline activations or gradients), and its mirrors' copies."""
        if not self.enabled:
            return
        key = (src, dst)
        if self._summed_send(key, lambda: self._copies(key), nbytes):
            return
        for s, d in self._copies(key):
            self._add(s, d, nbytes)

    def sends(self, src: Sequence[int], dst: Sequence[int], nbytes: float) -> None:
        """The sends src[e] -> dst[e] of ``nbytes`` each (one pipeline message per
        position), as :meth:`p2p` counts them one by one."""
        if not self.enabled:
            return
        key = (tuple(src), tuple(dst))
        pairs = lambda: [c for x, y in zip(*key, strict=True)  # noqa: E731
                         for c in self._copies((x, y))]
        if self._summed_send(key, pairs, nbytes):
            return
        if nbytes > 0:     # every pair's (and mirror's) path, in order: as p2p one by one
            hit = self._send_links.get(key)
            if hit is None:
                hit = self._send_links[key] = np.asarray(
                    [lk for s, d in pairs() for lk in self.topo.route(self.gpus[s],
                                                                      self.gpus[d])],
                    dtype=np.int64)
            if not self._fractional:
                self._flush()
                self._fractional = True
            np.add.at(self._bytes, hit, nbytes)     # unbuffered: each add in turn

    def collective(self, op: str, group: Sequence[int], nbytes: float,
                   algo: str | None = None, mirrored: bool = False) -> None:
        """A ring/tree collective of ``nbytes`` on ``group`` (flows as ``expand`` makes
        them; bytes scale linearly, so one expansion per (op, group, algo) serves every
        size). ``mirrored``: count it again in every mirror group (TP all-reduces)."""
        if not self.enabled or nbytes <= 0 or len(group) < 2:
            return
        if self.nccl is not None and algo is None:   # the protocol's flags on the wire
            c = self.nccl.for_group(op, tuple(group), nbytes, self.rank_host)
            nbytes = nbytes if c is None else nbytes / c.bw_efficiency
        for g in self._copies(group) if mirrored else [tuple(int(r) for r in group)]:
            key = (op, g, algo)
            hit = self._per_byte.get(key)
            if hit is None:
                hit = self._per_byte[key] = self._ring_per_byte(op, g, algo)
            self._flush()
            self._fractional = True
            self._bytes[hit[0]] += hit[1] * nbytes

    def _ring_per_byte(self, op: str, g: tuple[int, ...], algo: str | None
                       ) -> tuple[np.ndarray, np.ndarray]:
        """(link ids, bytes per byte of the collective) of ``op`` on ``g``: the sum, in
        ``expand``'s order, of every phase's flows on every link of their paths. A ring
        repeats one phase: it is routed once and added ``steps`` times, each link's
        increments in their order (the same floating-point sums as phase by phase)."""
        rep = ring_repeats(op, g, 1.0, algo, self.rank_host)
        if rep is None:
            acc = np.zeros(len(self._bytes))
            for ph in expand(op, g, 1.0, algo=algo, rank_host=self.rank_host):
                for s, d, b in ph:
                    for lk in self.topo.route(self.gpus[s], self.gpus[d]):
                        acc[lk] += b
            nz = np.flatnonzero(acc)
            return nz, acc[nz]
        phase, steps = rep
        lks: list[int] = []
        vals: list[float] = []
        for s, d, b in phase:
            path = self.topo.route(self.gpus[s], self.gpus[d])
            lks += path
            vals += [b] * len(path)
        if not lks:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        ids, col = np.unique(np.asarray(lks, dtype=np.int64), return_inverse=True)
        col = col.ravel()
        occ = np.zeros(len(col), dtype=np.int64)     # k-th increment of its link
        seen: dict[int, int] = {}
        for i, c in enumerate(col.tolist()):
            occ[i] = seen.get(c, 0)
            seen[c] = occ[i] + 1
        rows = np.zeros((int(occ.max()) + 1, len(ids)))
        rows[occ, col] = vals
        acc = np.zeros(len(ids))
        for _ in range(steps):
            for row in rows:
                acc += row
        keep = acc != 0
        return ids[keep], acc[keep]

    def _add(self, src: int, dst: int, nbytes: float) -> None:
        if nbytes > 0:
            path = self.topo.route(self.gpus[src], self.gpus[dst])
            total = self._whole_total + nbytes * len(path)
            if not self._fractional and (nbytes != int(nbytes) or total >= _EXACT_SUM):
                self._flush()      # (once fractional, nothing is pending any more)
                self._fractional = True
            self._whole_total = total
            for lk in path:
                self._bytes[lk] += nbytes


#: float64 adds whole numbers exactly, in any order, while every sum stays below this
_EXACT_SUM = 2.0 ** 53
