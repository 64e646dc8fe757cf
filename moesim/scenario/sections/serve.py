"""The ``serve:`` scenario section (one prefill or decode step of a serving deployment):
:class:`ServeConfig`, checked when the scenario is read. What the fields mean and how a
step runs on the training machinery: :mod:`moesim.serve.config` (``serving_scenario``).

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
  host_overhead: none      # none | vllm | vllm-async | sglang | vllm-inproc: CPU time per
                           # step (moesim.serve.host)
  decode_overlap: segments # segments | five_stage: how the two micro-batches of a decode
                           # step overlap (moesim.serve.five_stage)
  gemm_sms: all            # all | left_by_ep: with two micro-batches, the FP8 GEMMs run on
                           # the SMs the EP kernels leave for the whole step, as SGLang's
                           # prefill TBO runs DeepGEMM (moesim.compute.pinned_sms)
  mla_decode: gemm         # gemm | sglang: a decode step's MLA up-projections as one GEMM
                           # with training's head-layout copies, or as SGLang's absorbed
                           # FP8 batched GEMMs (moesim.serve.mla)
  mla_prefill: training    # training | sglang: a prefill step's MLA kernels as training's
                           # forward lists them, or as SGLang's prefill runs them
                           # (moesim.serve.mla)
  prefill_overlap: segments # segments | sglang: how a prefill step's two micro-batches
                           # overlap; sglang: SGLang's TBO stages, each layer ending when both
                           # combines are done (moesim.serve.prefill_tbo; exact engine)
  ll_sms: none             # none | compute: DeepEP's low-latency send and receive kernels
                           # hold no SMs, or run on the compute stream (moesim.serve.ll_sms)
  mtp:                     # optional (decode): speculative decoding with the model's MTP
    draft_tokens: 1        # module as draft (moesim.serve.mtp); draft tokens per request
    acceptance: 0.875      # probability the draft token is accepted (0..1)
```
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from moesim.compute.pinned_sms import GEMM_SMS
from moesim.errors import InputError
from moesim.scenario.limits import (
    FIELD_LIMITS,
    MAX_MICRO_BATCH_SIZE,
    MAX_SEQ_LEN,
    MAX_TOKENS_PER_MICROBATCH,
)
from moesim.scenario.sections import as_written

PHASES = ("prefill", "decode")
BACKENDS = ("auto", "nccl", "deepep", "deepep-ll")
KV_DTYPES = {"bf16": 2, "fp8": 1}
#: ``auto``: DeepEP's normal (high-throughput) kernels for prefill and its low-latency
#: kernels for decode (deepseek-ai/DeepEP README: "normal kernels ... for training and
#: inference prefilling", "low-latency kernels ... for inference decoding")
AUTO_BACKEND = {"prefill": "deepep", "decode": "deepep-ll"}
#: ``serve.host_overhead``: whose CPU time per step is priced (the engines of
#: :data:`moesim.serve.host.ENGINES`; ``none``: no CPU time)
HOST_OVERHEADS = ("none", "vllm", "vllm-async", "sglang", "vllm-inproc")
#: transformers' GenerationConfig default top_k (huggingface/transformers,
#: src/transformers/generation/configuration_utils.py: ``top_k = 50``)
DEFAULT_TOP_K = 50
#: ``serve.decode_overlap``: ``segments``, the training builder's interleave (a segment
#: ends at each all-to-all, :mod:`moesim.program.overlap`); ``five_stage``, DeepSeek's
#: decode pipeline (attention split in two, :mod:`moesim.serve.five_stage`)
DECODE_OVERLAPS = ("segments", "five_stage")
#: ``serve.mla_decode``: ``gemm``, the decode's MLA kernels as training's forward lists
#: them (the key/value up-projection one GEMM, the per-head key/value copies);
#: ``sglang``, SGLang's weight-absorbed path on an FP8 checkpoint (:mod:`moesim.serve.mla`)
MLA_DECODES = ("gemm", "sglang")
#: ``serve.mla_prefill``: ``training``, a prefill step's MLA kernels as training's forward
#: lists them; ``sglang``, as SGLang's multi-head prefill runs them (:mod:`moesim.serve.mla`)
MLA_PREFILLS = ("training", "sglang")
#: ``serve.prefill_overlap``: ``segments``, the training builder's interleave; ``sglang``,
#: SGLang's prefill TBO stages (:mod:`moesim.serve.prefill_tbo`)
PREFILL_OVERLAPS = ("segments", "sglang")
#: ``serve.ll_sms``: ``none``, DeepEP's low-latency kernels hold no SMs; ``compute``, their
#: send and receive kernels run on the compute stream, as SGLang calls them with the
#: receive hook (:mod:`moesim.serve.ll_sms`)
LL_SMS = ("none", "compute")
#: ``serve.mtp.draft_tokens``: draft tokens per request and step that moesim runs (SGLang's
#: one-step EAGLE draft with DeepSeek's NextN module: ``--speculative-num-steps 1``;
#: moesim.serve.mtp)
MTP_DRAFT_TOKENS = (1,)


@dataclass(frozen=True)
class MTPConfig:
    """``serve.mtp``: speculative decoding with the model's multi-token-prediction module
    as the draft (:mod:`moesim.serve.mtp`)."""
    draft_tokens: int = 1
    acceptance: float = 0.875

    @property
    def emitted(self) -> float:
        """Tokens a request emits per step: the verified token plus each draft token
        accepted (one draft token: ``1 + acceptance``)."""
        return 1.0 + self.acceptance


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
    host_overhead: str = "none"
    decode_overlap: str = "segments"
    gemm_sms: str = "all"
    mla_decode: str = "gemm"
    mla_prefill: str = "training"
    prefill_overlap: str = "segments"
    ll_sms: str = "none"
    mtp: MTPConfig | None = None

    @property
    def tokens_per_request(self) -> int:
        """Tokens each request puts through the model in a decode step: one, or with
        ``mtp`` the verified token and its draft tokens."""
        on = self.mtp is not None and self.phase == "decode"
        return 1 + (self.mtp.draft_tokens if on else 0)

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
        per = self.prompt if self.phase == "prefill" else self.tokens_per_request
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


def missing(source: str) -> InputError:
    """The error of a serving command on a scenario without a ``serve:`` section."""
    return InputError(source, "serve", "a serving scenario with a serve: section, e.g. "
                      "serve: {phase: decode, batch_per_gpu: 64} (a training scenario "
                      "runs with `moesim run`)", "no serve section")


def serve_from_dict(d: Any, source: str) -> ServeConfig:
    """Check the ``serve`` section; every problem is one :class:`InputError`."""
    if not d:
        raise missing(source)
    if not isinstance(d, dict):
        raise InputError(source, "serve", "a mapping of key: value", d)
    written = dict(d)
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
    choices = {"phase": PHASES, "ep_backend": BACKENDS, "kv_dtype": tuple(KV_DTYPES),
               "host_overhead": HOST_OVERHEADS, "decode_overlap": DECODE_OVERLAPS,
               "gemm_sms": GEMM_SMS, "mla_decode": MLA_DECODES,
               "mla_prefill": MLA_PREFILLS, "prefill_overlap": PREFILL_OVERLAPS,
               "ll_sms": LL_SMS}
    for k, allowed in choices.items():
        if k in d and d[k] not in allowed:
            raise InputError(source, f"serve.{k}", f"one of {list(allowed)}", d[k])
    for k in ("two_microbatch", "cuda_graphs"):
        if k in d and not isinstance(d[k], bool):
            raise InputError(source, f"serve.{k}", "true or false", d[k])
    if d.get("mtp") is not None:
        d["mtp"] = _mtp_from(d["mtp"], d.get("phase", "decode"), source)
    cfg = as_written(ServeConfig(**d), written)
    if cfg.requests_per_group() % cfg.microbatches:
        raise InputError(source, "serve.batch_per_gpu",
                         f"requests per TP group (batch_per_gpu·tp = "
                         f"{cfg.requests_per_group()}) divisible into {cfg.microbatches} "
                         "equal micro-batches", cfg.batch_per_gpu)
    _check_size(cfg, source)
    _check_overlap(cfg, source)
    if cfg.gemm_sms == "left_by_ep" and not cfg.two_microbatch:
        raise InputError(source, "serve.two_microbatch", "true with gemm_sms: left_by_ep "
                         "(GEMMs give the EP kernels their SMs under two-batch overlap)",
                         cfg.two_microbatch)
    if cfg.mla_decode != "gemm" and cfg.phase != "decode":
        raise InputError(source, "serve.mla_decode", "gemm for a prefill step (it names "
                         "how a decode step runs MLA)", cfg.mla_decode)
    if cfg.prefill_overlap != "segments":
        for ok, field, want, got in (
                (cfg.phase == "prefill", "serve.phase", "prefill with prefill_overlap: "
                 "sglang (SGLang's prefill TBO order)", cfg.phase),
                (cfg.two_microbatch, "serve.two_microbatch", "true with prefill_overlap: "
                 "sglang (it orders two micro-batches)", cfg.two_microbatch),
                (cfg.ep > 1, "serve.ep", "> 1 with prefill_overlap: sglang", cfg.ep)):
            if not ok:
                raise InputError(source, field, want, got)
    if cfg.ll_sms != "none":
        for ok, field, want, got in (
                (cfg.phase == "decode", "serve.phase", "decode with ll_sms: compute (the "
                 "low-latency kernels are the decode's)", cfg.phase),
                (cfg.ep > 1, "serve.ep", "> 1 with ll_sms: compute", cfg.ep),
                (cfg.backend == "deepep-ll", "serve.ep_backend", "deepep-ll or auto with "
                 "ll_sms: compute", cfg.ep_backend)):
            if not ok:
                raise InputError(source, field, want, got)
    if cfg.mla_prefill != "training" and cfg.phase != "prefill":
        raise InputError(source, "serve.mla_prefill", "training for a decode step (it "
                         "names how a prefill step runs MLA)", cfg.mla_prefill)
    return cfg


def _mtp_from(m: Any, phase: Any, source: str) -> MTPConfig:
    """The ``serve.mtp`` mapping, checked: a decode step's draft of one token with an
    acceptance probability in [0, 1]."""
    if phase != "decode":
        raise InputError(source, "serve.phase", "decode with serve.mtp (speculative "
                         "decoding drafts output tokens)", phase)
    if not isinstance(m, dict):
        raise InputError(source, "serve.mtp", "a mapping {draft_tokens: 1, acceptance: "
                         "0..1}", m)
    for k in m:
        if k not in ("draft_tokens", "acceptance"):
            raise InputError(source, f"serve.mtp.{k}", "one of the keys draft_tokens, "
                             "acceptance", k)
    k = m.get("draft_tokens", 1)
    if not _int_ok(k, 1) or k not in MTP_DRAFT_TOKENS:
        raise InputError(source, "serve.mtp.draft_tokens", "1 (SGLang's one-step draft; "
                         "longer drafts are not modelled)", k)
    a = m.get("acceptance", MTPConfig.acceptance)
    if isinstance(a, bool) or not isinstance(a, int | float) or not 0 <= a <= 1:
        raise InputError(source, "serve.mtp.acceptance", "a probability between 0 and 1 "
                         "(DeepSeek-V3 report §5.4.3: 0.85-0.90 for the second token)", a)
    return MTPConfig(draft_tokens=k, acceptance=float(a))


def _check_overlap(cfg: ServeConfig, source: str) -> None:
    """``decode_overlap: five_stage`` is a decode step of two micro-batches over DeepEP's
    low-latency kernels, whose hook-based receive holds no SMs while data moves
    (deepseek-ai/DeepEP README, "two-micro-batch overlapping"; moesim.serve.five_stage)."""
    if cfg.decode_overlap != "five_stage":
        return
    for ok, field, want, got in (
            (cfg.phase == "decode", "serve.phase", "decode with decode_overlap: five_stage "
             "(DeepSeek's 5-stage pipeline is its decoding overlap)", cfg.phase),
            (cfg.two_microbatch, "serve.two_microbatch", "true with decode_overlap: "
             "five_stage (it overlaps two micro-batches)", cfg.two_microbatch),
            (cfg.ep > 1, "serve.ep", "> 1 with decode_overlap: five_stage (it hides the EP "
             "all-to-alls)", cfg.ep),
            (cfg.backend == "deepep-ll", "serve.ep_backend", "deepep-ll or auto with "
             "decode_overlap: five_stage (the low-latency kernels' hook-based receive)",
             cfg.ep_backend)):
        if not ok:
            raise InputError(source, field, want, got)


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
    per = cfg.prompt if cfg.phase == "prefill" else cfg.tokens_per_request
    if per_mb * per > MAX_TOKENS_PER_MICROBATCH:
        raise InputError(source, "serve.prompt", f"requests per micro-batch x prompt <= "
                         f"{MAX_TOKENS_PER_MICROBATCH:,} tokens per micro-batch of a TP group "
                         f"for prefill ({per_mb} requests; routing keeps arrays of tokens x "
                         f"top_k per micro-batch; {_SIZE_NOTE})", cfg.prompt)
