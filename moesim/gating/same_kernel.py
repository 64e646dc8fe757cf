"""The draw-dependent part of :func:`moesim.gating.sampling._same_rows`, numba-compiled.

Given the standard normals ``z`` and the rounding offsets ``u`` that numpy drew, it
evaluates the numpy path's expressions element by element in the same order: the
projection and the row total are numpy's pairwise sums (:func:`_pairwise`), the
cumulative sum runs left to right as ``np.cumsum`` does, so every count and the rows
to redo are the same (``tests/test_sampling_same_kernel.py`` runs both). No moesim imports (a leaf module: numba only).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _block(a, lo, n):  # pragma: no cover - compiled
    """numpy's pairwise sum of ``a[lo:lo + n]`` for n <= 128: eight accumulators."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    m = n - (n % 8)
    i = 8
    while i < m:
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True, nogil=True)
def _pairwise(a, lo, n):  # pragma: no cover - compiled
    """numpy's pairwise sum of ``a[lo:lo + n]`` (its float64 ``add.reduce`` loop): blocks
    of <= 128 by :func:`_block`, longer runs split in two at a multiple of eight below
    the half and the halves' sums added. numpy recurses; this walks the same tree with
    its own stack (numba's on-disk cache cannot hold a recursive function)."""
    if n <= 128:
        return _block(a, lo, n)
    return _pairwise_stack(a, lo, n, np.empty(64, dtype=np.int64), np.empty(64, dtype=np.int64),
                           np.empty(64), np.empty(64, dtype=np.int64))


@njit(cache=True, nogil=True)
def _pairwise_stack(a, lo, n, st_lo, st_n, st_left, st_state):  # pragma: no cover
    """:func:`_pairwise` of n > 128 with the caller's stack (64 entries each; states 0
    new, 1 left pending, 2 right pending)."""
    d = 0
    st_lo[0], st_n[0], st_state[0] = lo, n, 0
    val = 0.0
    while d >= 0:
        h = st_n[d] // 2
        h -= h % 8
        if st_state[d] == 0:
            st_state[d] = 1
            if h > 128:
                d += 1
                st_lo[d], st_n[d], st_state[d] = st_lo[d - 1], h, 0
                continue
            val = _block(a, st_lo[d], h)
        if st_state[d] == 1:              # val: the left half's sum
            st_left[d] = val
            st_state[d] = 2
            rn = st_n[d] - h
            if rn > 128:
                d += 1
                st_lo[d], st_n[d], st_state[d] = st_lo[d - 1] + h, rn, 0
                continue
            val = _block(a, st_lo[d] + h, rn)
        val = st_left[d] + val            # val: the right half's sum
        d -= 1
    return val


@njit(cache=True, nogil=True)
def same_counts(a, s, a_s, mean, vb, sqrt_nf, sv, sv_pos, z, u, n, k, out):  # pragma: no cover
    """``out`` (R, E) int64: the rounded counts; returns the rows outside the
    invariants (sum k·n, 0 <= count <= n). ``a, s, a_s, mean, vb`` (E,) the
    draw-independent rows, ``sqrt_nf, sv, sv_pos, u, n`` (R,), ``z`` (R, E) (overwritten)."""
    r_, e_ = z.shape
    bad = np.zeros(r_, dtype=np.bool_)
    tmp = np.empty(e_)
    s_lo, s_n = np.empty(64, dtype=np.int64), np.empty(64, dtype=np.int64)
    s_left, s_state = np.empty(64), np.empty(64, dtype=np.int64)
    for r in range(r_):
        zr = z[r]
        for e in range(e_):
            tmp[e] = a_s[e] * zr[e]
        proj = 0.0 + (_block(tmp, 0, e_) if e_ <= 128 else
                      _pairwise_stack(tmp, 0, e_, s_lo, s_n, s_left, s_state))
        sq = sqrt_nf[r]
        for e in range(e_):
            zr[e] = mean[e] + (s[e] * zr[e] - a[e] * proj) * sq
        target = k * n[r]
        shift = 0.0
        if sv_pos[r]:
            tot_y = (_block(zr, 0, e_) if e_ <= 128 else
                     _pairwise_stack(zr, 0, e_, s_lo, s_n, s_left, s_state))
            shift = ((0.0 + tot_y) - float(target)) / sv[r]
        for e in range(e_):
            zr[e] -= vb[e] * shift
        ur = u[r]
        prev = np.floor(0.0 + ur)
        acc = 0.0
        tot = 0
        wrong = False
        for e in range(e_):
            if e == 0:
                acc = zr[0]
            else:
                acc = acc + zr[e]
            c = float(target) if e == e_ - 1 else acc
            f = np.floor(c + ur)
            x = np.int64(f - prev)
            prev = f
            out[r, e] = x
            tot += x
            if x < 0 or x > n[r]:
                wrong = True
        bad[r] = wrong or tot != target
    return bad
