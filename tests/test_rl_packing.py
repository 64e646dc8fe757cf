"""The trainer's batch as NeMo RL packs and runs it, by hand: samples padded to the
trainer's TP/CP multiple and packed into rows, rows made a multiple of the data-parallel
ranks, one optimizer step per mini-batch, log-prob passes over rows of their own
``logprob_mb_tokens``."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.rl.packing import pack, pack_for_replicas, pack_rows, pad_multiple, padded
from moesim.rl.phases import Batch, LinearTrainerCosts, step_work
from moesim.scenario.sections.rl import RLConfig, TrainPool


def test_a_small_batch_packs_into_rows_by_hand():
    # longest first into rows of 512: 300 + 200 = 500; 150 + 100 + 60 = 310
    assert list(pack(np.array([100, 300, 60, 200, 150]), 512)) == [500, 310]
    # 260 + 250 = 510 share a row; padded to multiples of 8 (264 + 256 = 520) they do not
    assert pack_rows(np.array([260, 250]), 512) == 1
    assert list(padded(np.array([260, 250]), 8)) == [264, 256]
    assert pack_rows(padded(np.array([260, 250]), 8), 512) == 2


@pytest.mark.parametrize("tp, cp, want", [(1, 1, 1), (4, 1, 4), (2, 2, 8), (1, 4, 8)])
def test_nemo_rls_pad_multiple(tp, cp, want):
    # 2 cp tp with context parallelism, else tp
    assert pad_multiple(tp, cp) == want


def test_rows_are_a_multiple_of_the_data_parallel_ranks():
    five = np.full(5, 100)              # 500 tokens: one row of 512
    assert pack_for_replicas(five, 512, dp=1) == 1
    assert pack_for_replicas(five, 512, dp=2) == 2      # at least one row per rank
    assert pack_for_replicas(five, 512, dp=4) == 4
    assert pack_for_replicas(five, 512, dp=8) == 5      # no more rows than sequences
    # five of 400 a row each, three of 50 beside them: 5 rows, raised to 6 for 3 ranks
    mix = np.array([400] * 5 + [50] * 3)
    assert pack_rows(mix, 512) == 5
    assert pack_for_replicas(mix, 512, dp=3) == 6
    # the busiest rank's rows are ceil(rows / dp) of the plain packing: 6 / 2 = ceil(5 / 2)
    assert pack_for_replicas(mix, 512, dp=2) == 6


def _cfg(**train) -> RLConfig:
    return RLConfig(prompts_per_step=4, samples_per_prompt=4,
                    train=TrainPool(gpus=8, **train))


BATCH = Batch(np.full(16, 64), np.full(16, 192))        # 16 samples of 256 tokens


@pytest.mark.parametrize("mini_batches, epochs, want", [
    (1, 1, 1.0 + 0.1 * 8),              # 16 samples, 2 per row of 512: one step of 8 rows
    (4, 1, 4 * (1.0 + 0.1 * 2)),        # 4 samples per mini-batch: 4 steps of 2 rows
    (4, 2, 2 * 4 * (1.0 + 0.1 * 2)),    # each epoch repeats the 4 optimizer steps
])
def test_one_optimizer_step_per_mini_batch(mini_batches, epochs, want):
    tc = LinearTrainerCosts(train_base_s=1.0, train_per_row_s=0.1)
    w = step_work(_cfg(mini_batches=mini_batches, epochs=epochs), BATCH, 512, None, 0, tc,
                  0.0, generation=False)
    assert w.durations.trainer["train"] == pytest.approx(want, rel=1e-12)
    assert w.mini_batch_rows == [8 // mini_batches] * mini_batches


def test_a_logprob_pass_is_the_forward_of_its_packed_rows():
    tc = LinearTrainerCosts(forward_per_row_s=0.05, forward_per_token_s=1e-6)
    # default: the trainer's 8 rows of 512
    w = step_work(_cfg(), BATCH, 512, None, 0, tc, 0.0, generation=False)
    assert w.durations.trainer["old_logprob"] == pytest.approx(0.05 * 8)
    # logprob_mb_tokens 1024: 4 samples per row, 4 rows of 1,024 tokens
    w = step_work(_cfg(logprob_mb_tokens=1024), BATCH, 512, None, 0, tc, 0.0,
                  generation=False)
    for phase in ("old_logprob", "reference"):
        assert w.durations.trainer[phase] == pytest.approx(4 * 1024 * 1e-6, rel=1e-12)
    assert w.rows == 8                  # training still packs rows of 512


def test_padding_for_tp_reaches_the_trainers_rows():
    # 16 samples of 64 + 193 = 257 tokens: 2 per row of 520 (514); with cp 2 and tp 2
    # each is padded to a multiple of 8, 264, and 264 + 264 = 528 > 520: one per row
    b = Batch(np.full(16, 64), np.full(16, 193))        # 257 tokens
    tc = LinearTrainerCosts(train_per_row_s=1.0)
    assert step_work(_cfg(), b, 520, None, 0, tc, 0.0, generation=False).rows == 8
    w = step_work(_cfg(tp=2, cp=2), b, 520, None, 0, tc, 0.0, generation=False)
    assert w.rows == 16


def test_verls_dynamic_batch_by_hand():
    from moesim.rl.packing import balanced_ranks, verl_micro_batches

    # 6 samples over 2 ranks, 3 each, longest first to the lighter rank with room:
    # 500 -> r0, 400 -> r1, 300 -> r1 (700), 200 -> r0 (700), 100 -> r0, 100 -> r1
    lengths = np.array([500, 400, 300, 200, 100, 100])
    assert list(balanced_ranks(lengths, 2)) == [800, 800]
    assert verl_micro_batches(lengths, 512, 2) == 2          # ceil(800 / 512)
    assert verl_micro_batches(lengths, 4096, 2) == 1
    assert verl_micro_batches(lengths, 512, 6) == 1          # one sample per rank
    # no more micro-batches than a rank's samples: 3 samples of 500 on one rank
    assert verl_micro_batches(np.full(3, 500), 512, 1) == 3


def test_verl_packing_counts_each_ranks_tokens_not_rows():
    # 16 samples of 300 tokens on 8 data-parallel ranks: 2 samples, 600 tokens per rank ->
    # 2 micro-batches of 512 each, rows = 2 x 8 (nemo: one sample per row of 512, 16 rows)
    b = Batch(np.full(16, 64), np.full(16, 236))
    tc = LinearTrainerCosts(train_base_s=1.0, train_per_row_s=0.1)
    nemo = step_work(_cfg(), b, 512, None, 0, tc, 0.0, generation=False)
    verl = step_work(_cfg(packing="verl"), b, 512, None, 0, tc, 0.0, generation=False)
    assert nemo.rows == verl.rows == 16
    # rows of 1,024: nemo packs 3 samples per row (900 tokens), 6 rows; verl keeps each
    # rank's 600 tokens in one micro-batch: 1 x 8 rows
    nemo = step_work(_cfg(), b, 1024, None, 0, tc, 0.0, generation=False)
    verl = step_work(_cfg(packing="verl"), b, 1024, None, 0, tc, 0.0, generation=False)
    assert (nemo.rows, verl.rows) == (6, 8)
    assert nemo.durations.trainer["train"] == pytest.approx(1.0 + 0.1 * 6)
    assert verl.durations.trainer["train"] == pytest.approx(1.0 + 0.1 * 8)
