"""One RL step's phase durations from its batch: generation on the rollout pool, the
algorithm's trainer phases on the trainer pool (:class:`TrainerCosts`; the phases and
their costs: :mod:`moesim.rl.algorithms`), weight sync and switch.

The trainer's passes run over the batch packed into rows of the trainer's sequence length
(:mod:`moesim.rl.packing`), and over each mini-batch's rows; the log-prob passes over rows
of ``rl.train.logprob_mb_tokens`` when it is set. Each sample is first padded to NeMo RL's
multiple for the trainer's TP and CP (:func:`moesim.rl.packing.pad_multiple`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from moesim.rl.algorithms import StepInputs, algorithm
from moesim.rl.generate import Generation, generate
from moesim.rl.loop import StepDurations
from moesim.rl.packing import (
    pack_rows,
    pad_multiple,
    padded,
    split_mini_batches,
    unpacked_rows,
    verl_micro_batches,
)
from moesim.scenario.sections.rl import RLConfig
from moesim.traffic.step_costs import StepCosts


class TrainerCosts(Protocol):
    def forward_s(self, rows: int, tokens: int | None = None) -> float:
        """One forward pass (log-probs of every token) over ``rows`` packed rows of
        ``tokens`` tokens (None: the trainer's rows)."""

    def train_step_s(self, rows: int) -> float:
        """One training step (forward, backward, optimizer) over ``rows`` packed rows."""

    def reward_model_s(self, rows: int) -> float:
        """The reward model's forward pass over ``rows`` packed rows."""


@dataclass(frozen=True)
class LinearTrainerCosts:
    """Every pass linear in rows: for tests and envelope studies (hand-computable)."""

    forward_per_row_s: float = 0.0
    train_base_s: float = 0.0
    train_per_row_s: float = 0.0
    reward_per_row_s: float = 0.0
    forward_per_token_s: float = 0.0    # rows of ``tokens`` tokens: per token instead

    def forward_s(self, rows: int, tokens: int | None = None) -> float:
        if tokens is not None and self.forward_per_token_s:
            return self.forward_per_token_s * tokens * rows
        return self.forward_per_row_s * rows

    def train_step_s(self, rows: int) -> float:
        return self.train_base_s + self.train_per_row_s * rows

    def reward_model_s(self, rows: int) -> float:
        return self.reward_per_row_s * rows


@dataclass
class Batch:
    """The samples of one RL step: lengths in tokens."""

    prompt: np.ndarray
    response: np.ndarray

    @property
    def tokens(self) -> int:
        return int(self.prompt.sum() + self.response.sum())


@dataclass
class StepWork:
    durations: StepDurations
    generation: Generation
    rows: int                     # packed rows of the whole batch
    mini_batch_rows: list[int]


def step_work(cfg: RLConfig, batch: Batch, seq_len: int, rollout: StepCosts,
              kv_tokens: int, trainer: TrainerCosts, sync_s: float,
              switch_s: tuple[float, float] = (0.0, 0.0), *,
              generation: bool = True, layer_windows: list[int] | None = None,
              reference_swap_s: float = 0.0, logprob_prep_s: float = 0.0,
              train_prep_s: float = 0.0, optimizer_copy_s: float = 0.0) -> StepWork:
    """Durations of every phase of one step over ``batch`` (``generation`` False: all
    but the generation, which partial rollouts simulate with the loop)."""
    ro, tr = cfg.rollout, cfg.train
    gen = (generate(batch.prompt, batch.response, rollout, ro.replicas, kv_tokens,
                    ro.max_batch, members=ro.replica_gpus // ro.tp,
                    layer_windows=layer_windows) if generation else
           Generation(0.0, np.zeros(0), np.zeros(0, dtype=np.int64), 0.0, 0))
    lengths = batch.prompt + batch.response
    longest = int(lengths.max()) if len(lengths) else 0
    lp = tr.logprob_mb_tokens
    if tr.packing == "verl":
        # rows = micro-batches of every rank x dp: the trainer prices ceil(rows / dp)
        def rows_of(x, cap):
            return verl_micro_batches(x, cap, tr.dp) * tr.dp
    elif tr.packing == "none":
        # NeMo RL without packing: every sample padded to the step's longest (itself
        # padded to the TP multiple), whole samples per micro-batch
        longest = int(padded(lengths, pad_multiple(tr.tp, tr.cp)).max()) if len(lengths) else 1

        def rows_of(x, cap):
            return unpacked_rows(x, cap, longest)
    else:
        # each sample padded as NeMo RL pads it for the trainer's TP and CP
        lengths = padded(lengths, pad_multiple(tr.tp, tr.cp))
        rows_of = pack_rows
    rows = rows_of(lengths, seq_len)
    mb_rows = [rows_of(lengths[ix], seq_len)
               for ix in split_mini_batches(len(lengths), tr.mini_batches)]
    work = StepInputs(cfg, trainer, len(lengths), rows, mb_rows,
                      logprob_rows=None if lp is None else rows_of(lengths, lp),
                      logprob_tokens=lp, reference_swap_s=reference_swap_s,
                      logprob_prep_s=logprob_prep_s, train_prep_s=train_prep_s,
                      longest=longest, optimizer_copy_s=optimizer_copy_s)
    d = StepDurations(generate=gen.time_s,
                      trainer=algorithm(cfg.algorithm).trainer_seconds(work),
                      weight_sync=sync_s, switch_in=switch_s[0], switch_out=switch_s[1])
    return StepWork(d, gen, rows, mb_rows)
