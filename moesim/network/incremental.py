"""Which flows a change can re-rate (pure numpy, no simpy): the exact incremental
re-solve of :class:`moesim.network.flow.FlowNetwork`.

Max-min (progressive filling) freezes flows in increasing order of rate. When flows
of rate >= r leave, or flows join that are guaranteed at least r, the filling below
level r is unchanged, so every flow slower than r keeps its rate. The flows that can
change are the new ones plus those at >= r connected to a changed link through links
shared with other such flows; they are re-solved on the capacity the others leave.
"""

from __future__ import annotations

import numpy as np

#: flows within this relative margin of the change threshold are candidates too
THRESHOLD_MARGIN = 1e-6

#: when at least this fraction of the running flows are candidates, re-solve them all
#: (exact too; finding the affected subset would cost more than it saves)
FULL_FRACTION = 0.9

#: candidate (flow, link) pairs up to which the closure is walked in plain Python
SMALL_CLOSURE = 256


def affected_flows(pf: np.ndarray, pl: np.ndarray, capacity_Bps: np.ndarray, alive: np.ndarray,
               rate: np.ndarray, changed: np.ndarray, r_done: float,
               new: np.ndarray) -> np.ndarray | None:
    """Flows whose rate may change (bool per flow slot; None: re-solve all); all others
    keep their rate. ``pf``/``pl``: (flow, link) pairs (finished flows' may be there:
    they are not ``alive``); ``rate``: current rates; ``changed``: links freed by the
    flows that finished (updated in place); ``r_done``: the smallest rate among those
    (inf if none); ``new``: flows that start now.

    Max-min freezes flows in increasing order of rate, and a change at rate r
    (a flow of rate r leaving, or a flow joining that will get at least r) leaves
    the rounds below r untouched: flows slower than r keep their rates. The
    affected flows are the new ones plus those at >= r reachable from the
    changed links through links shared with other such flows.
    """
    threshold = r_done
    if new.any():
        # a new flow gets at least min over its links of capacity / flows there
        on_new = new[pf]
        cnt = np.bincount(pl, weights=alive[pf], minlength=len(capacity_Bps))
        lb = float(np.min(capacity_Bps[pl[on_new]] / cnt[pl[on_new]]))
        threshold = min(threshold, lb)
        changed[pl[on_new]] = True
    cand = (alive & (rate >= threshold * (1.0 - THRESHOLD_MARGIN))) | new
    if np.count_nonzero(cand) >= FULL_FRACTION * np.count_nonzero(alive):
        return None
    cand_p = cand[pf]
    f, ln = pf[cand_p], pl[cand_p]
    affected = new.copy()
    if f.size <= SMALL_CLOSURE:   # same closure, walked in plain Python
        flow_links: dict[int, list[int]] = {}
        link_flows: dict[int, list[int]] = {}
        for fi, li in zip(f.tolist(), ln.tolist(), strict=True):
            flow_links.setdefault(fi, []).append(li)
            link_flows.setdefault(li, []).append(fi)
        stack = [li for li in link_flows if changed[li]]
        seen = set(stack)
        hit = set()
        while stack:
            for fi in link_flows[stack.pop()]:
                if fi not in hit:
                    hit.add(fi)
                    for li in flow_links[fi]:
                        if li not in seen:
                            seen.add(li)
                            stack.append(li)
        affected[list(hit)] = True
        return affected
    while f.size:   # the same closure, vectorized
        on = changed[ln]
        if not on.any():
            break
        affected[f[on]] = True
        take = affected[f]
        changed[ln[take]] = True     # every link of an affected flow is changed
        keep = ~take
        f, ln = f[keep], ln[keep]
    return affected
