"""Packing the step's sequences (prompt + response) into the trainer's rows of
``seq_len`` tokens, first fit over the sequences longest first (as sequence packing in
verl's ``use_dynamic_bsz`` and Megatron's packed-sequence training put several samples
in one row). A row holds sequences whose lengths sum to at most ``seq_len``.

NeMo RL's sequence packing (``BatchedDataDict.shard_by_batch_size`` with
``sequence_packing_args``, nemo_rl/distributed/batched_data_dict.py, NVIDIA-NeMo/RL
7ea279abf) differs in two ways that :func:`pack_for_replicas` follows: each sequence is
first padded to a multiple of ``sequence_length_pad_multiple`` (the policy's
``make_sequence_length_divisible_by``; for a Megatron worker ``2 cp tp`` with context
parallelism, else ``tp``: nemo_rl/models/policy/teacher_worker_group.py), and the
packer's bins (micro-batches of ``train_mb_tokens`` or ``logprob_mb_tokens``) are made
at least ``dp`` and a multiple of ``dp`` (``min_bin_count = bin_count_multiple =
shards``, ``SequencePacker._adjust_bin_count`` in nemo_rl/data/packing/algorithms.py,
which moves one sequence at a time into new bins), dealt round-robin to the ranks. Its
default packer is modified first fit decreasing (Johnson and Garey 1985); moesim packs
first fit decreasing, which fills the same or one bin more on such batches.
"""

from __future__ import annotations

import math

import numpy as np


class PackedRows(int):
    """A count of packed rows that also carries rows' sequence lengths (``members``, each
    row's in the order first fit placed them; ``count`` rows priced, ``len(members)``
    unless given), for the pricing of a row's attention per sequence
    (:mod:`moesim.rl.packed_attention`); an ``int`` everywhere else."""

    members: tuple[tuple[int, ...], ...]

    def __new__(cls, members, count: int | None = None) -> PackedRows:
        rows = int.__new__(cls, len(members) if count is None else count)
        rows.members = tuple(tuple(int(x) for x in m) for m in members)
        return rows


def pack_rows(lengths: np.ndarray, seq_len: int) -> PackedRows:
    """Rows of ``seq_len`` tokens that first-fit-decreasing packs ``lengths`` into (with
    each row's sequences, :class:`PackedRows`)."""
    return PackedRows(pack_members(lengths, seq_len))


def pack_members(lengths: np.ndarray, seq_len: int) -> list[list[int]]:
    """Each row's sequence lengths when first fit packs ``lengths`` longest first (the
    rows of :func:`pack`)."""
    lengths = np.sort(np.asarray(lengths, dtype=np.int64))[::-1]
    if len(lengths) and lengths[0] > seq_len:
        raise ValueError(f"a sequence of {lengths[0]} tokens exceeds rows of {seq_len}")
    free = np.empty(len(lengths), dtype=np.int64)
    rows: list[list[int]] = []
    for x in lengths:
        if rows:
            fit = np.flatnonzero(free[:len(rows)] >= x)
            if len(fit):
                free[fit[0]] -= x
                rows[fit[0]].append(int(x))
                continue
        free[len(rows)] = seq_len - x
        rows.append([int(x)])
    return rows


def one_row(rows: int) -> int:
    """One row standing for ``rows``: its sequences with it when ``rows`` carries them
    (:class:`PackedRows`; a pass priced per row then takes their mean row), else 1."""
    members = getattr(rows, "members", None)
    if not members:
        return 1
    return PackedRows(members, 1)


def pack(lengths: np.ndarray, seq_len: int) -> np.ndarray:
    """Tokens in each row when first fit packs ``lengths`` longest first."""
    return np.array([sum(r) for r in pack_members(lengths, seq_len)], dtype=np.int64)


def pad_multiple(tp: int, cp: int) -> int:
    """NeMo RL's per-sequence pad multiple for a Megatron worker: ``2 cp tp`` with context
    parallelism, else ``tp``."""
    return 2 * cp * tp if cp > 1 else tp


def padded(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """Each length rounded up to a multiple of ``multiple``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return -(-lengths // multiple) * multiple


def pack_for_replicas(lengths: np.ndarray, seq_len: int, dp: int, multiple: int = 1) -> int:
    """Rows (micro-batches) NeMo RL makes of ``lengths`` for ``dp`` data-parallel ranks:
    each length padded to ``multiple``, packed into rows of ``seq_len``, the row count
    raised to at least ``dp`` and to a multiple of ``dp``, but to no more rows than
    sequences (NeMo RL refuses such a batch; moesim leaves the extra ranks idle). The
    busiest rank's rows, ``ceil(rows / dp)``, are what :func:`pack_rows` of the padded
    lengths gives over ``dp`` ranks."""
    n = len(lengths)
    if not n:
        return 0
    rows = pack_rows(padded(lengths, multiple), seq_len)
    return min(-(-max(rows, dp) // dp) * dp, n)


def balanced_ranks(lengths: np.ndarray, dp: int) -> np.ndarray:
    """Tokens each of ``dp`` data-parallel ranks gets when the samples are dealt as
    verl's ``trainer.balance_batch: True`` deals them (verl/trainer/config/
    ppo_trainer.yaml; equal sample counts, token sums balanced by Karmarkar-Karp,
    ``get_seqlen_balanced_partitions(..., equal_size=True)``): here longest first, each
    to the rank with the fewest tokens that still has room."""
    lengths = np.sort(np.asarray(lengths, dtype=np.int64))[::-1]
    room = -(-len(lengths) // dp)
    tokens = np.zeros(dp, dtype=np.int64)
    count = np.zeros(dp, dtype=np.int64)
    for x in lengths:
        open_ = np.flatnonzero(count < room)
        r = open_[np.argmin(tokens[open_])]
        tokens[r] += x
        count[r] += 1
    return tokens


def verl_micro_batches(lengths: np.ndarray, max_token_len: int, dp: int) -> int:
    """Micro-batches every rank runs under verl's dynamic batch size
    (``use_dynamic_bsz``, ``rearrange_micro_batches`` in verl/utils/seqlen_balancing.py,
    volcengine/verl b178a3cd5): each rank's ``min(samples, ceil(tokens /
    max_token_len))``, the largest over the data-parallel group (an all-reduce of the
    maximum), each micro-batch a balanced share of the rank's tokens (which may pass
    ``max_token_len`` a little: moesim prices it as a row of ``max_token_len``). Returns
    0 for no samples."""
    if not len(lengths):
        return 0
    per_rank = -(-len(lengths) // dp)
    return int(min(per_rank, -(-balanced_ranks(lengths, dp).max() // max_token_len)))


def unpacked_rows(lengths: np.ndarray, row_tokens: int, longest: int) -> int:
    """Micro-batches NeMo RL makes of ``lengths`` without sequence packing
    (``sequence_packing.enabled: false``, ``dynamic_batching.enabled: false``, as
    examples/configs/grpo_math_qwen30ba3b_megatron.yaml at NVIDIA-NeMo/RL v0.3.0 =
    b1c86a816 sets them): grpo.py pads every sample to the step's longest
    (``batched_message_log_to_flat_message``, rounded to
    ``make_sequence_length_divisible_by``), and ``megatron_policy_worker.py`` runs
    micro-batches of whole padded samples (``train()``: ``make_microbatch_iterator(mbs)``
    over ``[mbs, longest]``; ``get_logprobs()``: ``logprob_batch_size`` samples). A row of
    ``row_tokens`` (``train_mb_tokens = max_total_sequence_length x train_micro_batch_size``)
    holds ``row_tokens // longest`` samples, at least one; the row is priced at
    ``row_tokens``, exact when the longest sample fills the maximum length."""
    if not len(lengths):
        return 0
    per_row = max(1, row_tokens // max(1, int(longest)))
    return -(-len(lengths) // per_row)


def rows_per_replica(rows: int, dp: int) -> int:
    """Rows the busiest of ``dp`` data-parallel replicas gets (the step waits for it)."""
    return math.ceil(rows / dp) if rows else 0


def split_mini_batches(n: int, mini_batches: int) -> list[np.ndarray]:
    """Sample indices of each mini-batch: consecutive equal parts (a prompt's group of
    samples stays together when the group size divides the part)."""
    return np.array_split(np.arange(n), mini_batches)
