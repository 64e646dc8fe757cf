"""The log-prob passes as Megatron-Core's forward-only pipeline runs them
(``rl.train.logprob_pipeline: megatron``).

By default (``folded``) moesim prices a log-prob pass with the trainer's pipeline stages
folded into data parallelism: ``ceil(rows / (dp pp))`` rows per group, each the whole
model's forward (:meth:`moesim.rl.engine_costs.EngineTrainerCosts.forward_s`): no fill,
no stage-to-stage transfer.

NeMo RL v0.3.0's ``get_logprobs`` (NVIDIA-NeMo/RL b1c86a816,
nemo_rl/models/policy/megatron_policy_worker.py:1108-1118) calls Megatron-Core's
``forward_backward_func`` with ``forward_only=True``; with PP > 1 that is
``forward_backward_pipelining_without_interleaving`` (NVIDIA/Megatron-LM 2ff0f099, the
commit NeMo RL v0.3.0 pins, megatron/core/pipeline_parallel/schedules.py:1765-1975):
each stage runs its ``m`` micro-batches one after the other, ``recv_forward``, the
forward, ``send_forward``, and every transfer blocks the stage: the requests are waited
on and ``batch_p2p_sync`` (default True, megatron/core/model_parallel_config.py:262)
calls ``torch.cuda.synchronize()`` after each (megatron/core/pipeline_parallel/
p2p_communication.py:388-402). The tensor sent is one micro-batch's hidden states
``[seq, 1, hidden]`` in the pipeline dtype (bf16), ``seq`` the packed row padded to the
rank's longest (``pad_full_seq_to``, :mod:`moesim.rl.pp_padding`), divided by TP with
sequence parallelism and by CP.

So a pass takes ``(m + pp - 1)`` cycles of one stage's forward (``1 / (pp cp)`` of a
row's: the folded pass prices a row on one TP group, where context parallelism splits
it over ``cp`` ranks)
plus its blocking transfers: one per micro-batch with two stages (the first stage sends,
the second receives), two with more (a middle stage receives, then sends), each the
slowest stage-to-next pair's latency plus bytes over its path's bottleneck. ``m =
ceil(rows / dp)``: NeMo RL v0.3.0 deals the packed rows round-robin to the data-parallel
ranks. An upper bound on the fill: the first and last cycles carry one transfer less.
"""

from __future__ import annotations

import math

import numpy as np

from moesim.rl.packing import one_row
from moesim.wiring import resolve

#: bytes per element of the hidden states a stage sends (``pipeline_dtype: bfloat16`` in
#: NeMo RL v0.3.0's examples/configs/grpo_math_1B_megatron.yaml)
BF16_BYTES = 2


def stage_transfer_s(res, nbytes: float) -> float:
    """Seconds of the slowest stage-to-next transfer of ``nbytes`` over every pipeline
    group of ``res`` (a :class:`moesim.scenario.resolved.Resolved`): the route's latency
    plus the bytes over its bottleneck link (0 with one stage)."""
    topo, worst = res.topology, 0.0
    cap = np.asarray(topo.capacity_Bps, dtype=np.float64)
    for g in res.layout.pp_groups:
        for a, b in zip(g, g[1:], strict=False):
            path = list(topo.route(topo.gpus[a], topo.gpus[b]))
            if path:
                worst = max(worst, float(topo.latency_s[path].sum() + nbytes / cap[path].min()))
    return worst


def hidden_bytes(tokens: int, hidden: int, tp: int, cp: int, sequence_parallel: bool) -> float:
    """Bytes of one micro-batch's hidden states a stage sends to the next (bf16)."""
    seq = -(-tokens // cp)
    if sequence_parallel:
        seq = -(-seq // tp)
    return float(seq * hidden * BF16_BYTES)


def pass_s(rows: int, dp: int, pp: int, row_s: float, transfer_s: float,
           cp: int = 1) -> float:
    """One forward-only pass of ``rows`` rows: ``(m + pp - 1)`` cycles of a stage's
    forward (``row_s / (pp cp)``: its layers, its context-parallel share of the row) and
    its blocking transfers (one with two stages, two with more), ``m = ceil(rows / dp)``
    micro-batches on the busiest rank."""
    if not rows:
        return 0.0
    m = math.ceil(rows / dp)
    per = 1 if pp == 2 else 2 if pp > 2 else 0
    return float((m + pp - 1) * (row_s / (pp * cp) + per * transfer_s))


def trainer_transfer_s(trainer, train, tokens: int | None) -> float:
    """One stage-to-stage transfer of a row of ``tokens`` (None: the trainer's rows) in
    the trainer pool (``trainer``'s scenario, ``rl.train`` ``train``), memoised in the
    trainer costs; 0 for trainer costs without a scenario (the linear test costs)."""
    scn = getattr(trainer, "scn", None)
    if scn is None:
        return 0.0
    tokens = tokens or scn.schedule.seq_len
    key = ("logprob_pipeline.transfer", tokens)
    if key not in trainer.memo:
        res = resolve(scn)
        sp = bool(res.scenario.parallel.sequence_parallel)
        trainer.memo[key] = stage_transfer_s(res, hidden_bytes(
            tokens, res.model.hidden, train.tp, train.cp, sp))
    return trainer.memo[key]


def step_logprob_s(x) -> float | None:
    """One log-prob pass of a step as the pipeline runs it (:class:`moesim.rl.algorithms.
    StepInputs` ``x``), or None where the folded pass stands: knob ``folded`` or one
    stage."""
    tr = x.cfg.train
    if tr.logprob_pipeline != "megatron" or tr.pp <= 1:
        return None
    rows = x.rows if x.logprob_rows is None else x.logprob_rows
    row_s = x.trainer.forward_s(one_row(rows), tokens=x.logprob_tokens)   # one row, the whole model
    transfer = trainer_transfer_s(x.trainer, tr, x.logprob_tokens)
    return pass_s(rows, tr.dp, tr.pp, row_s, transfer, tr.cp)
