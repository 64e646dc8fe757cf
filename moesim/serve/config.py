"""The ``serve:`` scenario section run: one prefill or decode step of a serving
deployment. The section is read and checked with the scenario
(:class:`moesim.scenario.sections.serve.ServeConfig`, where its fields and an example
are).

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

from moesim.ep.messages import deepep_carries, deepep_hidden_expected
from moesim.errors import InputError
from moesim.scenario.schema import (
    WHOLE_STEP_GRAPH,
    EPBackendConfig,
    OverlapConfig,
    ParallelConfig,
    Scenario,
    ScheduleConfig,
)
from moesim.scenario.sections.serve import ServeConfig, missing


def serve_section(scn: Scenario) -> ServeConfig:
    """The scenario's ``serve`` section (checked when it was read); a scenario without
    one is refused in one line."""
    if scn.serve is None:
        raise missing(scn.source)
    return scn.serve


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
    return _hidden_of(json.dumps(scn.model.as_dict(), sort_keys=True, default=str),
                      scn.source)


def serving_scenario(scn: Scenario, cfg: ServeConfig, world: int | None = None) -> Scenario:
    """The training-step scenario whose forward pass is the serving step: pp 1, dp =
    world / tp (attention DP), ``cfg.ep``, the EP backend, the micro-batches (one
    micro-batch = ``requests_per_group / m`` sequences of ``prompt`` tokens for prefill,
    of 1 token for decode, of ``1 + draft_tokens`` with ``serve.mtp``) and the EP overlap
    for two micro-batches.

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
    # decode: one token per request, or with serve.mtp the verified token and its draft
    # tokens (the target's verify forward, moesim.serve.mtp)
    seq = cfg.prompt if cfg.phase == "prefill" else cfg.tokens_per_request
    sch = ScheduleConfig(kind="gpipe", microbatches=m, micro_batch_size=per_mb, seq_len=seq,
                         step=cfg.step)
    graphs = (WHOLE_STEP_GRAPH,) if cfg.cuda_graphs and cfg.phase == "decode" else ()
    # DeepSeek's 5-stage decode runs the shared experts under the dispatch
    # (moesim.serve.five_stage): their kernels leave the unpermute op for the side parts
    ov = OverlapConfig(ep_comm_overlap=cfg.two_microbatch, dp_overlap=False,
                       nccl_sms=scn.overlap.nccl_sms, cuda_graphs=graphs,
                       shared_expert=(cfg.decode_overlap == "five_stage"
                                      or cfg.prefill_overlap == "sglang"),
                       nccl_tuning=scn.overlap.nccl_tuning,
                       collective_launch=scn.overlap.collective_launch)
    # a rank's routed experts run in one launch per kernel (vLLM's fused MoE, DeepGEMM's
    # grouped GEMMs) unless the scenario says otherwise (moesim.compute.select)
    compute = scn.compute.with_default("expert_launches", "grouped", src)
    return dataclasses.replace(scn, parallel=par, schedule=sch, overlap=ov, compute=compute)
