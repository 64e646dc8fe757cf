"""The trainer calls' data as NeMo RL v0.3.0 hands it to every worker: by value, one copy
per worker, of the batch padded to its longest sample (``rl.train.call_data: nemo``;
pure).

NVIDIA-NeMo/RL v0.3.0 (b1c86a816):

- **The data.** GRPO flattens the step's samples into one ``BatchedDataDict`` padded to
  the batch's longest sample, rounded up to ``make_sequence_length_divisible_by`` (the
  trainer's TP in the Megatron recipes) (nemo_rl/algorithms/grpo.py:606-646,
  ``batched_message_log_to_flat_message``): per position ``input_ids`` (int64),
  ``token_mask`` (``torch.ones_like(token_ids)``: int64, :611-617), ``advantages`` and
  ``generation_logprobs`` (fp32): 24 bytes. The log-prob passes send that
  (:653-657); training sends it with ``prev_logprobs`` and ``reference_policy_logprobs``
  (fp32, :658-659): 32 bytes.
- **The calls.** ``Policy.get_logprobs``, ``get_reference_policy_logprobs`` and ``train``
  shard the batch over the data-parallel ranks only (``shard_by_batch_size``: each shard
  keeps the batch's full width, nemo_rl/distributed/batched_data_dict.py:759-779) and call
  ``run_all_workers_sharded_data`` with the CP, TP and PP axes replicated
  (nemo_rl/models/policy/lm_policy.py:224-238, :286-300, :353-369), which calls every
  worker's method with its shard as an argument
  (``getattr(worker, method_name).remote(*worker_args, **worker_kwargs)``,
  nemo_rl/distributed/worker_groups.py:820-866): every worker of a data-parallel group
  gets the same shard, by value.
- **What Ray does with it** (ray 2.46.0, NeMo RL v0.3.0's pyproject.toml; Ray's
  documentation, "Anti-pattern: Passing the same large argument by value repeatedly harms
  performance"): an argument over 100 KB is put into the caller's object store on each
  call, with no deduplication, and the worker fetches it into its own node's store
  before the task runs.

So per call the driver puts ``workers`` copies of a shard (``ceil(samples / dp)`` rows of
the padded width), and the copies for workers on other nodes leave the driver's node. The
driver puts at Ray's published single-client rate (:data:`PUT_Bps`), and its node sends
at the rate Ray's own issue measured for one node serving many (:data:`SEND_Bps`); the
two overlap (a worker fetches while the driver puts the next copy), so a call takes the
longer of the two. Left out: the workers' deserialisation, the returned log-probs
(``B x L`` fp32 from the data-parallel leaders only) and the calls' Ray scheduling.

This grows with the padded width times the workers per data-parallel rank, not with the
step's tokens: a batch padded to 16,384 on TP4 CP4 PP4 sends 64 copies of each of two
shards of 2,048 x 16,384 positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: bytes per padded position of the log-prob calls' data (see the module doc)
LOGPROB_BYTES = 8 + 8 + 4 + 4
#: ... and of the training call's (two fp32 log-prob tensors more)
TRAIN_BYTES = LOGPROB_BYTES + 4 + 4
#: Ray's single-client ``ray.put`` throughput: ``single_client_put_gigabytes`` 19.856
#: (ray-project/ray release/perf_metrics/microbenchmark.json at 08444c4c)
PUT_Bps = 19.856e9
#: one node sending objects to many: 44.93 Gbit/s measured fetching 10 GiB in 128 MiB
#: objects from a head node with a 100 Gbit/s NIC to ten nodes (ray-project/ray issue
#: 42632, "Object store transfer performance is poor", the maintainers' benchmark with
#: one owner of the objects, as NeMo RL's driver owns its arguments)
SEND_Bps = 44.93e9 / 8


@dataclass(frozen=True)
class CallData:
    """One call's data: ``shard_bytes`` per worker, ``workers`` copies put by the driver,
    ``off_node`` of them sent from the driver's node."""

    shard_bytes: float
    workers: int
    off_node: int

    @property
    def put_s(self) -> float:
        return self.workers * self.shard_bytes / PUT_Bps

    @property
    def send_s(self) -> float:
        return self.off_node * self.shard_bytes / SEND_Bps

    @property
    def seconds(self) -> float:
        """The puts and the sends overlap: the longer of the two."""
        return max(self.put_s, self.send_s)


def padded_width(longest: int, multiple: int) -> int:
    """The batch's width: its longest sample rounded up to ``multiple``."""
    m = max(int(multiple), 1)
    return -(-int(longest) // m) * m


def off_node(workers: int, start: int, gpus_per_node: int) -> int:
    """Workers (GPUs ``start`` .. ``start + workers - 1``) not on the driver's node (the
    first ``gpus_per_node`` GPUs: NeMo RL's driver runs on the Ray head, node 0)."""
    on = max(0, min(start + workers, gpus_per_node) - start)
    return workers - on


def call(samples: int, dp: int, width: int, per_position: int, workers: int,
         off: int) -> CallData:
    """One call over ``samples`` padded to ``width``, sharded over ``dp`` ranks."""
    return CallData(float(math.ceil(samples / dp) * width * per_position), workers, off)


def _call(x, per_position: int) -> CallData | None:
    cfg = x.cfg
    tr = cfg.train
    if getattr(tr, "call_data", "none") != "nemo" or not x.samples or not x.longest:
        return None
    gpn = getattr(getattr(x.trainer, "scn", None), "gpus_per_node", None) or tr.gpus
    start = 0 if cfg.colocated else cfg.rollout.gpus
    width = padded_width(x.longest, tr.tp)
    return call(x.samples, tr.dp, width, per_position, tr.gpus, off_node(tr.gpus, start, gpn))


def step_logprob_s(x) -> float:
    """One log-prob call's data (:class:`moesim.rl.algorithms.StepInputs` ``x``; 0 unless
    ``rl.train.call_data: nemo``)."""
    c = _call(x, LOGPROB_BYTES)
    return 0.0 if c is None else c.seconds


def step_train_s(x) -> float:
    """The training call's data, once per step (0 unless ``nemo``)."""
    c = _call(x, TRAIN_BYTES)
    return 0.0 if c is None else c.seconds


def step_bytes(x) -> tuple[float, float]:
    """(bytes put, bytes sent off the driver's node) of a step's calls: two log-prob
    calls where both passes run, and the training call (0, 0 with the knob off)."""
    calls = [_call(x, LOGPROB_BYTES)] * (int(x.cfg.old_logprob) + int(x.cfg.reference))
    calls.append(_call(x, TRAIN_BYTES))
    calls = [c for c in calls if c is not None]
    return (sum(c.workers * c.shard_bytes for c in calls),
            sum(c.off_node * c.shard_bytes for c in calls))
