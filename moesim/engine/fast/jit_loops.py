"""numba-compiled inner loops of the fast path's staggered link bound (loaded lazily by
:mod:`moesim.engine.fast.network` once a run times many all-to-alls, or numba is
imported already).

:func:`drain_equal_ends` is :meth:`moesim.engine.fast.network._Incidence.finish` for an
all-to-all whose members all arrive together (every DeepEP exchange) on a group timed
by the staggered link bound: the same floating-point operations in the same order
(link loads summed pair by pair as ``np.bincount`` sums them, then ``a0 + load / cap``,
maxima over hops and over each member's flows), hence the same bits (tested against
the numpy path in tests/test_fast_speed_exact.py); :func:`drain_level_ends` is the same
for members arriving apart (``drain_finish``'s start levels, one load per link and
level); :func:`ll_pair_ends` builds a DeepEP low-latency dispatch's and combine's bytes
and times both with :func:`drain_equal_ends` in one call (the same bits as ``ll_matrix``
and the numpy bound: tests/test_fast_speed_exact.py). No moesim imports.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def drain_equal_ends(flat, pad_t, cap, lat, n, a0):   # pragma: no cover - compiled
    """Per member: when all its flows are done, every flow starting at ``a0``.
    ``flat``: (n*n,) bytes i→j; ``pad_t``: (hops, n*n) local link ids padded with
    ``len(cap)``; ``cap``: bytes/s per link; ``lat``: (n*n,) path latency."""
    n_links = cap.shape[0]
    hops, n2 = pad_t.shape
    load = np.zeros(n_links + 1)
    for p in range(n2):             # pair by pair, hop by hop: np.bincount's order
        w = flat[p]
        if w != 0.0:
            for h in range(hops):
                load[pad_t[h, p]] += w
    f_link = np.empty(n_links + 1)
    for lk in range(n_links):
        f_link[lk] = a0 + load[lk] / cap[lk] if load[lk] > 0 else -np.inf
    f_link[n_links] = -np.inf
    # each pair's end: the max over its hops, hop row by hop row (maxima of floats
    # without NaN: any order gives the same float), then over each row and column
    f = np.empty(n2)
    row = pad_t[0]
    for p in range(n2):
        f[p] = f_link[row[p]]
    for h in range(1, hops):
        row = pad_t[h]
        for p in range(n2):
            x = f_link[row[p]]
            f[p] = x if x > f[p] else f[p]
    for p in range(n2):
        x = f[p]
        x = (x if x > a0 else a0) + lat[p]
        f[p] = x if flat[p] > 0 else -np.inf
    end = np.full(n, a0)
    col = np.full(n, -np.inf)
    for i in range(n):
        m = -np.inf
        b = i * n
        for j in range(n):
            x = f[b + j]
            m = x if x > m else m
            col[j] = x if x > col[j] else col[j]
        end[i] = m if m > end[i] else end[i]
    for j in range(n):
        end[j] = col[j] if col[j] > end[j] else end[j]
    return end


@njit(cache=True, nogil=True)
def drain_level_ends(flat, start, taus, pad_t, cap, lat, n, arr):   # pragma: no cover
    """Per member: :meth:`moesim.engine.fast.network._Incidence.finish` by the staggered
    link bound when members arrive apart (``drain_finish``'s start levels): flow p starts
    at ``start[p]``; each link's load at level τ_k sums, pair by pair (np.bincount's
    order), the bytes of its flows starting at or after τ_k; the link is done at the
    latest τ_k + load / cap; a flow ends at max(its latest link, its start) + its path
    latency; a member at the latest end of its flows, or its arrival ``arr``. ``taus``
    from :func:`moesim.engine.fast.network._start_levels` (not empty)."""
    n_links = cap.shape[0]
    hops, n2 = pad_t.shape
    k_n = taus.shape[0]
    load = np.zeros((n_links + 1, k_n))
    for p in range(n2):
        w = flat[p]
        if w != 0.0:
            sp = start[p]
            for k in range(k_n):
                if sp >= taus[k]:
                    for h in range(hops):
                        load[pad_t[h, p], k] += w
    f_link = np.full(n_links + 1, -np.inf)
    for lk in range(n_links):
        m = -np.inf
        for k in range(k_n):
            if load[lk, k] > 0:
                x = taus[k] + load[lk, k] / cap[lk]
                m = x if x > m else m
        f_link[lk] = m
    end = arr.copy()
    for p in range(n2):
        if flat[p] > 0:
            f = f_link[pad_t[0, p]]
            for h in range(1, hops):
                x = f_link[pad_t[h, p]]
                f = x if x > f else f
            f = (f if f > start[p] else start[p]) + lat[p]
            i, j = p // n, p % n
            end[i] = f if f > end[i] else end[i]
            end[j] = f if f > end[j] else end[j]
    return end


@njit(cache=True, nogil=True)
def ll_pair_ends(tok, bd, bc, pad_t, cap, lat, a0, m_d, m_c):   # pragma: no cover
    """A DeepEP low-latency dispatch and its combine, both starting at ``a0``, in one
    call: :func:`drain_equal_ends` of each, from the (token, expert) messages ``tok``
    (n, n) int64 between EP ranks. Fills ``m_d`` and ``m_c`` (n, n) with ``tok`` times
    the bytes of a dispatch message ``bd`` and of a combine message ``bc``, the diagonal
    and negatives 0 (:func:`moesim.ep.plan.ll_matrix` before the combine's transpose:
    combine flow i→j carries ``m_c[j, i]``); returns the (n,) ends of the dispatch and
    of the combine."""
    n = tok.shape[0]
    for i in range(n):
        for j in range(n):
            t = tok[i, j]
            x, y = t * bd, t * bc
            m_d[i, j] = x if (i != j and x > 0.0) else 0.0
            m_c[i, j] = y if (i != j and y > 0.0) else 0.0
    return (drain_equal_ends(m_d.ravel(), pad_t, cap, lat, n, a0),
            drain_equal_ends(m_c.T.copy().ravel(), pad_t, cap, lat, n, a0))


@njit(cache=True, nogil=True, inline="always")
def _maximum(x, y):   # pragma: no cover - compiled
    """``np.maximum`` of two floats (NaN from the first, else the larger)."""
    return x if (x >= y or x != x) else y


@njit(cache=True, nogil=True)
def slowed(a, w, j, e, r):   # pragma: no cover - compiled
    """:meth:`moesim.engine.fast.pairs._Pair._slowed` per rank: the duration of ``w``
    seconds of full-rate compute starting at ``a`` under a kernel from ``j`` to ``e``
    that leaves rate ``r``; ``w`` (n,) or (1,) for every rank. The numpy path's
    operations, element by element, so the same bits."""
    n = a.shape[0]
    one = w.shape[0] == 1
    out = np.empty(n)
    for i in range(n):
        ai, ji = a[i], j[i]
        wi = w[0] if one else w[i]
        pre = _maximum(0.0, ji - ai)
        win = _maximum(0.0, e[i] - _maximum(ai, ji))
        w1 = _maximum(0.0, wi - pre)
        if wi <= pre:
            out[i] = wi
        elif w1 <= win * r:
            out[i] = pre + w1 / r
        else:
            out[i] = pre + (win + (w1 - win * r))
    return out


@njit(cache=True, nogil=True, inline="always")
def _minimum(x, y):   # pragma: no cover - compiled
    """``np.minimum`` of two floats (NaN from the first, else the smaller)."""
    return x if (x <= y or x != x) else y


@njit(cache=True, nogil=True)
def idle_split(busy, stall, j, st, e, g0, g1):   # pragma: no cover - compiled
    """:meth:`moesim.engine.fast.pairs._Pair._idle_to` for one kernel (joined at ``j``,
    moving data from ``st`` to ``e``) over the compute stream's wait from ``g0`` to
    ``g1``: adds its transfer to ``busy`` and its wait for partners to ``stall``, in
    place, with the numpy path's operations element by element."""
    for i in range(busy.shape[0]):
        busy[i] += _maximum(0.0, _minimum(e[i], g1[i]) - _maximum(st[i], g0[i]))
        stall[i] += _maximum(0.0, _minimum(st[i], g1[i]) - _maximum(j[i], g0[i]))
