"""Sampling k distinct experts per token with exact inclusion probabilities.

A token includes expert e with probability ``pi[e]`` (0 <= pi <= 1, sum pi = k)
and always picks exactly k distinct experts. The design is randomized systematic
sampling (Hartley & Rao 1962): lay the experts on a circle of circumference 1 in
a random order, expert e owning an arc of length ``pi[e]`` (the arcs wind round
the circle k times); the token draws a uniform point u and picks every expert
whose arc covers u. Each point is covered by exactly k arcs and no arc (length
<= 1) covers a point twice, so the k experts are distinct, and P(e picked) is
its arc length, exactly.

Arcs are kept in integer *ticks* (``TICKS`` per unit) so that "exactly k" never
depends on float rounding: tick counts sum to exactly ``k * TICKS``.

Three evaluations of the same design:

* :func:`sample_tokens` — per token (its own random order and point); returns the
  (tokens, k) expert ids. O(tokens × experts).
* :func:`sample_counts` — counts only, exact marginals: for a group of n tokens
  sharing one random order, the n points fall into the elementary intervals
  between arc ends with multinomial counts, and each expert's count is the sum
  over the intervals its arc covers. Each count is Binomial(n, pi[e]) exactly and
  the counts sum to exactly k·n with every count <= n (so some assignment of k
  distinct experts to each token realizes them). Its joint law is poor: experts
  whose arcs coincide on the circle get equal counts (with equal pi = k/E only
  E/k distinct values), so it is only the fallback of:
* :func:`sample_counts_fast` — counts with exact means and variances and a
  rank-one approximation of the covariance, Gaussian for well-filled entries,
  exact binomial for sparse ones, same invariants. O(groups × experts).
"""

from __future__ import annotations

import numpy as np

from moesim.gating.memo import Memo
from moesim.gating.pooled import pooled_counts
from moesim.gating.same_jit import same_kernel

#: ticks per unit of probability (2**40: exact in int64 and in float64)
TICKS = 1 << 40


def cap_probs(weights: np.ndarray, k: np.ndarray | int) -> np.ndarray:
    """Inclusion probabilities ∝ ``weights`` per row, summing to ``k``, each <= 1.

    Water-filling: experts whose share would exceed 1 are set to 1 and the rest
    rescaled, until none exceeds 1. ``weights`` is (E,) or (R, E), >= 0, with at
    least k positive entries per row (the caller checks).
    """
    w = np.atleast_2d(np.asarray(weights, dtype=float))
    kk = np.broadcast_to(np.asarray(k, dtype=float), (w.shape[0],))[:, None]
    capped = np.zeros(w.shape, dtype=bool)
    pi = np.zeros_like(w)
    for _ in range(w.shape[1] + 1):
        free = np.where(capped, 0.0, w)
        room = kk - capped.sum(axis=1, keepdims=True)
        tot = free.sum(axis=1, keepdims=True)
        scale = np.divide(room, tot, out=np.zeros_like(tot), where=tot > 0)
        pi = np.where(capped, 1.0, free * scale)
        over = (pi > 1.0) & ~capped
        if not over.any():
            break
        capped |= over
    pi = np.minimum(pi, 1.0)
    return pi[0] if np.ndim(weights) == 1 else pi


def to_ticks(pi: np.ndarray, k: int) -> np.ndarray:
    """Integer arc lengths per row: round ``pi * TICKS`` by largest remainder so
    each row sums to exactly ``k * TICKS`` and no entry exceeds ``TICKS``."""
    p = np.atleast_2d(np.asarray(pi, dtype=float))
    x = p * TICKS
    q = np.floor(x).astype(np.int64)
    frac = x - q
    short = k * TICKS - q.sum(axis=1)
    # add one tick to the `short` entries with the largest fractional part
    order = np.argsort(-frac, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(p.shape[1])[None, :].repeat(p.shape[0], 0), axis=1)
    q += (rank < short[:, None]) & (q < TICKS) & (p > 0)
    if np.any(q.sum(axis=1) != k * TICKS):
        raise ValueError("inclusion probabilities must sum to k with at least k positive")
    return q[0] if np.ndim(pi) == 1 else q


def _arc_starts(rng: np.random.Generator, q: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random circle order per row; returns (order, lengths in order, start tick
    of each position in order). The first position starts at tick 0."""
    order = np.argsort(rng.random(q.shape), axis=1)
    qo = np.take_along_axis(q, order, axis=1)
    starts_o = (np.cumsum(qo, axis=1) - qo) % TICKS
    return order, qo, starts_o


def _unorder(order: np.ndarray, x_o: np.ndarray) -> np.ndarray:
    out = np.empty_like(x_o)
    np.put_along_axis(out, order, x_o, axis=1)
    return out


def sample_tokens(rng: np.random.Generator, pi: np.ndarray, k: int) -> np.ndarray:
    """Per-token sampling. ``pi`` is (T, E), each row summing to k with entries
    <= 1. Returns (T, k) int64 expert ids, ascending per row, distinct."""
    q = to_ticks(np.atleast_2d(pi), k)
    if q.shape[0] == 0:
        return np.zeros((0, k), dtype=np.int64)
    order, _, starts_o = _arc_starts(rng, q)
    starts = _unorder(order, starts_o)
    u = rng.integers(0, TICKS, size=(q.shape[0], 1), dtype=np.int64)
    picked = ((u - starts) % TICKS) < q
    rows, cols = np.nonzero(picked)
    return cols.reshape(q.shape[0], k).astype(np.int64)


def sample_counts(rng: np.random.Generator, n: np.ndarray, pi: np.ndarray, k: int) -> np.ndarray:
    """Counts-level sampling for groups of tokens. ``n`` (R,) tokens per group;
    ``pi`` (R, E) inclusion probabilities per group, or (E,) shared by all groups
    (then all groups share one circle order too, which is cheaper). Returns (R, E)
    int64 counts, row r summing to exactly ``k * n[r]``, every entry <= ``n[r]``."""
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    q = to_ticks(np.atleast_2d(pi), k)  # (G, E), G = 1 (shared) or R
    r_, e_ = n.shape[0], q.shape[1]
    if r_ == 0:
        return np.zeros((0, e_), dtype=np.int64)
    g_ = q.shape[0]
    order, qo, starts_o = _arc_starts(rng, q)
    # sorted starts a_0 = 0 <= a_1 <= ... cut [0, TICKS) into elementary
    # intervals [a_i, a_{i+1}); srt[i] is the circle position starting at a_i
    srt = np.argsort(starts_o, axis=1, kind="stable")
    a = np.take_along_axis(starts_o, srt, axis=1)
    ends = np.concatenate([a[:, 1:], np.full((g_, 1), TICKS, dtype=np.int64)], axis=1)
    pvals = (ends - a).astype(float) / TICKS
    pvals /= pvals.sum(axis=1, keepdims=True)
    cnt = rng.multinomial(n, pvals[0] if g_ == 1 else pvals)
    # prefix[i] = points below a_i
    prefix = np.concatenate([np.zeros((r_, 1), dtype=np.int64), np.cumsum(cnt, axis=1)], axis=1)
    pos = np.empty_like(srt)
    np.put_along_axis(pos, srt, np.broadcast_to(np.arange(e_), (g_, e_)), axis=1)
    # the arc at circle position j runs from a[pos[j]] to the start of position
    # j + 1 (position 0 for the last); ties between equal starts only separate
    # zero-length intervals, which hold no points
    nxt = np.roll(pos, -1, axis=1)
    if g_ == 1:
        begin, finish = prefix[:, pos[0]], prefix[:, nxt[0]]
    else:
        begin = np.take_along_axis(prefix, pos, axis=1)
        finish = np.take_along_axis(prefix, nxt, axis=1)
    wraps = (starts_o + qo) >= TICKS
    counts_o = finish - begin + wraps * n[:, None]
    if g_ == 1:
        out = np.empty_like(counts_o)
        out[:, order[0]] = counts_o
        return out
    return _unorder(order, counts_o)


#: entries whose binomial variance n·pi·(1-pi) is at least this are drawn from the
#: Gaussian approximation; below it, exactly (5 sd fit inside [0, n])
GAUSS_MIN_VAR = 25.0


def _rank_one(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Solve a_e·(A - a_e) = d_e with A = Σ a_e per row (Newton on A).

    Then M = diag(A·a) - a aᵀ has diagonal d and zero row sums: a per-token
    covariance of inclusion indicators with exact variances pi(1 - pi) and a fixed
    total. For equal d it is the exact covariance of a uniform random k-subset,
    -d/(E-1) off the diagonal. Rows without a root (one entry's variance exceeding
    all others') stop at the smallest admissible A."""
    dmax = d.max(axis=1)
    a_min = 2.0 * np.sqrt(dmax)
    big_a = np.maximum(np.sqrt(d.sum(axis=1)), a_min)
    for _ in range(40):
        disc = np.sqrt(np.maximum(big_a[:, None] ** 2 - 4.0 * d, 0.0))
        a = np.divide(2.0 * d, big_a[:, None] + disc, out=np.zeros_like(d),
                      where=(big_a[:, None] + disc) > 0)
        g = a.sum(axis=1) - big_a
        dg = -np.sum(np.divide(a, disc, out=np.zeros_like(d), where=disc > 0), axis=1) - 1.0
        new = np.maximum(big_a - g / dg, a_min)
        if np.all(np.abs(new - big_a) <= 1e-12 * np.maximum(big_a, 1e-300)):
            big_a = new
            break
        big_a = new
    disc = np.sqrt(np.maximum(big_a[:, None] ** 2 - 4.0 * d, 0.0))
    a = np.divide(2.0 * d, big_a[:, None] + disc, out=np.zeros_like(d),
                  where=(big_a[:, None] + disc) > 0)
    return a, big_a


#: :func:`_rank_one_row` per row, :func:`_ticks_row` per (row, k), :func:`_same_setup` per
#: (pi, n, rows): every micro-batch of a layer asks for the same
_RANK_ONE = Memo(512)
_TICKS_ROW = Memo(512)
_SAME = Memo(256)


def _rank_one_row(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_rank_one` of one row, remembered per row (every micro-batch of a layer
    solves the same one); read-only results."""
    return _RANK_ONE.get(d.tobytes(), lambda: _rank_one(d))


def sample_counts_fast(rng: np.random.Generator, n: np.ndarray, pi: np.ndarray,
                       k: int) -> np.ndarray:
    """Fast counts-level sampling with a realistic joint law. ``n`` (R,), ``pi``
    (E,) or (R, E). Returns (R, E) int64 with rows summing to exactly ``k * n`` and
    0 <= entries <= n.

    Over n independent tokens the count of expert e is Binomial(n, pi_e) and the
    counts' covariance is n times the per-token covariance of the inclusion
    indicators, which has diagonal d = pi(1 - pi) and zero row sums (k picks per
    token). Entries with n·d >= GAUSS_MIN_VAR are drawn from the Gaussian with
    that mean and covariance n·(diag(A·a) - a aᵀ) (:func:`_rank_one`); the others
    exactly, as independent binomials (a row with no Gaussian entry is drawn exactly
    by :func:`_sparse_counts`: few tokens per source, every decode step). The
    Gaussian part absorbs the total so the
    row sums to k·n, and a randomized cumulative rounding (unbiased, sum-keeping)
    makes integers. Rows that would leave [0, n] (beyond 5 sd) fall back to
    :func:`sample_counts`. Cost O(R·E) Gaussian draws.
    """
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    r_ = n.shape[0]
    if np.ndim(pi) == 1 and r_ > 1 and np.all(n == n[0]):
        same = _same_rows(rng, n, np.asarray(pi, dtype=float), k)
        if same is not None:
            return same
    if np.ndim(pi) == 1 and r_:
        pi1 = np.asarray(pi, dtype=float)
        if bool(np.all(n.max() * (pi1 * (1.0 - pi1)) < GAUSS_MIN_VAR)):
            # every row sparse (each decode step): what the lines below reach, sooner
            return _pooled_counts(rng, n, _ticks_row(pi1, k), k)
    p = np.broadcast_to(np.asarray(pi, dtype=float), (r_, np.shape(pi)[-1]))
    nf = n[:, None].astype(float)
    d = p * (1.0 - p)
    big = nf * d >= GAUSS_MIN_VAR
    sparse = ~big.any(axis=1)
    small = ~big & (p > 0) & ~sparse[:, None]
    out = np.zeros(p.shape, dtype=np.int64)
    if small.any():
        out[small] = rng.binomial(np.broadcast_to(n[:, None], p.shape)[small], p[small])
    if sparse.all():      # no Gaussian entry to absorb the total: drawn exactly
        return _sparse_counts(rng, n, p, k)
    if sparse.any():
        rows = np.flatnonzero(sparse)
        out[rows] = _sparse_counts(rng, n[rows], p[rows], k)
    db = np.where(big, d, 0.0)
    if np.ndim(pi) == 1 and np.all(big == big[0]):
        a1, big_a1 = _rank_one_row(db[:1])  # the same for every row: solve once
        a, big_a = np.broadcast_to(a1, p.shape), np.broadcast_to(big_a1, (r_,))
    else:
        a, big_a = _rank_one(db)
    s = np.sqrt(big_a[:, None] * a)
    z = rng.standard_normal(p.shape)
    proj = np.sum(np.divide(a, s, out=np.zeros_like(a), where=s > 0) * z, axis=1)
    x = np.sqrt(nf) * (s * z - a * proj[:, None])
    target = k * n - out.sum(axis=1)  # what the Gaussian entries must add up to
    y = np.where(big, nf * p, 0.0) + x
    vb = nf * db
    sv = vb.sum(axis=1)
    shift = np.divide(y.sum(axis=1) - target, sv, out=np.zeros(r_), where=sv > 0)
    y = y - vb * shift[:, None]
    # randomized cumulative rounding: differences of floor(C + u)
    c = np.concatenate([np.zeros((r_, 1)), np.cumsum(y, axis=1)], axis=1)
    c[:, -1] = target  # the exact total (removes float drift)
    out += np.diff(np.floor(c + rng.random((r_, 1))), axis=1).astype(np.int64)
    bad = (out.sum(axis=1) != k * n) | np.any(out < 0, axis=1) | np.any(out > n[:, None], axis=1)
    if bad.any():
        out[bad] = sample_counts(rng, n[bad], p[bad], k)
    return out


#: a row with no Gaussian entry is drawn by :func:`sample_counts` in up to this many
#: groups of tokens, each with its own circle order (exact marginals; the groups break the
#: equal counts of experts whose arcs coincide on one circle)
SPARSE_GROUPS = 8


def _sparse_counts(rng: np.random.Generator, n: np.ndarray, p: np.ndarray, k: int
                   ) -> np.ndarray:
    """Rows whose entries are all sparse (n·pi·(1-pi) < GAUSS_MIN_VAR), drawn exactly:
    each row's tokens split into min(n, SPARSE_GROUPS) groups, each group on its own
    random circle order (the design of the module doc). Unrolled, a group's arcs tile
    [0, k·TICKS) end to end; a token's uniform point u stands for the k points
    u + w·TICKS (w < k), each in exactly one arc, so each token picks k distinct experts
    with P(e) = pi_e. Every count is Binomial(n, pi) (a sum of independent binomials
    with the same pi), rows sum to k·n, entries <= n; with n <= SPARSE_GROUPS every
    token has its own order (the exact per-token law). Cost O(groups·E + tokens·k·log).

    Was (issue 23): the binomials were drawn independently and the whole row residual
    was added to the last expert (expert 255 of DeepSeek-V3 decode took 6x its share)."""
    r_, e_ = p.shape
    out = np.zeros((r_, e_), dtype=np.int64)
    span = k * TICKS
    if bool(np.all(p == p[:1])):
        return _pooled_counts(rng, n, _ticks_row(np.ascontiguousarray(p[0]), k), k)
    step = max(1, (1 << 62) // span // SPARSE_GROUPS)     # rows per chunk: keys fit int64
    for lo in range(0, r_, step):
        hi = min(r_, lo + step)
        nn = n[lo:hi]
        g = np.clip(nn, 1, SPARSE_GROUPS)
        rows = np.repeat(np.arange(hi - lo), g)
        first = np.concatenate([[0], np.cumsum(g)[:-1]])
        j = np.arange(rows.shape[0]) - first[rows]
        part = nn[rows] // g[rows] + (j < nn[rows] % g[rows])
        ng = rows.shape[0]
        order = rng.permuted(np.broadcast_to(np.arange(e_), (ng, e_)), axis=1)
        q = to_ticks(p[lo:hi], k)[rows]
        ends = np.cumsum(np.take_along_axis(q, order, axis=1), axis=1)
        ends += np.arange(ng, dtype=np.int64)[:, None] * span
        grp = np.repeat(np.arange(ng), part)                     # each token's group
        u = rng.integers(0, TICKS, size=grp.shape[0], dtype=np.int64)
        x = (u + grp * span)[:, None] + np.arange(k, dtype=np.int64) * TICKS
        arc = np.searchsorted(ends.ravel(), x.ravel(), side="right")
        expert = order.ravel()[arc]
        tok_row = np.repeat(rows[grp], k)
        out[lo:hi] = np.bincount(tok_row * e_ + expert,
                                 minlength=(hi - lo) * e_).reshape(hi - lo, e_)
    return out


def _ticks_row(pi: np.ndarray, k: int) -> np.ndarray:
    """:func:`to_ticks` of one row, remembered (a layer's micro-batches share the law);
    read-only."""
    return _TICKS_ROW.get((pi.tobytes(), k), lambda: to_ticks(pi, k))


def _pooled_counts(rng: np.random.Generator, n: np.ndarray, q: np.ndarray, k: int
                   ) -> np.ndarray:
    """:func:`_sparse_counts` when every row shares the arcs ``q`` (E,): a pool of random
    circle orders, each token on one of them (:func:`moesim.gating.pooled.pooled_counts`)."""
    return pooled_counts(rng, n, q, k, TICKS)


def _same_setup(pi: np.ndarray, n0: int, r_: int) -> tuple | None:
    """What :func:`_same_rows` computes before its draws (None: an entry is drawn
    exactly), remembered per (pi, n, rows); read-only arrays."""
    return _SAME.get((pi.tobytes(), n0, r_), lambda: _make_same(pi, n0, r_))


def _make_same(pi: np.ndarray, n0: int, r_: int) -> tuple | None:
    p = pi[None, :]
    nf = np.full((r_, 1), float(n0))
    nf1 = nf[:1]
    d = p * (1.0 - p)
    big = nf1 * d >= GAUSS_MIN_VAR
    if (~big & (p > 0)).any():
        return None
    db = np.where(big, d, 0.0)
    a, big_a = _rank_one_row(db)
    s = np.sqrt(big_a[:, None] * a)
    a_s = np.divide(a, s, out=np.zeros_like(a), where=s > 0)
    mean = np.where(big, nf1 * p, 0.0)
    vb = nf1 * db
    sv = np.broadcast_to(vb.sum(axis=1), (r_,))
    out = (a, s, a_s, np.sqrt(nf), mean, vb, sv, sv > 0)
    # the same arrays as flat contiguous rows, for the compiled loop
    return out + ((tuple(np.ascontiguousarray(x).reshape(-1) for x in out[:3] + out[4:6])
                   + tuple(np.ascontiguousarray(x).reshape(-1) for x in (out[3],) + out[6:])),)


def _same_rows(rng: np.random.Generator, n: np.ndarray, pi: np.ndarray, k: int
               ) -> np.ndarray | None:
    """:func:`sample_counts_fast` when every row has the same ``n`` and ``pi`` and no
    entry is drawn exactly: the same draws and the same floating-point operations,
    with everything that does not depend on the draws computed once per (pi, n, rows)
    (:func:`_same_setup`) and broadcast (None: take the general path, nothing drawn)."""
    r_ = n.shape[0]
    setup = _same_setup(pi, int(n[0]), r_)
    if setup is None:
        return None
    z = rng.standard_normal((r_, pi.shape[0]))
    kern = same_kernel()
    if kern is not None:    # the same operations compiled (moesim.gating.same_kernel)
        out = np.empty(z.shape, dtype=np.int64)
        bad = kern(*setup[8], z, rng.random((r_, 1)).reshape(-1), n, k, out)
    else:
        out, bad = _same_numpy(rng, n, k, setup, z)
    if bad.any():
        p = pi[None, :]
        out[bad] = sample_counts(rng, n[bad], np.broadcast_to(p, (r_, p.shape[1]))[bad], k)
    return out


def _same_numpy(rng: np.random.Generator, n: np.ndarray, k: int, setup: tuple,
                z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_same_rows` after its normal draws, on numpy: (counts, rows to redo)."""
    r_ = n.shape[0]
    a, s, a_s, sqrt_nf, mean, vb, sv, sv_pos, _ = setup
    proj = np.sum(a_s * z, axis=1)
    # the general path's expressions, evaluated in place (the same values)
    x = np.multiply(s, z, out=z)
    x -= a * proj[:, None]
    x *= sqrt_nf
    target = k * n
    y = np.add(mean, x, out=x)
    shift = np.divide(y.sum(axis=1) - target, sv, out=np.zeros(r_), where=sv_pos)
    y -= vb * shift[:, None]
    c = np.empty((r_, y.shape[1] + 1))
    c[:, 0] = 0.0
    np.cumsum(y, axis=1, out=c[:, 1:])
    c[:, -1] = target
    c += rng.random((r_, 1))
    np.floor(c, out=c)
    out = (c[:, 1:] - c[:, :-1]).astype(np.int64)
    bad = (out.sum(axis=1) != k * n) | np.any(out < 0, axis=1) | np.any(out > n[:, None], axis=1)
    return out, bad
