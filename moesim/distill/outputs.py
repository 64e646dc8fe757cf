"""What a teacher's outputs weigh, and the kernels that make and use them. Pure arithmetic,
bytes and kernels (:class:`moesim.compute.base.Kernel`), no engine.

**Full logits**: every token's logits over the whole vocabulary, ``tokens x vocab x
value_bytes`` (bf16: 2 bytes).

**Top-k logits** through the distributed top-k of a vocabulary-parallel head
(:mod:`moesim.serve.head`: Megatron-LM's vocabulary sharding, Shoeybi et al. 2019 §3):
each of the teacher's ``tp`` ranks holds ``vocab / tp`` logits of every token, takes its
local top k (a memory-bound pass over its slice), all-gathers ``k`` (value, index) pairs
per token from every rank (nccl-tests' all-gather size ``S = tp x tokens x k x
(value_bytes + 4)``, a ring sends ``(tp - 1) / tp x S`` per rank: NVIDIA nccl-tests
doc/PERFORMANCE.md) and keeps the top k of the ``tp x k`` candidates (exact:
:func:`moesim.serve.head.dist_topk`). What leaves the teacher is ``tokens x k x
(value_bytes + 4)`` bytes: a value and an int32 index per pair.

**The loss** (KL divergence or cross-entropy of the student's distribution against the
teacher's): one fused kernel computes the loss and the student's gradient in its forward
pass, as Liger-Kernel's ``_jsd_kernel`` does (linkedin/Liger-Kernel
src/liger_kernel/ops/jsd.py at 01ed3837: it reads the student's and the teacher's
log-probabilities, writes a per-element loss tile and ``dX``, both fp32; the backward
only scales ``dX``). Per student TP rank, over its ``vocab / tp`` slice (full logits):
read the teacher's value and the student's fp32 value, write the loss and the gradient,
``value_bytes + 12`` bytes per logit; over its share of the top-k pairs: read the pair,
gather the student's fp32 value at the index, write loss and gradient, ``value_bytes +
16`` bytes per pair (the student's log-softmax normaliser is the hard-label
cross-entropy's, already in the step). With full logits on a student TP group above 1
the teacher's softmax over the sharded vocabulary needs two all-reduces of one fp32 per
token (the maximum, the sum of exponentials), as Megatron's vocabulary-parallel
cross-entropy does for the student's own (NVIDIA/Megatron-LM
megatron/core/tensor_parallel/cross_entropy.py at 8e6e7cd7). The temperature scales
values: it changes no byte and no time.
"""

from __future__ import annotations

from moesim.compute.base import Kernel
from moesim.model.costs import ACT_BYTES, memory_op

INDEX_BYTES = 4           # an int32 vocabulary index (vocabularies below 2^31)
STUDENT_LOGIT_BYTES = 4   # the student's logits in fp32 (Megatron's vocab-parallel loss)
STAT_BYTES = 4            # a softmax statistic (max, sum of exponentials) per token, fp32
#: FLOP per element of the loss (max, exp, sum, log, a product: as the training loss's 5,
#: moesim.model.costs.lm_head_kernels)
LOSS_FLOPS_PER_ELEMENT = 5


def pair_bytes(value_bytes: int) -> int:
    """Bytes of one top-k (value, index) pair."""
    return value_bytes + INDEX_BYTES


def full_logits_bytes(tokens: int, vocab: int, value_bytes: int) -> int:
    """Bytes of ``tokens`` tokens' logits over the whole vocabulary."""
    return tokens * vocab * value_bytes


def topk_bytes(tokens: int, k: int, value_bytes: int) -> int:
    """Bytes of ``tokens`` tokens' top-k pairs."""
    return tokens * k * pair_bytes(value_bytes)


def output_bytes(outputs: str, tokens: int, vocab: int, k: int, value_bytes: int) -> int:
    """What leaves the teacher for ``tokens`` tokens: full logits or top-k pairs."""
    if outputs == "logits":
        return full_logits_bytes(tokens, vocab, value_bytes)
    return topk_bytes(tokens, k, value_bytes)


def allgather_bytes(tokens: int, k: int, tp: int, value_bytes: int) -> dict:
    """The distributed top-k's all-gather over a TP group of ``tp``: nccl-tests' size S
    (the gathered total) and what a ring sends per rank."""
    s = tp * topk_bytes(tokens, k, value_bytes)
    return {"size_bytes": s, "sent_per_rank_bytes": (tp - 1) * s // tp if tp > 1 else 0,
            "candidates_per_token": tp * k}


def slice_of(vocab: int, tp: int) -> int:
    """Vocabulary entries one rank of a vocabulary-parallel head holds."""
    return -(-vocab // tp)


def teacher_output_kernels(outputs: str, tokens: int, vocab: int, tp: int, k: int,
                           value_bytes: int) -> list[Kernel]:
    """One teacher rank's kernels after its LM-head GEMM (whose bf16 logits the head
    writes): full logits in fp32 need a cast; top-k: the local top k over the rank's
    slice (read it, write k pairs per token) and the merge of the ``tp x k`` gathered
    candidates (none on one rank)."""
    v = slice_of(vocab, tp)
    if outputs == "logits":
        if value_bytes == ACT_BYTES:
            return []
        return [memory_op("logits_cast", tokens * v * (ACT_BYTES + value_bytes), tokens * v)]
    kk = min(k, v)
    out = [memory_op("topk_local", tokens * v * ACT_BYTES + topk_bytes(tokens, kk,
                                                                       value_bytes),
                     tokens * v)]
    if tp > 1:
        out.append(memory_op("topk_merge", topk_bytes(tokens, tp * kk + k, value_bytes),
                             tokens * tp * kk))
    return out


def loss_kernel(outputs: str, tokens: int, vocab: int, tp: int, k: int,
                value_bytes: int) -> Kernel:
    """One student rank's fused distillation loss, forward and backward, over its
    ``tokens`` tokens: over its vocabulary slice (full logits) or its share of the top-k
    pairs (``k / tp`` per token on average: the pairs whose index falls in its slice)."""
    if outputs == "logits":
        n = tokens * slice_of(vocab, tp)
        per = value_bytes + 3 * STUDENT_LOGIT_BYTES       # + student, loss, gradient
    else:
        n = -(-tokens * k // tp)
        per = pair_bytes(value_bytes) + 3 * STUDENT_LOGIT_BYTES
    return memory_op("distill_loss", n * per, LOSS_FLOPS_PER_ELEMENT * n)
