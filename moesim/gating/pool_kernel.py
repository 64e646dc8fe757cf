"""The counting loop of :func:`moesim.gating.sampling._pooled_counts`, numba-compiled.

Given the pool's circle orders, the arcs in ticks, every token's point (sorted, so the
tokens of one order are consecutive) and its row, it adds each token's k experts to the
(row, expert) counts: the experts whose arcs cover the points ``u + w·TICKS`` (w < k).
numpy finds them with one search of the arc ends and one ``bincount``; this walks the
ends and the points together (the points of one order, winding by winding, never
decrease: they lie within one ``TICKS`` of each other), the same integers in the same
cells (``tests/test_sampling_pool.py`` runs both). Cost O(pool·E + tokens·k) with no
search.

No moesim imports (a leaf module: numba only).
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def pooled_cells(order, q, u, row, k, ticks, span, out):
    """``out`` (R·E,) int64, zero on entry: the counts, flat. ``order`` (pool, E) the
    orders, ``q`` (E,) ticks per expert, ``u`` (tokens,) sorted points (order o's in
    [o·span, o·span + ticks)), ``row`` (tokens,) each token's row times E."""
    pool, n_exp = order.shape
    tokens = u.shape[0]
    i = 0
    for o in range(pool):
        start = i
        base = o * span
        lim = base + span
        while i < tokens and u[i] < lim:
            i += 1
        if i == start:
            continue
        j = 0
        end = q[order[o, 0]]        # the end of the order's first arc (local ticks)
        for w in range(k):
            off = w * ticks - base
            for t in range(start, i):
                x = u[t] + off
                while end <= x:     # the arc holding x: the first whose end is > x
                    j += 1
                    end += q[order[o, j]]
                out[row[t] + order[o, j]] += 1
