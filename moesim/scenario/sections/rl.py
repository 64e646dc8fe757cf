"""The ``rl:`` scenario section (RL post-training steps, docs/rl.md): :class:`RLConfig`,
checked when the scenario is read. The algorithm by name, the length distributions by
name and the pools against the cluster: :func:`moesim.rl.config.rl_config`.

```yaml
rl:
  algorithm: grpo
  steps: 4                          # RL steps simulated (moesim rl --steps overrides)
  prompts_per_step: 64
  samples_per_prompt: 32            # the GRPO group size
  prompt_tokens:   {dist: fixed, mean: 256}
  response_tokens: {dist: lognormal, mean: 2900, max: 3840}
  colocated: true                   # one pool, phases in turn, a switch cost between them
  rollout: {gpus: 32, tp: 2, ep: 1, kv_fraction: 0.9}
  train:   {gpus: 32, tp: 1, pp: 1, ep: 8, mini_batches: 4, epochs: 1}
  old_logprob: true                 # the old policy's log-probs: a forward pass
  reference: true                   # the reference policy's log-probs: a forward pass
  reward: {kind: rule}              # or {kind: model}: a forward pass of a reward model
  max_lag: 0                        # 0 synchronous; k: rollouts up to k versions old
  weight_sync: {method: nccl}       # nccl (gather + chain broadcast) | sharded | ipc (colocated)
```

Every problem is one :class:`~moesim.errors.InputError` naming the file and the
``rl.`` field. Defaults and their sources are next to each field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from moesim.errors import InputError
from moesim.model.read import ModelSection
from moesim.model.read import parse as parse_model
from moesim.scenario.sections import as_written
from moesim.scenario.sections.lengths import LengthDist
from moesim.scenario.sections.lengths import parse as parse_length

REWARD_KINDS = ("rule", "model")
SYNC_METHODS = ("nccl", "ipc", "sharded")
SYNC_CALLS = ("none", "nemo", "nemo-v03", "nemo-v03-ops", "nemo-v03-wake", "nemo-async",
              "nemo-v06")
#: rl.weight_sync.gather (moesim.rl.sync.refit_phases)
SYNC_GATHERS = ("node", "groups")
KV_DTYPES = ("bf16", "fp8")
REFERENCE_WEIGHTS = ("gpu", "host")
#: how the trainer makes micro-batches of a mini-batch (moesim.rl.packing): ``nemo``,
#: NeMo RL's sequence packing (samples padded, first fit into rows); ``verl``, verl's
#: dynamic batch size (each rank's tokens over the row, balanced partitions); ``none``,
#: NeMo RL without sequence packing (every sample padded to the step's longest, whole
#: samples per micro-batch: moesim.rl.packing.unpacked_rows)
PACKINGS = ("nemo", "verl", "none")
#: partial rollouts, after a weight sync: ``recompute`` each paused sample's KV cache under
#: the new weights (AReaL's interruptible rollouts), or ``keep`` the caches computed under
#: the old ones (NeMo RL's in-flight weight updates without
#: ``recompute_kv_cache_after_weight_updates``)
KV_AFTER_SYNC = ("recompute", "keep")
GENERATION_MODES = ("batch", "stream")
#: each step's longest response: ``drawn`` (as response_tokens draws it) or ``limit``
#: (set to response_tokens.max, the generation limit: a synchronous generation then lasts
#: as many decode steps as the limit allows, moesim.rl.run.draw_batch)
LONGEST_RESPONSES = ("drawn", "limit")
#: colocated host moves around the phases (moesim.rl.offload): ``none`` (only the
#: switch's), ``nemo`` (NeMo RL's Megatron worker and vLLM's sleep mode, phase by phase),
#: ``verl`` (verl's Megatron worker's parameter offloads, moesim.rl.offload_verl)
OFFLOADS = ("none", "nemo", "verl")
#: how the optimizer states' copy out in the refit runs (moesim.rl.offload.OFFLOAD_COPIES);
#: ``pageable-concurrent`` also prices the copies into pinned memory with a host's GPUs
#: copying at once (moesim.rl.offload_pinned)
OFFLOAD_COPIES = ("line", "pageable", "pageable-concurrent")
#: the loss's log-probabilities over the full vocabulary in each training micro-batch
#: (moesim.rl.loss): ``none`` (the model's fused loss only), ``nemo`` (NeMo RL's
#: DistributedLogprob over the vocab-parallel logits, forward and backward)
LOSS_LOGPROBS = ("none", "nemo")
#: the log-prob passes' log-softmax over the full vocabulary (moesim.rl.loss): ``none``
#: (the LM head's sampler pass only), ``nemo`` (NeMo RL v0.3's fp32 cast and
#: DistributedLogprob forward over the vocab-parallel logits of every log-prob
#: micro-batch), ``nemo-v06`` (v0.6's, one pass fewer)
LOGPROB_SOFTMAX = ("none", "nemo", "nemo-v06")
#: the host's per-op dispatch in the trainer's eager forward passes (moesim.program.
#: host_dispatch): ``none`` (the GPU's time only) or ``eager`` (each MoE layer's forward
#: bounded by its host time between Megatron's per-layer host syncs) or ``timeline`` (the
#: host and the GPU as two clocks op by op, Transformer Engine's module calls at their
#: published host cost)
HOST_DISPATCH = ("none", "eager", "timeline")
#: NeMo RL's per-sequence host loops in the trainer's passes (moesim.rl.seq_host): ``none``
#: or ``nemo`` (the loss, packing and log-prob collection loops of NeMo RL v0.3.0)
SEQ_HOSTS = ("none", "nemo")
#: the log-prob passes with pipeline stages (moesim.rl.logprob_pipeline): ``folded`` (the
#: stages folded into data parallelism) or ``megatron`` (Megatron's forward-only pipeline)
LOGPROB_PIPELINES = ("folded", "megatron")
#: the training steps' stage-to-stage transfers (moesim.rl.pp_p2p): ``overlapped`` (the
#: engines' sends beside the compute) or ``blocking`` (Megatron's 1F1B waits on each)
PP_P2P = ("overlapped", "blocking")
#: the trainer calls' data (moesim.rl.call_data): ``none`` (not priced) or ``nemo`` (NeMo
#: RL v0.3.0 hands every worker its data-parallel shard by value through Ray)
CALL_DATA = ("none", "nemo")
#: a packed row's core attention (moesim.rl.packed_attention): ``row`` (one causal
#: sequence of the row's length) or ``per_sequence`` (each packed sequence on its own, as
#: Transformer Engine's THD and FlashAttention's varlen kernels attend within cu_seqlens)
PACKED_ATTENTION = ("row", "per_sequence")
#: where the trainer's optimizer steps run (moesim.rl.cpu_optimizer): ``gpu``, or ``cpu``:
#: Megatron-Core's HybridDeviceOptimizer with offload fraction 1, as verl's H20 scripts set
#: it (states in host memory, gradients out and fp32 parameters back every step)
TRAIN_OPTIMIZERS = ("gpu", "cpu")
#: Transformer Engine's per-expert GEMM call on the host under ``host_dispatch:
#: timeline`` (moesim.program.nvtx_ranges): ``launch`` (a bare C++ kernel launch) or
#: ``nvte`` (the host time TE's own NVTX range around nvte_cublas_gemm encloses)
TE_GEMM_CALLS = ("launch", "nvte")
#: the rollout engines' sampler (moesim.rl.sampler_v1): ``none`` (the serving step's pass
#: over the rank's vocabulary shard) or ``vllm-v1`` (vLLM 0.9.0's V1 sampler with logprobs)
ROLLOUT_SAMPLERS = ("none", "vllm-v1")
#: the rollout worker's host work after vLLM returns (moesim.rl.worker_post): ``none`` or
#: ``nemo-v03`` (NeMo RL v0.3's per-token log-prob copy loop)
ROLLOUT_POSTS = ("none", "nemo-v03")
#: the rollout engines' executor (moesim.rl.executor): ``none`` (no executor's time) or
#: ``ray`` (vLLM V1's Ray Compiled Graph executor, as NeMo RL runs multi-GPU engines)
ROLLOUT_EXECUTORS = ("none", "ray")
#: the rollout engines' prefix cache (moesim.rl.prefix_cache): ``none`` (every sample
#: prefills its prompt) or ``vllm`` (vLLM's automatic prefix caching over each group's
#: shared prompt, the samples dealt in contiguous shards as NeMo RL's generate() does)
ROLLOUT_PREFIX_CACHES = ("none", "vllm")
#: the rollout engines' fixed CPU time per step (moesim.rl.step_fixed): ``none`` or
#: ``vllm-v1`` (vLLM V1's per-step work whatever the batch, moesim.serve.host)
ROLLOUT_STEP_FIXED = ("none", "vllm-v1")
#: the rollout engines' weights (moesim.rl.rollout_fp8): ``bf16`` (the trainer's weights
#: as they are) or ``fp8`` (NeMo RL's vLLM ``precision: fp8``: 128 x 128 block-scaled FP8
#: linear weights, cast from the bf16 weights each refit sends)
ROLLOUT_PRECISIONS = ("bf16", "fp8")
#: the rollout engines' CPU time per step (serve.host_overhead's choices)
ROLLOUT_HOST = ("none", "vllm", "vllm-async", "sglang", "vllm-inproc")
#: vLLM's ``gpu_memory_utilization`` default: the fraction of each GPU's memory the engine
#: may use for weights, activations and KV cache (vllm/config/cache.py, CacheConfig)
DEFAULT_KV_FRACTION = 0.9
#: vLLM's ``max_num_seqs`` default on GPUs of >= 70 GiB other than A100 (H100, H200): at
#: most 1024 running sequences per engine step (vllm/engine/arg_utils.py,
#: EngineArgs.get_batch_defaults, default_max_num_seqs for LLM_CLASS)
DEFAULT_MAX_BATCH = 1024


@dataclass(frozen=True)
class RolloutPool:
    gpus: int = 8
    tp: int = 1                 # tensor parallel of one engine replica
    ep: int = 1                 # expert parallel: 1, or a multiple of tp (attention DP = ep/tp)
    kv_fraction: float = DEFAULT_KV_FRACTION
    max_batch: int = DEFAULT_MAX_BATCH
    kv_dtype: str = "bf16"
    cuda_graphs: bool = False   # decode steps replayed from CUDA graphs (serve.cuda_graphs)
    host_overhead: str = "none"  # ROLLOUT_HOST: the engine's CPU time per step
    sampler: str = "none"  # ROLLOUT_SAMPLERS
    post_process: str = "none"  # ROLLOUT_POSTS
    executor: str = "none"  # ROLLOUT_EXECUTORS
    prefix_cache: str = "none"  # ROLLOUT_PREFIX_CACHES
    step_fixed: str = "none"  # ROLLOUT_STEP_FIXED
    precision: str = "bf16"  # ROLLOUT_PRECISIONS

    @property
    def replica_gpus(self) -> int:
        return max(self.tp, self.ep)

    @property
    def replicas(self) -> int:
        return self.gpus // self.replica_gpus


@dataclass(frozen=True)
class TrainPool:
    gpus: int | None = None     # None: the rest of the cluster (colocated: the rollout pool)
    # the layout: where rl.train does not write one of tp, pp, ep, cp, zero, moesim rl
    # takes the scenario's parallel value (moesim.rl.config.trainer_layout)
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1                 # context parallel (Megatron-Core's context_parallel_size)
    mini_batches: int = 1       # optimizer steps per RL step (per epoch)
    epochs: int = 1             # passes over the step's samples
    seq_len: int | None = None  # packed row length (None: the scenario's schedule.seq_len)
    #: the log-prob passes' packed row length (NeMo RL's sequence_packing.logprob_mb_tokens,
    #: examples/configs/grpo_math_1B.yaml, NVIDIA-NeMo/RL 7ea279abf; None: seq_len, as
    #: train_mb_tokens = logprob_mb_tokens there by default)
    logprob_mb_tokens: int | None = None
    #: where the reference policy's weights live between its passes: ``gpu`` (beside the
    #: policy's, no copy) or ``host``: NeMo RL's Megatron worker keeps the reference state
    #: dict in CPU memory and, for each reference pass, copies the policy's weights to the
    #: host, the reference's in and the policy's back (``use_reference_model``,
    #: nemo_rl/models/policy/workers/megatron_policy_worker.py, NVIDIA-NeMo/RL 7ea279abf)
    reference_weights: str = "gpu"
    packing: str = "nemo"       # PACKINGS
    offload: str = "none"       # OFFLOADS (colocated)
    #: with offload nemo: ``line`` (every move at the host link's rate) or ``pageable``
    #: (the optimizer states' ``v.to("cpu")`` in the refit at the rate of a copy into
    #: pageable host memory, moesim.rl.offload.PAGEABLE_D2H_Bps) or ``pageable-concurrent``
    #: (also vLLM's sleep and the refit's weights out at a host's concurrent pinned rate)
    offload_copy: str = "line"
    loss_logprob: str = "none"  # LOSS_LOGPROBS
    logprob_softmax: str = "none"  # LOGPROB_SOFTMAX
    host_dispatch: str = "none"  # HOST_DISPATCH
    #: Megatron's sort_chunks_by_idxs in the trainer's passes (its all-to-all dispatcher with
    #: more than one local expert; moesim.model.kernels.reference): off leaves it out
    sort_chunks: bool = False
    seq_host: str = "none"  # SEQ_HOSTS
    logprob_pipeline: str = "folded"  # LOGPROB_PIPELINES
    pp_p2p: str = "overlapped"  # PP_P2P
    call_data: str = "none"  # CALL_DATA
    packed_attention: str = "row"  # PACKED_ATTENTION
    te_gemm_call: str = "launch"  # TE_GEMM_CALLS
    optimizer: str = "gpu"  # TRAIN_OPTIMIZERS
    #: ZeRO stage over the trainer's data-parallel group (parallel.zero): 1 shards the
    #: optimizer states, as Megatron's distributed optimizer does (use_distributed_optimizer:
    #: true in verl's verl/trainer/config/engine/megatron.yaml, 093191fae2, and NeMo RL's
    #: examples/configs/grpo_math_1B.yaml megatron_cfg.optimizer, 00294d9baa); 3 shards
    #: weights, gradients and optimizer states, as FSDP's full sharding (verl's and NeMo RL's
    #: DTensor/FSDP trainers); 0 none
    zero: int = 0

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.cp * self.pp)


@dataclass(frozen=True)
class RewardConfig:
    kind: str = "rule"
    #: rule: CPU seconds per sample (a verifier; an assumption of ours: set it for yours)
    cpu_s_per_sample: float = 0.001
    workers: int = 32           # rule: samples scored in parallel (CPU processes)
    model: ModelSection | None = None   # model: a model section (None: the policy's own dims)


@dataclass(frozen=True)
class WeightSyncConfig:
    method: str = "nccl"
    #: host-side software time per parameter tensor (gather/convert/load call overhead):
    #: four eager PyTorch ops (gather, dtype cast, send, the engine's load copy) at ~10 us of
    #: dispatch each; PyTorch eager per-op overhead is ~10 us (moesim.compute.devices), an
    #: assumption, not a fit: set it from a profile of your stack
    per_tensor_s: float = 40e-6
    #: NeMo RL's refit in three steps, gather, transfer, load (moesim.rl.sync.refit_phases)
    per_gpu: bool = False
    #: with per_gpu: "nemo" adds NeMo RL v0.3's per-key gather calls and its buckets of
    #: 0.2 x free memory (moesim.rl.refit_calls); "none" leaves the refit as before
    calls: str = "none"
    #: with per_gpu, colocated: "node" (the model into each node once, shared over
    #: NVLink) or "groups" (every GPU through its own TP, PP and EP groups, as NeMo RL
    #: v0.3's gather_params: moesim.rl.refit_calls.group_gather)
    gather: str = "node"


@dataclass(frozen=True)
class RLConfig:
    algorithm: str = "grpo"
    steps: int = 4
    prompts_per_step: int = 64
    samples_per_prompt: int = 8
    prompt_tokens: LengthDist = field(default_factory=LengthDist)
    response_tokens: LengthDist = field(default_factory=lambda: LengthDist(mean=1024))
    colocated: bool = False
    rollout: RolloutPool = field(default_factory=RolloutPool)
    train: TrainPool = field(default_factory=TrainPool)
    old_logprob: bool = True
    reference: bool = True
    reward: RewardConfig = field(default_factory=RewardConfig)
    max_lag: int = 0
    partial_rollouts: bool = False
    kv_after_sync: str = "recompute"    # partial rollouts: recompute | keep the KV caches
    generation: str = "batch"   # batch | stream (moesim.rl.generate.stream; max_lag >= 1)
    longest_response: str = "drawn"     # LONGEST_RESPONSES
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def total_gpus(self) -> int:
        return self.rollout.gpus if self.colocated else self.rollout.gpus + self.train.gpus


_SUB = {"rollout": RolloutPool, "train": TrainPool, "reward": RewardConfig,
        "weight_sync": WeightSyncConfig}
#: the length distributions (moesim.traffic.lengths) and their defaults: fixed 256 and 1024
LENGTH_DEFAULTS = {"prompt_tokens": {"dist": "fixed", "mean": 256},
            "response_tokens": {"dist": "fixed", "mean": 1024}}
#: field -> (kind, detail): pos int >= 1, nonneg int >= 0, posnum > 0, nonnegnum >= 0,
#: frac in (0, 1], bool, choice, optpos (None or int >= 1)
_RULES: dict[str, tuple[str, Any]] = {
    "algorithm": ("name", None), "steps": ("pos", None),
    "prompts_per_step": ("pos", None), "samples_per_prompt": ("pos", None),
    "colocated": ("bool", None), "old_logprob": ("bool", None), "reference": ("bool", None),
    "max_lag": ("nonneg", None), "partial_rollouts": ("bool", None),
    "kv_after_sync": ("choice", KV_AFTER_SYNC), "generation": ("choice", GENERATION_MODES),
    "longest_response": ("choice", LONGEST_RESPONSES),
    "gpus": ("optpos", None), "tp": ("pos", None), "ep": ("pos", None), "pp": ("pos", None),
    "cp": ("pos", None),
    "kv_fraction": ("frac", None), "max_batch": ("pos", None), "kv_dtype": ("choice", KV_DTYPES),
    "cuda_graphs": ("bool", None), "host_overhead": ("choice", ROLLOUT_HOST),
    "sampler": ("choice", ROLLOUT_SAMPLERS), "post_process": ("choice", ROLLOUT_POSTS),
    "executor": ("choice", ROLLOUT_EXECUTORS), "prefix_cache": ("choice", ROLLOUT_PREFIX_CACHES),
    "step_fixed": ("choice", ROLLOUT_STEP_FIXED), "precision": ("choice", ROLLOUT_PRECISIONS),
    "offload": ("choice", OFFLOADS), "offload_copy": ("choice", OFFLOAD_COPIES),
    "loss_logprob": ("choice", LOSS_LOGPROBS), "logprob_softmax": ("choice", LOGPROB_SOFTMAX),
    "host_dispatch": ("choice", HOST_DISPATCH),
    "sort_chunks": ("bool", None),
    "seq_host": ("choice", SEQ_HOSTS),
    "logprob_pipeline": ("choice", LOGPROB_PIPELINES),
    "pp_p2p": ("choice", PP_P2P),
    "call_data": ("choice", CALL_DATA),
    "packed_attention": ("choice", PACKED_ATTENTION),
    "te_gemm_call": ("choice", TE_GEMM_CALLS),
    "optimizer": ("choice", TRAIN_OPTIMIZERS),
    "mini_batches": ("pos", None), "epochs": ("pos", None), "seq_len": ("optpos", None),
    "logprob_mb_tokens": ("optpos", None),
    "reference_weights": ("choice", REFERENCE_WEIGHTS),
    "packing": ("choice", PACKINGS),
    "zero": ("stage", None),
    "kind": ("choice", REWARD_KINDS), "cpu_s_per_sample": ("nonnegnum", None),
    "workers": ("pos", None), "model": ("optdict", None),
    "method": ("choice", SYNC_METHODS), "per_tensor_s": ("nonnegnum", None),
    "per_gpu": ("bool", None), "calls": ("choice", SYNC_CALLS),
    "gather": ("choice", SYNC_GATHERS),
}


#: what one machine can simulate: RL steps per run (each simulates a generation of every
#: sample), samples per step (prompts x group), tokens per sequence (prompt, response,
#: trainer row: beyond any model's context), running sequences per engine, passes over a
#: step's samples, host seconds per parameter tensor and CPU seconds per sample (beyond them a step lasts
#: longer than a year), max_lag (at most the steps)
MAX_STEPS = 10_000
MAX_SAMPLES = 1_000_000
MAX_TOKENS = 10_000_000
MAX_BATCH = 65_536
MAX_EPOCHS = 1_000
MAX_SECONDS = 3_600.0
_BOUNDS: dict[str, tuple[float, str]] = {
    "steps": (MAX_STEPS, "RL steps one run can simulate"),
    "max_lag": (MAX_STEPS, "the most RL steps one run can simulate"),
    "prompts_per_step": (MAX_SAMPLES, "samples per step one machine can simulate"),
    "samples_per_prompt": (MAX_SAMPLES, "samples per step one machine can simulate"),
    "seq_len": (MAX_TOKENS, "tokens per row"),
    "logprob_mb_tokens": (MAX_TOKENS, "tokens per row"),
    "max_batch": (MAX_BATCH, "running sequences per engine"),
    "epochs": (MAX_EPOCHS, "passes over a step's samples"),
    "per_tensor_s": (MAX_SECONDS, "seconds per tensor"),
    "cpu_s_per_sample": (MAX_SECONDS, "CPU seconds per sample"),
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _check(src: str, key: str, name: str, v: Any) -> None:
    kind, detail = _RULES[name]
    bad = {
        "pos": lambda: not (_is_int(v) and v >= 1),
        "nonneg": lambda: not (_is_int(v) and v >= 0),
        "optpos": lambda: v is not None and not (_is_int(v) and v >= 1),
        "posnum": lambda: not (_is_num(v) and v > 0),
        "nonnegnum": lambda: not (_is_num(v) and v >= 0),
        "frac": lambda: not (_is_num(v) and 0 < v <= 1),
        "stage": lambda: not (_is_int(v) and 0 <= v <= 3),
        "bool": lambda: not isinstance(v, bool),
        "choice": lambda: v not in detail,
        "name": lambda: False,          # checked by the registry (moesim.rl.algorithms)
        "optdict": lambda: v is not None and not isinstance(v, dict),
    }[kind]
    if bad():
        expected = {"pos": "an integer >= 1", "nonneg": "an integer >= 0",
                    "optpos": "an integer >= 1 (or omit it)", "posnum": "a finite number > 0",
                    "nonnegnum": "a finite number >= 0", "frac": "a number in (0, 1]",
                    "stage": "a ZeRO stage 0, 1, 2 or 3",
                    "bool": "true or false", "choice": f"one of {list(detail or ())}",
                    "name": "",
                    "optdict": "a model section mapping"}[kind]
        raise InputError(src, key, expected, v)
    bound = _BOUNDS.get(name)
    if bound is not None and v is not None and v > bound[0]:
        top = f"{bound[0]:,}" if isinstance(bound[0], int) else f"{bound[0]:g}"
        raise InputError(src, key, f"at most {top} ({bound[1]}: the limit of what one "
                         "machine simulates)", v)


def _sub(src: str, key: str, cls: type, d: Any) -> Any:
    if isinstance(d, cls):
        return d
    if not isinstance(d, dict):
        raise InputError(src, key, f"a mapping of the {key} keys", d)
    valid = [f.name for f in dataclasses.fields(cls)]
    for k, v in d.items():
        if k not in valid:
            raise InputError(src, f"{key}.{k}", f"one of the {key} keys {valid}", k)
        _check(src, f"{key}.{k}", k, v)
    if cls is RewardConfig and d.get("model") is not None:
        d = {**d, "model": reward_model(d["model"], src)}
    return cls(**d)


def reward_model(d: Any, source: str) -> ModelSection:
    """A reward model's section, checked as a model of its own: its errors name
    ``rl.reward.model.FIELD``, not the policy's ``model.FIELD``."""
    try:
        return parse_model(d, source)
    except InputError as err:
        field = err.field.removeprefix("model.").removeprefix("model")
        raise InputError(source, "rl.reward.model" + (f".{field}" if field else ""),
                         *err.args[2:]) from None


def rl_from_dict(d: Any, source: str) -> RLConfig | None:
    """Check the ``rl`` section against itself (None: no section). The algorithm's name
    and fields, the length distributions' names and the pools against the cluster are
    checked when the section is run (:func:`moesim.rl.config.rl_config`)."""
    if not d:
        return None
    if not isinstance(d, dict):
        raise InputError(source, "rl", "a mapping of key: value", d)
    valid = [f.name for f in dataclasses.fields(RLConfig)]
    kwargs = {}
    for k, v in d.items():
        if k not in valid:
            raise InputError(source, f"rl.{k}", f"one of the rl keys {valid}", k)
        if k in LENGTH_DEFAULTS:
            kwargs[k] = parse_length(v, source, f"rl.{k}", LENGTH_DEFAULTS[k])
        elif k in _SUB:
            kwargs[k] = _sub(source, f"rl.{k}", _SUB[k], v)
        else:
            _check(source, f"rl.{k}", k, v)
            kwargs[k] = v
    cfg = RLConfig(**kwargs)
    if cfg.samples_per_step > MAX_SAMPLES:
        raise InputError(source, "rl.samples_per_prompt", f"prompts_per_step x "
                         f"samples_per_prompt at most {MAX_SAMPLES:,} (samples per step one "
                         f"machine can simulate; {cfg.prompts_per_step:,} x "
                         f"{cfg.samples_per_prompt:,} = {cfg.samples_per_step:,})",
                         cfg.samples_per_prompt)
    if cfg.rollout.gpus is None:
        raise InputError(source, "rl.rollout.gpus", "the rollout pool's GPUs, an integer >= 1")
    return as_written(cfg, d)


#: (part, field, default): knobs left out of the summary's echo at their default, so
#: summaries read as they did before each knob existed
_ECHO_DEFAULTS = (("train", "offload_copy", "line"), ("train", "host_dispatch", "none"),
                  ("train", "sort_chunks", False), ("train", "seq_host", "none"),
                  ("train", "logprob_pipeline", "folded"),
                  ("train", "pp_p2p", "overlapped"), ("train", "logprob_softmax", "none"),
                  ("train", "call_data", "none"), ("train", "packed_attention", "row"),
                  ("train", "te_gemm_call", "launch"), ("train", "optimizer", "gpu"),
                  ("rollout", "sampler", "none"), ("weight_sync", "gather", "node"),
                  ("rollout", "post_process", "none"), ("rollout", "executor", "none"),
                  ("rollout", "prefix_cache", "none"), ("rollout", "step_fixed", "none"),
                  ("rollout", "precision", "bf16"))


def summary_dict(cfg: RLConfig) -> dict:
    """The checked section as the RL summary echoes it (a reward model as written)."""
    out = dataclasses.asdict(cfg)
    for part, name, default in _ECHO_DEFAULTS:
        if getattr(getattr(cfg, part), name) == default:
            del out[part][name]
    if cfg.reward.model is not None:
        out["reward"]["model"] = cfg.reward.model.as_dict()
    return out
