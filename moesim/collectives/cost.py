"""Collective bandwidth as NVIDIA nccl-tests reports it (doc/PERFORMANCE.md).

algbw = S / t with S the per-rank buffer size in nccl-tests' sense (the total size,
per-rank count × n, for all_gather and reduce_scatter); busbw = algbw × factor, which
makes the figure comparable to a link's bandwidth whatever the rank count:

    all_reduce                          2(n-1)/n
    reduce_scatter, all_gather,
    all_to_all(_v)                      (n-1)/n
    broadcast, send_recv                1
"""

from __future__ import annotations

import numpy as np

from moesim.errors import InputError


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw/algbw factor for ``op`` on ``n`` ranks."""
    if n < 1:
        raise InputError("collective", "ranks", "at least one rank", n)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather", "all_to_all", "all_to_all_v"):
        return (n - 1) / n
    if op in ("broadcast", "send_recv"):
        return 1.0
    raise InputError("collective", "op", "a collective op", op)


def effective_size(op: str, n: int, nbytes: float, matrix: np.ndarray | None = None) -> float:
    """S for algbw. For all_to_all_v it is the mean bytes per rank's send buffer
    (matrix total / n), which equals nccl-tests' S when the matrix is uniform."""
    if op == "all_to_all_v" and matrix is not None:
        return float(np.asarray(matrix, dtype=float).sum()) / n
    return float(nbytes)


def algbw_Bps(nbytes: float, time_s: float) -> float:
    """S / t in bytes/s (0 for an instantaneous collective)."""
    return float(nbytes) / time_s if time_s > 0 else 0.0


def busbw_Bps(op: str, n: int, nbytes: float, time_s: float) -> float:
    return algbw_Bps(nbytes, time_s) * bus_factor(op, n)


def ring_all_reduce_time_s(n: int, nbytes: float, bw_Bps: float, alpha_s: float) -> float:
    """Ideal ring all-reduce: 2(n-1)/n · S/B + 2(n-1)·α (nccl-tests PERFORMANCE.md)."""
    return 2 * (n - 1) / n * nbytes / bw_Bps + 2 * (n - 1) * alpha_s
