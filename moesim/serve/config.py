"""The ``serve:`` scenario section: one prefill or decode step of a serving deployment.

```yaml
serve:
  phase: decode            # prefill | decode
  batch_per_gpu: 128       # requests per GPU (alias requests_per_gpu)
  prompt: 4096             # prompt tokens per request (prefill processes them)
  context: 4096            # decode: tokens in each request's KV cache at the step
  output: 1024             # tokens generated per request (decode time per request)
  tp: 1                    # tensor parallel (attention DP = GPUs / tp)
  attn_dp: 128             # optional check: must equal GPUs / tp
  ep: 128                  # expert parallel
  two_microbatch: true     # two micro-batches, one's all-to-all under the other's compute
  ep_backend: auto         # auto | nccl | deepep | deepep-ll; auto: deepep for prefill,
                           # deepep-ll for decode, nccl for a hidden not a multiple of 128
  kv_dtype: bf16           # bf16 | fp8 (bytes per cached value)
  sample_top_k: 50         # tokens kept by the sampler's top-k
  step: 0                  # routing step index (expert popularity drifts per step)
  cuda_graphs: false       # decode replayed from a CUDA graph: no per-kernel launch cost
```

A TP group serves ``tp · batch_per_gpu`` requests (attention data parallelism over the
groups, as DeepSeek's published inference profiles do with TP1: github.com/deepseek-ai/
profile-data README). The step
runs on the training machinery: :func:`serving_scenario` turns the section into the
layout (pp 1, dp = GPUs / tp, ep), the micro-batches (1 or 2) and the EP backend, so the
routing, the EP exchanges and the executor are the training step's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from typing import Any

from moesim.ep.messages import deepep_carries, deepep_hidden_expected
from moesim.errors import InputError
from moesim.scenario.limits import (
    FIELD_LIMITS,
    MAX_MICRO_BATCH_SIZE,
    MAX_SEQ_LEN,
    MAX_TOKENS_PER_MICROBATCH,
)
from moesim.scenario.schema import (
    WHOLE_STEP_GRAPH,
    EPBackendConfig,
    OverlapConfig,
    ParallelConfig,
    Scenario,
    ScheduleConfig,
)

PHASES = ("prefill", "decode")
BACKENDS = ("auto", "nccl", "deepep", "deepep-ll")
KV_DTYPES = {"bf16": 2, "fp8": 1}
#: ``auto``: DeepEP's normal (high-throughput) kernels for prefill and its low-latency
#: kernels for decode (deepseek-ai/DeepEP README: "normal kernels ... for training and
#: inference prefilling", "low-latency kernels ... for inference decoding")
AUTO_BACKEND = {"prefill": "deepep", "decode": "deepep-ll"}
#: transformers' GenerationConfig default top_k (huggingface/transformers,
#: src/transformers/generation/configuration_utils.py: ``top_k = 50``)
DEFAULT_TOP_K = 50


@dataclass(frozen=True)
class ServeConfig:
    phase: str = "decode"
    batch_per_gpu: int = 1
    prompt: int = 4096
    context: int | None = None       # None: the prompt length
    output: int = 1
    tp: int = 1
    attn_dp: int | None = None
    ep: int = 1
    two_microbatch: bool = False
    ep_backend: str = "auto"
    kv_dtype: str = "bf16"
    sample_top_k: int = DEFAULT_TOP_K
    step: int = 0
    cuda_graphs: bool = False

    @property
    def microbatches(self) -> int:
        return 2 if self.two_microbatch else 1

    @property
    def kv_tokens(self) -> int:
        """Tokens in each request's KV cache during the step."""
        if self.phase == "prefill":
            return self.prompt
        return self.prompt if self.context is None else self.context

    @property
    def kv_bytes(self) -> int:
        return KV_DTYPES[self.kv_dtype]

    @property
    def backend(self) -> str:
        return AUTO_BACKEND[self.phase] if self.ep_backend == "auto" else self.ep_backend

    def requests_per_group(self) -> int:
        """Requests one TP group (one attention data-parallel rank) serves."""
        return self.batch_per_gpu * self.tp

    def tokens_per_group(self) -> int:
        """Tokens one TP group computes in the step (prompt tokens or one per request)."""
        per = self.prompt if self.phase == "prefill" else 1
        return self.requests_per_group() * per


_INTS = {"batch_per_gpu": 1, "prompt": 1, "context": 1, "output": 1, "tp": 1, "attn_dp": 1,
         "ep": 1, "sample_top_k": 1, "step": 0}

#: field -> its largest value and what it counts: the training step's limits
#: (moesim.scenario.limits), which the serving step runs on (tokens of a sequence;
#: requests of one micro-batch are its sequences; GPUs of a group)
LIMITS: dict[str, tuple[int, str]] = {
    "batch_per_gpu": (MAX_MICRO_BATCH_SIZE, "requests per GPU"),
    "prompt": (MAX_SEQ_LEN, "prompt tokens per request"),
    "context": (MAX_SEQ_LEN, "tokens in a request's KV cache"),
    "output": (MAX_SEQ_LEN, "tokens generated per request"),
    "sample_top_k": (MAX_SEQ_LEN, "tokens kept by the sampler (above any vocabulary)"),
    "step": (FIELD_LIMITS["schedule.step"][0], "the routing step index"),
    "tp": (FIELD_LIMITS["parallel.tp"][0], "GPUs per tensor-parallel group"),
    "attn_dp": (FIELD_LIMITS["parallel.dp"][0], "attention data-parallel ranks"),
    "ep": (FIELD_LIMITS["parallel.ep"][0], "GPUs per expert-parallel group"),
}
_SIZE_NOTE = "the most this simulator runs on one machine; docs/scenarios.md, Size limits"


def _int_ok(v: Any, lo: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def serve_from_dict(d: Any, source: str) -> ServeConfig:
    """Check the ``serve`` section; every problem is one :class:`InputError`."""
    if not d:
        raise InputError(source, "serve", "a serving scenario with a serve: section, e.g. "
                         "serve: {phase: decode, batch_per_gpu: 64} (a training scenario "
                         "runs with `moesim run`)", "no serve section")
    if not isinstance(d, dict):
        raise InputError(source, "serve", "a mapping of key: value", d)
    d = dict(d)
    if "requests_per_gpu" in d:
        if "batch_per_gpu" in d:
            raise InputError(source, "serve.requests_per_gpu",
                             "either requests_per_gpu or batch_per_gpu (the same field)",
                             "both")
        d["batch_per_gpu"] = d.pop("requests_per_gpu")
    valid = [f.name for f in dataclasses.fields(ServeConfig)]
    for k, v in d.items():
        if k not in valid:
            raise InputError(source, f"serve.{k}", f"one of the serve keys {valid} "
                             "(or requests_per_gpu)", k)
        if k in _INTS and not (v is None and k in ("context", "attn_dp")) and \
                not _int_ok(v, _INTS[k]):
            raise InputError(source, f"serve.{k}", f"an integer >= {_INTS[k]}", v)
        if k in LIMITS and v is not None and v > LIMITS[k][0]:
            raise InputError(source, f"serve.{k}", f"at most {LIMITS[k][0]:,} {LIMITS[k][1]} "
                             f"({_SIZE_NOTE})", v)
    choices = {"phase": PHASES, "ep_backend": BACKENDS, "kv_dtype": tuple(KV_DTYPES)}
    for k, allowed in choices.items():
        if k in d and d[k] not in allowed:
            raise InputError(source, f"serve.{k}", f"one of {list(allowed)}", d[k])
    for k in ("two_microbatch", "cuda_graphs"):
        if k in d and not isinstance(d[k], bool):
            raise InputError(source, f"serve.{k}", "true or false", d[k])
    cfg = ServeConfig(**d)
    if cfg.requests_per_group() % cfg.microbatches:
        raise InputError(source, "serve.batch_per_gpu",
                         f"requests per TP group (batch_per_gpu·tp = "
                         f"{cfg.requests_per_group()}) divisible into {cfg.microbatches} "
                         "equal micro-batches", cfg.batch_per_gpu)
    _check_size(cfg, source)
    return cfg


def _check_size(cfg: ServeConfig, source: str) -> None:
    """A micro-batch of the step within the training step's limits: at most
    :data:`MAX_MICRO_BATCH_SIZE` requests (sequences) and
    :data:`MAX_TOKENS_PER_MICROBATCH` tokens per TP group (routing keeps arrays of
    tokens x top_k per micro-batch: 10^12 requests asked for 54 TiB)."""
    per_mb = cfg.requests_per_group() // cfg.microbatches
    if per_mb > MAX_MICRO_BATCH_SIZE:
        raise InputError(source, "serve.batch_per_gpu", f"batch_per_gpu·tp / micro-batches "
                         f"<= {MAX_MICRO_BATCH_SIZE:,} requests per micro-batch of a TP "
                         f"group (tp={cfg.tp}, {cfg.microbatches} micro-batch(es); "
                         f"{_SIZE_NOTE})", cfg.batch_per_gpu)
    per = cfg.prompt if cfg.phase == "prefill" else 1
    if per_mb * per > MAX_TOKENS_PER_MICROBATCH:
        raise InputError(source, "serve.prompt", f"requests per micro-batch x prompt <= "
                         f"{MAX_TOKENS_PER_MICROBATCH:,} tokens per micro-batch of a TP group "
                         f"for prefill ({per_mb} requests; routing keeps arrays of tokens x "
                         f"top_k per micro-batch; {_SIZE_NOTE})", cfg.prompt)


#: fields of a scenario's own ``parallel`` section that a serving step replaces (its layout
#: is ``serve.tp`` / ``serve.ep``, one pipeline stage, attention data parallel): given
#: anything but their defaults they would be ignored, so they are refused (issue 20, 14)
SERVE_REPLACES = ("tp", "pp", "dp", "ep", "zero", "vpp", "cp", "etp", "sequence_parallel",
                  "pipeline_layout", "decoder_first_pipeline_num_layers",
                  "decoder_last_pipeline_num_layers")


#: ``overlap`` fields a serving step sets itself (:func:`serving_scenario`); a scenario's
#: own value would be dropped without a word, so it is refused (``nccl_sms`` is kept)
OVERLAP_REPLACES = ("ep_comm_overlap", "dp_overlap", "kind", "cuda_graphs", "shared_expert",
                    "tp_comm")


def check_training_layout_unset(scn: Scenario) -> None:
    """Refuse a ``parallel.*`` or ``overlap.*`` field a serving step would ignore, naming
    it."""
    why = {"parallel": "its layout from serve.tp and serve.ep (one pipeline stage, attention "
                       "data parallel)",
           "overlap": "its overlap from serve.two_microbatch (the all-to-alls of one "
                      "micro-batch under the other's compute) and serve.cuda_graphs"}
    for section, default, names in (("parallel", ParallelConfig(), SERVE_REPLACES),
                                     ("overlap", OverlapConfig(), OVERLAP_REPLACES)):
        for name in names:
            got, want = getattr(getattr(scn, section), name), getattr(default, name)
            if got != want:
                raise InputError(scn.source, f"{section}.{name}", f"left unset ({want}): a "
                                 f"serving step takes {why[section]}", got)


@functools.lru_cache(maxsize=64)
def _hidden_of(model_json: str, source: str) -> int:
    from moesim.model.read import model_from_dict
    return int(model_from_dict(json.loads(model_json), source).hidden)


def _hidden(scn: Scenario) -> int:
    """The scenario's model's hidden size (0: no model section)."""
    if not scn.model:
        return 0
    return _hidden_of(json.dumps(dict(scn.model), sort_keys=True, default=str), scn.source)


def serving_scenario(scn: Scenario, cfg: ServeConfig, world: int | None = None) -> Scenario:
    """The training-step scenario whose forward pass is the serving step: pp 1, dp =
    world / tp (attention DP), ``cfg.ep``, the EP backend, the micro-batches (one
    micro-batch = ``requests_per_group / m`` sequences of ``prompt`` tokens for prefill,
    of 1 token for decode) and the EP overlap for two micro-batches.

    ``cuda_graphs`` (decode only): the step is replayed from a CUDA graph, as vLLM
    (vllm/config/model.py: ``ModelConfig.enforce_eager`` defaults to False, "use CUDA
    graph and eager execution in hybrid"; NeMo RL's examples/configs/grpo_math_1B.yaml
    keeps ``enforce_eager: False``) runs decode batches, so no
    kernel pays a host launch (``overlap.cuda_graphs`` holds
    :data:`~moesim.scenario.schema.WHOLE_STEP_GRAPH`: the compute model's launch overhead
    is the device's graph floor, as :mod:`moesim.program.cuda_graphs` charges Megatron's
    graphed modules); every kernel's work is kept. The graph's own launch, once per step,
    is not added. Prefill steps (token counts beyond the captured sizes) launch eagerly.
    The routed experts run in one launch per kernel (``compute.expert_launches:
    grouped``) unless the scenario's ``compute`` says ``per_expert``."""
    src = scn.source
    if world is not None:
        if world % cfg.tp:
            raise InputError(src, "serve.tp", f"a divisor of the cluster's {world} GPUs",
                             cfg.tp)
        if cfg.attn_dp is not None and cfg.attn_dp != world // cfg.tp:
            raise InputError(src, "serve.attn_dp", f"GPUs / tp = {world // cfg.tp}",
                             cfg.attn_dp)
    backend = cfg.backend if cfg.ep > 1 else "nccl"
    hidden = _hidden(scn) if backend in ("deepep", "deepep-ll") else 0
    if hidden and not deepep_carries(hidden):
        if cfg.ep_backend != "auto":
            raise InputError(src, "serve.ep_backend",
                             "nccl or auto " + deepep_hidden_expected(hidden), cfg.ep_backend)
        backend = "nccl"           # auto: what such a deployment can run (gpt-oss: 2880)
    par = ParallelConfig(tp=cfg.tp, pp=1, dp=None, ep=cfg.ep, zero=0, vpp=1,
                         order=scn.parallel.order,
                         ep_backend=EPBackendConfig(kind=backend,
                                                    sms=scn.parallel.ep_backend.sms))
    m = cfg.microbatches
    per_mb = cfg.requests_per_group() // m
    seq = cfg.prompt if cfg.phase == "prefill" else 1
    sch = ScheduleConfig(kind="gpipe", microbatches=m, micro_batch_size=per_mb, seq_len=seq,
                         step=cfg.step)
    graphs = (WHOLE_STEP_GRAPH,) if cfg.cuda_graphs and cfg.phase == "decode" else ()
    ov = OverlapConfig(ep_comm_overlap=cfg.two_microbatch, dp_overlap=False,
                       nccl_sms=scn.overlap.nccl_sms, cuda_graphs=graphs)
    # a rank's routed experts run in one launch per kernel (vLLM's fused MoE, DeepGEMM's
    # grouped GEMMs) unless the scenario says otherwise (moesim.compute.select)
    compute = {"expert_launches": "grouped", **dict(scn.compute or {})}
    return dataclasses.replace(scn, parallel=par, schedule=sch, overlap=ov, compute=compute)
