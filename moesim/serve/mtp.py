"""Speculative decoding with the model's multi-token-prediction module as the draft
(``serve.mtp``), as SGLang runs DeepSeek-V3's NextN module with one draft token.

DeepSeek-V3 report (arXiv:2412.19437) §5.4.3: the MTP module "combined with the
framework of speculative decoding"; "the acceptance rate of the second token prediction
ranges between 85% and 90%", "1.8 times TPS". SGLang's EAGLE worker
(sgl-project/sglang ``python/sglang/srt/speculative/eagle_worker.py`` at 00559eac,
``forward_batch_generation``) runs per decode step, with ``--speculative-num-steps 1``
(one draft token per request):

- ``verify``: the target model's forward over the verified token and the draft token of
  every request (``num_tokens_per_req = speculative_num_steps + 1``), so every GEMM, the
  MoE dispatch, experts and combine and the LM head run on ``requests x (1 + k)`` tokens;
  attention runs ``1 + k`` queries per request over the same KV cache (its FLOPs grow,
  the cache read does not) and writes ``1 + k`` tokens' KV (the draft token's too);
- ``draft``: ``forward_draft_extend_after_decode``, the draft model over ``1 + k`` tokens
  per request (``num_tokens_per_req = speculative_num_steps + 1``) keeping the last
  position's logits (``CaptureHiddenMode.LAST``); ``draft_forward`` runs no further
  forward with one step ("We don't need to run the last forward").

The draft model is DeepSeek's NextN module (``python/sglang/srt/models/deepseek_nextn.py``
at 0114f9c9, ``DeepseekModelNextN``): the shared embedding, ``enorm`` and ``hnorm``,
``eh_proj`` over the concatenated [embedding; hidden] (2h -> h), one decoder layer with a
MoE (``DeepseekV2DecoderLayer(..., is_nextn=True)``) with its own KV cache ("Draft and
target worker own their own KV cache pools"), ``shared_head.norm`` and the shared LM head.

In moesim the step is one forward of ``1 + k`` tokens per request through the model's
layers and one more: the MTP depth's decoder layer as layer ``layers`` (routed, dispatched
and priced as any MoE layer, with its own KV cache, by both engines:
:func:`with_draft`); the LM head's op carries the verify's head over all tokens and the
draft's embedding, norms, ``eh_proj`` (``1 + k`` tokens per request) and head on one
token per request (:func:`draft_head_kernels`). A request emits ``1 + a`` tokens per step
(``a``: ``serve.mtp.acceptance``): TPOT is the step over ``1 + a``.
"""

from __future__ import annotations

import dataclasses

from moesim.compute.base import Kernel
from moesim.errors import InputError
from moesim.program import recipe
from moesim.scenario.sections.serve import ServeConfig
from moesim.serve.kv import kv_values_per_token_layer

#: suffix of a model spec that carries the draft layer (:func:`with_draft`)
DRAFT_SUFFIX = "+mtp-draft"
#: the core attention kernel over the KV cache (moesim.serve.costs.decode_core_kernel)
CORE = "attention_decode"
#: id(spec) -> (spec, its spec with the draft layer): one object per model, so consecutive
#: steps of one deployment share the fast engine's state (moesim.serve.steps)
_DRAFTS: dict[int, tuple] = {}


def active(cfg: ServeConfig) -> bool:
    """Whether ``cfg``'s step is speculative decoding's (``serve.mtp`` on a decode step)."""
    return cfg.mtp is not None and cfg.phase == "decode"


def with_draft(res, cfg: ServeConfig):
    """``res`` whose model runs the MTP depth's decoder layer as one more layer (index
    ``layers``) when ``cfg.mtp`` is set; ``res`` itself otherwise or when it already
    does. A model without an MTP depth (``model.mtp_layers``) is refused in one line."""
    spec = res.model
    if not active(cfg) or spec.name.endswith(DRAFT_SUFFIX):
        return res
    if spec.mtp_layers < 1:
        raise InputError(res.scenario.source, "model.mtp_layers", ">= 1 with serve.mtp (the "
                         "draft is the model's MTP module; DeepSeek-V3's config.json: "
                         "num_nextn_predict_layers 1)", spec.mtp_layers)
    hit = _DRAFTS.get(id(spec))
    if hit is not None and hit[0] is spec:
        return dataclasses.replace(res, model=hit[1])
    draft = dataclasses.replace(spec, name=spec.name + DRAFT_SUFFIX, layers=spec.layers + 1,
                                mtp_layers=spec.mtp_layers - 1)
    if draft.is_moe_layer(spec.layers) != spec.is_moe_layer(spec.layers):
        raise InputError(res.scenario.source, "serve.mtp", "a model whose MTP layer is laid "
                         "out as its next decoder layer (MoE pattern)", spec.name)
    if len(_DRAFTS) > 64:
        _DRAFTS.clear()
    _DRAFTS[id(spec)] = (spec, draft)
    return dataclasses.replace(res, model=draft)


def draft_layer(spec) -> int | None:
    """Index of the draft's decoder layer in a spec from :func:`with_draft`; else None."""
    return spec.layers - 1 if spec.name.endswith(DRAFT_SUFFIX) else None


def verify_core(kernels: list[Kernel], spec, tokens: int, per_request: int, context: int,
                tp: int, kv_bytes: int) -> list[Kernel]:
    """``kernels`` (one layer's decode attention over ``tokens`` query tokens,
    ``per_request`` of them per request) with the core attention reading each request's
    cache once: its FLOPs are the queries', its bytes the cache of ``tokens /
    per_request`` requests plus every query's vectors."""
    if per_request <= 1:
        return kernels
    cached = context * kv_values_per_token_layer(spec, tp) * kv_bytes
    extra = (tokens - tokens // per_request) * cached      # reads the queries share
    return [dataclasses.replace(k, bytes=max(float(k.bytes) - extra, 0.0))
            if k.name == CORE else k for k in kernels]


def draft_head_kernels(spec, tokens: int, requests: int, tp: int,
                       head) -> list[Kernel]:
    """The draft's kernels besides its decoder layer, for one micro-batch: the shared
    embedding, ``enorm``/``hnorm`` and ``eh_proj`` over ``tokens`` (training's MTP
    kernels, :func:`moesim.model.mtp.head_kernels` less its loss head), then the final
    norm, LM head and sampler on ``requests`` (one per request: the last position),
    ``head(spec, n, tp)`` giving the serving head's kernels for ``n`` tokens."""
    return [*recipe.mtp_draft_pre(spec, tokens, tp), *head(spec, requests, tp)]


def emitted_tokens(cfg: ServeConfig) -> float:
    """Tokens a request emits per decode step: 1, or ``1 + acceptance`` with one draft."""
    return cfg.mtp.emitted if active(cfg) else 1.0


def summary(cfg: ServeConfig, step_s: float, draft_s: float | None) -> dict:
    """The summary's ``mtp`` block: the knob, tokens emitted per request per step, the
    step and its parts (``draft_s``: rank 0's compute on the draft; ``verify_s`` the
    rest), TPOT = step / emitted."""
    e = emitted_tokens(cfg)
    out = {"draft_tokens": cfg.mtp.draft_tokens, "acceptance": cfg.mtp.acceptance,
           "emitted_per_request": e, "step_s": step_s, "tpot_s": step_s / e}
    if draft_s is not None:
        out.update(draft_s=draft_s, verify_s=step_s - draft_s)
    return out


def draft_compute_s(spans, spec, head_s: float) -> float | None:
    """Rank 0's compute on the draft: its spans on the draft layer plus the draft's head
    kernels (``head_s``, both micro-batches); None without spans of rank 0."""
    layer = draft_layer(spec)
    mine = [s for s in spans if s.rank == 0]
    if layer is None or not mine:
        return None
    return head_s + sum(s.end_s - s.start_s for s in mine
                        if s.layer == layer and s.kind == "compute")

