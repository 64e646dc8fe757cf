"""The compiled pooled sampler gives numpy's counts (issue 23).

``moesim.gating.pooled.pooled_counts`` (every decode step's routing: few tokens per
source, every row the same law) draws its floats once, then builds the orders and counts
each token's k experts on numpy (Fisher-Yates vectorized over the orders, one search of
the arc ends and a ``bincount``) or, once enough points have been counted, in the numba
loop of :mod:`moesim.gating.pool_kernel`. Both must give the same integers from the same
draws.
"""

from __future__ import annotations

import numpy as np
import pytest

from moesim.gating import pooled, sampling
from moesim.gating.sampling import TICKS, cap_probs, to_ticks

pytest.importorskip("numba")


@pytest.fixture(autouse=True)
def _restore():
    yield
    pooled.use_pool_kernel(None)


def _counts(on: bool, seed: int, n, q, k):
    pooled.use_pool_kernel(on)
    return sampling._pooled_counts(np.random.default_rng(seed), np.asarray(n), q, k)


@pytest.mark.parametrize("rows,per_row,experts,k,skew", [
    (128, 64, 256, 8, 0.3),     # deepseek-v3-decode: 64 tokens per source, EP128
    (8, 1, 8, 2, 0.0),          # one token per source
    (3, 5, 16, 4, 1.2),         # strong skew, fewer tokens than the pool
    (16, 300, 64, 6, 0.0),      # more tokens than POOL_ORDERS
    (1, 300_000, 16, 4, 0.5),   # ~1,200 points per order
])
def test_kernel_counts_equal_numpy(rows, per_row, experts, k, skew):
    w = 1.0 / np.arange(1, experts + 1) ** skew
    q = to_ticks(cap_probs(w, k), k)
    n = np.full(rows, per_row)
    for seed in range(3):
        a = _counts(False, seed, n, q, k)
        b = _counts(True, seed, n, q, k)
        assert a.dtype == b.dtype == np.int64
        np.testing.assert_array_equal(a, b)
        assert (b.sum(axis=1) == k * n).all() and (b <= n[:, None]).all()


def test_kernel_by_hand():
    """Two experts of pi = 1 each with k = 2: every token takes both, whatever its point
    and order: each of the 3 rows of 4 tokens counts 4 and 4."""
    q = np.array([TICKS, TICKS], dtype=np.int64)
    out = _counts(True, 0, [4, 4, 4], q, 2)
    np.testing.assert_array_equal(out, [[4, 4], [4, 4], [4, 4]])


def test_numpy_until_enough_points():
    pooled.use_pool_kernel(None)
    assert pooled.POOL.get(10) is None       # below POOL_JIT_AFTER: numpy


def _words(*v32):
    """uint64 words holding these 32-bit numbers, low half first."""
    v = list(v32) + [0] * (len(v32) % 2)
    return np.array([v[i] | (v[i + 1] << 32) for i in range(0, len(v), 2)], dtype=np.uint64)


def test_orders_by_hand():
    """Fisher-Yates from 32-bit numbers: E = 3, position 2 swaps with (v0·3) >> 32, then
    position 1 with (v1·2) >> 32. v = (0.1, 0.9)·2^32: 2<->0 gives [2, 1, 0], then 1<->1;
    v = (0.7, 0.2)·2^32: 2<->2, then 1<->0: [1, 0, 2]."""
    f = 1 << 32
    assert pooled.order_words(1, 3) == 1
    np.testing.assert_array_equal(pooled.orders(_words(f // 10, 9 * f // 10), 1, 3),
                                  [[2, 1, 0]])
    np.testing.assert_array_equal(pooled.orders(_words(7 * f // 10, f // 5), 1, 3),
                                  [[1, 0, 2]])


def test_orders_uniform():
    """Every one of the 6 orders of 3 experts about equally often (chi-square, 5 dof:
    the 0.999 quantile is 20.5)."""
    rng = np.random.default_rng(5)
    o = pooled.orders(rng.bit_generator.random_raw(pooled.order_words(6000, 3)), 6000, 3)
    code = o[:, 0] * 9 + o[:, 1] * 3 + o[:, 2]
    _, seen = np.unique(code, return_counts=True)
    assert seen.size == 6
    assert ((seen - 1000.0) ** 2 / 1000.0).sum() < 20.5


def test_one_draw_per_call():
    """The call's randomness is one draw of raw words: ceil(pool·(E-1)/2) for the orders
    and one per token; the generator after it is where that draw leaves it."""
    q = to_ticks(np.full(16, 0.25), 4)
    n = np.array([3, 0, 5])
    for on in (False, True):
        a, b = np.random.default_rng(2), np.random.default_rng(2)
        pooled.use_pool_kernel(on)
        pooled.pooled_counts(a, n, q, 4, TICKS)
        b.bit_generator.random_raw((8 * 15 + 1) // 2 + 8)
        assert a.integers(1 << 62) == b.integers(1 << 62)


def test_ticks_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        pooled.pooled_counts(np.random.default_rng(0), np.array([1]), np.array([3, 3]), 1, 6)


@pytest.mark.parametrize("orders", [1, 32])
def test_any_pool_keeps_variance_and_covariance(monkeypatch, orders):
    """The module doc's claim: given the pool, tokens are independent and include expert
    e with probability pi_e whatever the order, so over calls a count's variance is
    n·pi(1-pi) and two experts' covariance n·(P(both) - pi_e·pi_f), even with one order
    shared by every token of a call. E = 16, k = 4, pi = 1/4, n = 16 tokens: variance
    16·1/4·3/4 = 3; the design's P(both) = k(k-1)/(E(E-1)) = 1/20, covariance
    16·(1/20 - 1/16) = -0.2. 4,000 calls: the variance's standard error ~0.07, the
    covariance's ~0.05."""
    monkeypatch.setattr(pooled, "POOL_ORDERS", orders)
    pooled.use_pool_kernel(False)
    q = to_ticks(np.full(16, 0.25), 4)
    rng = np.random.default_rng(17)
    c = np.array([pooled.pooled_counts(rng, np.array([16]), q, 4, TICKS)[0]
                  for _ in range(4000)])
    assert (c.sum(axis=1) == 64).all()
    var = c.var(axis=0, ddof=1)
    np.testing.assert_allclose(var.mean(), 3.0, rtol=0.05)
    cov = np.cov(c[:, 0], c[:, 1])[0, 1]
    assert abs(cov - (-0.2)) < 0.2, cov
