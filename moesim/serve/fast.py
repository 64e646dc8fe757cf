"""A serving step on the fast engine's lockstep model (``engine.mode: fast``).

A serving step has one pipeline stage and forward items only, so it is the simplest case
of :mod:`moesim.engine.fast`: each EP group is one chain
(:class:`moesim.engine.fast.pipeline.Chain`); every member runs the same attention (here
the serving kernels of :class:`moesim.serve.program.ServeBuilder`: KV-cache reads for
decode, the prompt's causal attention for prefill), then the EP dispatch, its own
experts and the combine, timed as the fast engine times them (routing through the exact
builder's ``route``, so token counts and expert statistics equal the exact engine's;
all-to-alls by the link bound, DeepEP exchanges by the exact engine's rule on link-bound
flow ends). With two micro-batches, the pair runs as the fast engine pairs overlapped
items: each all-to-all is hidden by up to half the partner's non-expert compute
(``summary["shortcuts"]`` gives the measured bounds). No gradient phase, no optimizer.
"""

from __future__ import annotations

import time

import numpy as np

from moesim.engine.breakdown import CATEGORIES
from moesim.engine.fast.engine import Context, _chains, _route_rec
from moesim.engine.fast.pipeline import Chain
from moesim.engine.fast.summary import make_plan, shortcuts
from moesim.engine.summary import link_stats, make_result, summarize
from moesim.model import costs
from moesim.serve import costs as serve_costs
from moesim.serve.config import ServeConfig
from moesim.serve.head import FP32_BYTES, ID_BYTES
from moesim.serve.program import ServeBuilder
from moesim.trace.result import SimResult


class ServeChain(Chain):
    """A chain of one stage running serving items (forward only, serving costs)."""

    def __init__(self, ctx, groups, route, span_pos, builder: ServeBuilder) -> None:
        super().__init__(ctx, groups, route, span_pos)
        self.sb = builder

    def layer(self, s: int, layer: int, mb: int, phase: str) -> None:
        c = self.c
        self._compute(s, "fwd.attn", ("attn", "fwd"), self.sb._attn_kernels, layer, mb, "fwd")
        self._tp(s, "fwd.tp_attn", layer, mb, "fwd")
        if c.spec.is_moe_layer(layer):
            self._moe(s, layer, mb, "fwd")
        else:
            self._compute(s, "fwd.ffn", ("ffn", "fwd"), lambda: costs.dense_ffn_kernels(
                c.spec, c.tokens, c.tp, "fwd"), layer, mb, "fwd")
        self._tp(s, "fwd.tp_mlp", layer, mb, "fwd")

    def item(self, s: int, item, budget: float = 0.0) -> None:
        c, sb = self.c, self.sb
        mb = item.mb
        self.budget = budget
        self._compute(s, "fwd.embedding", ("emb", "fwd"), lambda: costs.embedding_kernels(
            c.spec, c.tokens, c.tp, "fwd"), -1, mb, "fwd")
        for layer in range(c.spec.layers):
            self.layer(s, layer, mb, "fwd")
        self._compute(s, "fwd.lm_head", ("head", "fwd"), lambda: serve_costs.head_kernels(
            c.spec, sb.head_tokens, c.tp), -1, mb, "fwd")
        if c.tp > 1:     # distributed top-k over the TP group: two all-reduces, a gather
            g = tuple(c.res.layout.group_of(self.groups[s][0], "tp"))
            b = sb.head_tokens
            k = min(sb.cfg.sample_top_k, -(-c.spec.vocab // c.tp))
            d = (2 * c.rings.time("all_reduce", g, float(b * FP32_BYTES))
                 + c.rings.time("all_gather", g, float(c.tp * b * k * (FP32_BYTES + ID_BYTES))))
            a = self.t[s]
            self.out[s].acc["tp"] += d
            self._span(s, "tp", "fwd.head_topk", a, a + d, -1, mb, "fwd")
            self.t[s] = a + d
        self.budget = 0.0
        self.out[s].end = self.t[s].copy()


def _budget(ctx: Context, sb: ServeBuilder) -> float:
    """Non-expert compute of one micro-batch per all-to-all it holds (the fast engine's
    rule, :func:`moesim.engine.fast.engine._budget`, with serving attention)."""
    spec, tok, tp = ctx.spec, ctx.tokens, ctx.tp
    attn, _ = ctx.timer(("attn", "fwd"), sb._attn_kernels)
    pre, _ = ctx.timer(("router", "fwd"), lambda: [
        *costs.router_kernels(spec, ctx.ep_tokens, "fwd"),
        *costs.permute_kernels(spec, ctx.sent, "fwd")])
    post, _ = ctx.timer(("post", "fwd"), lambda: [
        *costs.unpermute_kernels(spec, ctx.sent, "fwd"),
        *costs.shared_expert_kernels(spec, tok, tp, "fwd")])
    return (attn + pre + post) / 2


def simulate_serve_fast(res, cfg: ServeConfig, *, progress=None, span_ranks: int = 64
                        ) -> tuple[SimResult, object]:
    """One serving step on the lockstep model; returns the result (training summary
    keys, the caller adds the serving ones) and the step plan."""
    t0 = time.perf_counter()
    lay = res.layout
    b = ServeBuilder(res, cfg)
    ctx = Context(res, b)
    ctx.timer = b.timer                 # FP8 weights: the builder's compute model
    items = [it for it in ctx.order[0] if it.kind == "F"]
    world = lay.world
    acc = {k: np.zeros(world) for k in CATEGORIES if k != "idle"}
    end = np.zeros(world)
    flops = 0.0
    spans = []
    want = set(range(min(span_ranks, world)))
    chains = _chains(lay)
    if progress:
        progress("built", len(chains) * len(items))
    budget = _budget(ctx, b) if ctx.overlap and len(items) == 2 else 0.0
    for groups in chains:
        g = groups[0]
        cache: dict[tuple, object] = {}

        def route(s: int, layer: int, mb: int, g=g, cache=cache):
            rec = cache.get((layer, mb))
            if rec is None:
                rec = cache[(layer, mb)] = _route_rec(ctx, b.route(g[0], g, layer, mb), g,
                                                     forward_only=True)
                b._routes.pop((g[0], layer, mb), None)      # keep memory flat
            return rec

        ch = ServeChain(ctx, groups, route, [[e for e, r in enumerate(g) if r in want]], b)
        if budget > 0:
            ch.pair(0, items[0], items[1], budget, budget)
        else:
            for it in items:
                ch.item(0, it)
        if progress:
            progress("items", len(items))
        o = ch.out[0]
        idx = np.asarray(g)
        for k in acc:
            acc[k][idx] = o.acc[k]
        end[idx] = o.end
        flops += o.flops
        spans += ch.spans
    step = float(end.max(initial=0.0))
    rows = []
    for r in range(world):
        row = dict.fromkeys(CATEGORIES, 0.0)
        for k in acc:
            row[k] = float(acc[k][r])
        row["idle"] = max(0.0, step - sum(row[k] for k in acc))
        rows.append(row)
    plan = make_plan(b, flops)
    spans.sort(key=lambda s: (s.rank, s.start_s, s.end_s))
    summary = summarize(res, plan, rows, step)
    summary["replicas"] = "independent"
    summary["shortcuts"] = shortcuts(ctx, False, len(chains), world, span_ranks)
    links = link_stats(res.topology, np.zeros(len(res.topology.link_names)))
    return make_result(res, plan, spans, summary, step, links, t0), plan
