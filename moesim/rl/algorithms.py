"""RL algorithms by name (``rl.algorithm``): each registered once in :data:`ALGORITHMS`
with its phases.

Every algorithm here generates its step's samples on the rollout pool (``generate``),
runs its *trainer phases* in turn on the trainer pool (scoring passes, then the policy
update, always the last), and loads the new weights into the rollout engines
(``weight_sync``; colocated, a ``switch`` onloads and offloads the trainer around its
phases). :class:`Algorithm` says which trainer phases, in which order, and what each one
costs from the step's packed rows (:class:`StepInputs`); the step loop
(:mod:`moesim.rl.loop`) lays out whatever phases it is given, and the summary, trace and
plot report the algorithm's :attr:`Algorithm.report` phases. A trainer phase of 0 s (a
pass the config turns off) is left out of the timeline; the policy update never is.

GRPO (Shao et al. 2024, DeepSeekMath §4.1; verl's and NeMo RL's order): reward (rule:
CPU workers; model: a forward pass of the reward model), the old policy's log-probs and
the reference policy's (a forward pass each over all of the step's rows, each optional),
then ``epochs x mini_batches`` optimizer steps. With ``rl.train.offload: nemo`` the
colocated host moves before the log-prob passes and before training are phases of their
own (``logprob_prep``, ``train_prep``: :mod:`moesim.rl.offload`), and with
``rl.train.loss_logprob: nemo`` the loss's full-vocabulary log-probs in every
micro-batch (``loss_logprob``: :mod:`moesim.rl.loss`), each 0 s (left out) otherwise. Group-normalised advantages (each sample's
reward minus its group's mean, over the group's standard deviation) are a reduction over a
few thousand numbers on the CPU: no time is charged for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from moesim.rl import call_data
from moesim.rl.logprob_pipeline import step_logprob_s as pipelined_logprob_s
from moesim.rl.pp_p2p import step_train_s as pp_p2p_train_s
from moesim.rl.seq_host import step_logprob_s, step_train_s
from moesim.traffic.registry import Registry


@dataclass(frozen=True)
class StepInputs:
    """What a trainer phase's cost is computed from: the ``rl`` config, the trainer's
    costs (:class:`moesim.rl.phases.TrainerCosts`), the step's ``samples``, its packed
    ``rows`` and each mini-batch's rows; the log-prob passes' rows
    (``logprob_rows``, of ``logprob_tokens`` tokens; None: ``rows`` of the trainer's)."""

    cfg: Any
    trainer: Any
    samples: int
    rows: int
    mini_batch_rows: list[int]
    logprob_rows: int | None = None
    logprob_tokens: int | None = None
    reference_swap_s: float = 0.0       # weights moved around a reference pass
    logprob_prep_s: float = 0.0         # colocated host moves before the log-prob passes
    train_prep_s: float = 0.0           # ... and before the optimizer steps (moesim.rl.offload)
    longest: int = 0                    # the step's longest sample (moesim.rl.call_data)
    optimizer_copy_s: float = 0.0       # one host optimizer step's copies (moesim.rl.cpu_optimizer)

    def logprob_s(self) -> float:
        """One forward-only log-prob pass over the step's samples (as Megatron's pipeline
        runs it with ``rl.train.logprob_pipeline: megatron``, :mod:`moesim.rl.logprob_pipeline`)."""
        piped = pipelined_logprob_s(self)
        if piped is not None:
            return piped
        if self.logprob_tokens is None:
            return self.trainer.forward_s(self.rows)
        return self.trainer.forward_s(self.logprob_rows, tokens=self.logprob_tokens)


@dataclass(frozen=True)
class Phase:
    """A trainer phase: its ``name`` and its ``seconds(StepInputs)`` (0: not run)."""

    name: str
    seconds: Callable[[StepInputs], float]


@dataclass(frozen=True)
class Algorithm:
    """``trainer``: the trainer phases in the order they run, the policy update last;
    ``report``: every phase's name in the order reports list them (``generate``,
    ``weight_sync`` and ``switch`` among them)."""

    name: str
    trainer: tuple[Phase, ...]
    report: tuple[str, ...]

    def trainer_seconds(self, x: StepInputs) -> dict[str, float]:
        """Each trainer phase's duration for one step, in run order."""
        return {p.name: p.seconds(x) for p in self.trainer}

    @property
    def trainer_phases(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.trainer)


#: RL algorithms by name: ``rl.algorithm`` (factory: the :class:`Algorithm`)
ALGORITHMS = Registry("rl.algorithm")


def algorithm(name: str, source: str = "<rl>") -> Algorithm:
    """The registered algorithm ``name`` (an InputError naming ``rl.algorithm`` if none)."""
    return ALGORITHMS.get(name, source).factory


def _reward_s(x: StepInputs) -> float:
    rw = x.cfg.reward
    if rw.kind == "rule":
        return math.ceil(x.samples / rw.workers) * rw.cpu_s_per_sample
    return x.trainer.reward_model_s(x.rows)


def _old_logprob_s(x: StepInputs) -> float:
    # + the call's data to every worker with rl.train.call_data (moesim.rl.call_data)
    return (x.logprob_s() + step_logprob_s(x) + call_data.step_logprob_s(x)
            if x.cfg.old_logprob else 0.0)


def _reference_s(x: StepInputs) -> float:
    return (x.logprob_s() + step_logprob_s(x) + call_data.step_logprob_s(x)
            + x.reference_swap_s if x.cfg.reference else 0.0)


def _train_s(x: StepInputs) -> float:
    # + Megatron's blocking stage-to-stage transfers with rl.train.pp_p2p (moesim.rl.pp_p2p)
    return (x.cfg.train.epochs * sum(x.trainer.train_step_s(r) for r in x.mini_batch_rows)
            + pp_p2p_train_s(x) + call_data.step_train_s(x))


def _loss_logprob_s(x: StepInputs) -> float:
    """The loss's full-vocabulary log-probs beyond the fused loss, every micro-batch of
    every optimizer step (:mod:`moesim.rl.loss`; trainer costs without it: 0), and with
    ``rl.train.seq_host: nemo`` NeMo RL's per-sequence loss loops (:mod:`moesim.rl.seq_host`)."""
    cost = getattr(x.trainer, "loss_logprob_s", None)
    if cost is None:
        return step_train_s(x)
    return x.cfg.train.epochs * sum(cost(r) for r in x.mini_batch_rows) + step_train_s(x)


def _cpu_optimizer_s(x: StepInputs) -> float:
    """With ``rl.train.optimizer: cpu``: every optimizer step's gradients out and fp32
    parameters back over the host link (:mod:`moesim.rl.cpu_optimizer`)."""
    return x.cfg.train.epochs * len(x.mini_batch_rows) * x.optimizer_copy_s


def _logprob_prep_s(x: StepInputs) -> float:
    return x.logprob_prep_s if (x.cfg.old_logprob or x.cfg.reference) else 0.0


def _train_prep_s(x: StepInputs) -> float:
    return x.train_prep_s


GRPO = Algorithm(
    "grpo",
    trainer=(Phase("reward", _reward_s), Phase("logprob_prep", _logprob_prep_s),
             Phase("old_logprob", _old_logprob_s), Phase("reference", _reference_s),
             Phase("train_prep", _train_prep_s), Phase("loss_logprob", _loss_logprob_s),
             Phase("cpu_optimizer", _cpu_optimizer_s), Phase("train", _train_s)),
    report=("generate", "logprob_prep", "old_logprob", "reference", "reward", "train_prep",
            "loss_logprob", "cpu_optimizer", "train", "weight_sync", "switch"))

ALGORITHMS.register("grpo", GRPO, {"old_logprob": True, "reference": True},
                    "group-relative policy optimisation: reward, old and reference "
                    "log-probs, then the optimizer steps")
