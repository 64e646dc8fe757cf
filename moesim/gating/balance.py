"""Load-balance statistics of routed tokens.

Load-balancing loss (Switch Transformers arXiv:2101.03961 §2.2, GShard):
``E · Σ_i f_i · P_i`` with f_i the fraction of routed (token, expert)
assignments going to expert i (before dropping) and P_i the mean router
probability of expert i; it is 1 when both are uniform.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def lb_loss(f: np.ndarray, p: np.ndarray) -> float:
    """E · Σ f_i P_i."""
    return float(f.shape[0] * np.dot(f, p))


@dataclass(frozen=True)
class LoadStats:
    """Per-layer load summary. Token counts are (token, expert) assignments."""

    assigned: np.ndarray     # (E,) routed assignments per expert, before dropping
    kept: np.ndarray         # (E,) after capacity
    dropped: np.ndarray      # (E,) assigned - kept
    f: np.ndarray            # (E,) assigned / total assigned
    p: np.ndarray            # (E,) mean router probability (token-weighted)
    lb_loss: float           # E · Σ f·P
    max_over_mean: float     # max kept load / mean kept load (1 = balanced)
    drop_fraction: float     # dropped / assigned


def load_stats(assigned: np.ndarray, kept: np.ndarray, p: np.ndarray) -> LoadStats:
    """Stats from per-expert assigned and kept counts and P (per expert)."""
    a = np.asarray(assigned, dtype=np.int64)
    k = np.asarray(kept, dtype=np.int64)
    tot = int(a.sum())
    f = a / tot if tot else np.zeros(a.shape)
    mean = k.mean() if k.size else 0.0
    return LoadStats(
        assigned=a, kept=k, dropped=a - k, f=f, p=np.asarray(p, dtype=float),
        lb_loss=lb_loss(f, p),
        max_over_mean=float(k.max() / mean) if mean > 0 else 0.0,
        drop_fraction=float((a - k).sum() / tot) if tot else 0.0,
    )


def layer_stats(routings: Sequence) -> LoadStats:
    """Combine the :class:`MicrobatchRouting` results of one layer (all
    micro-batches): counts add; P is weighted by each micro-batch's tokens."""
    if not routings:
        raise ValueError("layer_stats needs at least one micro-batch")
    assigned = sum(r.assign.sum(axis=0) for r in routings)
    kept = sum(r.kept.sum(axis=0) for r in routings)
    w = np.array([r.n_tokens for r in routings], dtype=float)
    p = sum(wi * r.router_prob_mean for wi, r in zip(w, routings, strict=True))
    p = p / w.sum() if w.sum() > 0 else p
    return load_stats(assigned, kept, p)
