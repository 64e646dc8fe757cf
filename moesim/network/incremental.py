"""Which flows a change can re-rate, and their re-solve (pure numpy, no simpy): the
exact incremental re-solve of :class:`moesim.network.flow.FlowNetwork`.

Max-min (progressive filling) freezes flows in increasing order of rate. When flows
of rate >= r leave, or flows join that are guaranteed at least r, the filling below
level r is unchanged, so every flow slower than r keeps its rate. The flows that can
change are the new ones plus those at >= r connected to a changed link through links
shared with other such flows; they are re-solved on the capacity the others leave.

The closure is walked from the changed links over a link -> running flows index, so an event
costs work in the links and flows it reaches, not in all (flow, link) pairs.
:func:`solve` is the numpy implementation; :func:`moesim.network.jit_loops.solve` the
compiled one, with the same floating-point operations in the same order.
"""

from __future__ import annotations

import numpy as np

from moesim.network.maxmin import CAP_FLOOR, maxmin_pairs

#: flows within this relative margin of the change threshold are candidates too
THRESHOLD_MARGIN = 1e-6

#: a re-solved rate counts as changed (``stats``) when it moved by more than this, relative
CHANGE_RTOL = 1e-12

#: when at least this fraction of the running flows are candidates, re-solve them all
#: (exact too; finding the affected subset would cost more than it saves)
FULL_FRACTION = 0.9

#: on the compiled path, when at least this fraction of the running flows are candidates,
#: re-solve every candidate on the capacity the slower flows leave (one pass over the
#: pairs) instead of walking the closure (measured on skewed all-to-alls, docs/network.md)
CANDIDATE_FRACTION = 0.1


def ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(starts[i], ends[i])`` over i (int64)."""
    lens = ends - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offs = np.repeat(starts - (np.cumsum(lens) - lens), lens)
    return offs + np.arange(total, dtype=np.int64)


def link_index(pf: np.ndarray, pl: np.ndarray, alive: np.ndarray,
               n_links: int) -> tuple[np.ndarray, np.ndarray]:
    """(lptr, lslot): the running flows crossing link l are ``lslot[lptr[l]:lptr[l+1]]``,
    in slot order (flows that finish later stay listed; they are not ``alive``)."""
    keep = alive[pf]
    pl = pl[keep]
    lptr = np.zeros(n_links + 1, dtype=np.int64)
    np.cumsum(np.bincount(pl, minlength=n_links), out=lptr[1:])
    return lptr, pf[keep][np.argsort(pl, kind="stable")]


def solve(now: float, pstart: np.ndarray, pf: np.ndarray, pl: np.ndarray, lptr: np.ndarray | None,
          lidx: np.ndarray | None, cap: np.ndarray, alive: np.ndarray, rate: np.ndarray,
          rem: np.ndarray, tref: np.ndarray, tfin: np.ndarray, lcnt: np.ndarray,
          done: np.ndarray, first_new: int, r_done: float, n_alive: int,
          whole: bool, stats: np.ndarray | None = None) -> np.ndarray:
    """Re-rate after slots ``done`` finished and alive slots ``first_new:`` started;
    updates rate, rem, tref and tfin of the re-rated slots and returns them (sorted).

    Flow slot s crosses links ``pl[pstart[s]:pstart[s+1]]`` (pairs in slot order,
    ``pf`` the slot of each pair); ``lcnt``: running flows per link; ``whole``:
    re-solve every running flow, else only those the change can affect (the
    link -> flows index ``lptr``/``lidx`` of :func:`link_index` is then needed);
    ``stats``: counters to add to (``moesim.network.slots.COUNTERS``)."""
    if stats is None:
        stats = np.zeros(10, dtype=np.int64)
    n = len(alive)
    cap_used = cap
    if not whole:
        is_new = np.zeros(n, dtype=bool)
        is_new[first_new:] = alive[first_new:]
        new = np.flatnonzero(is_new)
        threshold = r_done
        if len(new):   # a new flow gets at least min over its links of capacity / flows there
            nl = pl[ranges(pstart[new], pstart[new + 1])]
            threshold = min(threshold, float(np.min(cap[nl] / lcnt[nl])))
        cand = alive & (rate >= threshold * (1.0 - THRESHOLD_MARGIN))
        cand |= is_new
        if np.count_nonzero(cand) >= FULL_FRACTION * n_alive:
            whole = True
        else:
            start = np.concatenate((done, new))
            seen = np.zeros(len(cap), dtype=bool)
            frontier = np.unique(pl[ranges(pstart[start], pstart[start + 1])])
            seen[frontier] = True
            hit = np.zeros(n, dtype=bool)
            while frontier.size:   # breadth-first over links shared by candidates
                fl = lidx[ranges(lptr[frontier], lptr[frontier + 1])]
                fl = np.unique(fl[cand[fl] & ~hit[fl]])
                if not fl.size:
                    break
                hit[fl] = True
                ln = pl[ranges(pstart[fl], pstart[fl + 1])]
                frontier = np.unique(ln[~seen[ln]])
                seen[frontier] = True
            idx = np.flatnonzero(hit)
            links = np.flatnonzero(seen)
            lens = lptr[links + 1] - lptr[links]
            stats[5] += len(links)
            stats[6] += 2 * int(lens.sum())
            fs = lidx[ranges(lptr[links], lptr[links + 1])]
            # the capacity the others leave, summed in slot (= pair) order per link
            load = np.bincount(np.repeat(links, lens), weights=np.where(hit[fs], 0.0, rate[fs]),
                               minlength=len(cap))
            cap_used = np.maximum(cap - load, cap * CAP_FLOOR)
    if whole:
        idx = np.flatnonzero(alive)
        stats[8] += 1
    sub = ranges(pstart[idx], pstart[idx + 1])
    got = maxmin_pairs(pf[sub], pl[sub], n, cap_used, stats=stats)[idx]
    old = rate[idx]
    stats[:3] += (1, len(idx), len(sub))
    stats[7] += int(np.count_nonzero(np.abs(got - old) > CHANGE_RTOL * np.maximum(got, old)))
    r = rem[idx] - rate[idx] * (now - tref[idx])
    rem[idx] = r
    tref[idx] = now
    rate[idx] = got
    tfin[idx] = now + r / got   # got > 0: every used link has capacity > 0
    return idx
