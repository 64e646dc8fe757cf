"""Max-min fair rates by bottleneck levels, compiled (numba; used by
:mod:`moesim.network.jit_loops`, the flow network's compiled path).

Progressive filling level by level: the link of smallest fair share
``max(capacity - frozen load, capacity x cap_floor) / unfrozen flows`` is taken from a
binary heap, its unfrozen flows are frozen at that share, and the shares of the other
links they cross are recomputed. While filling, a link's share never decreases (flows
frozen elsewhere leave it at least their share), so the smallest share is final: the
allocation of :func:`moesim.network.maxmin.maxmin_pairs` (whose rounds freeze every
local bottleneck at once), in work proportional to the pairs (each frozen once), not
pairs x rounds. Rates differ from the rounds' in the last bits (loads summed per level,
not per round; shares are not merged within ``SAT_RTOL``). No moesim imports.

The heap is lazy: a link whose share rose keeps its old place until it reaches the top,
and is placed again then (a share that fell by rounding is placed again at once). The
heap's order stays at most each link's share, so the link popped is still the one of
smallest (share, first use), and the rates are the same bits as with a heap updated at
every change. The flows' pairs and the links' state are copied into local arrays first
(local link ids in order of first use), so the loops run over a few small arrays.
(numba caches compiled code per source file: after editing this module, delete
``moesim/network/__pycache__/*.nb[ic]``, or :mod:`moesim.network.jit_loops`' cached code,
which calls these functions, keeps the old version.)
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
def maxmin_levels(seg_start, seg_end, pl, cap, out, cap_floor, cnt, frozen, stats):
    """Max-min rate of flow i crossing links ``pl[seg_start[i]:seg_end[i]]``, into ``out[i]``,
    by bottleneck levels (module doc); links of capacity ``cap`` (with a load already in
    ``frozen``, if any: flows fixed at their rates). ``cnt`` (int), ``frozen`` (float):
    per-link workspaces, zero on entry (``frozen``: the fixed load) and zero on the links
    of these flows on return.
    Adds the levels and the pairs frozen to ``stats[3]`` and ``stats[4]``."""
    nf = seg_start.shape[0]
    n_pairs = 0
    for i in range(nf):
        n_pairs += seg_end[i] - seg_start[i]
    # the flows' pairs copied together, over local link ids (order of first use), and
    # the links' state in local arrays: the loops below stay in a few small arrays
    used = np.empty(min(n_pairs, cap.shape[0]), dtype=np.int64)
    lid = np.empty(cap.shape[0], dtype=np.int64)
    loc = np.empty(n_pairs, dtype=np.int32)
    fst = np.empty(nf + 1, dtype=np.int64)
    n_used = 0
    k2 = 0
    for i in range(nf):
        fst[i] = k2
        for k in range(seg_start[i], seg_end[i]):
            lk = pl[k]
            if cnt[lk] == 0:
                lid[lk] = n_used
                used[n_used] = lk
                n_used += 1
            cnt[lk] += 1
            loc[k2] = lid[lk]
            k2 += 1
    fst[nf] = n_pairs
    # link -> flows over local link ids: a counting sort of the pairs
    ptr = np.empty(n_used + 1, dtype=np.int64)
    ptr[0] = 0
    key = np.empty(n_used)
    heap = np.empty(n_used, dtype=np.int64)
    pos = np.empty(n_used, dtype=np.int64)
    lcap = np.empty(n_used)
    lfro = np.empty(n_used)
    lcnt = np.empty(n_used, dtype=np.int64)
    for u in range(n_used):
        lk = used[u]
        lcap[u] = cap[lk]
        lfro[u] = frozen[lk]
        lcnt[u] = cnt[lk]
        frozen[lk] = 0.0
        cnt[lk] = 0
        ptr[u + 1] = ptr[u] + lcnt[u]
        key[u] = fair_share(lcap[u], lfro[u], cap_floor, lcnt[u])
        heap[u] = u
        pos[u] = u
    fill = ptr[:-1].copy()
    lf = np.empty(n_pairs, dtype=np.int32)
    for i in range(nf):
        for q in range(fst[i], fst[i + 1]):
            u = loc[q]
            lf[fill[u]] = i
            fill[u] += 1
    hkey = key.copy()   # the heap's order: at most the true share ``key`` (lazy raises)
    nh = n_used
    for j in range((nh >> 1) - 1, -1, -1):
        _down(heap, pos, hkey, nh, j)
    fz = np.zeros(nf, dtype=np.bool_)
    lbad = np.zeros(n_used, dtype=np.bool_)
    dirty = np.empty(n_used, dtype=np.int64)
    while nh > 0:
        u = heap[0]
        if lcnt[u] == 0:   # no unfrozen flow left: out of the heap
            nh -= 1
            if nh > 0:
                heap[0] = heap[nh]
                pos[heap[0]] = 0
                _down(heap, pos, hkey, nh, 0)
            continue
        if hkey[u] != key[u]:   # its share rose since it was placed: place it again
            hkey[u] = key[u]
            _down(heap, pos, hkey, nh, 0)
            continue
        v = key[u]
        stats[3] += 1
        n_dirty = 0
        for q in range(ptr[u], ptr[u + 1]):
            i = lf[q]
            if fz[i]:
                continue
            fz[i] = True
            out[i] = v
            stats[4] += fst[i + 1] - fst[i]
            for q2 in range(fst[i], fst[i + 1]):
                w = loc[q2]
                lfro[w] += v
                lcnt[w] -= 1
                if not lbad[w]:
                    lbad[w] = True
                    dirty[n_dirty] = w
                    n_dirty += 1
        for d in range(n_dirty):   # the popped link is among them, now without flows
            w = dirty[d]
            lbad[w] = False
            if lcnt[w] > 0:
                s = fair_share(lcap[w], lfro[w], cap_floor, lcnt[w])
                key[w] = s
                if s < hkey[w]:   # lower only by rounding: placed again at once
                    hkey[w] = s
                    _sift(heap, pos, hkey, nh, pos[w])
