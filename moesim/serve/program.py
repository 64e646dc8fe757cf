"""Per-rank op programs of one serving step (pure: no simpy).

A serving step is the forward pass of the training step's machinery (a
:class:`moesim.program.build.Builder` it holds and writes its ops with: ``compute_op``,
``layer_ops``: the layer template's forward steps, ``collective_op``) with serving costs:
the same routing per MoE layer and micro-batch (:func:`moesim.gating.route_microbatch`,
so a hot expert stalls a decode step as it stalls training), the same EP exchanges (NCCL
all-to-all-v or DeepEP's planned normal/low-latency kernels,
:mod:`moesim.program.ep_backend`), the same TP all-reduces, and, with two micro-batches,
the same EP overlap
(:mod:`moesim.program.overlap`: the EP collectives move to the ``ep`` stream and the two
micro-batches interleave segment by segment, one's all-to-all under the other's compute,
as DeepSeek's prefill and decode do: DeepSeek-V3 report §3.4; with ``serve.decode_overlap:
five_stage`` in the stages of DeepSeek's decode pipeline, :mod:`moesim.serve.five_stage`,
:func:`moesim.program.overlap.interleave_stages`). What differs
(:mod:`moesim.serve.costs`): attention reads the KV cache (decode; a sliding-window layer
only its last ``window`` tokens) or writes it (prefill), there is no backward, no gradient
and no optimizer, and the LM head samples by a vocabulary-parallel distributed top-k
(:mod:`moesim.serve.head`) over the TP group, for one token per request.
"""

from __future__ import annotations

import dataclasses

from moesim.collectives.communicator import CollectiveSpec
from moesim.compute.pinned_sms import PinnedGemms
from moesim.model import costs, window
from moesim.program import recipe, shared_overlap
from moesim.program.build import Builder, StepPlan
from moesim.program.layer_plan import layer_steps
from moesim.program.ops import Op
from moesim.program.overlap import (
    ep_stream,
    insert_op,
    interleave,
    interleave_stages,
    is_ep,
    move_op,
)
from moesim.program.timer import Timer
from moesim.scenario.sections.serve import ServeConfig
from moesim.serve import costs as serve_costs
from moesim.serve import ll_sms, mtp
from moesim.serve.five_stage import ATTN_PARTS, DELTA_STAGES, split_attention
from moesim.serve.head import FP32_BYTES, ID_BYTES
from moesim.serve.prefill_tbo import sglang_prefill_stages


def _forward_op(kind: str) -> str:
    """The name of a MoE layer's forward op of ``kind``, read from the layer's template
    (:mod:`moesim.program.layer_plan`), never restated here."""
    for st in layer_steps(True, False, "fwd"):
        for s in (st, *st.block):
            if s.kind == kind:
                return s.name
    raise KeyError(kind)


ATTN_OP = _forward_op("attn")
ROUTER_OP = _forward_op("router")


def build_serve_step(res, cfg: ServeConfig, *, replicas: str = "independent",
                     dedup: bool = False) -> StepPlan:
    """Programs of every rank for one serving step of ``res`` (resolved from
    :func:`moesim.serve.config.serving_scenario`)."""
    return ServeBuilder(res, cfg, replicas, dedup).build()


class ServeBuilder:
    """Every rank's forward-only program of one serving step, written with the training
    builder it holds (``builder``: its routing, EP/TP transfers, MoE block and compute
    model) and the serving kernels (attention over the KV cache, the LM head's top-k).
    It is the :class:`moesim.engine.fast.forward.ForwardStep` of the fast engine."""

    def __init__(self, res, cfg: ServeConfig, replicas: str = "independent",
                 dedup: bool = False, routing_cache: dict | None = None) -> None:
        # serve.mtp: the MTP depth's decoder layer runs as one more layer (moesim.serve.mtp)
        res = mtp.with_draft(res, cfg)
        self.builder = b = Builder(res, cfg.step, replicas, dedup)
        self.cfg = cfg
        self.spec, self.tp, self.tokens = b.spec, b.tp, b.tokens
        if routing_cache is not None:
            # the routing law per (seed, step, layer) and DeepEP's copy ratios, kept by
            # the caller across steps of one deployment (moesim.serve.steps)
            b.routes.dedup_cache = routing_cache
        self.kv_bytes = cfg.kv_bytes
        # tokens that reach the LM head per micro-batch: one per request (prefill samples
        # the first output token from each prompt's last position); serve.mtp: the
        # verify's 1 + k per request, and the draft's one per request
        self.requests = res.scenario.schedule.micro_batch_size
        self.draft = mtp.draft_layer(self.spec)
        self.head_tokens = (self.requests if self.draft is None else
                            self.tokens + self.requests)
        if cfg.decode_overlap == "five_stage":
            # the fast engine runs this chain (moesim.engine.fast.forward.simulate_forward)
            from moesim.serve.five_stage import FiveStageChain
            self.chain = FiveStageChain
        if self.spec.weight_bytes != costs.ACT_BYTES:     # e.g. an FP8 checkpoint
            stored = getattr(res.compute, "stored", None)  # compute.weights / sparsity's
            b.timer = Timer(stored(self.spec.weight_bytes) if stored else
                            serve_costs.WeightBytes(res.compute, self.spec.weight_bytes))
        self.pinned = _pin_gemms(res, cfg, b)
        # serve.ll_sms: compute: DeepEP's low-latency send and receive kernels with each
        # MoE layer's attention (moesim.serve.ll_sms)
        self.ll = None
        if cfg.ll_sms == "compute" and b.ep > 1 and b.ep_backend.kind == "deepep-ll":
            rt = res.scenario.routing
            ll_sms.family_of(res.device.name, res.scenario.source)   # refused off Hopper/Blackwell
            self.ll = ll_sms.kernels(self.tokens, self.spec.top_k, self.spec.hidden,
                                     rt.dispatch_dtype, rt.combine_dtype)

    def _pin(self, prog: list[Op], start: int) -> None:
        """``serve.gemm_sms: left_by_ep``: each compute op of ``prog[start:]`` carries the
        part of its time its pinned GEMMs take (``Op.pinned_s``), which the engines do not
        slow while a communication kernel holds SMs."""
        pin = self.pinned
        for i in range(start, len(prog)):
            op = prog[i]
            if op.kernels and op.is_compute:
                p = pin.pinned_s(op.kernels)
                if p > 0:
                    prog[i] = dataclasses.replace(op, pinned_s=p)

    def build(self) -> StepPlan:
        """Every rank's program and the step's statistics."""
        return self.builder.build(self.rank_program)

    def rank_program(self, rank: int) -> list[Op]:
        """Rank ``rank``'s ops: each micro-batch's forward, two interleaved with EP
        overlap."""
        b = self.builder
        prog: list[Op] = []
        overlap = b.scn.overlap.ep_comm_overlap and b.ep > 1
        beside = shared_overlap.enabled(b.scn, self.spec)   # shared experts beside
        five = overlap and self.cfg.decode_overlap == "five_stage"
        sgl = overlap and self.cfg.prefill_overlap == "sglang"
        pending = None
        starts = []
        for item in b.order[0]:
            if item.kind != "F":          # serving runs the forward only
                continue
            start = len(prog)
            starts.append(start)
            self._forward(prog, rank, item.mb)
            if self.pinned is not None:
                self._pin(prog, start)
            if five:
                _shared_together(prog, start)
            if overlap or beside:
                ep_stream(prog, start)
            if not overlap:
                continue
            if pending is not None and five:
                interleave_stages(prog, pending, (_stages(prog, pending, start),
                                                  _stages(prog, start, len(prog))),
                                  DELTA_STAGES)
                pending = None
            elif pending is not None and sgl:   # SGLang's prefill TBO order
                interleave_stages(prog, pending, (sglang_prefill_stages(prog, pending, start),
                                                  sglang_prefill_stages(prog, start,
                                                                        len(prog))), 0)
                pending = None
            elif pending is not None:     # the two micro-batches interleave
                interleave(prog, pending, start, {})
                pending = None
            else:
                pending = start
        return prog

    def _forward(self, prog: list[Op], rank: int, mb: int) -> None:
        spec, tp, b = self.spec, self.tp, self.builder
        b.compute_op(prog, "fwd.embedding", -1, mb, "fwd", ("emb", "fwd"),
                     lambda: recipe.embedding(spec, self.tokens, tp, "fwd"))
        for layer in range(spec.layers):
            self._layer(prog, rank, layer, mb)
        self._head(prog, rank, mb)

    def attn_span(self, layer: int) -> float:
        """Keys layer ``layer``'s queries see: the prompt (prefill; a windowed layer the
        causal length with its window's pairs, :func:`moesim.model.window.effective_seq`)
        or the cached context (decode; a windowed layer ``min(context, window)``)."""
        cfg = self.cfg
        if cfg.phase == "prefill":
            return window.effective_seq(self.spec, layer, cfg.prompt)
        return window.kv_tokens(self.spec, layer, cfg.kv_tokens)

    def attn_key(self, layer: int) -> tuple:
        """Cache key of layer ``layer``'s attention kernels (one per span)."""
        span = self.attn_span(layer)
        full = self.cfg.prompt if self.cfg.phase == "prefill" else self.cfg.kv_tokens
        key = ("attn", "fwd") if span == full else ("attn", "fwd", span)
        return (*key, "ll") if self._ll_layer(layer) else key

    def _ll_layer(self, layer: int) -> bool:
        """Layer ``layer`` carries DeepEP's low-latency kernels' SM time
        (``serve.ll_sms: compute``, a MoE layer)."""
        return self.ll is not None and self.spec.is_moe_layer(layer)

    def attn_kernels(self, layer: int = 0):
        """Layer ``layer``'s attention kernels for one micro-batch (:class:`ForwardStep`)."""
        spec, tp, cfg = self.spec, self.tp, self.cfg
        span = self.attn_span(layer)
        sp = self.builder.sp      # the step plan's sequence parallelism (serving: none)
        if cfg.phase == "prefill":
            return serve_costs.prefill_attention_kernels(spec, self.tokens, span, tp,
                                                         self.kv_bytes, cfg.mla_prefill, sp)
        ks = serve_costs.decode_attention_kernels(spec, self.tokens, int(span), tp,
                                                  self.kv_bytes, cfg.mla_decode, sp)
        # serve.mtp: 1 + k queries per request, one read of each request's cache
        ks = mtp.verify_core(ks, spec, self.tokens, cfg.tokens_per_request, int(span), tp,
                             self.kv_bytes)
        if self._ll_layer(layer):     # the combine's first, the dispatch's last
            return [self.ll[0], *ks, self.ll[1]]
        return ks

    def _layer(self, prog: list[Op], rank: int, layer: int, mb: int) -> None:
        """The training builder's layer (:meth:`Builder.layer_ops`, its template's
        forward steps) with the serving attention; with the 5-stage decode overlap a MoE
        layer's attention is two ops, ATTN-0 and ATTN-1 (:mod:`moesim.serve.five_stage`)."""
        b = self.builder
        if self.cfg.decode_overlap != "five_stage" or not self.spec.is_moe_layer(layer):
            b.layer_ops(prog, rank, layer, mb, "fwd", attn=(
                self.attn_key(layer), lambda: self.attn_kernels(layer)))
            return
        start = len(prog)
        half = [((*self.attn_key(layer), ATTN_PARTS[h]),
                 lambda h=h: split_attention(self.attn_kernels(layer))[h]) for h in (0, 1)]
        b.layer_ops(prog, rank, layer, mb, "fwd", attn=half[0])
        at = next(i for i in range(start, len(prog)) if prog[i].name == ATTN_OP)
        prog[at] = dataclasses.replace(prog[at], name=ATTN_PARTS[0])
        one: list[Op] = []
        b.compute_op(one, ATTN_PARTS[1], layer, mb, "fwd", *half[1])
        insert_op(prog, at + 1, one[0])

    def head_kernels(self):
        """The LM head's kernels for one micro-batch (:class:`ForwardStep`); with
        ``serve.mtp`` the verify's head over every token, then the draft's kernels besides
        its decoder layer (:func:`moesim.serve.mtp.draft_head_kernels`)."""
        if self.draft is None:
            return serve_costs.head_kernels(self.spec, self.head_tokens, self.tp)
        return [*serve_costs.head_kernels(self.spec, self.tokens, self.tp),
                *self.draft_kernels()]

    def draft_kernels(self):
        """``serve.mtp``: the draft's kernels besides its decoder layer (one micro-batch)."""
        return mtp.draft_head_kernels(self.spec, self.tokens, self.requests, self.tp,
                                      serve_costs.head_kernels)

    def head_tp_s(self, rings, group: tuple[int, ...]) -> float:
        """The distributed top-k over the TP ``group`` on the fast engine's ring model:
        two all-reduces of one fp32 per token, an all-gather of k candidates per rank."""
        b, tp = self.head_tokens, self.tp
        k = min(self.cfg.sample_top_k, -(-self.spec.vocab // tp))
        return (2 * rings.time("all_reduce", group, float(b * FP32_BYTES))
                + rings.time("all_gather", group, float(tp * b * k * (FP32_BYTES + ID_BYTES))))

    def _head(self, prog: list[Op], rank: int, mb: int) -> None:
        """LM head over the vocabulary slice, then the distributed top-k of the TP group:
        all-reduce of the max and of the sum of exponentials (one fp32 per token each),
        all-gather of every rank's k candidates (fp32 value + int32 id)."""
        b, tp, sb = self.head_tokens, self.tp, self.builder
        sb.compute_op(prog, "fwd.lm_head", -1, mb, "fwd", ("head", "fwd"), self.head_kernels)
        if tp <= 1:
            return
        group = sb.lay.group_of(rank, "tp")
        k = min(self.cfg.sample_top_k, -(-self.spec.vocab // tp))
        stat = float(b * FP32_BYTES)
        gather = float(tp * b * k * (FP32_BYTES + ID_BYTES))
        for name, op, nbytes in (("fwd.head_max", "all_reduce", stat),
                                 ("fwd.head_sumexp", "all_reduce", stat),
                                 ("fwd.head_topk", "all_gather", gather)):
            spec = sb.collective_spec((name, group),
                                      lambda o=op, n=nbytes: CollectiveSpec(o, group, n))
            sb.collective_op(prog, "tp", name, spec, (name, mb, group[0]), -1, mb, "fwd",
                             nbytes)


def _pin_gemms(res, cfg: ServeConfig, b: Builder) -> PinnedGemms | None:
    """``serve.gemm_sms: left_by_ep`` with two micro-batches over an EP backend holding
    SMs: the builder's timer prices the FP8 GEMMs on the SMs those kernels leave, for the
    whole step (:mod:`moesim.compute.pinned_sms`, SGLang's prefill TBO); None otherwise."""
    total = int(getattr(res.device, "sms", 0) or 0)
    held = b.ep_sms
    if (cfg.gemm_sms != "left_by_ep" or not b.scn.overlap.ep_comm_overlap or b.ep <= 1
            or total <= 0 or not 0 < held < total):
        return None
    inner = res.compute
    b.timer = Timer(PinnedGemms(b.timer.model, total - held, total,
                                res.scenario.compute.precision,
                                float(getattr(inner, "launch_overhead_s", 0.0) or 0.0),
                                float(getattr(inner, "graph_kernel_s", 0.0) or 0.0)))
    return b.timer.model


def _shared_together(prog: list[Op], start: int) -> None:
    """The 5-stage pipeline's SHARED: the shared experts' second part (built beside the
    combine) moved to just after the first (beside the dispatch)."""
    first, second = shared_overlap.NAMES["fwd"]
    i = start
    while i < len(prog):
        if prog[i].name == second:
            j = max(k for k in range(start, i) if prog[k].name == first)
            move_op(prog, i, j)
        i += 1


def _stages(prog: list[Op], lo: int, hi: int) -> list[tuple[list[int], int | None]]:
    """One micro-batch's ops ``prog[lo:hi]`` cut into the 5-stage pipeline's stages
    (:mod:`moesim.serve.five_stage`): after ATTN-0, after the gate, after SHARED, after the
    combine is sent, and an empty stage that waits for the combine."""
    fc2 = shared_overlap.NAMES["fwd"][1]
    out: list[tuple[list[int], int | None]] = []
    cur: list[int] = []
    for i in range(lo, hi):
        cur.append(i)
        op = prog[i]
        if op.name in (ATTN_PARTS[0], ROUTER_OP, fc2):
            out.append((cur, None))
            cur = []
        elif is_ep(op) and op.kind == "ep_combine":
            out += [(cur, None), ([], i)]
            cur = []
    return out + ([(cur, None)] if cur else [])
