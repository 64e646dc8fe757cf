"""The compiled loop of equal-row counts (moesim.gating.same_kernel) gives the numpy
path's counts bit for bit, and the switch keeps numpy when numba is not wanted."""

import numpy as np
import pytest

from moesim.gating import same_jit
from moesim.gating.sampling import sample_counts_fast


@pytest.fixture
def restore():
    yield
    same_jit.use_same_kernel(None)


def _both(pi, n, rows, k, seed):
    same_jit.use_same_kernel(False)
    want = sample_counts_fast(np.random.default_rng(seed), np.full(rows, n), pi, k)
    same_jit.use_same_kernel(True)
    got = sample_counts_fast(np.random.default_rng(seed), np.full(rows, n), pi, k)
    return want, got


def test_compiled_equal_rows_equal_numpy_bit_for_bit(restore):
    pytest.importorskip("numba")
    rng = np.random.default_rng(3)
    cases = [(256, 8, 4096, 64), (256, 8, 2048, 32), (160, 6, 8192, 16), (64, 2, 100_000, 7),
             (16, 1, 5000, 5), (300, 4, 50_000, 3), (131, 3, 9000, 9), (7, 2, 3000, 4)]
    for e, k, n, rows in cases:
        for pi in (np.full(e, k / e), rng.dirichlet(np.full(e, 50.0)) * k):
            for seed in range(4):
                want, got = _both(pi, n, rows, k, seed)
                assert same_jit._STATE["kernel"] is not None
                assert got.dtype == want.dtype and np.array_equal(got, want)
                assert (got.sum(axis=1) == k * n).all()


def test_compiled_equal_rows_redo_the_same_bad_rows(restore, monkeypatch):
    """Rows outside [0, n] go to the exact path from the same stream point."""
    pytest.importorskip("numba")
    from moesim.gating import same_kernel

    real = same_kernel.same_counts

    def all_bad(*args):
        real(*args)
        return np.ones(args[8].shape[0], dtype=bool)

    e, k, n = 64, 4, 20_000
    pi = np.full(e, k / e)
    same_jit.use_same_kernel(True)
    monkeypatch.setattr(same_kernel, "same_counts", all_bad)
    got = sample_counts_fast(np.random.default_rng(2), np.full(5, n), pi, k)
    assert (got.sum(axis=1) == k * n).all() and (got >= 0).all() and (got <= n).all()


def test_same_kernel_switch(restore):
    same_jit.use_same_kernel(False)
    assert same_jit.same_kernel() is None
    same_jit.use_same_kernel(None)
    assert same_jit._STATE["kernel"] is None


def test_pairwise_sum_equals_numpy_sum_bit_for_bit():
    pytest.importorskip("numba")
    from moesim.gating.same_kernel import _pairwise

    rng = np.random.default_rng(0)
    for n in [0, 1, 7, 8, 9, 15, 16, 127, 128, 129, 135, 136, 240, 250, 255, 256, 257, 300,
              384, 513, 1000, 1808, 4097, 20_000]:
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 6, n)
        assert _pairwise(x, 0, n) + 0.0 == x.sum(), n
        y = rng.standard_normal((3, n))
        assert np.array_equal([0.0 + _pairwise(r, 0, n) for r in y], y.sum(axis=1)), n
