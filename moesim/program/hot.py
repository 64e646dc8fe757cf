"""Which ranks are "hot": those whose expert load stands out in their pipeline stage.

A rank's load is the tokens its experts receive, summed over its stage's MoE layers
(the per-layer maximum over micro-batches, as the builder records it). Ranks of
different stages hold different layers, so each rank is compared with the OTHER
ranks of its own stage (leaving it out, so one hot rank among 2 or 4 still stands
out: with itself in, its z-score can never pass (n-1)/sqrt(n)). A rank is hot when
its load exceeds both ``HOT_FACTOR`` × their mean and their mean + ``HOT_Z``
standard deviations: the factor keeps uniform routing's sampling noise out (at 2048
ranks some rank is always 2 std above the mean), the deviation keeps a gradual skew
(zipf) from marking half the stage.
Pure numpy.
"""

from __future__ import annotations

import numpy as np

HOT_FACTOR = 1.2
HOT_Z = 2.0
HOT_RULE = (f"expert load (tokens received, summed over the stage's MoE layers) above both "
            f"{HOT_FACTOR} x the mean and the mean + {HOT_Z:g} std of the other ranks of "
            "its pipeline stage")


def hot_ranks(received: np.ndarray, stage_of: np.ndarray) -> list[int]:
    """Hot ranks (ascending) from ``received`` (world, moe_layers) and the stage of
    every rank (world,)."""
    received = np.asarray(received)
    if received.size == 0:
        return []
    load = received.sum(axis=1).astype(float)
    stage_of = np.asarray(stage_of)
    out: list[int] = []
    for s in np.unique(stage_of):
        ranks = np.flatnonzero(stage_of == s)
        n = len(ranks)
        x = load[ranks]
        if n < 2 or x.max() <= 0:
            continue
        mean = (x.sum() - x) / (n - 1)                     # of the others
        var = np.maximum(((x ** 2).sum() - x ** 2) / (n - 1) - mean ** 2, 0.0)
        hot = (x > HOT_FACTOR * mean) & (x > mean + HOT_Z * np.sqrt(var))
        out += [int(r) for r in ranks[hot]]
    return sorted(out)
