"""The host work of NeMo RL v0.3's colocated IPC handle transfer
(``rl.weight_sync.calls: nemo-v03``; with ``per_gpu: true``): Ray actor calls through the
driver and the pickling of every policy worker's per-tensor metadata, counted from the
code and priced from published per-item measurements.

What NVIDIA-NeMo/RL v0.3.0 (b1c86a816) runs, per refit (``nemo_rl/algorithms/grpo.py``
``refit_policy_generation``, lines 396-455):

1. ``policy.prepare_weights_for_ipc()`` (``nemo_rl/models/policy/lm_policy.py``): one Ray
   call per policy worker; each returns its ``state_dict_info``, the Megatron keys of one
   EP rank over all stages (``get_param_info``: gathered over PP and EP, merged by name;
   :func:`moesim.rl.refit_calls.megatron_keys`), which the driver unpickles ``P`` times.
2. Per group of keys (a bucket): ``policy.get_weights_ipc_handles(keys)``: one Ray call
   per policy worker with the group's keys (pickled once per call by the driver); each
   worker returns ``{device_uuid: (True, [(dtype, handle)], {hf_name: offset})}``
   (``megatron_policy_worker.py`` ``get_weights_ipc_handles``), a dict with one entry per HF
   tensor of the bucket, which the driver unpickles for every one of the ``P`` workers.
   Then ``policy_generation.update_weights_from_ipc_handles(all_handles)``
   (``nemo_rl/models/generation/vllm.py``): one Ray call per vLLM engine (its TP rank 0,
   ``run_rank_0_only_axes``) carrying the handles of the engine's ``g`` devices, so the
   driver pickles all ``P`` workers' dicts again; each engine with ``g > 1`` (Ray executor)
   unpickles its ``g`` dicts and calls each executor with its own
   (``worker.execute_method.remote("update_weights_from_local_ipc_handles", ...)``:
   ``g`` calls, ``g`` dicts pickled), and each executor unpickles one dict, rebuilds the
   packed buffer and takes a view per tensor (``vllm_backend.py``). With ``g = 1`` vLLM's
   ``UniProcExecutor`` runs in the engine's process (``collective_rpc``: no call, no pickle).
3. Around them: ``offload_before_refit``, ``offload_after_refit`` (one call per policy
   worker each) and two ``wake_up`` calls (one per engine each).

The driver waits for each group before the next (``ray.get``), so a refit's transfer is
the serial chain driver → workers → driver → engines → executors, summed over the
groups: :func:`ipc_handle_transfer`.

Prices (docs/sources.md):

- a Ray actor call, :data:`RAY_CALL_S`: Ray's committed release microbenchmark
  (ray-project/ray ``release/perf_metrics/microbenchmark.json``, commit 08444c4):
  "1_n_actor_calls_async" 8,038 calls/s, one caller submitting to many actors and getting
  their results; small arguments, one node (NeMo RL's calls cross nodes: a lower bound);
- pickling, per dict entry (one string key and its value), :data:`PICKLE_DUMPS_S` and
  :data:`PICKLE_LOADS_S`: CPython's C pickle on ``{f"k{i}": f"v{i}"}`` of 1,000 entries,
  encode 59.2 us and decode 264 us on Python 3.13.9 (bluedynamics/zodb-json-codec
  ``BENCHMARKS.md``, commit 27261bc, "wide_dict", the "Python" column; its bench.py builds
  the dict). Ray pickles arguments and results with cloudpickle, whose reducer is not
  called for str, int, dict, list and tuple (Python ``pickle`` docs,
  ``Pickler.reducer_override``), so the C pickler's rate holds; a Megatron key (a tuple
  of a name, a stage, a shape and a dtype) counts as one entry, a lower bound;
- an executor's rebuild and unpack of one packed bucket, :data:`PACKED_RECOVER_S`: NeMo
  RL's refit blog (NVIDIA-NeMo/.github ``blog/posts/nemo-rl-refit-performance/index.md``,
  commit 2392b33, Part 1, Figure 5: tensor packing "reduces the time required to recover
  a tensor from IPC handles from 120ms to 12ms", DeepSeek-V3).

Not priced (no published per-item cost found): ``gc.collect()`` and
``torch.cuda.empty_cache()`` in each offload, the per-group ``model.state_dict()`` and
``named_modules()`` and the Megatron-to-HF conversion in ``gather_params``, vLLM's
``wake_up`` (``cuMemCreate``/``cuMemMap`` of weights and KV cache).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: seconds per Ray actor call: 1 / 8,038.17 calls/s, "1_n_actor_calls_async" in
#: ray-project/ray release/perf_metrics/microbenchmark.json (commit 08444c4)
RAY_CALL_S = 1 / 8038.166251679982
#: seconds to pickle one dict entry (a short string key and its value): 59.2 us for the
#: 1,000 entries of zodb-json-codec's "wide_dict" (BENCHMARKS.md, commit 27261bc,
#: CPython 3.13.9's C pickle)
PICKLE_DUMPS_S = 59.2e-6 / 1000
#: seconds to unpickle one such entry: 264 us for the same 1,000 entries (same table)
PICKLE_LOADS_S = 264e-6 / 1000
#: seconds for a vLLM executor to rebuild one packed IPC bucket and take its tensors'
#: views: "from 120ms to 12ms" (NeMo RL refit blog, commit 2392b33, Part 1, Figure 5)
PACKED_RECOVER_S = 12e-3
#: Ray calls per refit outside the groups: prepare_weights_for_ipc, offload_before_refit,
#: offload_after_refit (one per policy worker each) and two wake_up (one per engine each)
FIXED_WORKER_CALLS = 3
FIXED_ENGINE_CALLS = 2


@dataclass(frozen=True)
class HandleTransfer:
    """Counts and seconds of one refit's IPC handle transfer on its serial chain."""

    driver_calls: int           # Ray calls the driver makes
    executor_calls: int         # calls one engine makes to its executors
    pickled_entries: int        # dict entries pickled on the chain
    unpickled_entries: int      # dict entries unpickled on the chain
    buckets: int
    calls_s: float
    pickle_s: float
    recover_s: float

    @property
    def time_s(self) -> float:
        return self.calls_s + self.pickle_s + self.recover_s

    def as_dict(self) -> dict:
        return {**asdict(self), "time_s": self.time_s}


def ipc_handle_transfer(*, hf_tensors: int, megatron_keys: int, buckets: int,
                        policy_workers: int, engines: int, engine_gpus: int
                        ) -> HandleTransfer:
    """The serial chain of one colocated refit (module docstring), summed over its
    ``buckets``: ``policy_workers`` trainer processes, ``engines`` vLLM engines of
    ``engine_gpus`` executors each, ``hf_tensors`` HF tensors and ``megatron_keys`` keys.

    Per refit: the driver makes ``3 P + 2 E`` fixed calls and ``b (P + E)`` group calls;
    it unpickles ``P K`` key entries (``state_dict_info``) and ``P H`` handle entries,
    pickles ``P K`` key entries (each worker's keys) and ``P H`` handle entries (to the
    engines); one worker unpickles its ``K`` keys and pickles its ``H`` entries; one
    engine unpickles its ``g H``; with ``g > 1`` it makes ``b g`` calls and pickles
    ``g H``, and one executor unpickles ``H``."""
    p, e, g, h, k = policy_workers, engines, engine_gpus, hf_tensors, megatron_keys
    driver_calls = FIXED_WORKER_CALLS * p + FIXED_ENGINE_CALLS * e + buckets * (p + e)
    executor_calls = buckets * g if g > 1 else 0
    pickled = p * k + h + p * h + (g * h if g > 1 else 0)
    unpickled = p * k + k + p * h + g * h + (h if g > 1 else 0)
    return HandleTransfer(driver_calls, executor_calls, pickled, unpickled, buckets,
                          (driver_calls + executor_calls) * RAY_CALL_S,
                          pickled * PICKLE_DUMPS_S + unpickled * PICKLE_LOADS_S,
                          buckets * PACKED_RECOVER_S)
