"""Gradient buckets beside the flow-by-flow all-to-alls of a DualPipe(V) chain.

With ``dp_overlap`` a stage's gradient buckets start once every rank holding the stage
has run the last weight-gradient part of the bucket's layer, which in DualPipe is
while the other stage's backward still runs, with its all-to-alls. A bucket's ring
flows leave through the NICs those all-to-alls use, and the exact engine runs both on
one max-min network: the all-to-alls are slower (DeepSeek-V3 cut to 32 GPUs, PP2,
each stage's EP16 over two nodes: a late backward all-to-all takes 5.33-5.60 ms in the
exact engine, 4.9 ms with the NICs to itself) and so is the bucket.

:class:`ChainBuckets` follows the buckets as the chain runs (same cut and order as
:func:`moesim.engine.fast.dual.dual_gradient_phase`: stages highest first, each bucket
over the data-parallel then the expert-data-parallel groups; a rank's buckets one
after the other): a bucket is issued once the weight-gradient parts of its layer have
all run, starts when its group's latest member is ready and its previous bucket has
ended, and lasts its ring time alone (:class:`moesim.engine.fast.dp.RingCost`) plus
what the all-to-alls it met took from it. An all-to-all run flow by flow
(:func:`moesim.engine.fast.flow_a2a.exact_finish`) runs, beside its own flows, the ring
flows of every bucket in flight that touches its hosts, from the bucket's start or the
all-to-all's first arrival, with the bytes the bucket has left (moved at its rate
alone since then); the ring flows' delivery moves the bucket's end (:meth:`Bucket.moved`).
A ring runs as one flow per (member, next member) pair carrying every step's chunk
(the steps are not separated). The gradient phase after the pipeline keeps its own
timing of the buckets (:mod:`moesim.engine.fast.dp`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moesim.collectives.algorithms import ring_orders
from moesim.engine.fast.dp import buckets


@dataclass
class Bucket:
    """One gradient collective of a chain: ring flows ``pairs`` of ``nbytes`` each,
    ``alone`` seconds with the network to itself; ``start``/``end`` set by
    :meth:`ChainBuckets.schedule`; ``slow``: seconds the all-to-alls took from it."""
    group: tuple[int, ...]
    layer: int
    ready: float
    alone: float
    pairs: list[tuple[int, int]]
    hosts: list[tuple[int, int]]     # (host of src, host of dst) per pair
    nbytes: list[float]              # per pair, all steps
    steps: int
    slow: float = 0.0
    start: float = 0.0
    end: float = 0.0
    prev: list = field(default_factory=list)   # the buckets it follows on its ranks

    def ring(self, lo: float) -> tuple[float, int, list]:
        """``(start, steps, flows)`` of what it has left at ``lo`` (or at its start):
        its steps left (the fraction of its time alone still to run), each step's
        flows."""
        t = max(self.start, lo)
        steps = max(1, round(self.steps * min(1.0, (self.end - t) / self.alone)))
        return t, steps, [(x, y, b / self.steps) for (x, y), b
                          in zip(self.pairs, self.nbytes, strict=True)]

    def moved(self, delivered: float) -> None:
        """Its flows run beside an all-to-all were delivered at ``delivered``."""
        self.slow += max(0.0, delivered - self.end)
        self.end = max(self.end, delivered)


class ChainBuckets:
    """The gradient buckets of one DualPipe(V) chain (``groups[pos]``: the ranks of its
    EP group at pipeline position ``pos``), as the chain's weight-gradient parts end."""

    def __init__(self, ctx, groups, order, prior: ChainBuckets | None = None) -> None:
        res = ctx.res
        lay, zero = res.layout, res.scenario.parallel.zero
        self.op = "all_reduce" if zero == 0 else "reduce_scatter"
        self.rings, self.rank_host, self.m = ctx.rings, ctx.rank_host, ctx.m
        mine = {int(r) for g in groups for r in g}
        self.where = {int(r): (p, e) for p, g in enumerate(groups) for e, r in enumerate(g)}
        self.plan: list[tuple[int, list[tuple[tuple[int, ...], float]]]] = []
        for st in range(order.stages - 1, -1, -1):
            holders = sorted({order.rank_of[k][st] for k in range(len(order.rank_of))})
            ranks = [int(r) for h in holders for r in groups[h]]
            for layer, d_b, e_b in buckets(res, st, list(reversed(ctx.chunks[st])),
                                           first=st == 0, last=st == order.stages - 1):
                for kind, nbytes in (("dp", d_b), ("edp", e_b)):
                    colls = []
                    for r in ranks:
                        g = _group(lay, groups, holders, r, kind)
                        if (len(g) > 1 and nbytes > 0 and set(g) <= mine
                                and all(g != x for x, _ in colls)):
                            colls.append((g, nbytes))
                    self.plan.append((layer, colls))
        self.count: dict[int, int] = {}
        self.last: dict[tuple[int, int], np.ndarray] = {}
        self.issued: list[Bucket] = []
        self.nxt = 0
        if prior is not None:     # every bucket issued, at the ready times of a first run
            self.issued = [Bucket(b.group, b.layer, b.ready, b.alone, b.pairs, b.hosts,
                                  b.nbytes, b.steps) for b in prior.issued]
            self.nxt = len(self.plan)
            self.schedule()

    def w_end(self, pos: int, layer: int, t: np.ndarray) -> None:
        """A weight-gradient part of ``layer`` ended at ``t`` (per member) on ``pos``."""
        self.last[(pos, layer)] = np.array(t, dtype=float)
        self.count[layer] = self.count.get(layer, 0) + 1
        if self.count[layer] >= self.m:       # its buckets' ready times, as run now
            for bk in self.issued:
                if bk.layer == layer:
                    bk.ready = self._ready(bk.group, layer)
        while self.nxt < len(self.plan) and self.count.get(self.plan[self.nxt][0], 0) >= self.m:
            layer_n, colls = self.plan[self.nxt]
            for g, nbytes in colls:
                self.issued.append(self._bucket(g, layer_n, nbytes))
            self.nxt += 1
        self.schedule()

    def _bucket(self, g: tuple[int, ...], layer: int, nbytes: float) -> Bucket:
        ready = self._ready(g, layer)
        n = len(g)
        rings = ring_orders(g, self.rank_host)
        steps = 2 * (n - 1) if self.op == "all_reduce" else n - 1
        per: dict[tuple[int, int], int] = {}
        for ring in rings:
            for i, x in enumerate(ring):
                key = (int(x), int(ring[(i + 1) % n]))
                per[key] = per.get(key, 0) + 1
        pairs = list(per)
        c = self.rings.choice(self.op, g, nbytes)   # NCCL's protocol: its flags on the wire
        wire = nbytes if c is None else nbytes / c.bw_efficiency
        chunk = steps * wire / n / len(rings)       # a ring's bytes per pair, all steps
        return Bucket(g, layer, ready, self.rings.time(self.op, g, nbytes), pairs,
                      [(self.rank_host[x], self.rank_host[y]) for x, y in pairs],
                      [chunk * per[p] for p in pairs], steps)

    def _ready(self, g: tuple[int, ...], layer: int) -> float:
        return max(float(self.last[(p, layer)][e]) for p, e in (self.where[r] for r in g))

    def schedule(self) -> None:
        """Starts and ends of the issued buckets: a rank's buckets one after the other."""
        free: dict[int, Bucket] = {}
        for bk in self.issued:
            bk.prev = list({id(p): p for p in (free.get(r) for r in bk.group)
                            if p is not None}.values())
            bk.start = max([bk.ready, *(p.end for p in bk.prev)])
            bk.end = bk.start + bk.alone + bk.slow
            for r in bk.group:
                free[r] = bk

    def beside(self, group: tuple[int, ...], lo: float, hi: float) -> list[Bucket]:
        """The buckets in flight between ``lo`` and ``hi`` whose ring touches the hosts of
        ``group``."""
        hosts = {self.rank_host[r] for r in group}
        return [bk for bk in self.issued if bk.start < hi and bk.end > lo and bk.alone > 0
                and any(hx in hosts or hy in hosts for hx, hy in bk.hosts)]


def _group(lay, groups, holders, r: int, kind: str) -> tuple[int, ...]:
    """The union of ``kind`` groups (``dp`` or ``edp``) of the peers of ``r`` holding the
    stage (positions ``holders``), as :func:`moesim.engine.fast.dual.dual_gradient_phase`."""
    pp_group = lay.group_of(r, "pp")
    g: set[int] = set()
    for h in holders:
        g |= set(lay.group_of(pp_group[h], kind))
    return tuple(sorted(g))
