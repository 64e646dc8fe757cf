"""Packing the step's sequences (prompt + response) into the trainer's rows of
``seq_len`` tokens, first fit over the sequences longest first (as sequence packing in
verl's ``use_dynamic_bsz`` and Megatron's packed-sequence training put several samples
in one row). A row holds sequences whose lengths sum to at most ``seq_len``."""

from __future__ import annotations

import math

import numpy as np


def pack_rows(lengths: np.ndarray, seq_len: int) -> int:
    """Rows of ``seq_len`` tokens that first-fit-decreasing packs ``lengths`` into."""
    return len(pack(lengths, seq_len))


def pack(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """Tokens in each row when first fit packs ``lengths`` longest first."""
    lengths = np.sort(np.asarray(lengths, dtype=np.int64))[::-1]
    if not len(lengths):
        return np.zeros(0, dtype=np.int64)
    if lengths[0] > seq_len:
        raise ValueError(f"a sequence of {lengths[0]} tokens exceeds rows of {seq_len}")
    free = np.empty(len(lengths), dtype=np.int64)
    rows = 0
    for x in lengths:
        if rows:
            fit = np.flatnonzero(free[:rows] >= x)
            if len(fit):
                free[fit[0]] -= x
                continue
        free[rows] = seq_len - x
        rows += 1
    return seq_len - free[:rows]


def rows_per_replica(rows: int, dp: int) -> int:
    """Rows the busiest of ``dp`` data-parallel replicas gets (the step waits for it)."""
    return math.ceil(rows / dp) if rows else 0


def split_mini_batches(n: int, mini_batches: int) -> list[np.ndarray]:
    """Sample indices of each mini-batch: consecutive equal parts (a prompt's group of
    samples stays together when the group size divides the part)."""
    return np.array_split(np.arange(n), mini_batches)
