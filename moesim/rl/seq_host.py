"""NeMo RL's per-sequence host loops in the trainer's passes (``rl.train.seq_host: nemo``;
pure).

With sequence packing, NeMo RL v0.3.0 (NVIDIA-NeMo/RL b1c86a816) walks every packed
sequence of a micro-batch in Python, and each walk reads GPU numbers back to the host
(``.item()``, or a 0-d CUDA tensor used as a slice bound, which ``__index__`` copies to
the host): each such read waits until the GPU has run everything queued before it, so
the small ops the host issues after it run at the host's pace with the GPU idle.

- **Training, the loss** (the last pipeline stage, between a micro-batch's forward and
  backward): ``forward_step_arbitrary_loss`` wraps the loss in
  ``SequencePackingLossWrapper`` (nemo_rl/models/megatron/common.py:346-352), which calls
  ``ClippedPGLossFn`` once per sequence (nemo_rl/algorithms/loss_functions.py:658-697),
  and the loss ends with eight ``.item()`` metrics (:138, :281, :286, :294-301).
- **Every pass, the packing** (every stage, before each micro-batch's forward):
  ``_pack_sequences_for_megatron`` reads each sequence's length with ``.item()``, twice
  when sequences are padded to the TP multiple or the packed row to the pipeline's shape
  (nemo_rl/models/megatron/common.py:73-140).
- **Log-prob passes, the collection** (the last stage, after each micro-batch's forward):
  ``from_parallel_logits_to_logprobs_packed_sequences`` rolls the targets and scatters
  the log-probs back one sequence at a time, two ``.item()`` each loop
  (nemo_rl/distributed/model_utils.py:296-306, :346-360).

:data:`TRAIN_LOSS`, :data:`PACK`, :data:`COLLECT` and :data:`PER_MICRO_BATCH` count those
calls (file:line above and in each :class:`Loop`). Each is priced at the host costs
:mod:`moesim.program.host_dispatch` takes from published measurements: an op that
launches work 16.1 us (PyTorch's operator benchmark), a view 3.3 us; a device-to-host
read is priced as one such op (its launch and return; no published figure for the round
trip on an idle GPU), so every figure here is a lower bound. The loss's middle part (the
fp32 cast, ``DistributedLogprob``, the KL, ratio and clipping ops, ClippedPGLossFn
:140-276) is left out: there the host issues ops while the GPU runs the passes over the
sequence's logits, which ``rl.train.loss_logprob`` prices; the loss's backward runs in
C++ autograd, ahead of the GPU.

With context parallelism (``rl.train.cp`` > 1) the loss and the collection also shard
each sequence and all-gather its log-probs over the CP group, one NCCL call a sequence:
:mod:`moesim.rl.cp_loops`, priced under the same knob.

Without sequence packing (``rl.train.packing`` other than ``nemo``) none of these loops
runs: the knob adds nothing.

On the step: a pipeline's steady state runs at its slowest stage's pace, and the last
stage's loop lies on every micro-batch's path, so the busiest data-parallel rank's
sequences each add their loop's time: ``ceil(samples / dp)`` sequences per optimizer
step (training) or per pass (log-probs), plus the fixed work of each of its
``ceil(rows / dp)`` micro-batches.
"""

from __future__ import annotations

import math

from moesim.rl import cp_loops
from moesim.rl.host_calls import Loop

_LF = "nemo_rl/algorithms/loss_functions.py"
_MC = "nemo_rl/models/megatron/common.py"
_MU = "nemo_rl/distributed/model_utils.py"


#: training: one packed sequence's loss on the last stage, outside its logits passes
TRAIN_LOSS: tuple[Loop, ...] = (
    Loop("sequence bounds", reads=2, views=2,
         source=f"{_LF}:659-660 seq_starts[i].item(), seq_ends[i].item()"),
    Loop("the sequence's data", reads=6, views=21, source=(
        f"{_LF}:663-669 data.slice over the micro-batch's 8 keys (grpo.py train_data), each "
        "of the six 2-D keys sliced at unpadded_seq_lengths[i], a 0-d CUDA tensor")),
    Loop("the logits slice", ops=2, reads=1, views=2, source=(
        f"{_LF}:677-681 (seq_start + padded_seq_lengths[i]) // cp as a slice bound")),
    Loop("masks and the first metric", ops=9, reads=1, views=6, source=(
        f"{_LF}:120-138 five [:, 1:] slices, mask, |gen - prev|, exp, masked_mean "
        "(mul, sum, add, div: nemo_rl/algorithms/utils.py:131-136), .item()")),
    Loop("the metrics", ops=5, reads=8, views=1, source=(
        f"{_LF}:277-301 probs_ratio .item(), masked_mean of the clamped ratios and its "
        ".item(), loss.item(), `if kl` and kl.item(), sample_importance_ratio.item(), "
        "sample_mask.sum().item(), approx_entropy.item()")),
    Loop("accumulate", ops=1, source=f"{_LF}:692 loss_accum += loss"),
)

#: every pass: one sequence packed into the micro-batch's row (every stage)
PACK: tuple[Loop, ...] = (
    Loop("length", reads=1, views=2, source=f"{_MC}:73-87 seq_lengths[b].item(), the slice"),
    Loop("padded copy", ops=1, reads=1, views=2, padded_only=True, source=(
        f"{_MC}:112-140 seq_lengths[b].item(), the slice, F.pad")),
)

#: log-prob passes: one sequence's log-probs collected on the last stage
COLLECT: tuple[Loop, ...] = (
    Loop("roll the targets", ops=2, reads=2, views=3, source=(
        f"{_MU}:296-306 cu_seqlens_padded[i].item() x2, slice, roll, copy into "
        "rolled_targets")),
    Loop("scatter the log-probs", ops=1, reads=2, views=3, source=(
        f"{_MU}:346-360 cu_seqlens_padded[i].item() x2, slices, copy into out_logprobs")),
)

#: every pass: each micro-batch's fixed host work before its forward (every stage)
PER_MICRO_BATCH: tuple[Loop, ...] = (
    Loop("data to the GPU", ops=6, source=(
        f"{_MC}:287 next(data_iterator).to('cuda') (training; the log-prob passes' "
        "nemo_rl/models/policy/megatron_policy_worker.py:1018): the six tensors of the "
        "log-prob data (the training data has eight; six counted)")),
    Loop("cu_seqlens and the row", ops=4, reads=1, views=3, source=(
        f"{_MC}:92 torch.tensor, :101-106 the lengths' sub and max().item(), :148-153 "
        "cat, unsqueeze, :179-180 contiguous x2")),
    Loop("padded cu_seqlens and row", ops=2, padded_only=True, source=(
        f"{_MC}:94 torch.tensor of the padded bounds, :149 the second cat")),
)


def parts_s(parts: tuple[Loop, ...], padded: bool) -> float:
    """Host seconds of ``parts`` (the padded-only ones when ``padded``)."""
    return sum(p.seconds for p in parts if padded or not p.padded_only)


def is_padded(tp: int, cp: int, pp: int) -> bool:
    """NeMo RL pads each sequence (``pad_factor = 2 cp tp`` with CP, else ``tp``) or the
    packed row (``pad_full_seq_to`` with PP > 1): the second packing loop runs."""
    return tp > 1 or cp > 1 or pp > 1


def train_s(samples: int, mini_batch_rows: list[int], dp: int, tp: int, cp: int,
            pp: int) -> float:
    """Seconds the loops add to one epoch of optimizer steps: each mini-batch (an equal
    share of ``samples``, ``len(mini_batch_rows)`` of them) puts ``ceil(share / dp)``
    sequences and ``ceil(rows / dp)`` micro-batches on its busiest rank's path."""
    if not samples or not mini_batch_rows:
        return 0.0
    pad = is_padded(tp, cp, pp)
    per_seq = parts_s(TRAIN_LOSS, pad) + parts_s(PACK, pad)
    per_mb = parts_s(PER_MICRO_BATCH, pad)
    n = len(mini_batch_rows)
    shares = [samples // n + (1 if i < samples % n else 0) for i in range(n)]
    return sum(math.ceil(s / dp) * per_seq + math.ceil(r / dp) * per_mb
               for s, r in zip(shares, mini_batch_rows, strict=True))


def logprob_s(samples: int, rows: int, dp: int, tp: int, cp: int, pp: int) -> float:
    """Seconds the loops add to one log-prob pass over ``samples`` in ``rows`` rows."""
    if not samples:
        return 0.0
    pad = is_padded(tp, cp, pp)
    per_seq = parts_s(COLLECT, pad) + parts_s(PACK, pad)
    return (math.ceil(samples / dp) * per_seq
            + math.ceil(rows / dp) * parts_s(PER_MICRO_BATCH, pad))


def step_train_s(x) -> float:
    """What the loops add to a step's optimizer steps (:class:`moesim.rl.algorithms.
    StepInputs` ``x``; 0 unless ``rl.train.seq_host: nemo``)."""
    tr = x.cfg.train
    if tr.seq_host != "nemo" or tr.packing != "nemo":
        return 0.0
    # with CP > 1 also the per-sequence CP all-gathers (moesim.rl.cp_loops)
    return (tr.epochs * train_s(x.samples, x.mini_batch_rows, tr.dp, tr.tp, tr.cp, tr.pp)
            + cp_loops.step_train_s(x))


def step_logprob_s(x) -> float:
    """What the loops add to one of a step's log-prob passes (0 unless ``nemo``)."""
    tr = x.cfg.train
    if tr.seq_host != "nemo" or tr.packing != "nemo":
        return 0.0
    rows = x.rows if x.logprob_rows is None else x.logprob_rows
    return logprob_s(x.samples, rows, tr.dp, tr.tp, tr.cp, tr.pp) + cp_loops.step_logprob_s(x)
