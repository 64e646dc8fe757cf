"""Counts of many rows that share one inclusion law, few tokens each (every decode step):
the design of :mod:`moesim.gating.sampling` with a pool of circle orders.

The call draws ``POOL_ORDERS`` random circle orders of the E experts; every token takes one
of them and a point on the circle, both uniform, and counts the k experts whose arcs cover
the point's k windings. Given the pool, the tokens are independent and each includes
expert e with probability pi_e whatever the order (its arc's length), so every count is
Binomial(n, pi_e) exactly and tokens' inclusions are uncorrelated: the counts' means,
variances and covariances are those of independent tokens for any pool size, and each
token's k experts follow the design exactly. The pool's size only shapes higher moments
(which k-sets tokens of one call share), so it is set by cost: 32 orders (~0.5 ms a call
at DeepSeek-V3 decode's 8,192 tokens; 256 took 1.3 ms).

All randomness of a call is one draw of raw 64-bit words from the generator
(``rng.bit_generator.random_raw``): ``ceil(pool·(E-1)/2)`` words give the orders' 32-bit
numbers, low half first (Fisher-Yates: row o's swap of position i with
``(v·(i+1)) >> 32``, i = E-1 down to 1; the multiply-shift of Lemire, arXiv:1805.10941,
without its rejection step: each position's odds off by at most E/2^32), then one word per token, tokens laid out
row by row: its point is the top ``log2 TICKS`` bits (exactly uniform), its order
``(low 24 bits · pool) >> 24`` (exactly uniform when pool divides 2^24; otherwise some
orders are a few 10^-6 more likely, which changes nothing of a token's law: the orders
are exchangeable). What follows the draw is deterministic, so numpy
(:func:`_numpy_counts`: one search of the arc ends, a ``bincount``) and the compiled loop
(:mod:`moesim.gating.pool_kernel`: Fisher-Yates, a counting sort, a walk of the sorted
points) give the same integers (``tests/test_sampling_pool.py``). Cost O(pool·E +
tokens·k).

Was (issue 23, before 2026-12-02): 256 orders by ``rng.permuted``, a multinomial of tokens
per order, sorted points and a random permutation of the rows, ~2.1 ms a call at 8,192
tokens of DeepSeek-V3 decode (116 calls a step); now one draw and one compiled call of
~0.5 ms. The counts' means, variances and covariances are the same; the random stream is
not.

No moesim imports but the kernel's loader (:mod:`moesim.gating.same_jit`)."""

from __future__ import annotations

import numpy as np

from moesim.gating.same_jit import POOL

#: circle orders drawn per call (the module doc: any size keeps the counts' means,
#: variances and covariances exact)
POOL_ORDERS = 32


def pooled_counts(rng: np.random.Generator, n: np.ndarray, q: np.ndarray, k: int,
                  ticks: int) -> np.ndarray:
    """(R, E) int64 counts: row r's ``n[r]`` tokens each pick k distinct experts on the
    arcs ``q`` (E,) int64 ticks summing to ``k·ticks``, each <= ``ticks`` (a power of
    two, at most 2^40). Rows sum to ``k·n``; every entry <= n."""
    n = np.asarray(n, dtype=np.int64)
    r_, e_ = n.shape[0], q.shape[0]
    bits = int(ticks).bit_length() - 1
    if ticks != 1 << bits or not 1 <= bits <= POINT_BITS:
        raise ValueError(f"ticks must be a power of two <= 2**{POINT_BITS}, got {ticks}")
    tokens = int(n.sum())
    if tokens == 0:
        return np.zeros((r_, e_), dtype=np.int64)
    pool = min(POOL_ORDERS, tokens)
    raw = rng.bit_generator.random_raw(order_words(pool, e_) + tokens)
    q = np.ascontiguousarray(q, dtype=np.int64)
    kern = POOL.get(tokens * k)   # the compiled loop once enough points ran on numpy
    if kern is not None:
        out = np.zeros(r_ * e_, dtype=np.int64)
        kern(raw, n, q, k, bits, pool, out)
        return out.reshape(r_, e_)
    return _numpy_counts(raw, n, q, k, bits, pool)


#: bits of a token's word that place its point (the top ones; the low 24 pick its order)
POINT_BITS = 40
_LOW24 = np.uint64((1 << 24) - 1)


def order_words(pool: int, e_: int) -> int:
    """Raw words the orders take: one 32-bit number per Fisher-Yates swap, two a word."""
    return (pool * (e_ - 1) + 1) // 2


def orders(raw: np.ndarray, pool: int, e_: int) -> np.ndarray:
    """(pool, E) random orders from ``raw`` (:func:`order_words` uint64 words):
    Fisher-Yates per row, vectorized over the rows (the compiled loop does the same
    swaps)."""
    halves = np.empty(2 * raw.shape[0], dtype=np.uint64)
    halves[0::2] = raw & np.uint64(0xFFFFFFFF)
    halves[1::2] = raw >> np.uint64(32)
    v = halves[:pool * (e_ - 1)].reshape(pool, e_ - 1)
    order = np.tile(np.arange(e_, dtype=np.int64), (pool, 1))
    rows = np.arange(pool)
    for c, i in enumerate(range(e_ - 1, 0, -1)):
        j = ((v[:, c] * np.uint64(i + 1)) >> np.uint64(32)).astype(np.int64)
        held = order[:, i].copy()
        order[:, i] = order[rows, j]
        order[rows, j] = held
    return order


def _numpy_counts(raw: np.ndarray, n: np.ndarray, q: np.ndarray, k: int, bits: int,
                  pool: int) -> np.ndarray:
    """:func:`pooled_counts` after its draw, on numpy."""
    r_, e_ = n.shape[0], q.shape[0]
    ticks = 1 << bits
    span = k * ticks
    cut = order_words(pool, e_)
    order = orders(raw[:cut], pool, e_)
    word = raw[cut:]
    u_t = (word >> np.uint64(64 - bits)).astype(np.int64)
    o_t = (((word & _LOW24) * np.uint64(pool)) >> np.uint64(24)).astype(np.int64)
    ends = np.cumsum(q[order], axis=1) + np.arange(pool, dtype=np.int64)[:, None] * span
    needles = (o_t * span + u_t)[None, :] + (np.arange(k, dtype=np.int64) * ticks)[:, None]
    arc = np.searchsorted(ends.ravel(), needles.ravel(), side="right")  # first end > x
    row = np.tile(np.repeat(np.arange(r_, dtype=np.int64) * e_, n), k)
    return np.bincount(row + order.ravel()[arc], minlength=r_ * e_).reshape(r_, e_)


def use_pool_kernel(on: bool | None) -> None:
    """Tests: ``True`` compiles and uses the compiled loop now, ``False`` keeps numpy,
    ``None`` restores the default (:data:`moesim.gating.same_jit.POOL`)."""
    POOL.use(on)
