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

Two evaluations of the same design:

* :func:`sample_tokens` — per token (its own random order and point); returns the
  (tokens, k) expert ids. O(tokens × experts).
* :func:`sample_counts` — counts only: for a group of n tokens sharing one random
  order, the n points fall into the elementary intervals between arc ends with
  multinomial counts, and each expert's count is the sum over the intervals its
  arc covers. O(experts log experts) per group, independent of n. Each expert's
  count is Binomial(n, pi[e]) exactly, as in the per-token path, and the counts
  sum to exactly k·n with every count <= n (so some assignment of k distinct
  experts to each token realizes them). Only the joint law differs: tokens of
  one group share the circle order.
"""

from __future__ import annotations

import numpy as np

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


def sample_sets(rng: np.random.Generator, n: np.ndarray, pi: np.ndarray, k: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Counts-level sampling that keeps which *sets* were drawn, all groups sharing
    one circle order. ``n`` (R,) tokens per group, ``pi`` (E,). Returns ``cnt``
    (R, E): tokens of each group whose point fell in elementary interval i, and
    ``member`` (E, E) bool: whether interval i's set includes item j (exactly k
    per interval). ``cnt @ member`` is a draw of :func:`sample_counts`."""
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    q = to_ticks(np.asarray(pi, dtype=float).reshape(1, -1), k)
    order, qo, starts_o = _arc_starts(rng, q)
    starts = _unorder(order, starts_o)[0]
    a = np.sort(starts)
    ends = np.append(a[1:], TICKS)
    pvals = (ends - a).astype(float) / TICKS
    cnt = rng.multinomial(n, pvals / pvals.sum())
    member = ((a[:, None] - starts[None, :]) % TICKS) < q
    return cnt.astype(np.int64), member
