"""The GRPO loss's log-probabilities over the full vocabulary in one training micro-batch
(``rl.train.loss_logprob: nemo``), as NeMo RL computes them from Megatron's
vocab-parallel logits (NVIDIA-NeMo/RL v0.3.0, b1c86a816):

- ``nemo_rl/algorithms/loss_functions.py`` ``ClippedPGLossFn.__call__``: "we cast the
  logits to float32 before computing the loss" (``next_token_logits.to(torch.float32)``),
  then ``from_parallel_logits_to_logprobs``;
- ``nemo_rl/distributed/model_utils.py`` ``DistributedLogprob.forward``: ``amax`` over the
  rank's vocabulary shard, an all-reduce (max) over TP, ``logits - max``, ``.exp()``,
  ``.sum()``, an all-reduce (sum), ``- log(sum)``, ``.clone()``, ``.exp_()`` (the softmax
  kept for the backward), ``gather`` of the target; ``backward``: ``one_hot`` of the
  targets (int64) times the mask, ``.float()``, ``.sub_(softmax)``, ``.mul_(grad)``.

The log-prob passes (``rl.train.logprob_softmax: nemo``) run the same forward with
``inference_only=True`` (``megatron_policy_worker.py`` ``get_logprobs`` ``collection_fn``:
``from_parallel_logits_to_logprobs(output_tensor.to(torch.float32), ...)`` when sequence
packing is off): the cast and the forward's ops, 54 bytes per element, of which the LM
head's sampler pass (:func:`moesim.serve.costs.head_kernels`: bf16 read + fp32 write, 6
bytes) is priced already: 48 more per element of every log-prob micro-batch. NeMo RL
v0.6.0 (5fb588932, ``DistributedLogprob.forward`` in nemo_rl/distributed/model_utils.py)
casts inside the function and takes the softmax with one out-of-place ``exp`` instead of
``clone`` + ``exp_``: cast 6, amax 4, sub 8, exp 8, sum 4, sub 8, exp 8 = 46 bytes
(``rl.train.logprob_softmax: nemo-v06``).

Each op is a pass over the ``tokens x ceil(vocab / tp)`` elements of the rank's logits
(Megatron's output layer with ``parallel_output=True``: every TP rank holds all of the
row's tokens and its vocabulary shard). Bytes per element, read + written:

| op | bytes |
|---|---|
| cast bf16 -> fp32 | 2 + 4 |
| amax, sum | 4 each |
| sub, exp, sub, clone, exp_ | 4 + 4 each |
| one_hot (int64), mask multiply | 8, 8 + 8 |
| float, sub_, mul_ | 8 + 4, 4 + 4 + 4, 4 + 4 |
| cast's backward fp32 -> bf16 | 4 + 2 |

= 54 forward + 62 backward = 116 bytes per element. moesim's training step already
prices its fused loss over the same logits (:func:`moesim.model.costs` ``loss``:
``ACT_BYTES + FP32_BYTES`` = 6 bytes per element), so the extra is 110 bytes per element,
one memory-bound op per micro-batch on the compute model (HBM roofline). The three
all-reduces carry one number per token: left out. The memory: the saved fp32 softmax
(4 bytes per element) lives from the loss to the backward, and the backward's int64
one-hot (8 bytes per element) is its transient peak (:func:`loss_bytes`;
:func:`moesim.rl.memory.loss_extra_bytes` adds them to the trainer's last stage).
"""

from __future__ import annotations

#: bytes per logits element NeMo RL's DistributedLogprob reads and writes in a training
#: micro-batch (forward 54 + backward 62, table above)
NEMO_BYTES_PER_ELEMENT = 116
#: of which moesim's fused loss op already prices (bf16 read + fp32 write)
PRICED_BYTES_PER_ELEMENT = 6
#: bytes per logits element of a log-prob pass's fp32 cast and DistributedLogprob forward,
#: by ``rl.train.logprob_softmax``: v0.3.0's (the forward half of the table above; ``exp_``
#: runs whether or not it is saved) and v0.6.0's (one out-of-place ``exp``, no clone)
NEMO_LOGPROB_BYTES_PER_ELEMENT = {"nemo": 54, "nemo-v06": 46}


def elements(tokens: int, vocab: int, tp: int, cp: int = 1) -> int:
    """Logits elements on one rank for a row of ``tokens`` tokens: its context-parallel
    share of the tokens times its vocabulary shard."""
    return -(-tokens // cp) * -(-vocab // tp)


def extra_bytes(tokens: int, vocab: int, tp: int, cp: int = 1) -> float:
    """HBM bytes NeMo RL's loss log-probs move beyond moesim's fused loss, one micro-batch."""
    return float(elements(tokens, vocab, tp, cp)
                 * (NEMO_BYTES_PER_ELEMENT - PRICED_BYTES_PER_ELEMENT))


def logprob_extra_bytes(tokens: int, vocab: int, tp: int, cp: int = 1,
                        kind: str = "nemo") -> float:
    """HBM bytes NeMo RL's log-prob pass (``kind``: ``nemo`` v0.3.0, ``nemo-v06`` v0.6.0)
    moves over one row of ``tokens`` beyond the LM head's sampler pass that moesim's
    forward prices (6 bytes per element)."""
    return float(elements(tokens, vocab, tp, cp)
                 * (NEMO_LOGPROB_BYTES_PER_ELEMENT[kind] - PRICED_BYTES_PER_ELEMENT))


def loss_bytes(tokens: int, vocab: int, tp: int, cp: int = 1) -> float:
    """Peak bytes of the loss's tensors on one rank: the fp32 logits, the saved fp32
    softmax and the backward's int64 one-hot (4 + 4 + 8 bytes per element)."""
    return float(elements(tokens, vocab, tp, cp) * 16)
