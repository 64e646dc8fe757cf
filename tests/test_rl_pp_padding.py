"""NeMo RL v0.3's micro-batch tokens with pipeline parallelism (moesim.rl.pp_padding):
bins dealt to ranks, each micro-batch padded to the rank's longest bin with PP, by hand."""

from __future__ import annotations

import numpy as np

from moesim.rl.pp_padding import RowTokens, bins_by_rank, row_tokens, tokens_run


def test_bins_dealt_round_robin():
    # first fit, longest first, rows of 4: 3 | 2 2 | then 1 joins the 3, the last 1 opens
    # a third bin: bins of 4, 4, 1 tokens; bin i to rank i % 2
    ranks = bins_by_rank(np.array([3, 2, 2, 1, 1]), 4, dp=2)
    assert [r.tolist() for r in ranks] == [[4, 1], [4]]


def test_pp_pads_every_micro_batch_to_the_ranks_longest_bin():
    bins = np.array([4, 4, 1])
    assert tokens_run(bins, pp=2) == 12          # three micro-batches of 4
    assert tokens_run(bins, pp=1) == 9           # each its own length
    assert tokens_run(np.zeros(0, dtype=np.int64), pp=2) == 0


def test_a_tiny_batch_with_pp2_by_hand():
    # DP2: rank 0 holds bins of 4 and 1 (runs 2 x 4 = 8 with PP2), rank 1 one of 4;
    # moesim prices ceil(3 / 2) = 2 rows of 4 on the busiest rank: as many tokens
    lengths = np.array([3, 2, 2, 1, 1])
    assert row_tokens(lengths, 4, dp=2, pp=2) == RowTokens(padded=5, run=8, micro_batches=2,
                                                           priced=8)
    assert row_tokens(lengths, 4, dp=2, pp=1) == RowTokens(padded=5, run=5, micro_batches=2,
                                                           priced=8)
    # each sequence padded to TP2's multiple first: 4 2 2 2 2 -> bins of 4, 4, 4
    assert row_tokens(lengths, 4, dp=1, pp=2, multiple=2) == RowTokens(
        padded=12, run=12, micro_batches=3, priced=12)
    # a bin shorter than the row: PP pads to the longest bin (6), not to the row (8)
    assert row_tokens(np.array([3, 1, 2]), 8, dp=1, pp=2) == RowTokens(
        padded=6, run=6, micro_batches=1, priced=8)
