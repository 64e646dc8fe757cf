"""The hottest expert per rank of a route record, read from the nonzero entries only,
equals numpy's argmax and max over the whole (ranks, experts) matrix, ties included."""

import numpy as np

from moesim.engine.fast.records import _hottest


def _want(local):
    top = local.max(axis=1)
    return np.where(top > 0, local.argmax(axis=1), -1), top


def test_hottest_equals_argmax_with_ties_and_empty_rows():
    rng = np.random.default_rng(11)
    for dens in (0.02, 0.3, 1.0, 0.0):
        local = rng.integers(0, 4, (16, 40)) * (rng.random((16, 40)) < dens)
        local[3] = 0                                   # a rank with no tokens
        local[5, [7, 20, 33]] = 9                      # a tie: the first column wins
        flat = np.flatnonzero(local)
        rows, vals = flat // 40, local.ravel()[flat]
        hot, top = _hottest(16, 40, flat, rows, vals)
        want_hot, want_top = _want(local)
        assert hot.tolist() == want_hot.tolist() and top.tolist() == want_top.tolist()
        assert hot[3] == -1 and top[3] == 0
        assert hot[5] == 7 and top[5] == 9
