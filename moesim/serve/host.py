"""The serving engine's CPU time per step, and what of it the GPU waits for.

Between two forward passes a serving engine's CPU schedules the next batch (picks the
requests, allocates KV blocks, prepares the inputs' metadata) and processes the last
batch's outputs (copies the sampled tokens back, detokenizes, checks stop conditions,
answers the client). ``serve.host_overhead`` names the engine whose CPU work is priced:

- ``none`` (default): no CPU time; a step is its GPU work.
- ``vllm``: vLLM V1's engine core runs ``schedule()``, ``execute_model()`` and
  ``update_from_output()`` one after the other (vllm-project/vllm
  ``vllm/v1/engine/core.py``, ``EngineCore.step``), so scheduling is **in series** with
  the GPU; output processing (detokenization, ``vllm/v1/engine/output_processor.py``)
  runs in the API-server process, **overlapped** with the next step.
- ``vllm-async``: vLLM V1 with ``--async-scheduling`` (``EngineCore.step_with_batch_queue``:
  the next batch is scheduled while the previous one executes): all CPU work overlapped.
- ``vllm-inproc``: vLLM V1 with its engine core in the caller's process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as NeMo RL runs it: ``nemo_rl/models/generation/
  vllm.py``, NVIDIA-NeMo/RL v0.3.0): the ``LLM`` class's ``LLMEngine.step`` runs the
  engine core's step (``InprocClient``) and then the output processor (detokenization,
  the requested log-probs, ``RequestOutput``s) in one thread, so **both** are in series
  with the GPU; what vLLM V1's separate engine-core process overlaps ("de-tokenization,
  and request streaming", vLLM blog "vLLM V1", 2025-01-27) is not overlapped. Its output
  processing costs :data:`INPROC_OUTPUT_PER_REQUEST_S` per request (below).
- ``sglang``: SGLang's overlap scheduler (on by default since v0.4; LMSYS blog
  "SGLang v0.4", 2024-12-04, "Zero-Overhead Batch Scheduler": "The scheduler runs one
  batch ahead and prepares all the metadata required for the next batch"): all CPU work
  overlapped.

A step that runs ``serial`` seconds of CPU work in series and ``overlapped`` seconds beside
the GPU's ``gpu`` seconds lasts ``max(gpu + serial, overlapped)``: work in series adds to
the step, work overlapped costs only what outlasts the GPU (and the serial part). The
step is **host-bound** when the CPU's work per step (``serial + overlapped``) is more than
the GPU's.

CPU seconds per step, linear in the requests ``B`` the engine (one TP group: one
attention data-parallel rank) steps, from published vLLM measurements on H100 hosts:

- scheduling and input preparation: :data:`SCHEDULE_PER_REQUEST_S` x ``B``, from the
  GPU's idle gap between two decode steps, "about 5-6ms" at batch 256 (Llama-2-7B, vLLM
  with asynchronous output processing, so the gap is the scheduling side; vllm-project/vllm
  issue 10634), 5.5 ms / 256; the same engine before asynchronous output processing idled
  4-13 ms per decode step (issue 6854). No small-batch figure is published: the cost is
  taken as proportional to ``B``.
- output processing: :data:`OUTPUT_PER_REQUEST_S` x ``B``, from vLLM PR 46112's
  measurement of output processing, 0.142 ms at batch 128 and 0.287 ms at 256 (0.287 ms
  / 256; 128 gives 0.1435 ms with it, +1 %).

- in-process output processing (``vllm-inproc``): :data:`INPROC_OUTPUT_PER_REQUEST_S` x
  ``B``: what asynchronous output processing took off the GPU's critical path. vLLM
  measured "5-13ms of GPU bubble" per decode step with all its CPU work in series
  (issue 6854: the sampled tokens' copy back, detokenization, pythonization, input
  preparation, scheduling) and "about 5-6ms" at batch 256 once output processing ran
  beside the GPU (issue 10634); the difference at the large-batch end, 13 - 5.5 =
  7.5 ms at batch 256 (issue 6854 gives no batch size: its upper end is taken at 10634's
  256, an assumption), is 29.3 us per request. With the scheduling, 50.8 us per request
  in series, 13 ms at batch 256. Cross-check, not used: vLLM's v0.6.0 blog measured
  Llama-3-8B on one H100 with the API server in the engine's process at 62 % CPU and
  38 % GPU time (host 1.6 x the GPU's).

A fixed part per engine step (``rl.rollout.step_fixed: vllm-v1``, :func:`fixed_extra_s`):
the per-request costs above are anchored at batch 256 and vanish at small batch, but
vLLM V1's engine step does work whatever its batch (``EngineCore.step``: ``schedule()``,
the GPU model runner's ``_update_states``, ``_prepare_inputs`` and attention-metadata
build, the piecewise CUDA graphs' replay with attention launched eagerly between them,
the sampler's eager ops and the ``.tolist()`` of the sampled ids, then
``update_from_output``; the vllm 0.9.0 wheel: ``vllm/v1/engine/core.py`` 215-230
``EngineCore.step``, ``vllm/v1/worker/gpu_model_runner.py`` 1112-1310 ``execute_model``
(``_update_states``, ``_prepare_inputs``, ``set_forward_context``, the model, the
logits, the sampler, ``sampled_token_ids.tolist()``), ``vllm/config.py`` 4025-4037 (V1's
default ``splitting_ops``: the piecewise graphs split at ``vllm.unified_attention``),
``vllm/v1/engine/llm_engine.py`` 223-241 (the ``LLM`` class's step: the engine core's
outputs, then the output processor)). Priced from one published small-batch
measurement, the split written down before any other row was compared:
:data:`V1_TPOT_1B_S`, vLLM V1's mean time per output token for Llama-3.2-1B served one
request at a time (vllm-project/vllm PR 17866, the run without the PR's fast path: 100
requests at 0.92 per second, 500 prompt and 50 output tokens), less moesim's GPU step
for it (:data:`V1_GPU_1B_S`: H100, CUDA graphs, 525 tokens of context) and less the
scheduling priced per request; the rest is the fixed part :data:`V1_STEP_FIXED_S`,
taken from the scheduling side (serving's V1 runs output processing in another
process). With it the scheduling side of a step of ``B`` requests is
``F + (5.5 ms - F) x B / 256``: unchanged at batch 256, where its per-request rate was
measured, and ``F`` at batch 0. The 1B model's step may also hold per-layer host time
(eager attention between graph pieces) that a larger model's GPU work hides: an upper
bound for larger models.

Both engines get the same per-request costs (SGLang's are not published by batch size);
an overlapped engine pays them only where they outlast the GPU. A prefill step counts its
prompts as requests (one scheduling decision and one first token each). Constants:
docs/sources.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.trace.spans import Span

#: seconds of scheduling and input preparation per request per step: vllm-project/vllm
#: issue 10634, the GPU idle "about 5-6ms" between decode steps at batch 256 (5.5 ms / 256)
SCHEDULE_PER_REQUEST_S = 5.5e-3 / 256
#: seconds of output processing per request per step: vllm-project/vllm PR 46112,
#: 0.287 ms at batch 256 (0.142 ms at 128)
OUTPUT_PER_REQUEST_S = 0.287e-3 / 256
#: seconds of output processing per request per step in vLLM's in-process engine: the
#: GPU bubble with all CPU work in series (vllm-project/vllm issue 6854, "5-13ms", its
#: upper end) less the scheduling side at batch 256 (issue 10634, 5.5 ms), over 256
INPROC_OUTPUT_PER_REQUEST_S = (13e-3 - 5.5e-3) / 256

#: the batch at which the per-request scheduling rate was measured (issue 10634)
SCHEDULE_ANCHOR_REQUESTS = 256
#: vLLM V1's mean TPOT for Llama-3.2-1B, one request at a time (vllm-project/vllm PR 17866,
#: "Without fast-path decode": Mean TPOT 2.73 ms; 100 requests, 0.92 req/s, 500 in, 50 out)
V1_TPOT_1B_S = 2.73e-3
#: moesim's GPU step for that row (Llama-3.2-1B, H100, CUDA graphs, batch 1, 525 tokens of
#: context; benchmarks/vllm_small_batch.py prints it, tests/test_step_fixed.py checks it)
V1_GPU_1B_S = 1.17726e-3
#: vLLM V1's fixed CPU time per engine step in series with the GPU: the 1B row's TPOT less
#: its GPU step and the scheduling side's per-request part, F + (5.5 ms - F) / 256 = rest
V1_STEP_FIXED_S = ((V1_TPOT_1B_S - V1_GPU_1B_S - SCHEDULE_PER_REQUEST_S)
                   / (1.0 - 1.0 / SCHEDULE_ANCHOR_REQUESTS))
#: ``rl.rollout.step_fixed`` -> the fixed CPU seconds per engine step
STEP_FIXED = {"none": 0.0, "vllm-v1": V1_STEP_FIXED_S}
#: engines whose scheduling runs in series with the GPU: the fixed part adds to the step
STEP_FIXED_ENGINES = ("vllm", "vllm-inproc")


def fixed_extra_s(requests: int, fixed_s: float = V1_STEP_FIXED_S) -> float:
    """Seconds a step of ``requests`` requests gains over the per-request scheduling
    price when ``fixed_s`` of the scheduling side is paid per step: the side becomes
    ``fixed_s + (anchor - fixed_s) x requests / 256`` (the anchor, 5.5 ms at batch 256,
    kept), so the step gains ``fixed_s x (1 - requests / 256)`` (less beyond 256)."""
    return fixed_s * (1.0 - requests / SCHEDULE_ANCHOR_REQUESTS)


@dataclass(frozen=True)
class HostEngine:
    """Which of the engine's CPU work runs in series with the GPU."""

    name: str
    schedule_in_series: bool     # scheduling + input preparation between the GPU steps
    output_in_series: bool       # output processing between the GPU steps
    doc: str
    #: the engine's own output processing per request (None: ``output_per_request_s``)
    output_per_request_s: float | None = None


#: ``serve.host_overhead`` -> the engine (``none`` has no CPU time)
ENGINES: dict[str, HostEngine | None] = {
    "none": None,
    "vllm": HostEngine("vllm", True, False, "vLLM V1: scheduling in series "
                       "(EngineCore.step), output processing in the API server, overlapped"),
    "vllm-async": HostEngine("vllm-async", False, False, "vLLM V1 --async-scheduling: "
                             "all CPU work overlapped (step_with_batch_queue)"),
    "sglang": HostEngine("sglang", False, False, "SGLang's overlap scheduler: all CPU "
                         "work overlapped, one batch ahead"),
    "vllm-inproc": HostEngine("vllm-inproc", True, True, "vLLM V1 in-process "
                              "(VLLM_ENABLE_V1_MULTIPROCESSING=0): scheduling and output "
                              "processing in series", INPROC_OUTPUT_PER_REQUEST_S),
}


@dataclass(frozen=True)
class HostStep:
    """One step's CPU work against its GPU time (seconds)."""

    engine: str
    requests: int
    gpu_s: float
    schedule_s: float
    output_s: float
    serial_s: float          # the part in series with the GPU
    overlapped_s: float      # the part beside the GPU

    @property
    def host_s(self) -> float:
        return self.schedule_s + self.output_s

    @property
    def step_s(self) -> float:
        return max(self.gpu_s + self.serial_s, self.overlapped_s)

    @property
    def exposed_s(self) -> float:
        """Seconds the step lasts beyond its GPU work."""
        return self.step_s - self.gpu_s

    @property
    def host_bound(self) -> bool:
        return self.host_s > self.gpu_s

    def summary(self) -> dict:
        return {"engine": self.engine, "requests": self.requests, "gpu_s": self.gpu_s,
                "schedule_s": self.schedule_s, "output_s": self.output_s,
                "host_s": self.host_s, "serial_s": self.serial_s,
                "overlapped_s": self.overlapped_s, "exposed_s": self.exposed_s,
                "host_bound": self.host_bound}


def host_step(name: str, requests: int, gpu_s: float, *,
              schedule_per_request_s: float = SCHEDULE_PER_REQUEST_S,
              output_per_request_s: float = OUTPUT_PER_REQUEST_S) -> HostStep | None:
    """The CPU work of one step of ``requests`` requests whose GPU work is ``gpu_s``
    under engine ``name`` (None for ``none``)."""
    eng = ENGINES[name]
    if eng is None:
        return None
    sched = schedule_per_request_s * requests
    if eng.output_per_request_s is not None:
        output_per_request_s = eng.output_per_request_s
    out = output_per_request_s * requests
    serial = (sched if eng.schedule_in_series else 0.0) + (out if eng.output_in_series else 0.0)
    return HostStep(name, requests, gpu_s, sched, out, serial, sched + out - serial)


def host_spans(h: HostStep, ranks) -> list[Span]:
    """The step's CPU work on each rank's ``host`` track: the part in series after the
    GPU work (``host.serial``, from ``gpu_s``), the overlapped part from the step's start
    (``host.overlapped``: the next step's scheduling or the last step's outputs, done
    while the GPU runs)."""
    out: list[Span] = []
    for r in sorted(set(ranks)):
        if h.serial_s > 0:
            out.append(Span(r, "host", "host", "host.serial", h.gpu_s, h.gpu_s + h.serial_s,
                            tokens=h.requests))
        if h.overlapped_s > 0:
            out.append(Span(r, "host", "host", "host.overlapped", 0.0, h.overlapped_s,
                            tokens=h.requests))
    return out
