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
above its capacity.
"""

from __future__ import annotations

import numpy as np

#: links whose fair share is within this relative tolerance of the minimum share
#: saturate in the same round (merges levels that differ only by rounding).
SAT_RTOL = 1e-9


def maxmin_pairs(
    pair_flow: np.ndarray,
    pair_link: np.ndarray,
    n_flows: int,
    capacity_Bps: np.ndarray,
) -> np.ndarray:
    """Max-min fair rate (bytes/s) of each flow, from (flow, link) incidence pairs.

    ``pair_flow[k]`` crosses ``pair_link[k]``; a flow must not list a link twice.
    Pairs sorted by flow are used as they are (else sorted here). A flow with no
    pair (src == dst) gets rate ``inf``. ``capacity_Bps`` is indexed by link id
    and must be > 0 for every link used.
    """
    cap = np.asarray(capacity_Bps, dtype=float)
    po = np.asarray(pair_flow, dtype=np.int64)   # original flow id per pair
    pl = np.asarray(pair_link, dtype=np.int64)
    rates = np.full(n_flows, np.inf)
    if po.size == 0:
        return rates
    if np.any(po[1:] < po[:-1]):
        order = np.argsort(po, kind="stable")
        po, pl = po[order], pl[order]
    if np.any(cap[pl] <= 0):
        raise ValueError("every link a flow crosses needs capacity_Bps > 0")
    n_links = cap.shape[0]
    frozen_load = np.zeros(n_links)
    share = np.empty(n_links)
    nbr = np.empty(n_links)
    while po.size:
        new_flow = np.empty(po.size, dtype=bool)
        new_flow[0] = True
        np.not_equal(po[1:], po[:-1], out=new_flow[1:])
        starts = np.flatnonzero(new_flow)
        seg_len = np.diff(np.append(starts, po.size))
        cnt = np.bincount(pl, minlength=n_links)
        share.fill(np.inf)
        used = cnt > 0
        share[used] = np.maximum(cap[used] - frozen_load[used], 0.0) / cnt[used]
        flow_min = np.minimum.reduceat(share[pl], starts)
        flow_min_p = np.repeat(flow_min, seg_len)
        nbr.fill(np.inf)
        np.minimum.at(nbr, pl, flow_min_p)
        bottleneck = share <= nbr * (1.0 + SAT_RTOL)
        frozen = np.logical_or.reduceat(bottleneck[pl], starts)
        rates[po[starts[frozen]]] = flow_min[frozen]
        frozen_p = np.repeat(frozen, seg_len)
        frozen_load += np.bincount(pl[frozen_p], weights=flow_min_p[frozen_p], minlength=n_links)
        keep = ~frozen_p
        po, pl = po[keep], pl[keep]
    return rates


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
