"""The fast path: one training step without simpy, for thousands of GPUs (issue 7).

``simulate_fast(res)`` returns the same :class:`~moesim.trace.result.SimResult`
summary as :func:`moesim.engine.run.simulate`, computed by a lockstep model:

- the cluster splits into tp × edp *chains* (:mod:`moesim.engine.fast_pipeline`):
  the EP groups of one (tp, edp) coordinate across the pipeline stages; each chain
  is list-scheduled item by item with per-rank numpy vectors;
- routing is the exact engine's: :func:`moesim.gating.route_microbatch` with the
  same seeds (through the exact builder's ``route``), so token counts, expert
  statistics and memory equal the exact engine's;
- all-to-alls, TP and pipeline transfers are charged by the link bound
  (:mod:`moesim.engine.fast_network`); gradient buckets, the optimizer and ZeRO
  gathers follow the pipeline (:mod:`moesim.engine.fast_dp`);
- with identical replicas only the chains with edp index 0 run; the others copy.

Every approximation is listed in ``summary["shortcuts"]`` with its measured bound.
"""

from __future__ import annotations

import time

import numpy as np

from moesim.engine.breakdown import CATEGORIES, rank_breakdown
from moesim.engine.build import ACT_BYTES, StepPlan, _Builder, _Timer
from moesim.engine.fast_dp import RingCost, gradient_phase
from moesim.engine.fast_network import FastNetwork
from moesim.engine.fast_pipeline import Chain, RouteRec
from moesim.engine.overlap import PairRule
from moesim.engine.replicas import replicas_mode
from moesim.engine.run import expert_summary, memory_summary
from moesim.model import costs
from moesim.scenario.resolve import Resolved
from moesim.trace.result import LinkStats, SimResult
from moesim.trace.spans import Span


class Context:
    """What every chain shares: model dims, costs, network, schedule."""

    def __init__(self, res: Resolved, builder: _Builder) -> None:
        b = builder
        scn = res.scenario
        self.res, self.spec = res, res.model
        self.tp, self.pp, self.v, self.m = b.tp, b.pp, b.v, b.m
        self.tokens, self.ep_tokens, self.seq = b.tokens, b.ep_tokens, b.seq
        k = self.spec.top_k if res.routing.top_k is None else res.routing.top_k
        self.sent = self.ep_tokens * k
        self.chunks, self.order = b.chunks, b.order
        self.timer = _Timer(res.compute)
        topo = res.topology
        gpus = list(topo.gpus)
        self.rank_host = [topo.host_of(g) for g in gpus]
        self.net = FastNetwork(topo, gpus, self.rank_host)
        self.rings = RingCost(topo, gpus, self.rank_host)
        self.act_bytes = self.tokens * self.spec.hidden * ACT_BYTES / self.tp
        self.a2a_algo = scn.routing.a2a_algo
        self.overlap = scn.overlap.ep_comm_overlap and b.ep > 1
        self._tp: dict[int, float] = {}

    def tp_time(self, rank: int) -> float:
        if self.tp <= 1:
            return 0.0
        hit = self._tp.get(rank)
        if hit is None:
            g = self.res.layout.group_of(rank, "tp")
            nbytes = float(self.tokens * self.spec.hidden * ACT_BYTES)
            hit = self._tp[rank] = self.rings.time("all_reduce", tuple(g), nbytes)
        return hit


def _route_rec(ctx: Context, r, group: tuple[int, ...]) -> RouteRec:
    n = len(group)
    grad_bpt = float(ACT_BYTES * ctx.spec.hidden)
    mats = {"fwd.dispatch": r.dispatch_bytes, "fwd.combine": r.combine_bytes,
            "bwd.combine": r.dispatch_tokens * grad_bpt,
            "bwd.dispatch": r.combine_tokens * grad_bpt}
    off = ~np.eye(n, dtype=bool)
    if ctx.a2a_algo == "direct":
        a2a = {k: ctx.net.a2a_rank_times(group, m) for k, m in mats.items()}
        nz = ((r.dispatch_tokens > 0) | (r.dispatch_tokens.T > 0)) & off
    else:   # phased: everybody waits for everybody, all finish together
        a2a = {k: np.full(n, ctx.net.collective_time("all_to_all_v", group, 0.0,
                                                    ctx.a2a_algo, m)) for k, m in mats.items()}
        nz = off
    local = r.rank_expert_tokens
    exp_t, exp_f = {}, {}
    vals, inv = np.unique(local, return_inverse=True)
    for phase in ("fwd", "bwd"):
        tf = np.array([ctx.timer(("expert", int(x), phase),
                                 lambda x=int(x): costs.expert_kernels(ctx.spec, x, phase))
                       if x > 0 else (0.0, 0.0) for x in vals])
        t = tf[:, 0][inv].reshape(local.shape)
        f = tf[:, 1][inv].reshape(local.shape)
        exp_t[phase] = t.sum(axis=1)
        exp_f[phase] = float(f.sum())
    has = local.sum(axis=1) > 0
    hot = np.where(has, local.argmax(axis=1), -1)
    hot_tok = np.where(has, local.max(axis=1), 0)
    return RouteRec(a2a=a2a, nz=nz, exp_t=exp_t, exp_f=exp_f, hot=hot, hot_tok=hot_tok,
                    recv=np.asarray(r.rank_tokens), d_out=r.dispatch_bytes.sum(axis=1),
                    c_out=r.combine_bytes.sum(axis=1))


def _units(ctx: Context, s: int) -> list[list]:
    """Schedule items of stage s, paired as the exact builder interleaves them."""
    items = ctx.order[s]
    if not ctx.overlap:
        return [[it] for it in items]
    rule = PairRule(ctx.order, ctx.pp, ctx.v)
    out: list[list] = []
    pending = None
    for it in items:
        if pending is not None and rule.can_pair(s, pending, it):
            out[-1].append(it)
            pending = None
        else:
            out.append([it])
            pending = it
    return out


def _budget(ctx: Context, item) -> float:
    """Compute of ``item`` per all-to-all it holds: what hides a partner's all-to-all."""
    spec, ph = ctx.spec, "fwd" if item.kind == "F" else "bwd"
    tok, tp = ctx.tokens, ctx.tp
    attn, _ = ctx.timer(("attn", ph), lambda: [*costs.norm_kernels(spec, tok, tp, ph),
                                                *costs.attention_kernels(spec, tok, ctx.seq,
                                                                         tp, ph)])
    pre, _ = ctx.timer(("router", ph), lambda: [*costs.router_kernels(spec, ctx.ep_tokens, ph),
                                                *costs.permute_kernels(spec, ctx.sent, ph)])
    post, _ = ctx.timer(("post", ph), lambda: [*costs.unpermute_kernels(spec, ctx.sent, ph),
                                               *costs.shared_expert_kernels(spec, tok, tp, ph)])
    return (attn + pre + post) / 2


def _run_chain(ctx: Context, b: _Builder, groups, span_pos) -> Chain:
    cache: dict[tuple, RouteRec] = {}

    def route(s: int, layer: int, mb: int) -> RouteRec:
        key = (s, layer, mb)
        rec = cache.pop(key, None)       # each record serves its fwd then its bwd
        if rec is None:
            g = groups[s]
            r = b.route(g[0], g, layer, mb)
            canon = int(b.rmap.rep[g[0]]) if b.rmap is not None else g[0]
            b._routes.pop((canon, layer, mb), None)   # keep memory flat
            rec = _route_rec(ctx, r, g)
            cache[key] = rec
        return rec

    ch = Chain(ctx, groups, route, span_pos)
    units = [_units(ctx, s) for s in range(ctx.pp)]
    pos = [0] * ctx.pp
    left = sum(len(u) for u in units)
    while left:
        moved = False
        for s in range(ctx.pp):
            while pos[s] < len(units[s]) and all(ch.ready(s, it) for it in units[s][pos[s]]):
                unit = units[s][pos[s]]
                if len(unit) == 2:
                    ch.item(s, unit[0], _budget(ctx, unit[1]))
                    ch.item(s, unit[1], _budget(ctx, unit[0]))
                else:
                    ch.item(s, unit[0])
                pos[s] += 1
                left -= 1
                moved = True
        if not moved:
            raise RuntimeError(f"fast path: pipeline deadlock at items {pos}")
    return ch


def _chains(lay) -> list[list[tuple[int, ...]]]:
    """Per chain, the EP group of every stage (position e of stage s feeds e of s+1)."""
    pp_coord = lay.coords["pp"]
    out = []
    for g0 in lay.ep_groups:
        if int(pp_coord[g0[0]]) != 0:
            continue
        groups = []
        for s in range(lay.pp):
            g = tuple(lay.group_of(r, "pp")[s] for r in g0)
            if set(g) != set(lay.group_of(g[0], "ep")):
                raise RuntimeError("fast path: pipeline neighbours of an EP group are not "
                                   "one EP group")
            groups.append(g)
        out.append(groups)
    return out
