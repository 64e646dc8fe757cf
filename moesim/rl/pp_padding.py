"""The tokens NeMo RL v0.3's Megatron trainer runs per data-parallel rank with sequence
packing, against the rows moesim prices (pure; a check, no knob).

NVIDIA-NeMo/RL v0.3.0 (b1c86a816):

- ``BatchedDataDict.shard_by_batch_size`` (nemo_rl/distributed/batched_data_dict.py:
  376-479) pads each sequence to ``sequence_length_pad_multiple``, packs each global batch
  (a mini-batch; the whole batch for the log-prob passes) into bins of
  ``max_tokens_per_microbatch`` (``train_mb_tokens`` or ``logprob_mb_tokens``) and deals
  bin ``i`` to rank ``i % dp``; a bin's length is the sum of its padded sequences. v0.3.0
  has no minimum bin count (later versions raise it to a multiple of ``dp``).
- With pipeline parallelism every micro-batch is padded to the rank's longest bin of that
  global batch, so that Megatron's p2p sees one tensor shape:
  ``pad_full_seq_to = get_microbatch_iterator_for_packable_sequences_len()[1]``
  (``max(micro_batch_lengths)``, batched_data_dict.py:725-727) in ``train()``
  (nemo_rl/models/policy/megatron_policy_worker.py:826-831) and ``get_logprobs()``
  (:1001-1011); ``_pack_sequences_for_megatron`` pads the last sequence up to it
  (nemo_rl/models/megatron/common.py:97-98, :122-124). Without PP a micro-batch runs its
  own length.

moesim prices every micro-batch as a full row of ``seq_len`` (``logprob_mb_tokens`` for
the log-prob passes), ``ceil(rows / dp)`` of them on the busiest rank: the most any
rank's bins can be padded to. :func:`row_tokens` gives both counts, so the padding with
PP adds no token moesim does not price. moesim packs first fit decreasing where NeMo RL
packs modified first fit decreasing (Johnson and Garey 1985): the same or one bin more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moesim.rl.packing import pack, padded


def bins_by_rank(lengths: np.ndarray, cap: int, dp: int, multiple: int = 1) -> list[np.ndarray]:
    """Tokens of each bin each of ``dp`` ranks gets: ``lengths`` padded to ``multiple``,
    packed into bins of ``cap`` (first fit, longest first, bins in the order they open),
    bin ``i`` to rank ``i % dp``."""
    rows = pack(padded(lengths, multiple), cap)
    return [rows[r::dp] for r in range(dp)]


def tokens_run(bins: np.ndarray, pp: int) -> int:
    """Tokens one rank's micro-batches run: with ``pp > 1`` each at the longest of
    ``bins`` (``pad_full_seq_to``), else each at its own length."""
    if not len(bins):
        return 0
    return int(len(bins) * bins.max()) if pp > 1 else int(bins.sum())


@dataclass(frozen=True)
class RowTokens:
    """One global batch on its busiest rank (the most tokens run): ``padded`` its
    sequences' tokens after each one's pad to the TP multiple, ``run`` what its
    micro-batches run (PP's padding included), ``micro_batches``; ``priced``: what moesim
    prices on its busiest rank (``ceil(rows / dp)`` rows of ``cap``)."""

    padded: int
    run: int
    micro_batches: int
    priced: int


def row_tokens(lengths: np.ndarray, cap: int, dp: int, pp: int,
               multiple: int = 1) -> RowTokens:
    """:class:`RowTokens` of one global batch of ``lengths``."""
    ranks = bins_by_rank(lengths, cap, dp, multiple)
    bins = max(ranks, key=lambda b: (tokens_run(b, pp), len(b)))
    rows = sum(len(b) for b in ranks)
    return RowTokens(padded=int(bins.sum()), run=tokens_run(bins, pp),
                     micro_batches=len(bins), priced=-(-rows // dp) * cap)
