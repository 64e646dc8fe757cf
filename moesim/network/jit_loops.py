"""numba-compiled inner loops of the flow model (loaded by :mod:`moesim.network.jit`).

* :func:`maxmin_segments` = :func:`moesim.network.maxmin.maxmin_pairs` (progressive
  filling by rounds of local bottlenecks) on flows given as pair ranges, loop by loop
  the floating-point operations of the numpy rounds in the same order: the same bits;
* :func:`moesim.network.levels.maxmin_levels`: the same allocation by bottleneck levels
  (a heap of link shares; each pair frozen once instead of once per round): the flow
  network's solver on this path, equal to the rounds up to rounding (tests: within
  1e-12 relative);
* :func:`solve` = one re-rate of :class:`moesim.network.flow.FlowNetwork`: the choice
  between a whole and an incremental re-solve; when at least ``full_fraction`` of the
  running flows are candidates (rate >= the change's threshold, or new), every
  candidate re-solved on the capacity the slower flows leave (one pass over the pairs);
  else the affected closure walked from the changed links over a link -> flows index
  (only the links and flows it reaches) and the capacity the unaffected flows leave on
  those links (summed in pair order, as ``np.bincount`` does); then the max-min levels
  and the per-flow state update. The numpy path (:mod:`moesim.network.incremental`)
  re-solves the closure by rounds: the same rates up to rounding;
* :func:`link_index`, :func:`due` and :func:`earliest`: the link -> running flows
  index (a stable counting sort), the flows due to finish, and the next finish time;
* :func:`add`: new flows into their slots and pairs (the bookkeeping of
  :meth:`moesim.network.slots.Slots.add`).

Workspace arrays (per link or per flow slot) are passed in zeroed and left zeroed, so
a call costs work in what it touches, not in the size of the network.
Imports only :mod:`moesim.network.levels` (the constants come in as arguments): no
import cycle.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moesim.network.levels import count_links, fair_share, maxmin_levels


@njit(cache=True, nogil=True)
def maxmin_segments(seg_start, seg_end, pl, cap, out, cap_floor, sat_fac,
                    cnt, share, frozen, bad, added, stats):
    """Max-min rate of flow i crossing links ``pl[seg_start[i]:seg_end[i]]``, into
    ``out[i]``; flows in the order numpy's solver sees them (sorted by flow id).
    ``cnt`` (int), ``share``, ``frozen``, ``added`` (float), ``bad`` (bool): per-link
    workspaces, zero on entry and on return. Adds the rounds and the pairs they passed
    over to ``stats[3]`` and ``stats[4]``."""
    nf = seg_start.shape[0]
    act = np.arange(nf)
    fmin = np.empty(nf)
    n_pairs = 0
    for i in range(nf):
        n_pairs += seg_end[i] - seg_start[i]
    used = np.empty(n_pairs, dtype=np.int64)
    n_act = nf
    while n_act > 0:
        stats[3] += 1
        n_used, pairs = count_links(act, n_act, seg_start, seg_end, pl, cnt, used)
        stats[4] += pairs
        for u in range(n_used):
            lk = used[u]
            share[lk] = fair_share(cap[lk], frozen[lk], cap_floor, cnt[lk])
        for a in range(n_act):
            i = act[a]
            m = np.inf
            for k in range(seg_start[i], seg_end[i]):
                s = share[pl[k]]
                if s < m:
                    m = s
            fmin[a] = m
            lim = m * sat_fac
            for k in range(seg_start[i], seg_end[i]):
                if share[pl[k]] > lim:
                    bad[pl[k]] = True
        n_keep = 0
        for a in range(n_act):
            i = act[a]
            m = fmin[a]
            frz = False
            for k in range(seg_start[i], seg_end[i]):
                if not bad[pl[k]]:
                    frz = True
                    break
            if frz:
                out[i] = m
                for k in range(seg_start[i], seg_end[i]):
                    added[pl[k]] += m
            else:
                act[n_keep] = i
                n_keep += 1
        for u in range(n_used):
            lk = used[u]
            frozen[lk] += added[lk]
            added[lk] = 0.0
            cnt[lk] = 0
            bad[lk] = False
        n_act = n_keep
    for i in range(nf):
        for k in range(seg_start[i], seg_end[i]):
            frozen[pl[k]] = 0.0


@njit(cache=True, nogil=True)
def link_index(pf, pl, alive, lptr, lslot):
    """The link -> running flows index, in place: the running flows crossing link l
    become lslot[lptr[l]:lptr[l+1]], in slot order (a stable counting sort of the running
    flows' pairs; ``lptr`` has one entry per link plus one, ``lslot`` room for every
    pair); returns how many entries of ``lslot`` it filled."""
    n_links = lptr.shape[0] - 1
    lptr[:] = 0
    m = 0
    for k in range(pl.shape[0]):
        if alive[pf[k]]:
            lptr[pl[k] + 1] += 1
            m += 1
    for lk in range(n_links):
        lptr[lk + 1] += lptr[lk]
    fill = lptr[:-1].copy()
    for k in range(pl.shape[0]):
        if alive[pf[k]]:
            lk = pl[k]
            lslot[fill[lk]] = pf[k]
            fill[lk] += 1
    return m


@njit(cache=True, nogil=True)
def add(f, group, alive, pstart, pf, pl, lcnt, counts, plats, nroute, links, lens, sizes,
        gids, first, p0, now):
    """:meth:`moesim.network.slots.Slots.add` compiled, on buffers already large enough:
    flow i (slot ``first + i``) of ``sizes[i]`` bytes, group ``gids[i]``, route latency
    ``plats[i]`` and ``nroute[i]`` route links is solved over the next ``lens[i]`` of
    ``links``; its pairs go from ``p0`` on."""
    k = p0
    for i in range(lens.shape[0]):
        s = first + i
        f[0, s] = sizes[i]
        f[1, s] = now
        f[2, s] = 0.0
        f[3, s] = np.inf
        f[4, s] = sizes[i]
        f[6, s] = now
        f[5, s] = plats[i]
        f[7, s] = nroute[i]
        counts[4] += nroute[i]
        group[s] = gids[i]
        alive[s] = True
        k1 = k + lens[i]
        for q in range(k, k1):
            lk = links[q - p0]
            pf[q] = s
            pl[q] = lk
            lcnt[lk] += 1
        k = k1
        pstart[s + 1] = k1
    counts[0] += lens.shape[0]
    counts[1] += k - p0
    counts[2] = 0


@njit(cache=True, nogil=True)
def due(tfin, start, first, now, tol, rtol):
    """Slots < ``first`` whose predicted finish is within ``tol`` of ``now`` (with
    ``rtol`` > 0 also those whose time left is within rtol x their age)."""
    out = np.empty(first, dtype=np.int64)
    n = 0
    if rtol > 0:
        for s in range(first):
            if tfin[s] - now <= tol + rtol * (now - start[s]):
                out[n] = s
                n += 1
    else:
        lim = now + tol
        for s in range(first):
            if tfin[s] <= lim:
                out[n] = s
                n += 1
    return out[:n]


@njit(cache=True, nogil=True)
def earliest(tfin):
    """min(tfin) (inf when empty)."""
    m = np.inf
    for s in range(tfin.shape[0]):
        if tfin[s] < m:
            m = tfin[s]
    return m


@njit(cache=True, nogil=True)
def solve(now, pstart, pf, pl, lptr, lidx, cap, alive, rate, rem, tref, tfin, lcnt,
          done, first_new, r_done, n_alive, whole, full_fraction, margin, cap_floor,
          change_rtol, hit, seen, res, cnt, frozen, stats):
    """Re-rate after slots ``done`` finished and alive slots ``first_new:`` started.

    ``whole``: re-solve every running flow (else the incremental rule decides, with
    ``margin`` as in :mod:`moesim.network.incremental` and ``full_fraction`` its
    ``CANDIDATE_FRACTION``: at or above it, every candidate is re-solved). Updates
    rate, rem, tref and tfin of the re-rated slots and returns them (sorted). Adds to
    ``stats`` what it did (the counters of :mod:`moesim.network.slots`)."""
    n = alive.shape[0]
    aff = np.empty(0, dtype=np.int64)
    links = np.empty(0, dtype=np.int64)
    if not whole:
        threshold = r_done
        has_new = False
        for s in range(first_new, n):
            if alive[s]:
                has_new = True
                for k in range(pstart[s], pstart[s + 1]):
                    lb = cap[pl[k]] / lcnt[pl[k]]
                    if lb < threshold:
                        threshold = lb
        thr = threshold * (1.0 - margin)
        n_cand = 0
        for s in range(first_new):
            if alive[s] and rate[s] >= thr:
                n_cand += 1
        for s in range(first_new, n):
            if alive[s]:
                n_cand += 1
        if n_cand >= full_fraction * n_alive:
            # every candidate (rate >= thr, or new) re-solved, on the capacity the slower
            # flows leave: exact by the same rule, and one pass over the pairs instead of
            # a closure walk over most of them
            aff = np.empty(n_cand, dtype=np.int64)
            m = 0
            for s in range(n):
                if not alive[s]:
                    continue
                if s >= first_new or rate[s] >= thr:
                    aff[m] = s
                    m += 1
                else:
                    for k in range(pstart[s], pstart[s + 1]):
                        frozen[pl[k]] += rate[s]
            stats[9] += 1
        else:
            stack = np.empty(16, dtype=np.int64)
            n_stack = 0
            seen_l = np.empty(16, dtype=np.int64)
            n_seen = 0
            for j in range(done.shape[0] + (n - first_new if has_new else 0)):
                s = done[j] if j < done.shape[0] else first_new + j - done.shape[0]
                if j >= done.shape[0] and not alive[s]:
                    continue
                for k in range(pstart[s], pstart[s + 1]):
                    lk = pl[k]
                    if not seen[lk]:
                        seen[lk] = True
                        if n_seen == seen_l.shape[0]:
                            seen_l = np.concatenate((seen_l, np.empty(n_seen, dtype=np.int64)))
                            stack = np.concatenate((stack, np.empty(n_seen, dtype=np.int64)))
                        seen_l[n_seen] = lk
                        n_seen += 1
                        stack[n_stack] = lk
                        n_stack += 1
            hits = np.empty(16, dtype=np.int64)
            n_hit = 0
            while n_stack > 0:
                n_stack -= 1
                lk = stack[n_stack]
                for q in range(lptr[lk], lptr[lk + 1]):
                    s = lidx[q]
                    if hit[s] or not alive[s] or (s < first_new and rate[s] < thr):
                        continue
                    hit[s] = True
                    if n_hit == hits.shape[0]:
                        hits = np.concatenate((hits, np.empty(n_hit, dtype=np.int64)))
                    hits[n_hit] = s
                    n_hit += 1
                    for k in range(pstart[s], pstart[s + 1]):
                        l2 = pl[k]
                        if not seen[l2]:
                            seen[l2] = True
                            if n_seen == seen_l.shape[0]:
                                seen_l = np.concatenate((seen_l, np.empty(n_seen, dtype=np.int64)))
                                stack = np.concatenate((stack, np.empty(n_seen, dtype=np.int64)))
                            seen_l[n_seen] = l2
                            n_seen += 1
                            stack[n_stack] = l2
                            n_stack += 1
            aff = np.sort(hits[:n_hit])
            links = seen_l[:n_seen]
            stats[5] += n_seen
            for u in range(n_seen):
                stats[6] += 2 * (lptr[links[u] + 1] - lptr[links[u]])
            # capacity the unaffected flows leave, summed in pair order (np.bincount's)
            for u in range(n_seen):
                lk = links[u]
                load = 0.0
                for q in range(lptr[lk], lptr[lk + 1]):
                    s = lidx[q]
                    if not hit[s]:
                        load += rate[s]
                c = cap[lk]
                x = c - load
                y = c * cap_floor
                res[lk] = x if x >= y else y
            for u in range(n_hit):
                hit[aff[u]] = False
            for u in range(n_seen):
                seen[links[u]] = False
    elif whole:
        m = 0
        for s in range(n):
            if alive[s]:
                m += 1
        aff = np.empty(m, dtype=np.int64)
        m = 0
        for s in range(n):
            if alive[s]:
                aff[m] = s
                m += 1
        stats[8] += 1
    got = np.empty(aff.shape[0])
    if links.shape[0] > 0:   # closure: on the residual capacity
        maxmin_levels(pstart[aff], pstart[aff + 1], pl, res, got, cap_floor, cnt, frozen, stats)
    else:   # whole, or candidates with the slower flows' load already in ``frozen``
        maxmin_levels(pstart[aff], pstart[aff + 1], pl, cap, got, cap_floor, cnt, frozen, stats)
        if not whole:
            frozen[:] = 0.0
    for u in range(links.shape[0]):
        res[links[u]] = 0.0
    stats[0] += 1
    stats[1] += aff.shape[0]
    for u in range(aff.shape[0]):
        s = aff[u]
        stats[2] += pstart[s + 1] - pstart[s]
        if abs(got[u] - rate[s]) > change_rtol * max(got[u], rate[s]):
            stats[7] += 1
        r = rem[s] - rate[s] * (now - tref[s])
        rem[s] = r
        tref[s] = now
        rate[s] = got[u]
        tfin[s] = now + r / got[u]
    return aff


@njit(cache=True, nogil=True)
def step(now, first_new, tol, n, n_pairs, f, alive, pstart, pf, pl, lptr, lidx, cap, lcnt,
         counts, params, stats, hit, done_out, cnt, wf, seen):
    """One event of :class:`moesim.network.slots.Slots` (its ``_step_numpy``, compiled)
    on slots ``:n`` and pairs ``:n_pairs`` of the buffers: writes the finished slots (due,
    then zero-byte new) into ``done_out`` and returns (how many finished, how many were
    due, rates re-solved or -1, next finish time).

    ``counts``: running flows, their pairs, whether the link -> flows index
    ``lptr``/``lidx`` is valid, its entries (rebuilt here in place when needed), the
    running flows' route links (``f[7]`` summed: what the whole/incremental choice reads);
    ``params``: coalesce rtol, incremental (1/0), small-problem pairs, full fraction,
    threshold margin, capacity floor, change rtol; ``hit`` (per slot), ``cnt``, ``wf``
    (rows: residual capacity, frozen load), ``seen`` (per link): workspaces, zero on
    entry and on return."""
    rtol, incremental, small_pairs = params[0], params[1] != 0.0, params[2]
    alive = alive[:n]
    pstart = pstart[:n + 1]
    pf = pf[:n_pairs]
    pl = pl[:n_pairs]
    rem, tref, rate, tfin, size, start = f[0, :n], f[1, :n], f[2, :n], f[3, :n], f[4, :n], f[6, :n]
    old = due(tfin, start, first_new, now, tol, rtol)
    n_old = old.shape[0]
    r_done = np.inf
    for u in range(n_old):
        done_out[u] = old[u]
        if rate[old[u]] < r_done:
            r_done = rate[old[u]]
    j = n_old
    for s in range(first_new, n):
        if size[s] == 0.0:
            done_out[j] = s
            j += 1
    for u in range(j):
        s = done_out[u]
        alive[s] = False
        rate[s] = 0.0
        tfin[s] = np.inf
        for k in range(pstart[s], pstart[s + 1]):
            lcnt[pl[k]] -= 1
        counts[0] -= 1
        counts[1] -= pstart[s + 1] - pstart[s]
        counts[4] -= np.int64(f[7, s])
    has_new = False
    if counts[0] > 0:
        for s in range(first_new, n):
            if alive[s]:
                has_new = True
                break
    n_res = -1
    if has_new or n_old > 0:
        whole = not (incremental and counts[4] > small_pairs)
        if not whole and (counts[2] == 0 or 2 * counts[1] < counts[3]):
            counts[3] = link_index(pf, pl, alive, lptr, lidx)
            counts[2] = 1
        fn = first_new if has_new else n
        aff = solve(now, pstart, pf, pl, lptr, lidx, cap, alive, rate, rem, tref, tfin, lcnt,
                    old, fn, r_done, counts[0], whole, params[3], params[4], params[5],
                    params[6], hit, seen, wf[0], cnt, wf[1], stats)
        n_res = aff.shape[0]
    wake = earliest(tfin) if counts[0] > 0 else np.inf
    return j, n_old, n_res, wake
