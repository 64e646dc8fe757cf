"""A forward-only step on the lockstep model: serving steps and RL scoring.

The public entry point for a step that runs the model forward only (issue 20: serving
reached into the fast engine's private names). A forward step has one pipeline stage and
forward items only, so it is the simplest case of the lockstep model: each EP group is one
chain (:class:`moesim.engine.fast.pipeline.Chain`); every member runs the same attention
(the caller's :class:`ForwardStep`: e.g. KV-cache reads for decode, the prompt's causal
attention for prefill), then the EP dispatch, its own experts and the combine, timed as
the fast engine times them (routing through the builder's ``routes``, so token counts and
expert statistics equal the exact engine's; all-to-alls by the link bound, DeepEP
exchanges by the exact engine's rule on link-bound flow ends), then the caller's head. No
gradient phase, no optimizer.

Two micro-batches run as the exact builder interleaves them
(:func:`moesim.program.overlap.interleave`): the compute stream runs their segments
alternately (A1 B1 A2 B2 ..., a segment ending at each all-to-all), the all-to-alls run in
that order on one ``ep`` stream, each starting when its segment's compute and the previous
all-to-all are done, and a micro-batch's next segment waits for its all-to-all (that wait
is its exposed communication). Compute that runs while an all-to-all holding SMs is in
flight (DeepEP's normal kernels) runs at ``1 - held/SMs`` of its rate until the
all-to-all ends (the exact engine's re-rating in closed form); with GEMMs pinned to the SMs
the EP kernels leave (``serve.gemm_sms: left_by_ep``, :mod:`moesim.compute.pinned_sms`) an
op's pinned part is not slowed, as the exact engine takes it
(:mod:`moesim.engine.exact.execute`: an even mix of pinned and other kernels).
"""

from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from moesim.compute.pinned_sms import pinned_model
from moesim.engine.breakdown import CATEGORIES
from moesim.engine.fast.engine import Context, _chains
from moesim.engine.fast.pairs import pinned_slowdown
from moesim.engine.fast.pipeline import Chain, all_pairs
from moesim.engine.fast.plan_stats import make_plan, shortcuts
from moesim.engine.fast.records import _route_rec
from moesim.engine.summary import link_stats, make_result, summarize
from moesim.program import recipe
from moesim.program.build import Builder
from moesim.scenario.resolved import Resolved
from moesim.trace.result import SimResult


class ForwardState:
    """What consecutive forward steps of one deployment share (issue 23: a decode step
    rebuilt the network every step): the fast network (every group's routes and link
    incidence, memoized collective times), the ring cost model and the expert kernels'
    prices per token count. Valid for one topology, model and compute model; a step of
    another (compared by identity) starts it afresh. The flow network's simpy clock
    (:meth:`moesim.engine.fast.network.FastNetwork.exact_finish`) restarts at every step,
    so a step with the state gives the same floats as a fresh one."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._parts: tuple | None = None

    def attach(self, ctx: Context) -> None:
        """Give ``ctx`` the shared parts (the first step keeps its own as the shared)."""
        res = ctx.res
        objs = (res.topology, res.model, res.compute)
        vals = (type(ctx.timer.model), ctx.etp, res.scenario.engine.coalesce_rtol,
                tuple(ctx.net.gpus))
        if self._key is None or vals != self._key[1] or any(
                a is not b for a, b in zip(objs, self._key[0], strict=True)):
            self._key = (objs, vals)
            self._parts = (ctx.net, ctx.rings, ctx._lut, ctx._ek)
            return
        net, rings, lut, ek = self._parts
        net._env = net._flow = None     # the flow network's clock starts at 0, as fresh
        ctx.net, ctx.rings, ctx._lut, ctx._ek = net, rings, lut, ek


class ForwardStep(Protocol):
    """What a forward-only step adds to the training builder's machinery."""

    builder: Builder                    # its routing, micro-batches and compute model
    head_tokens: int                    # tokens reaching the head per micro-batch

    def attn_key(self, layer: int) -> tuple:
        """Cache key of layer ``layer``'s attention kernels (equal keys, equal kernels)."""

    def attn_kernels(self, layer: int) -> list:
        """Kernels of layer ``layer``'s attention (one micro-batch)."""

    def head_kernels(self) -> list:
        """Kernels of the head (one micro-batch)."""

    def head_tp_s(self, rings, group: tuple[int, ...]) -> float:
        """Seconds of the head's communication over the TP ``group`` (``rings``: the
        fast engine's ring cost model, ``rings.time(op, group, nbytes)``)."""


class ForwardChain(Chain):
    """A chain of one stage running forward items with the step's own attention and
    head (``step``: a :class:`ForwardStep`)."""

    def __init__(self, ctx, groups, route, span_pos, step: ForwardStep) -> None:
        super().__init__(ctx, groups, route, span_pos)
        self.sb = step
        self.pairing = False
        # pinned GEMMs (moesim.compute.pinned_sms): the compute model, and per routed
        # micro-batch record (by id, kept with it) the experts' pinned seconds per member
        self.pin = pinned_model(ctx.timer.model)
        self.exp_pinned: dict[int, tuple] = {}

    # ------------------------------------------------------------ two micro-batches
    def run_pair(self, s: int, items) -> None:
        """Interleave the items' segments on one compute stream and one ep stream."""
        self.ep_free = np.zeros(self.n)
        self.pairing = True
        gens = [self._segments(s, it) for it in items]
        issued: list = [None] * len(gens)     # each one's last all-to-all, sent back to it
        alive = [True] * len(gens)
        while any(alive):
            for i, g in enumerate(gens):
                if not alive[i]:
                    continue
                try:
                    issued[i] = self._issue(s, *g.send(issued[i]))
                except StopIteration:
                    alive[i] = False
        self.pairing = False
        self.out[s].end = self.t[s].copy()

    def _segments(self, s: int, item):
        """One micro-batch's ops; yields at each all-to-all (the end of a segment) and is
        sent back what :meth:`_issue` made of it. The layer's steps are the exact
        builder's (:meth:`moesim.program.layer_plan.LayerPlan.steps`, as
        :meth:`moesim.program.build.Builder.moe_ops` walks the MoE block): the shared
        experts' part beside an all-to-all opens the segment after it, as
        :func:`moesim.program.overlap.interleave` orders them, before its wait."""
        c, mb = self.c, item.mb
        self._compute(s, "fwd.embedding", ("emb", "fwd"),
                      lambda: recipe.embedding(c.spec, c.tokens, c.tp, "fwd"), -1, mb, "fwd")
        do = self._do
        for layer in range(c.spec.layers):
            for st in self.plan.steps(layer, "fwd"):
                if st.kind != "moe":
                    do[st.kind](s, st, layer, mb)
                    continue
                rec = self.route(s, layer, mb)
                for x in st.block:
                    if x.kind == "a2a":
                        issued = yield x.arg, x.name, rec, layer, mb
                        self._beside(s, issued, x.beside, layer, mb)
                    elif x.kind == "experts":
                        self._experts(s, rec, layer, mb, "fwd", x.name)
                    else:       # router, unpermute
                        self._compute(s, x.name, *self.kern.op(x, layer), layer, mb, "fwd")
        self._head(s, mb)

    def _beside(self, s: int, issued, part: int, layer: int, mb: int) -> None:
        """The shared experts' part ``part`` (-1: none) beside the all-to-all just
        ``issued`` (``overlap.shared_expert``), then the wait for that all-to-all."""
        if part >= 0:
            side, op = self.kern.shared("fwd", part)
            self._compute(s, side.name, *op, layer, mb, "fwd")
        self._wait_ep(s, *issued)

    def _issue(self, s: int, kind: str, name: str, rec, layer: int, mb: int):
        """Start an all-to-all on the ep stream; the compute stream goes on."""
        a_ep = np.maximum(self.t[s], self.ep_free)
        if not self.span_pos[s] and self.n > 1 and rec.nz is all_pairs(self.n):
            start = np.full(self.n, a_ep.max())    # everybody waits for everybody
        else:
            peers = np.where(rec.nz, a_ep[None, :], -np.inf)
            late = peers.argmax(axis=1)
            start = np.maximum(a_ep, peers.max(axis=1))
        x = rec.a2a[name]
        if x.ndim == 2:
            dur = np.maximum(self.c.net.a2a_finish(self.groups[s], x, a_ep), start) - start
        else:
            dur = x
        end = start + dur
        self.ep_free = end
        if self.span_pos[s]:
            g = np.asarray(self.groups[s])
            self._span(s, "stall", name, a_ep, start, layer, mb, "fwd", stream="ep",
                       waited_on=np.where(start > a_ep, g[late], -1), expert=rec.hot[late],
                       tokens=rec.hot_tok[late], peers=tuple(g.tolist()),
                       reason=f"partner arrived late at {name}")
            self._span(s, kind, name, start, end, layer, mb, "fwd", stream="ep",
                       peers=tuple(g.tolist()))
        return kind, a_ep, start, end

    def _wait_ep(self, s: int, kind: str, a_ep, start, end) -> None:
        """The compute stream waits for a micro-batch's all-to-all: exposed time, the
        part spent waiting for a late partner counted as stall."""
        t = self.t[s]
        done = np.maximum(t, end)
        stall = np.clip(np.minimum(start, done) - np.maximum(t, a_ep), 0.0, None)
        acc = self.out[s].acc
        acc["stall"] += stall
        acc[kind] += done - t - stall
        self.t[s] = done

    def _rate(self, s: int, work, pinned=None):
        """Duration of ``work`` seconds of compute from now while the ep stream's kernels
        hold SMs until ``ep_free`` (share f): min(w / (1 - f), w + busy · f); with
        ``pinned`` seconds of it not slowed (share p = pinned / w), a second of work takes
        x = p + (1 - p) / (1 - f) while SMs are held: min(w · x, w + busy · (1 - 1/x))."""
        f = self.c.ep_sm_frac
        if not self.pairing or f <= 0:
            return work
        busy = np.maximum(self.ep_free - self.t[s], 0.0)
        if pinned is None or not np.any(pinned > 0):
            return np.minimum(work / (1.0 - f), work + busy * f)
        _, x = pinned_slowdown(work, pinned, f)
        return np.minimum(work * x, work + busy * (1.0 - 1.0 / x))

    def expert_pinned(self, rec, r) -> None:
        """Keep the experts' pinned seconds per member of routed micro-batch ``r`` (its
        record ``rec``), each expert's kernels as :func:`_route_rec` prices them (a rank's
        later experts share the first's launches under grouped launches)."""
        c, pin = self.c, self.pin
        local = r.rank_expert_tokens
        flat = np.nonzero(local.ravel() != 0)[0]
        rows, vals = flat // local.shape[1], local.ravel()[flat]
        later = np.zeros(len(rows), dtype=bool)
        if c.grouped and len(rows) > 1:
            np.equal(rows[1:], rows[:-1], out=later[1:])
        memo: dict[tuple[int, bool], float] = {}
        p = np.empty(len(rows))
        for i, (x, f) in enumerate(zip(vals.tolist(), later.tolist(), strict=True)):
            hit = memo.get((x, f))
            if hit is None:
                hit = memo[(x, f)] = pin.pinned_s(c._expert_kernels(x, "fwd", f)[0], memo=False)
            p[i] = hit
        self.exp_pinned[id(rec)] = (rec, np.bincount(rows, weights=p, minlength=self.n))

    def _compute(self, s: int, name: str, key: tuple, make, layer, mb, phase) -> None:
        if not self.pairing or self.c.ep_sm_frac <= 0:
            return super()._compute(s, name, key, make, layer, mb, phase)
        t, fl = self.c.timer(key, make)
        if t <= 0 and fl <= 0:
            return
        pinned = None
        if self.pin is not None:
            pinned = np.full(self.n, self.pin.pinned_s(self.c.timer.kernels_for(key)))
        d = self._rate(s, np.full(self.n, t), pinned)
        a = self.t[s]
        self.out[s].acc["compute"] += d
        self.out[s].flops += fl * self.n
        self._span(s, "compute", name, a, a + d, layer, mb, phase, flops=fl)
        self.t[s] = a + d

    def _experts(self, s: int, rec, layer: int, mb: int, phase: str, name: str) -> None:
        a = self.t[s]
        hit = self.exp_pinned.get(id(rec)) if self.pin is not None else None
        d = self._rate(s, rec.exp_t[phase], hit[1] if hit is not None and hit[0] is rec
                       else None)
        self.out[s].acc["compute"] += d
        self.out[s].flops += rec.exp_f[phase]
        self._span(s, "compute", name, a, a + d, layer, mb, phase,
                   tokens=rec.recv)
        self.t[s] = a + d

    # ------------------------------------------------------------ one micro-batch at a time
    def _attn(self, s: int, st, layer: int, mb: int) -> None:
        """The step's own attention (:class:`ForwardStep`: e.g. over the KV cache)."""
        sb = self.sb
        self._compute(s, st.name, sb.attn_key(layer), lambda: sb.attn_kernels(layer), layer,
                      mb, st.phase)

    def item(self, s: int, item, budget: float = 0.0) -> None:
        c = self.c
        mb = item.mb
        self.budget = budget
        self._compute(s, "fwd.embedding", ("emb", "fwd"), lambda: recipe.embedding(
            c.spec, c.tokens, c.tp, "fwd"), -1, mb, "fwd")
        for layer in range(c.spec.layers):
            self.layer(s, layer, mb, "fwd")
        self._head(s, mb)
        self.budget = 0.0
        self.out[s].end = self.t[s].copy()

    def _head(self, s: int, mb: int) -> None:
        c, sb = self.c, self.sb
        self._compute(s, "fwd.lm_head", ("head", "fwd"), sb.head_kernels, -1, mb, "fwd")
        if c.tp > 1:     # e.g. a distributed top-k over the TP group
            g = tuple(c.res.layout.group_of(self.groups[s][0], "tp"))
            d = sb.head_tp_s(c.rings, g)
            a = self.t[s]
            self.out[s].acc["tp"] += d
            self._span(s, "tp", "fwd.head_topk", a, a + d, -1, mb, "fwd")
            self.t[s] = a + d


def simulate_forward(res: Resolved, forward: ForwardStep, *, progress=None,
                     span_ranks: int = 64, step_only: bool = False,
                     state: ForwardState | None = None) -> tuple[SimResult | float, object]:
    """One forward-only step of ``res`` on the lockstep model. ``forward``: the step's
    :class:`ForwardStep` (its ``builder``, a :class:`moesim.program.build.Builder`, gives
    the routing, micro-batches and compute model). Spans are kept for the ``span_ranks``
    lowest ranks (0: none, the cheapest). Returns the result (training summary keys) and the
    step plan; ``step_only``: the step time in seconds instead of the result (no
    summary, memory table or spans: what a step-cost surface needs); ``state``: a
    :class:`ForwardState` kept across steps of one deployment."""
    t0 = time.perf_counter()
    lay = res.layout
    b = forward.builder
    ctx = Context(res, b)
    ctx.timer = b.timer                 # e.g. FP8 weights: the builder's compute model
    if state is not None:
        state.attach(ctx)
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
    for groups in chains:
        g = groups[0]
        cache: dict[tuple, object] = {}

        chain: list = []

        def route(s: int, layer: int, mb: int, g=g, cache=cache, chain=chain):
            rec = cache.get((layer, mb))
            if rec is None:
                r = b.routes.route(g[0], g, layer, mb)
                rec = cache[(layer, mb)] = _route_rec(ctx, r, g, forward_only=True)
                if chain[0].pin is not None:          # pinned GEMMs: the experts' part
                    chain[0].expert_pinned(rec, r)
                b.routes.forget(g[0], layer, mb)      # keep memory flat
            return rec

        # the step may run its own chain (a serving step's 5-stage decode overlap)
        ch = getattr(forward, "chain", ForwardChain)(
            ctx, groups, route, [[e for e, r in enumerate(g) if r in want]], forward)
        chain.append(ch)
        if ctx.overlap and len(items) == 2:
            ch.run_pair(0, items)
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
    if step_only:
        return step, None
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
