"""Max-min fair rates by progressive filling (pure numpy, no simpy).

Every flow crosses a set of links; each link has a capacity in bytes/s. Max-min
fairness (the allocation SimGrid uses for its flow-level model) raises every
unfrozen flow's rate at the same pace until some link is full; the flows on a
full link are frozen at that level, and filling goes on with the rest.

Instead of stepping level by level, each round freezes every link that is a
*local* bottleneck: its fair share ``(capacity - frozen load) / active flows`` is
no larger than the share of any link that one of its flows also crosses. During
progressive filling a link's share never decreases (flows frozen elsewhere leave
it at least their share), so such a link saturates at exactly its current share
and all its flows freeze there. The global minimum is always a local one, so
every round makes progress, and the result equals level-by-level filling. A
round is a handful of vectorized passes over the (flow, link) pairs; the number
of rounds is the length of the longest chain of dependent bottlenecks, usually
far below the number of distinct rates.

Links whose share is within a relative :data:`SAT_RTOL` of their neighbourhood's
minimum count as local bottlenecks (merges shares that differ only by rounding);
a flow is frozen at the smallest share on its path, so no link is ever loaded
above its capacity (up to :data:`CAP_FLOOR` of it, the floor that keeps rounding from
giving a flow rate 0).

Problems of at most :data:`SMALL_PAIRS` pairs run the same rounds in plain Python
(numpy's per-call overhead dominates there), with the same floating-point operations
in the same order: the rates are bit-identical (tested). With numba installed every
problem runs the same rounds compiled (:func:`moesim.network.jit_loops.maxmin_segments`,
bit-identical too; :mod:`moesim.network.jit` chooses).
"""

from __future__ import annotations

import numpy as np

from moesim.network import jit

#: links whose fair share is within this relative tolerance of the minimum share
#: saturate in the same round (merges levels that differ only by rounding).
SAT_RTOL = 1e-9

#: a link's capacity left for its unfrozen flows is floored at this fraction of its
#: capacity, so rounding (frozen load a hair above capacity) never gives a flow rate 0
#: (it would never finish); a link may then carry 1e-12 of its capacity too much
CAP_FLOOR = 1e-12

#: problems with at most this many (flow, link) pairs are solved by the same rounds in
#: plain Python (numpy's per-call overhead dominates there); the result is bit-identical
SMALL_PAIRS = 40

#: problems with more pairs than this load the compiled rounds (numba) if not loaded yet
JIT_PAIRS = 20000


_CAP_MSG = "every link a flow crosses needs capacity_Bps > 0"


def maxmin_pairs(
    pair_flow: np.ndarray,
    pair_link: np.ndarray,
    n_flows: int,
    capacity_Bps: np.ndarray,
    *,
    stats: np.ndarray | None = None,
) -> np.ndarray:
    """Max-min fair rate (bytes/s) of each flow, from (flow, link) incidence pairs.

    ``pair_flow[k]`` crosses ``pair_link[k]``; a flow must not list a link twice.
    Pairs sorted by flow are used as they are (else sorted here). A flow with no
    pair (src == dst) gets rate ``inf``. ``capacity_Bps`` is indexed by link id
    and must be > 0 for every link used. ``stats`` (int64, optional): the rounds and
    the pairs they passed over are added to ``stats[3]`` and ``stats[4]``.
    """
    if stats is None:
        stats = np.zeros(5, dtype=np.int64)
    cap = np.asarray(capacity_Bps, dtype=float)
    po = np.asarray(pair_flow, dtype=np.int64)   # original flow id per pair
    pl = np.asarray(pair_link, dtype=np.int64)
    rates = np.full(n_flows, np.inf)
    if po.size == 0:
        return rates
    # compiled once loaded (a large flow network loads it) or for a large problem
    kern = jit.kernels(load=po.size > JIT_PAIRS)
    if po.size <= SMALL_PAIRS and kern is None:
        stats[3:5] += _maxmin_small(po.tolist(), pl.tolist(), cap, rates)
        return rates
    if np.any(po[1:] < po[:-1]):
        order = np.argsort(po, kind="stable")
        po, pl = po[order], pl[order]
    if np.any(cap[pl] <= 0):
        raise ValueError(_CAP_MSG)
    if kern is not None:
        _maxmin_compiled(kern, po, pl, cap, rates, stats)
        return rates
    n_links = cap.shape[0]
    frozen_load = np.zeros(n_links)
    share = np.empty(n_links)
    new_flow = np.empty(po.size, dtype=bool)   # pairs are sorted by flow: one segment each
    new_flow[0] = True
    np.not_equal(po[1:], po[:-1], out=new_flow[1:])
    starts = np.flatnonzero(new_flow)
    seg_len = np.diff(np.append(starts, po.size))
    flow_ids = po[starts]
    while pl.size:
        stats[3:5] += (1, pl.size)
        cnt = np.bincount(pl, minlength=n_links)
        share.fill(np.inf)
        used = cnt > 0
        share[used] = np.maximum(cap[used] - frozen_load[used], cap[used] * CAP_FLOOR) / cnt[used]
        share_p = share[pl]
        flow_min = np.minimum.reduceat(share_p, starts)
        flow_min_p = np.repeat(flow_min, seg_len)
        # a link is a local bottleneck when its share is (within SAT_RTOL) the smallest
        # share on the path of every flow crossing it
        not_bottleneck = np.zeros(n_links, dtype=bool)
        not_bottleneck[pl[share_p > flow_min_p * (1.0 + SAT_RTOL)]] = True
        frozen = np.logical_or.reduceat(~not_bottleneck[pl], starts)
        rates[flow_ids[frozen]] = flow_min[frozen]
        frozen_p = np.repeat(frozen, seg_len)
        frozen_load += np.bincount(pl[frozen_p], weights=flow_min_p[frozen_p], minlength=n_links)
        keep = ~frozen
        flow_ids, seg_len = flow_ids[keep], seg_len[keep]
        pl = pl[~frozen_p]
        starts = np.cumsum(seg_len) - seg_len
    return rates


def _maxmin_compiled(kern, po: np.ndarray, pl: np.ndarray, cap: np.ndarray,
                     rates: np.ndarray, stats: np.ndarray) -> None:
    """The rounds of :func:`maxmin_pairs` compiled, on pairs sorted by flow; writes ``rates``."""
    starts = np.flatnonzero(np.concatenate(([True], po[1:] != po[:-1])))
    ends = np.append(starts[1:], po.size)
    out = np.empty(len(starts))
    n = len(cap)
    kern.maxmin_segments(starts, ends, pl, cap, out, CAP_FLOOR, 1.0 + SAT_RTOL,
                         np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n),
                         np.zeros(n, dtype=bool), np.zeros(n), stats)
    rates[po[starts]] = out


def _maxmin_small(po: list[int], pl: list[int], cap: np.ndarray,
                  rates: np.ndarray) -> tuple[int, int]:
    """The rounds of :func:`maxmin_pairs` in plain Python, with the same floating-point
    operations in the same order (so the same rates to the last bit); writes ``rates``,
    returns (rounds, pairs the rounds passed over)."""
    flows: dict[int, list[int]] = {}
    pairs = zip(po, pl, strict=True)
    if any(a > b for a, b in zip(po, po[1:], strict=False)):   # same order as the stable sort by flow
        pairs = sorted(pairs, key=lambda p: p[0])
    for f, link in pairs:
        flows.setdefault(f, []).append(link)
    used = sorted(set(pl))
    capv = dict(zip(used, cap[used].tolist(), strict=True))
    if not all(c > 0 for c in capv.values()):
        raise ValueError(_CAP_MSG)
    frozen_load = dict.fromkeys(used, 0.0)
    active = list(flows.items())
    inf = float("inf")
    rounds = round_pairs = 0
    while active:
        rounds += 1
        round_pairs += sum(len(links) for _, links in active)
        cnt: dict[int, int] = {}
        for _, links in active:
            for link in links:
                cnt[link] = cnt.get(link, 0) + 1
        share = {link: max(capv[link] - frozen_load[link], capv[link] * CAP_FLOOR) / c
                 for link, c in cnt.items()}
        fmin = [min(share[link] for link in links) for _, links in active]
        nbr: dict[int, float] = {}
        for (_, links), m in zip(active, fmin, strict=True):
            for link in links:
                if m < nbr.get(link, inf):
                    nbr[link] = m
        bottleneck = {link for link, s in share.items() if s <= nbr.get(link, inf) * (1.0 + SAT_RTOL)}
        added: dict[int, float] = {}
        rest = []
        for (f, links), m in zip(active, fmin, strict=True):
            if any(link in bottleneck for link in links):
                rates[f] = m
                for link in links:
                    added[link] = added.get(link, 0.0) + m
            else:
                rest.append((f, links))
        for link, w in added.items():
            frozen_load[link] += w
        active = rest
    return rounds, round_pairs


def maxmin_rates(indptr: np.ndarray, indices: np.ndarray, capacity_Bps: np.ndarray) -> np.ndarray:
    """Max-min fair rate (bytes/s) per flow from a CSR flow->links incidence.

    Flow ``f`` crosses links ``indices[indptr[f]:indptr[f+1]]``. A flow with no
    links gets rate ``inf``.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    n_flows = indptr.shape[0] - 1
    pair_flow = np.repeat(np.arange(n_flows, dtype=np.int64), np.diff(indptr))
    return maxmin_pairs(pair_flow, np.asarray(indices, dtype=np.int64), n_flows, capacity_Bps)


def link_load(indptr: np.ndarray, indices: np.ndarray, rates: np.ndarray, n_links: int) -> np.ndarray:
    """Sum of the (finite) rates of the flows crossing each link, bytes/s."""
    indptr = np.asarray(indptr, dtype=np.int64)
    pair_flow = np.repeat(np.arange(indptr.shape[0] - 1), np.diff(indptr))
    return np.bincount(np.asarray(indices, dtype=np.int64), weights=np.asarray(rates)[pair_flow],
                       minlength=n_links)
