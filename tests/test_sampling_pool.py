"""The compiled counting loop of the pooled sampler gives numpy's counts (issue 23).

``moesim.gating.sampling._pooled_counts`` (every decode step's routing: few tokens per
source, every row the same law) counts each token's k experts with one search of the arc
ends and a ``bincount``, or, once enough points have been counted, with the numba loop of
:mod:`moesim.gating.pool_kernel`. Both must give the same integers from the same draws.
"""

from __future__ import annotations

import numpy as np
import pytest

from moesim.gating import sampling
from moesim.gating.sampling import TICKS, cap_probs, to_ticks

pytest.importorskip("numba")


@pytest.fixture(autouse=True)
def _restore():
    yield
    sampling.use_pool_kernel(None)


def _counts(on: bool, seed: int, n, q, k):
    sampling.use_pool_kernel(on)
    return sampling._pooled_counts(np.random.default_rng(seed), np.asarray(n), q, k)


@pytest.mark.parametrize("rows,per_row,experts,k,skew", [
    (128, 64, 256, 8, 0.3),     # deepseek-v3-decode: 64 tokens per source, EP128
    (8, 1, 8, 2, 0.0),          # one token per source
    (3, 5, 16, 4, 1.2),         # strong skew, fewer tokens than the pool
    (16, 300, 64, 6, 0.0),      # more tokens than POOL_ORDERS
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
    sampling.use_pool_kernel(None)
    assert sampling.POOL.get(10) is None       # below POOL_JIT_AFTER: numpy


def test_orders_drawn_as_from_the_broadcast_view():
    """The pool's orders come from contiguous rows 0..E-1 (faster to shuffle): the same
    orders and the same generator state after as from the broadcast view drawn before."""
    a, b = np.random.default_rng(11), np.random.default_rng(11)
    old = a.permuted(np.broadcast_to(np.arange(256), (256, 256)), axis=1)
    new = b.permuted(sampling._identity_rows(256, 256), axis=1)
    np.testing.assert_array_equal(old, new)
    assert a.integers(1 << 62) == b.integers(1 << 62)
