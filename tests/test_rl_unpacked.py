"""NeMo RL without sequence packing (rl.train.packing: none) and the log-prob passes'
fp32 log-softmax (rl.train.logprob_softmax: nemo), worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.rl import loss
from moesim.rl.packing import pack_rows, unpacked_rows
from moesim.rl.phases import Batch, LinearTrainerCosts, step_work
from moesim.scenario.sections.rl import RLConfig, TrainPool, summary_dict


def _cfg(**train) -> RLConfig:
    return RLConfig(prompts_per_step=4, samples_per_prompt=4,
                    train=TrainPool(gpus=8, **train))


def test_unpacked_rows_hold_whole_padded_samples():
    # every sample padded to the longest (500): a row of 512 holds one, of 1,024 two
    lengths = np.array([100, 500, 60, 200, 150])
    assert unpacked_rows(lengths, 512, 500) == 5
    assert unpacked_rows(lengths, 1024, 500) == 3          # ceil(5 / 2)
    assert unpacked_rows(lengths, 2048, 500) == 2          # 4 a row: ceil(5 / 4)
    # packing puts the short ones together: 500 | 200 + 150 + 100 + 60 = 510
    assert pack_rows(lengths, 512) == 2
    # a row shorter than the longest still holds one sample
    assert unpacked_rows(lengths, 256, 500) == 5
    assert unpacked_rows(np.zeros(0, dtype=np.int64), 512, 1) == 0


def test_no_packing_reaches_the_trainer_and_the_logprob_passes():
    # 16 samples: 15 of 256 tokens and one of 511, padded (tp 2) to 512 = the longest;
    # packed, the 15 go two to a row of 512 (8 rows) and the long one alone: 9 rows
    b = Batch(np.full(16, 64), np.array([192] * 15 + [447]))
    tc = LinearTrainerCosts(train_per_row_s=1.0, forward_per_token_s=1e-6)
    packed = step_work(_cfg(tp=2), b, 512, None, 0, tc, 0.0, generation=False)
    assert packed.rows == 9
    # unpacked: one sample per row of 512, 16 rows; 4 optimizer steps of 4 rows
    w = step_work(_cfg(tp=2, packing="none", mini_batches=4, logprob_mb_tokens=2048), b,
                  512, None, 0, tc, 0.0, generation=False)
    assert w.rows == 16
    assert w.mini_batch_rows == [4, 4, 4, 4]
    assert w.durations.trainer["train"] == pytest.approx(16.0, rel=1e-12)
    # log-prob rows of 2,048 tokens hold 4 samples of 512: 4 rows of 2,048 tokens
    assert w.durations.trainer["old_logprob"] == pytest.approx(4 * 2048 * 1e-6, rel=1e-12)


def test_logprob_softmax_bytes_by_hand():
    # a row of 16,384 tokens, vocabulary 151,936 over TP 2: 75,968 columns each;
    # 54 bytes per element less the sampler's 6 already priced
    n = 16384 * 75968
    assert loss.elements(16384, 151936, 2) == n == 1_244_659_712
    assert loss.logprob_extra_bytes(16384, 151936, 2) == pytest.approx(48.0 * n, rel=1e-15)
    assert loss.logprob_extra_bytes(16384, 151936, 2) == pytest.approx(59_743_666_176.0)


def test_the_summary_echoes_the_knobs_only_when_on():
    assert "logprob_softmax" not in summary_dict(_cfg())["train"]
    assert summary_dict(_cfg(logprob_softmax="nemo"))["train"]["logprob_softmax"] == "nemo"
    assert summary_dict(_cfg(packing="none"))["train"]["packing"] == "none"


def test_v06_logprob_softmax_is_one_pass_lighter():
    # v0.6.0: cast 6 + amax 4 + sub 8 + exp 8 + sum 4 + sub 8 + exp 8 = 46 bytes, less 6
    n = 4096 * 151936
    assert loss.logprob_extra_bytes(4096, 151936, 1, kind="nemo-v06") == pytest.approx(
        40.0 * n, rel=1e-15)
    assert loss.logprob_extra_bytes(4096, 151936, 1, kind="nemo-v06") == pytest.approx(
        24_893_194_240.0)
