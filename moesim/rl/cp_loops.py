"""NeMo RL's per-sequence context-parallel work in the loss and the log-prob collection
(``rl.train.seq_host: nemo`` with ``rl.train.cp`` > 1; pure but for the memoised NCCL
estimate).

With context parallelism NeMo RL v0.3.0 (NVIDIA-NeMo/RL b1c86a816) shards each packed
sequence over the CP ranks in ``2 cp`` load-balanced chunks and, one sequence at a time,
gathers the sequence's log-probabilities back over the CP group:

- **Training, the loss** (last stage, inside :mod:`moesim.rl.seq_host`'s per-sequence
  loss loop): ``ClippedPGLossFn`` calls ``from_parallel_logits_to_logprobs`` with the CP
  group (nemo_rl/algorithms/loss_functions.py:146-155), which shards the rolled targets
  (``_get_tokens_on_this_cp_rank``, nemo_rl/distributed/model_utils.py:228-230, :383-399:
  two slices and a ``cat``) and all-gathers the sequence's fp32 log-probs
  (``allgather_cp_sharded_tensor``, :241-245; ``AllGatherCPTensor.forward`` :408-440:
  ``cp`` ``empty_like`` buffers, one ``torch.distributed.all_gather``, ``cp``
  ``torch.chunk`` views, a ``cat``) and drops the padding (:247-248, a view). Its
  backward (:442-470) all-reduces the gradient over the CP group, then builds a pinned
  index tensor, copies it to the GPU and ``index_select``\\ s the rank's chunks.
- **Log-prob passes, the collection** (last stage, after each micro-batch's forward):
  ``from_parallel_logits_to_logprobs_packed_sequences`` shards each sequence's rolled
  targets (model_utils.py:303-305) and, with ``cp_size > 1``, loops over the sequences
  again (:331-340): two ``.item()`` reads, a slice, the same all-gather, a copy into
  ``final_probs`` (allocated once per micro-batch, :333).

Host calls are priced as :mod:`moesim.rl.seq_host` prices them (an op 16.1 us, a view
3.3 us, a device-to-host read as one op). Each all-gather is an eager NCCL call: its host
time (:data:`moesim.collectives.nccl.launch.CALL_HOST_S`) and then its GPU time, NCCL's
own estimate for the CP group's shape (:mod:`moesim.collectives.nccl`), both on the path:
the loop's next ``.item()`` waits for it. The backward's all-reduce runs in the autograd
thread with no read after it: ``max(host, GPU + launch)``
(:func:`moesim.collectives.nccl.launch.eager_call_s`). A message is a sequence's fp32
log-probs: priced at the step's mean padded sequence (its rows' tokens over its samples).

What a step gains: the busiest data-parallel rank's sequences, ``ceil(samples / dp)`` per
log-prob pass and per epoch of optimizer steps (``ceil(share / dp)`` per mini-batch), as
:mod:`moesim.rl.seq_host` counts them; nothing with ``cp`` = 1 (the code returns early).
"""

from __future__ import annotations

import math

from moesim.collectives.nccl import launch as nccl_launch
from moesim.collectives.nccl.choice import ENGINE_ALGORITHMS, choose, engine_tuning, group_shape
from moesim.collectives.nccl.model import algo_time, tune
from moesim.rl.host_calls import Loop

_MU = "nemo_rl/distributed/model_utils.py"
#: bytes of one log-prob (``DistributedLogprob`` returns float32)
FP32 = 4


def train_forward(cp: int) -> Loop:
    """One sequence's CP work in the loss's forward, beyond :mod:`moesim.rl.seq_host`'s."""
    return Loop("CP shard and all-gather of the sequence's log-probs", ops=cp + 2,
                views=cp + 3, source=(
                    f"{_MU}:228-230,383-399 two slices and a cat; :408-434 {cp} empty_like, "
                    f"{cp} torch.chunk, a cat; :247-248 the padding dropped"))


def train_backward(cp: int) -> Loop:
    """One sequence's CP work in the loss's backward (besides the all-reduce)."""
    return Loop("the CP all-gather's backward", ops=3, views=2, source=(
        f"{_MU}:455-469 view, torch.tensor(pin_memory=True), .cuda(), index_select, view"))


def collect(cp: int) -> Loop:
    """One sequence's CP work in a log-prob pass's collection (besides its all-gather)."""
    return Loop("CP shard of the targets and the per-sequence all-gather", ops=cp + 3,
                reads=2, views=cp + 4, source=(
                    f"{_MU}:303-305 (_get_tokens_on_this_cp_rank: two slices, a cat); "
                    f":335-339 cu_seqlens_padded[i].item() x2, the slice, {cp} empty_like, "
                    f"{cp} torch.chunk, a cat, the copy into final_probs"))


#: once per micro-batch of a log-prob pass: ``final_probs = torch.zeros(...)`` (:333)
COLLECT_PER_MICRO_BATCH = Loop("final_probs", ops=1, source=f"{_MU}:333 torch.zeros")


def nccl_gpu_s(res, op: str, nbytes: float) -> float:
    """NCCL's estimate (its own cost model, :mod:`moesim.collectives.nccl`) of one
    ``op`` of ``nbytes`` (nccl-tests size) on the trainer's first CP group of ``res``
    (a :class:`moesim.scenario.resolved.Resolved`); 0 where NCCL's model does not know the
    topology or the group is spread unevenly (the call's host time alone is priced)."""
    groups = res.layout.cp_groups
    if not groups or len(groups[0]) < 2:
        return 0.0
    topo = res.topology
    tuning = engine_tuning(topo, res.scenario.cluster.device)
    hosts = {}
    rank_host = [hosts.setdefault(topo.host_of(g), len(hosts)) for g in topo.gpus]
    shape = group_shape(groups[0], rank_host)
    if tuning is None or shape is None:
        return 0.0
    facts = tuning.facts(*shape)
    if facts is None:
        return 0.0
    c = choose(op, nbytes, facts, ENGINE_ALGORITHMS)
    if c is None:
        return 0.0
    t_us, _lat, _bw = algo_time(op, c.algo, c.protocol, nbytes, facts, tune(op, facts))
    return t_us * 1e-6


def calls_s(trainer, seq_tokens: int) -> tuple[float, float]:
    """(forward all-gather, backward all-reduce) seconds per sequence of ``seq_tokens``
    padded tokens, memoised in the trainer costs; (0, 0) for costs without a scenario."""
    scn = getattr(trainer, "scn", None)
    if scn is None:
        return 0.0, 0.0
    key = ("cp_loops.calls", seq_tokens)
    if key not in trainer.memo:
        from moesim.wiring import resolve

        res = resolve(scn)
        nbytes = float(FP32 * seq_tokens)
        gather = nccl_launch.CALL_HOST_S + nccl_gpu_s(res, "all_gather", nbytes)
        reduce = nccl_launch.eager_call_s(nccl_gpu_s(res, "all_reduce", nbytes))
        trainer.memo[key] = (gather, reduce)
    return trainer.memo[key]


def mean_sequence(rows: int, row_tokens: int, samples: int) -> int:
    """The step's mean padded sequence: its rows' tokens over its samples (at least 1)."""
    return max(1, math.ceil(rows * row_tokens / max(samples, 1)))


def train_s(samples: int, mini_batches: int, dp: int, cp: int, gather_s: float,
            reduce_s: float) -> float:
    """Seconds one epoch of ``mini_batches`` optimizer steps gains: each sequence on the
    busiest rank (``ceil(share / dp)`` per mini-batch) runs :func:`train_forward` and its
    all-gather, :func:`train_backward` and its all-reduce."""
    if cp <= 1 or not samples or not mini_batches:
        return 0.0
    per_seq = (train_forward(cp).seconds + gather_s + train_backward(cp).seconds + reduce_s)
    shares = [samples // mini_batches + (1 if i < samples % mini_batches else 0)
              for i in range(mini_batches)]
    return sum(math.ceil(s / dp) for s in shares) * per_seq


def logprob_s(samples: int, rows: int, dp: int, cp: int, gather_s: float) -> float:
    """Seconds one log-prob pass over ``samples`` in ``rows`` rows gains."""
    if cp <= 1 or not samples:
        return 0.0
    return (math.ceil(samples / dp) * (collect(cp).seconds + gather_s)
            + math.ceil(rows / dp) * COLLECT_PER_MICRO_BATCH.seconds)


def step_train_s(x) -> float:
    """What the CP loops add to a step's optimizer steps (:class:`moesim.rl.algorithms.
    StepInputs` ``x``); called by :func:`moesim.rl.seq_host.step_train_s` under its knob."""
    tr = x.cfg.train
    if tr.cp <= 1:
        return 0.0
    row = getattr(getattr(x.trainer, "scn", None), "schedule", None)
    seq = mean_sequence(x.rows, row.seq_len if row else 1, x.samples)
    gather, reduce = calls_s(x.trainer, seq)
    return tr.epochs * train_s(x.samples, len(x.mini_batch_rows), tr.dp, tr.cp, gather, reduce)


def step_logprob_s(x) -> float:
    """What the CP loops add to one log-prob pass (:func:`moesim.rl.seq_host.step_logprob_s`
    under its knob)."""
    tr = x.cfg.train
    if tr.cp <= 1:
        return 0.0
    rows = x.rows if x.logprob_rows is None else x.logprob_rows
    row = getattr(getattr(x.trainer, "scn", None), "schedule", None)
    tokens = x.logprob_tokens or (row.seq_len if row else 1)
    gather, _ = calls_s(x.trainer, mean_sequence(rows, tokens, x.samples))
    return logprob_s(x.samples, rows, tr.dp, tr.cp, gather)
