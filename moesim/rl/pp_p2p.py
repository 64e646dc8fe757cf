"""Megatron's blocking stage-to-stage transfers in the training steps
(``rl.train.pp_p2p: blocking``; pure but for the memoised transfer).

moesim's engines send a micro-batch's activations and gradients between pipeline stages
on a stream of their own, beside the compute; a stage waits only for what it receives
late. NeMo RL v0.3.0 trains with Megatron-Core's non-interleaved 1F1B
(``forward_backward_pipelining_without_interleaving``, NVIDIA/Megatron-LM 2ff0f099
megatron/core/pipeline_parallel/schedules.py:1765-2072, steady state :1934-2032), whose
transfers block the stage: ``send_forward_recv_backward`` and
``send_backward_recv_forward`` wait on their requests and, with ``batch_p2p_comm`` and
``batch_p2p_sync`` (both default True,
megatron/core/model_parallel_config.py:257-262), ``torch.cuda.synchronize()``
(megatron/core/pipeline_parallel/p2p_communication.py:388-402), so no compute runs during
them (``overlap_p2p_comm`` is an interleaved schedule's option).

Each of the ``m + pp - 1`` slots of an optimizer step (``m`` micro-batches on the busiest
data-parallel rank) gains the exchanges of a stage: one with two stages (the first stage
sends activations and receives gradients in one batched exchange; the last the other
way), two with more (a middle stage exchanges with both neighbours), each one transfer of
a micro-batch's hidden states (:func:`moesim.rl.logprob_pipeline.hidden_bytes`: the row
padded to ``pad_full_seq_to``, divided by TP with sequence parallelism) over the slowest
stage-to-next path (a send and a receive of the same size run at once, one each way). The
warm-up and cool-down slots carry one transfer each: counted as full slots, an upper
bound of ``pp - 1`` transfers.
"""

from __future__ import annotations

import math

from moesim.rl.logprob_pipeline import trainer_transfer_s


def exchanges_per_slot(pp: int) -> int:
    """Blocking exchanges one stage makes per 1F1B slot: 0 with one stage, 1 with two,
    2 with more."""
    return 0 if pp <= 1 else 1 if pp == 2 else 2


def train_s(micro_batches: list[int], pp: int, transfer_s: float) -> float:
    """Seconds the blocking transfers add to optimizer steps of ``micro_batches`` each."""
    k = exchanges_per_slot(pp)
    return float(sum((m + pp - 1) * k * transfer_s for m in micro_batches if m))


def step_train_s(x) -> float:
    """What the transfers add to a step's optimizer steps (:class:`moesim.rl.algorithms.
    StepInputs` ``x``; 0 unless ``rl.train.pp_p2p: blocking`` with pipeline stages)."""
    tr = x.cfg.train
    if tr.pp_p2p != "blocking" or tr.pp <= 1:
        return 0.0
    per = getattr(x.trainer, "micro_batches", None)
    mbs = [per(r) if per else math.ceil(r / tr.dp) for r in x.mini_batch_rows]
    return tr.epochs * train_s(mbs, tr.pp, trainer_transfer_s(x.trainer, tr, None))
