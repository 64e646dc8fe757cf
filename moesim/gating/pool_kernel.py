""":func:`moesim.gating.pooled.pooled_counts` after its draw, numba-compiled.

From the call's uniform floats: the pool's circle orders by Fisher-Yates (the swaps of
:func:`moesim.gating.pooled.orders`), each token's order and point, the tokens put in
order by (order, sub-bucket of the point) with a counting sort, about one point per
sub-bucket, and each order's points sorted by insertion, then, order by order
and winding by winding, a walk of the arc ends and the sorted points together (the points
``u + w·ticks`` of one order never decrease from one winding to the next): the expert of
every (token, winding) without a search. The same integers in the same cells as numpy's
search and ``bincount`` (``tests/test_sampling_pool.py``). Cost O(pool·E + tokens·k).

No moesim imports (a leaf module: numba only).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _insertion_sort(pu, pr, lo, hi):
    """Sort ``pu[lo:hi]`` ascending, carrying ``pr``, by insertion: the points arrive
    sorted by their sub-bucket already (about one point each), so this moves few. Written
    out: with ``np.argsort`` here, the kernel loaded from numba's cache after a ``moesim
    run`` in the same process gave other counts than compiled afresh (numba 0.68.1,
    2026-12-02), so it calls no library sort."""
    for a in range(lo + 1, hi):
        ua, ra = pu[a], pr[a]
        b = a - 1
        while b >= lo and pu[b] > ua:
            pu[b + 1] = pu[b]
            pr[b + 1] = pr[b]
            b -= 1
        pu[b + 1] = ua
        pr[b + 1] = ra


@njit(cache=True, nogil=True)
def pooled_counts(raw, n, q, k, bits, pool, out):
    """``out`` (R·E,) int64, zero on entry: the counts, flat. ``raw`` the call's uint64
    words (the orders' 32-bit numbers two a word, then one word per token: its point the
    top ``bits`` bits, its order from the low 24), ``n`` (R,) tokens per row, ``q`` (E,)
    ticks per expert (``ticks`` = 2^bits)."""
    r_ = n.shape[0]
    e_ = q.shape[0]
    ticks = np.int64(1) << bits
    order = np.empty((pool, e_), dtype=np.int64)
    lo32 = np.uint64(0xFFFFFFFF)
    low24 = np.uint64((1 << 24) - 1)
    c = 0
    for o in range(pool):
        for e in range(e_):
            order[o, e] = e
        for i in range(e_ - 1, 0, -1):
            w = raw[c >> 1]
            v = (w & lo32) if (c & 1) == 0 else (w >> np.uint64(32))
            j = np.int64((v * np.uint64(i + 1)) >> np.uint64(32))
            c += 1
            held = order[o, i]
            order[o, i] = order[o, j]
            order[o, j] = held
    w0 = (c + 1) >> 1
    tokens = raw.shape[0] - w0
    # a counting sort by (order, sub-bucket of the point): ``sub`` sub-buckets per order,
    # the smallest power of two with pool·sub >= tokens (about one point each)
    sb = 0
    while (pool << sb) < tokens and sb < bits:
        sb += 1
    sub = np.int64(1) << sb
    nkey = pool * sub
    count = np.zeros(nkey + 1, dtype=np.int64)
    key = np.empty(tokens, dtype=np.int64)
    point = np.empty(tokens, dtype=np.int64)
    top = np.uint64(64 - bits)
    for t in range(tokens):
        w = raw[w0 + t]
        u = np.int64(w >> top)
        o = np.int64(((w & low24) * np.uint64(pool)) >> np.uint64(24))
        kt = o * sub + (u >> (bits - sb))
        key[t] = kt
        point[t] = u
        count[kt + 1] += 1
    for i in range(nkey):
        count[i + 1] += count[i]
    start = np.empty(pool + 1, dtype=np.int64)    # each order's first slot
    for o in range(pool + 1):
        start[o] = count[o * sub]
    pu = np.empty(tokens, dtype=np.int64)
    pr = np.empty(tokens, dtype=np.int64)
    t = 0
    for r in range(r_):
        for _ in range(n[r]):
            p = count[key[t]]
            count[key[t]] += 1
            pu[p] = point[t]
            pr[p] = r * e_
            t += 1
    for o in range(pool):
        lo, hi = start[o], start[o + 1]
        if lo == hi:
            continue
        _insertion_sort(pu, pr, lo, hi)
        j = 0
        end = q[order[o, 0]]        # the end of the order's first arc
        for w in range(k):
            off = w * ticks
            for t in range(lo, hi):
                x = pu[t] + off
                while end <= x:     # the arc holding x: the first whose end is > x
                    j += 1
                    end += q[order[o, j]]
                out[pr[t] + order[o, j]] += 1
