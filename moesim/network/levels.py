"""Max-min fair rates by bottleneck levels, compiled (numba; used by
:mod:`moesim.network.kernels`, the flow network's compiled path).

Progressive filling level by level: the link of smallest fair share
``max(capacity - frozen load, capacity x cap_floor) / unfrozen flows`` is taken from an
indexed binary heap, its unfrozen flows are frozen at that share, and the shares of the
other links they cross are recomputed in place in the heap. While filling, a link's
share never decreases (flows frozen elsewhere leave it at least their share), so the
smallest share is final: the allocation of :func:`moesim.network.maxmin.maxmin_pairs`
(whose rounds freeze every local bottleneck at once), in work proportional to the pairs
(each frozen once) and the share updates (log of the links each), not pairs x rounds.
Rates differ from the rounds' in the last bits (loads summed per level, not per round;
shares are not merged within ``SAT_RTOL``). No moesim imports.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _less(key, a, b):
    """Heap order of local links a, b: smaller share first, then smaller id."""
    return key[a] < key[b] or (key[a] == key[b] and a < b)


@njit(cache=True, nogil=True)
def _down(heap, pos, key, n, j):
    """Move heap[j] down until heap[:n] is a min-heap below it."""
    u = heap[j]
    while True:
        c = 2 * j + 1
        if c >= n:
            break
        if c + 1 < n and _less(key, heap[c + 1], heap[c]):
            c += 1
        if not _less(key, heap[c], u):
            break
        heap[j] = heap[c]
        pos[heap[j]] = j
        j = c
    heap[j] = u
    pos[u] = j


@njit(cache=True, nogil=True)
def _sift(heap, pos, key, n, j):
    """Restore the min-heap order of heap[:n] after the key of heap[j] changed."""
    u = heap[j]
    while j > 0:
        p = (j - 1) >> 1
        if not _less(key, u, heap[p]):
            break
        heap[j] = heap[p]
        pos[heap[j]] = j
        j = p
    heap[j] = u
    pos[u] = j
    _down(heap, pos, key, n, j)


@njit(cache=True, nogil=True)
def count_links(act, n_act, seg_start, seg_end, pl, cnt, used):
    """Count the flows ``act[:n_act]`` on each link they cross into ``cnt`` and list the
    links in order of first use in ``used``; returns (links used, pairs passed over)."""
    n_used = 0
    pairs = 0
    for a in range(n_act):
        i = act[a]
        pairs += seg_end[i] - seg_start[i]
        for k in range(seg_start[i], seg_end[i]):
            lk = pl[k]
            if cnt[lk] == 0:
                used[n_used] = lk
                n_used += 1
            cnt[lk] += 1
    return n_used, pairs


@njit(cache=True, nogil=True)
def fair_share(c, load, cap_floor, n):
    """Share of n unfrozen flows on a link of capacity c carrying ``load`` (floored)."""
    x = c - load
    y = c * cap_floor
    return (x if x >= y else y) / n


@njit(cache=True, nogil=True)
def maxmin_levels(seg_start, seg_end, pl, cap, out, cap_floor, cnt, frozen, bad, stats):
    """Max-min rate of flow i crossing links ``pl[seg_start[i]:seg_end[i]]``, into ``out[i]``,
    by bottleneck levels (module doc); links of capacity ``cap`` (with a load already in
    ``frozen``, if any: flows fixed at their rates). ``cnt`` (int), ``frozen`` (float),
    ``bad`` (bool): per-link workspaces, zero on entry (``frozen``: the fixed load) and
    ``cnt``, ``bad`` zero on return; ``frozen`` is zeroed on the links of these flows.
    Adds the levels and the pairs frozen to ``stats[3]`` and ``stats[4]``."""
    nf = seg_start.shape[0]
    n_pairs = 0
    for i in range(nf):
        n_pairs += seg_end[i] - seg_start[i]
    used = np.empty(n_pairs, dtype=np.int64)
    n_used = count_links(np.arange(nf), nf, seg_start, seg_end, pl, cnt, used)[0]
    # link -> flows over local link ids (order of first use): a counting sort of the pairs
    lid = np.empty(cap.shape[0], dtype=np.int64)
    ptr = np.empty(n_used + 1, dtype=np.int64)
    ptr[0] = 0
    key = np.empty(n_used)
    heap = np.empty(n_used, dtype=np.int64)
    pos = np.empty(n_used, dtype=np.int64)
    for u in range(n_used):
        lk = used[u]
        lid[lk] = u
        ptr[u + 1] = ptr[u] + cnt[lk]
        key[u] = fair_share(cap[lk], frozen[lk], cap_floor, cnt[lk])
        heap[u] = u
        pos[u] = u
    fill = ptr[:-1].copy()
    lf = np.empty(n_pairs, dtype=np.int64)
    for i in range(nf):
        for k in range(seg_start[i], seg_end[i]):
            u = lid[pl[k]]
            lf[fill[u]] = i
            fill[u] += 1
    nh = n_used
    for j in range((nh >> 1) - 1, -1, -1):
        _down(heap, pos, key, nh, j)
    fz = np.zeros(nf, dtype=np.bool_)
    dirty = np.empty(n_used, dtype=np.int64)
    while nh > 0:
        u = heap[0]
        v = key[u]
        stats[3] += 1
        n_dirty = 0
        for q in range(ptr[u], ptr[u + 1]):
            i = lf[q]
            if fz[i]:
                continue
            fz[i] = True
            out[i] = v
            stats[4] += seg_end[i] - seg_start[i]
            for k in range(seg_start[i], seg_end[i]):
                l2 = pl[k]
                frozen[l2] += v
                cnt[l2] -= 1
                if not bad[l2]:
                    bad[l2] = True
                    dirty[n_dirty] = l2
                    n_dirty += 1
        for d in range(n_dirty):   # the popped link is among them, now without flows
            l2 = dirty[d]
            bad[l2] = False
            w = lid[l2]
            j = pos[w]
            if cnt[l2] > 0:
                key[w] = fair_share(cap[l2], frozen[l2], cap_floor, cnt[l2])
                _sift(heap, pos, key, nh, j)
            else:   # no unfrozen flow left: out of the heap
                nh -= 1
                if j < nh:
                    heap[j] = heap[nh]
                    pos[heap[j]] = j
                    _sift(heap, pos, key, nh, j)
    for u in range(n_used):
        frozen[used[u]] = 0.0
