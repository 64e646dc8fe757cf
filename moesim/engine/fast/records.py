"""One routed micro-batch's record on the fast path (:class:`RouteRec`): its all-to-alls
timed (DeepEP exchanges by the exact engine's rule on link-bound flow ends, direct
all-to-alls as byte matrices for the link bound, phased ones by their collective time)
and its experts priced per rank, from the builder's token routing (``b.routes``)."""

from __future__ import annotations

import numpy as np

from moesim.engine.fast.pipeline import RouteRec, all_pairs
from moesim.gating.matrices import bytes_per_token
from moesim.program.build import ACT_BYTES


def _route_rec(ctx, r, group: tuple[int, ...], forward_only: bool = False) -> RouteRec:
    """The record of routed micro-batch ``r`` on EP ``group`` (``ctx``: the step's
    :class:`moesim.engine.fast.engine.Context`). ``forward_only``: time the forward
    dispatch and combine and price the forward experts only (serving)."""
    n = len(group)
    names = ("fwd.dispatch", "fwd.combine") + (() if forward_only
                                               else ("bwd.combine", "bwd.dispatch"))
    off = all_pairs(n)
    mats: dict[str, np.ndarray] = {}
    if ctx.ep_backend.deepep:
        # a DeepEP exchange starts when every member has arrived (after the count
        # exchange): its flows start together; a member is done at max(its last flow,
        # its SM bound) + fill/drain (moesim.collectives.ep_exchange, the exact rule)
        L = ctx.ep_ranks_per_node(group)
        a2a = {}
        done: dict[tuple[str, str], tuple] = {}
        pure = ctx.net.stateless(group)
        pair = _ll_forward(ctx, r, group) if forward_only and pure else None
        if pair is not None:       # the forward low-latency pair in one compiled call
            a2a, mats, d_out, c_out = pair
        for name in (() if pair is not None else names):
            key = ctx.ep_backend.plan_key(name)   # directions with one plan share it
            if key not in done or not pure:   # not pure: the flow network's clock moves on
                spec = (done[key][0] if key in done
                        else ctx.ep_backend.spec(r, group, name, L))
                end = ctx.net.a2a_finish(group, spec.byte_matrix(), np.zeros(n))
                done[key] = (spec, spec.notify_s + np.maximum(end, spec.sm_s) + spec.fill_s)
            spec, a2a[name] = done[key]
            m = spec.byte_matrix()
            mats[name] = m          # the bytes that really cross the links
            if name == "fwd.dispatch":
                d_out = m.sum(axis=1)
            elif name == "fwd.combine":
                c_out = m.sum(axis=1)
        nz = off
    else:
        mats = {"fwd.dispatch": r.dispatch_bytes, "fwd.combine": r.combine_bytes}
        if not forward_only:
            grad_bpt = float(ACT_BYTES * ctx.spec.hidden)
            to_experts = bytes_per_token(ctx.ep_backend.dtypes["grad_dispatch"], ctx.spec.hidden)
            mats.update({"bwd.combine": r.dispatch_tokens * to_experts,
                         "bwd.dispatch": r.combine_tokens * grad_bpt})
        d_out, c_out = r.dispatch_bytes.sum(axis=1), r.combine_bytes.sum(axis=1)
        if ctx.a2a_algo == "direct":
            a2a = {k: np.asarray(m, dtype=float) for k, m in mats.items()}
            nz = ((r.dispatch_tokens > 0) | (r.dispatch_tokens.T > 0)) & off
        else:   # phased: everybody waits for everybody, all finish together
            a2a = {k: np.full(n, ctx.net.collective_time("all_to_all_v", group, 0.0,
                                                        ctx.a2a_algo, m))
                   for k, m in mats.items()}
            nz = off
    local = r.rank_expert_tokens
    flat = np.nonzero(local.ravel() != 0)[0]
    rows, vals = flat // local.shape[1], local.ravel()[flat]
    exp_t, exp_f = {}, {}
    exp_p = {} if ctx.pinned is not None else None   # overlap.gemm_sms (fast.pinned)
    later = None
    if ctx.grouped and len(rows) > 1:   # a rank's later experts share the 1st's launches
        later = np.empty(len(rows), dtype=bool)
        later[0] = False
        np.equal(rows[1:], rows[:-1], out=later[1:])
    for phase in (("fwd",) if forward_only else
                  ("fwd", "bwd") + (("bwd.B", "bwd.W") if ctx.dual is not None else ())
                  + (("act",) if ctx.rc.any_act else ())):
        t, f = ctx.expert_cost(vals, phase)
        if later is not None:
            t = np.where(later, ctx.expert_cost(vals, phase, fused=True)[0], t)
        exp_t[phase] = np.bincount(rows, weights=t, minlength=n)
        exp_f[phase] = float(f.sum())
        if exp_p is not None:
            exp_p[phase] = ctx.pinned.per_rank(rows, vals, later, phase, n)
    top = local.max(axis=1)
    has = top > 0           # token counts are >= 0: a rank with any has a positive max
    hot = np.where(has, local.argmax(axis=1), -1)
    hot_tok = np.where(has, top, 0)
    return RouteRec(a2a=a2a, nz=nz, exp_t=exp_t, exp_f=exp_f, hot=hot, hot_tok=hot_tok,
                    recv=np.asarray(r.rank_tokens), d_out=d_out, c_out=c_out, mats=mats,
                    exp_p=exp_p)


def _ll_forward(ctx, r, group: tuple[int, ...]):
    """(ends, byte matrices, dispatch and combine bytes sent per member) of the forward
    DeepEP low-latency dispatch and combine of routed micro-batch ``r``, both timed in one
    compiled call (:meth:`moesim.engine.fast.network.FastNetwork.ll_pair_finish`): what
    the loop of :func:`_route_rec` computes from the planned specs, the same floats;
    None until both are planned, or where that pass does not apply."""
    fixed = ctx.ep_backend.ll_forward(group)
    if fixed is None:
        return None
    sd, sc, bd, bc = fixed
    got = ctx.net.ll_pair_finish(group, r.dispatch_tokens, bd, bc)
    if got is None:
        return None
    m_d, m_c, end_d, end_c = got
    m_d.setflags(write=False)
    m_c = m_c.T                         # the combine's matrix, as ll_matrix lays it out
    m_c.setflags(write=False)
    zero = np.zeros(len(group))         # no SMs held (the planned specs' sm_s)
    a2a = {"fwd.dispatch": sd.notify_s + np.maximum(end_d, zero) + sd.fill_s,
           "fwd.combine": sc.notify_s + np.maximum(end_c, zero) + sc.fill_s}
    return a2a, {"fwd.dispatch": m_d, "fwd.combine": m_c}, m_d.sum(axis=1), m_c.sum(axis=1)
