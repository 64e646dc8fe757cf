"""One serving step end to end: load the ``serve`` section, resolve its layout, build the
op programs (:mod:`moesim.serve.program`), run them on the exact engine and summarise.

``engine.mode: exact`` (default) runs the op programs on simpy; ``engine.mode: fast`` runs
the same step on the fast engine's lockstep model (:mod:`moesim.serve.fast`), for
deployments too large for the exact engine (DeepSeek-V3 decode over 128 GPUs).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from moesim.engine import collector
from moesim.engine.exact.engine import simulate_exact
from moesim.errors import InputError
from moesim.memory.fit import fit_summary, step_fits
from moesim.scenario import load_scenario
from moesim.scenario.blame import blame_overrides
from moesim.scenario.resolved import Resolved
from moesim.scenario.sections.serve import ServeConfig
from moesim.serve import mtp
from moesim.serve.config import (
    check_training_layout_unset,
    serve_section,
    serving_scenario,
)
from moesim.serve.host import HostStep, host_spans, host_step
from moesim.serve.memory import serve_memory
from moesim.serve.program import ServeBuilder
from moesim.trace.result import SimResult
from moesim.wiring import resolve

#: the training layout fields serving sets from its own section
_FIELDS = {"parallel.tp": "serve.tp", "parallel.pp": "serve.tp", "parallel.dp": "serve.tp",
           "parallel.ep": "serve.ep", "parallel.ep_backend.kind": "serve.ep_backend",
           "schedule.seq_len": "serve.prompt"}


def resolve_serve(target: str | Path, overrides=()) -> tuple[Resolved, ServeConfig]:
    """Load a scenario with a ``serve`` section (and ``--set`` overrides), check it and
    resolve the serving layout. Errors name the ``serve`` fields."""
    scn = load_scenario(target, list(overrides))
    try:
        cfg = serve_section(scn)
        check_training_layout_unset(scn)
        try:
            res = resolve(serving_scenario(scn, cfg))
            serving_scenario(scn, cfg, res.layout.world)   # attn_dp and tp against the world
            mtp.with_draft(res, cfg)          # serve.mtp: the model has an MTP depth
            if cfg.prefill_overlap == "sglang" and res.scenario.engine.mode == "fast":
                raise InputError(scn.source, "serve.prefill_overlap", "segments on the fast "
                                 "engine (SGLang's prefill order runs on the exact engine: "
                                 "engine.mode exact)", cfg.prefill_overlap)
        except InputError as err:
            field = _FIELDS.get(err.field)
            if field is None:
                raise
            raise InputError(err.source, field, err.expected, err.got) from None
    except InputError as err:   # a value given by --set: the command line's (issue 12)
        raise blame_overrides(err, scn.source, list(overrides),
                              lambda ov: resolve_serve(target, ov)) from None
    return res, cfg


def simulate_serve(res: Resolved, cfg: ServeConfig, *, progress=None,
                   record_series: bool = True, spans: bool = True,
                   host_overhead: str | None = None) -> SimResult:
    """Run one serving step on the scenario's engine; ``result.summary`` is the serving
    summary (:func:`serve_summary`). ``spans=False``: the fast engine keeps none (a step
    priced for a surface; the exact engine keeps its own). ``host_overhead`` (default:
    ``cfg.host_overhead``) names the engine whose CPU time per step is added
    (:mod:`moesim.serve.host`). With ``serve.mtp`` the step is speculative decoding's
    (:mod:`moesim.serve.mtp`: the verify forward and the draft's layer)."""
    res = mtp.with_draft(res, cfg)
    if res.scenario.engine.mode == "fast":
        from moesim.serve.fast import simulate_serve_fast
        builders: list = []
        with collector.paused():   # as for a training step (moesim.engine.collector)
            result, plan = simulate_serve_fast(res, cfg, progress=progress,
                                               span_ranks=64 if spans else 0,
                                               builders=builders)
        h = _with_host(result, cfg, host_overhead)
        result.summary = serve_summary(res, cfg, result.summary, plan, h,
                                       _draft_s(result, builders[-1], cfg))
        result.summary["engine"] = "fast"
        return result
    plans, builders = [], []

    def build(r, replicas="independent", dedup=False):
        builders.append(ServeBuilder(r, cfg, replicas, dedup))
        plans.append(builders[-1].build())
        return plans[-1]

    with collector.paused():
        result = simulate_exact(res, progress=progress, record_series=record_series,
                                build=build)
    h = _with_host(result, cfg, host_overhead)
    result.summary = serve_summary(res, cfg, result.summary, plans[-1], h,
                                   _draft_s(result, builders[-1], cfg))
    return result


def _draft_s(result: SimResult, sb: ServeBuilder, cfg: ServeConfig) -> float | None:
    """``serve.mtp``: rank 0's compute on the draft (its decoder layer's spans and its
    other kernels, priced by the step's compute model), None without spans or MTP."""
    if not mtp.active(cfg):
        return None
    t, _ = sb.builder.timer(("mtp", "draft"), sb.draft_kernels)
    return mtp.draft_compute_s(result.spans, sb.spec, t * sb.builder.m)


def _with_host(result: SimResult, cfg: ServeConfig, name: str | None) -> HostStep | None:
    """Add the engine's CPU time per step to ``result`` (its step time, breakdown, MFU
    and a ``host`` span on every rank that has spans); None when there is none."""
    h = host_step(name or cfg.host_overhead, cfg.requests_per_group(),
                  float(result.summary["step_time_s"]))
    if h is None:
        return None
    s = result.summary
    s["step_time_s"] = result.step_time_s = h.step_s
    s["breakdown_s"] = {**s["breakdown_s"], "host": h.exposed_s}
    if h.step_s > 0:
        s["mfu"] = s["mfu"] * h.gpu_s / h.step_s
    result.spans = [*result.spans, *host_spans(h, {sp.rank for sp in result.spans})]
    return h


def _echo(cfg: ServeConfig) -> dict:
    """The section's fields for the summary; ``host_overhead``, ``decode_overlap``,
    ``gemm_sms``, ``mla_decode``, ``mla_prefill``, ``prefill_overlap`` and ``ll_sms`` only
    when they are not the default."""
    d = dataclasses.asdict(cfg)
    for key, default in (("host_overhead", "none"), ("decode_overlap", "segments"),
                         ("gemm_sms", "all"), ("mla_decode", "gemm"),
                         ("mla_prefill", "training"), ("prefill_overlap", "segments"),
                         ("ll_sms", "none"), ("mtp", None)):
        if d.get(key) == default:
            del d[key]
    return d


def serve_summary(res: Resolved, cfg: ServeConfig, s: dict, plan,
                  host: HostStep | None = None, draft_s: float | None = None) -> dict:
    """The serving fields on top of the engine's summary: phase, ttft_s (prefill) or
    tpot_s (decode), tokens/s (in all and per GPU), the serving memory table, and with a
    ``host_overhead`` the step's CPU time (``host``: :meth:`HostStep.summary`)."""
    step = float(s["step_time_s"])
    world = res.layout.world
    tokens = plan.tokens_per_step
    requests = cfg.requests_per_group() * res.layout.dp
    if mtp.active(cfg):        # tokens emitted: 1 + acceptance per request (moesim.serve.mtp)
        tokens = requests * mtp.emitted_tokens(cfg)
    out = {"scenario": s["scenario"], "phase": cfg.phase, "world": world,
           "step_time_s": step}
    if cfg.phase == "prefill":
        out["ttft_s"] = step          # the batch's prompts, first token sampled (no queueing)
    else:
        out["tpot_s"] = step / mtp.emitted_tokens(cfg)
        out["request_decode_s"] = cfg.output * out["tpot_s"]
    tps = tokens / step if step > 0 else 0.0
    memory = serve_memory(res, cfg, plan.rank_received)
    fit = fit_summary(step_fits(memory, "serving step"))   # as every command reports it
    out.update({
        "tokens_per_step": tokens, "requests_per_step": requests,
        "tokens_per_s": tps, "tokens_per_s_per_gpu": tps / world,
        "model_flops": s["model_flops"], "mfu": s["mfu"],
        "breakdown_s": s["breakdown_s"], "per_rank": s["per_rank"], "experts": s["experts"],
        "memory": memory, "fit": fit, "oom": fit["oom"],
        # what priced the kernels (the training-pass counts of the engine's step do not
        # apply to a serving step: only the model and the section's choice)
        "kernel_pricing": {k: s["kernel_pricing"][k] for k in ("compute_section",
                                                                "compute_model")
                           if k in s.get("kernel_pricing", {})},
        "hot_ranks": s["hot_ranks"], "warnings": s["warnings"],
        "serve": {**_echo(cfg), "ep_backend": res.scenario.parallel.ep_backend.kind,
                  "attn_dp": res.layout.dp, "kv_tokens": cfg.kv_tokens,
                  "tokens_per_gpu": cfg.tokens_per_group() // cfg.tp},
        "engine": "exact", "replicas": s.get("replicas"), "shortcuts": s.get("shortcuts", []),
    })
    if "eplb" in s:        # routing.placement: the EPLB plan (moesim.engine.summary)
        out["eplb"] = s["eplb"]
    if host is not None:
        out["host"] = host.summary()
    if mtp.active(cfg):
        out["mtp"] = mtp.summary(cfg, step, draft_s)
    if "sim_wall_s" in s:
        out["sim_wall_s"] = s["sim_wall_s"]
    return out
