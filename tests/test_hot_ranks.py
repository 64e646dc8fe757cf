"""Hot ranks: only those whose expert load stands out in their stage (issue 12 item 17)."""

from __future__ import annotations

import numpy as np

from moesim.program.hot import HOT_RULE, hot_ranks


def test_one_hot_rank_of_four_stands_out():
    # stage 0: 10, 10, 10, 30 -> the others' mean 10, std 0: 30 > 12 and > 10
    received = np.array([[10], [10], [10], [30]])
    assert hot_ranks(received, np.zeros(4, dtype=int)) == [3]


def test_stages_compared_separately():
    # stage 0 (ranks 0-3) holds 4 MoE layers, stage 1 (ranks 4-7) one: stage 1's ranks
    # are below stage 0's mean, yet rank 6 stands out within stage 1
    received = np.zeros((8, 5), dtype=int)
    received[:4, :4] = 100
    received[4:, 4] = [10, 10, 40, 10]
    assert hot_ranks(received, np.repeat([0, 1], 4)) == [6]


def test_gradual_skew_marks_only_the_outliers():
    # zipf-like loads 1/r^0.3 over 64 ranks: against the other 63, ranks 0-3 stand more
    # than 2 std out (z = 5.57, 3.42, 2.56, 2.05; rank 4: 1.70); the old rule (>= 1.2 x
    # the mean of all) marked 11 of them
    load = 1.0 / np.arange(1, 65) ** 0.3
    received = (load * 1e4).astype(int)[:, None]
    got = hot_ranks(received, np.zeros(64, dtype=int))
    old = np.flatnonzero(received[:, 0] >= 1.2 * received[:, 0].mean()).tolist()
    assert got == [0, 1, 2, 3] and len(old) == 11


def test_uniform_noise_is_not_hot():
    rng = np.random.default_rng(0)
    received = rng.binomial(100_000, 1 / 64, size=(2048, 3))
    assert hot_ranks(received, np.repeat(np.arange(16), 128)) == []
    assert "std" in HOT_RULE and "1.2" in HOT_RULE
