"""DualPipe / DualPipeV on the fast path: one chain runs every pipeline rank's items of
:func:`moesim.schedule.dualpipe.make_dual_order` in lockstep (no simpy), as the exact
builder (:mod:`moesim.program.dualpipe_build`) lays them out:

- ``F``, ``B`` (the input-gradient part of every kernel, :func:`moesim.model.costs.
  split_backward`), ``W`` (the weight-gradient part), ``BW`` (per layer B then W);
  a chain position ``s`` is pipeline rank ``s`` (the EP group there); an item's stage
  picks its layers; pipeline messages go to the position :meth:`DualOrder.rank` names;
- ``F&B``: both receives first, the forward then the full backward, both sends after
  the pair; with ``overlap.kind: static`` and EP > 1 the two halves interleave
  segment by segment, the backward's first, with the all-to-alls on the ``ep`` stream
  (:func:`moesim.engine.fast.pairs.run_pair`, as for the static pairs of 1F1B);
  with ``overlap.gemm_sms: left_by_ep`` (the context's ``pin``) every FP8 GEMM is
  priced on the SMs the EP kernels leave, in pairs and lone chunks alike, and each
  recorded compute op carries its pinned seconds, not slowed again in the pair;
- ``schedule.pp_comm: reference`` (``ref``): items carry no receive or send; the
  messages go at the reference's commits (:mod:`moesim.engine.fast.dual_ref`);
- gradient buckets per held stage, highest stage first, over the data-parallel groups
  of every copy of the stage (:func:`dual_gradient_phase`).

:func:`a2a_pair` runs one (forward, backward) step of Megatron-Core's a2a-overlapped
1F1B on an ordinary chain with the same pair semantics.
"""

from __future__ import annotations

import numpy as np

from moesim.engine.fast.dp import buckets, group_collective, optimizer_tail
from moesim.engine.fast.dual_ref import schedule_commits
from moesim.engine.fast.grad_flows import ChainBuckets
from moesim.engine.fast.pairs import run_pair
from moesim.engine.fast.pipeline import Chain
from moesim.program import recipe
from moesim.program.dualpipe_build import PartTimer


class DualChain(Chain):
    """A :class:`Chain` whose positions run DualPipe(V) items."""

    def __init__(self, ctx, groups, route, span_pos, order, prior=None) -> None:
        super().__init__(ctx, groups, route, span_pos)
        self.d = order
        self.part: str | None = None         # "B" while an input-gradient part runs
        self.deferred: list | None = None    # sends held until an F&B pair ends
        self.w_done: dict[int, int] = {}
        # schedule.pp_comm: reference: messages at the commits (fast.dual_ref)
        self.ref = ctx.res.scenario.schedule.pp_comm == "reference"
        # gradient buckets beside the all-to-alls run flow by flow (fast.grad_flows)
        self.bk = ChainBuckets(ctx, groups, order, prior) if beside_buckets(ctx, groups) else None
        ctx.net.held.buckets = self.bk

    # ------------------------------------------------------------ messages
    def _keys(self, s: int, it) -> list[tuple[tuple, int]]:
        """(message key, source position) an item waits for."""
        d, out = self.d, []
        for kind, mb, st in it.parts():
            if kind == "F" and st > 0 and d.rank(mb, st - 1) != s:
                out.append((("act", mb, st), d.rank(mb, st - 1)))
            elif kind == "B" and st < d.stages - 1 and d.rank(mb, st + 1) != s:
                out.append((("grad", mb, st), d.rank(mb, st + 1)))
        return out

    def ready(self, s: int, it) -> bool:
        return all(k in self.msgs for k, _ in self._keys(s, it))

    def _recv(self, s: int, it) -> None:
        for key, src in self._keys(s, it):
            self._wait(s, self.msgs.pop(key), f"{'fwd' if key[0] == 'act' else 'bwd'}.recv",
                       src, -1, key[1], "fwd" if key[0] == "act" else "bwd")

    def _send_to(self, s: int, dst: int, key: tuple, mb: int, phase: str, layer: int) -> None:
        if dst == s or self.ref:
            return
        if self.deferred is not None:
            self.deferred.append((dst, key, mb, phase, layer))
        else:
            self._send(s, dst, key, mb, phase, layer)

    # ------------------------------------------------------------ pinned GEMMs
    def _compute(self, s: int, name: str, key: tuple, make, layer, mb, phase) -> None:
        n = len(self.rec) if self.rec is not None else -1
        super()._compute(s, name, key, make, layer, mb, phase)
        pin = self.c.pin
        if pin is not None and n >= 0 and len(self.rec) > n:   # recorded: + pinned seconds
            self.rec[-1] += (pin.pinned_s(self.c.timer.kernels_for(key)),)

    def _expert_gemms(self, s: int, rec, layer: int, mb: int, phase: str, name: str,
                      recompute: bool = True) -> None:
        n = len(self.rec) if self.rec is not None else -1
        super()._expert_gemms(s, rec, layer, mb, phase, name, recompute)
        if rec.exp_p is not None and n >= 0 and len(self.rec) > n:
            self.rec[-1] += (rec.exp_p[phase],)

    # ------------------------------------------------------------ parts
    def _experts(self, s: int, rec, layer: int, mb: int, phase: str, name: str) -> None:
        if self.part is None:
            return super()._experts(s, rec, layer, mb, phase, name)
        key = f"{phase}.{self.part}"
        dur = rec.exp_t[key]
        self.out[s].flops += rec.exp_f[key]
        if self.rec is not None:
            self.rec.append(("c", dur, name, layer, mb, phase, {"tokens": rec.recv})
                            + ((rec.exp_p[key],) if rec.exp_p is not None else ()))
            return
        a = self.t[s]
        self.out[s].acc["compute"] += dur
        self._span(s, "compute", name, a, a + dur, layer, mb, phase, tokens=rec.recv)
        self.t[s] = a + dur

    def _b_layer(self, s: int, layer: int, mb: int) -> None:
        c = self.c
        base = c.timer
        c.timer, self.part = PartTimer(base, "B"), "B"
        try:
            self.layer(s, layer, mb, "bwd")
        finally:
            c.timer, self.part = base, None

    def _w_layer(self, s: int, layer: int, mb: int) -> None:
        """Layer ``layer``'s deferred weight gradients, in its template's ``W`` order
        (:func:`moesim.program.layer_plan.weight_steps`)."""
        c = self.c
        for st in self.plan.steps(layer, "W"):
            if st.kind == "experts":
                self.part = "W"
                self._experts(s, self.route(s, layer, mb), layer, mb, "bwd", st.name)
                self.part = None
            else:
                self._compute(s, st.name, *self.kern.op(st, layer), layer, mb, "bwd")
        out = self.out[s]
        self._last_bwd(s, layer)
        if self.bk is not None:
            bk = self.bk
            self._at(s, lambda t: bk.w_end(s, layer, t))
        self.w_done[layer] = self.w_done.get(layer, 0) + 1
        if self.w_done[layer] == c.m:
            self._at(s, lambda _t: setattr(out, "grads", True))

    def _lm(self, s: int, mb: int, part: str) -> None:
        c = self.c
        name = "bwd.lm_head" if part == "B" else "bwd.w_lm_head"
        self._compute(s, name, ("lm", "bwd", part), lambda: recipe.backward_part(
            recipe.lm_head(c.spec, c.tokens, c.tp, "bwd", c.sp), part), -1, mb, "bwd")

    # ------------------------------------------------------------ items
    def fwd(self, s: int, mb: int, st: int) -> None:
        c, d = self.c, self.d
        layers = list(c.chunks[st])
        if st == 0:
            self._compute(s, "fwd.embedding", ("emb", "fwd"), lambda: recipe.embedding(
                c.spec, c.tokens, c.tp, "fwd"), -1, mb, "fwd")
        for layer in layers:
            self.layer(s, layer, mb, "fwd")
        if st == d.stages - 1:
            self._compute(s, "fwd.lm_head", ("lm", "fwd"), lambda: recipe.lm_head(
                c.spec, c.tokens, c.tp, "fwd", c.sp), -1, mb, "fwd")
        else:
            self._send_to(s, d.rank(mb, st + 1), ("act", mb, st + 1), mb, "fwd",
                          layers[-1] if layers else -1)

    def bwd(self, s: int, mb: int, st: int, full: bool) -> None:
        c, d = self.c, self.d
        layers = list(c.chunks[st])
        self._new_iv(s)
        if st == d.stages - 1:
            self._lm(s, mb, "B")
            if full:
                self._lm(s, mb, "W")
        for layer in reversed(layers):
            self._b_layer(s, layer, mb)
            if full:
                self._w_layer(s, layer, mb)
        if st > 0:
            self._send_to(s, d.rank(mb, st - 1), ("grad", mb, st - 1), mb, "bwd",
                          layers[0] if layers else -1)

    def run(self, s: int, it) -> None:
        """One item on position ``s``."""
        if not self.ref:
            self._recv(s, it)
        if it.kind == "F":
            self.fwd(s, it.mb, it.stage)
        elif it.kind in ("B", "BW"):
            self.bwd(s, it.mb, it.stage, it.kind == "BW")
        elif it.kind == "W":
            if it.stage == self.d.stages - 1:
                self._lm(s, it.mb, "W")
            for layer in reversed(self.c.chunks[it.stage]):
                self._w_layer(s, layer, it.mb)
        else:
            self.deferred = []
            if self.c.fb_overlap:    # interleaved as pair_items: the backward's segment first
                f = self.record(s, lambda: self.fwd(s, it.mb, it.stage))
                b = self.record(s, lambda: self.bwd(s, it.bmb, it.bstage, True))
                run_pair(self, s, b, f, split_dense=True)
            else:
                self.fwd(s, it.mb, it.stage)
                self.bwd(s, it.bmb, it.bstage, True)
            held, self.deferred = self.deferred, None
            for dst, key, mb, phase, layer in held:
                self._send(s, dst, key, mb, phase, layer)
        self.out[s].end = self.t[s].copy()


def a2a_pair(ch: Chain, s: int, f, b) -> None:
    """One (forward, backward) step of ``overlap.kind: a2a-1f1b`` on stage ``s`` as the
    exact builder pairs it (:func:`moesim.program.dualpipe_build.pair_items`): both
    receives first, the two items interleaved segment by segment, the backward's
    first (:func:`moesim.engine.fast.pairs.run_pair`), both sends after the pair."""
    for it in (f, b):
        key = ch._recv_key(s, it)
        if key is not None:
            vs = it.chunk * ch.c.pp + s
            src = (vs - 1) % ch.c.pp if it.kind == "F" else (vs + 1) % ch.c.pp
            ch._wait(s, ch.msgs.pop(key), f"{'fwd' if it.kind == 'F' else 'bwd'}.recv", src,
                     -1, it.mb, "fwd" if it.kind == "F" else "bwd")
            ch.msgs[key] = ch.t[s].copy()          # received: the item's wait is empty
    held: list[tuple] = []
    ch._send = lambda _s, *args: held.append(args)   # type: ignore[method-assign]
    try:
        of = ch.record(s, lambda: ch.item(s, f))
        ob = ch.record(s, lambda: ch.item(s, b))
    finally:
        del ch._send
    run_pair(ch, s, ob, of)
    for args in held:
        ch._send(s, *args)
    ch.out[s].end = ch.t[s].copy()


def run_dual_chain(ctx, groups, span_pos, new_rec, progress=None) -> DualChain:
    """List-schedule every position's items (``new_rec(s, layer, mb)``: the
    :class:`~moesim.engine.fast.pipeline.RouteRec` of that micro-batch at position s)."""
    cache: dict[tuple, list] = {}
    d = ctx.dual

    def route(s: int, layer: int, mb: int):
        key = (s, layer, mb)
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = [new_rec(s, layer, mb), 0]
        hit[1] += 1
        if hit[1] == 3:                  # forward, input gradient, weight gradient
            cache.pop(key)
        return hit[0]

    prior = None
    if beside_buckets(ctx, groups):
        # the buckets' ready times from a first run (fast.grad_flows): an all-to-all the
        # list schedule runs before the other position's weight gradients meets them too
        recs: dict[tuple, object] = {}

        def route(s: int, layer: int, mb: int):     # noqa: F811 (every record kept)
            key = (s, layer, mb)
            if key not in recs:
                recs[key] = new_rec(s, layer, mb)
            return recs[key]

        counting, ctx.links.enabled = ctx.links.enabled, False
        try:
            prior = _schedule(DualChain(ctx, groups, route, [[] for _ in groups], d), None).bk
        finally:
            ctx.links.enabled = counting
    return _schedule(DualChain(ctx, groups, route, span_pos, d, prior), progress)


def beside_buckets(ctx, groups) -> bool:
    """Whether the chain's gradient buckets run beside its all-to-alls
    (:mod:`moesim.engine.fast.grad_flows`): ``dp_overlap``, and all-to-alls run flow by
    flow (direct NCCL ones, not DeepEP's)."""
    return bool(ctx.net.exact_ok and ctx.res.scenario.overlap.dp_overlap
                and not ctx.ep_backend.deepep and ctx.a2a_algo == "direct"
                and not all(ctx.net.stateless(g) for g in groups))


def _schedule(ch: DualChain, progress) -> DualChain:
    """List-schedule every position's items of ``ch`` (or its reference events)."""
    if ch.ref:
        return schedule_commits(ch, progress)
    d = ch.d
    pos = [0] * d.ranks
    left = sum(len(x) for x in d.items)
    while left:
        moved = False
        for s in range(d.ranks):
            items = d.items[s]
            while pos[s] < len(items) and ch.ready(s, items[pos[s]]):
                ch.run(s, items[pos[s]])
                pos[s] += 1
                left -= 1
                moved = True
                if progress is not None:
                    progress("items", 1)
        if not moved:
            raise RuntimeError(f"fast path: DualPipe deadlock at items {pos}")
    return ch


def dual_gradient_phase(res, b, rings, timer, stages: dict[int, dict], links=None):
    """Buckets, optimizer and ZeRO-1/2 gathers of a DualPipe(V) step, as the exact
    builder's ``_dual_parts``: per model stage, highest first, buckets over its layers
    last to first, each over the union of the data-parallel (expert-data-parallel)
    groups of every rank holding the stage; the optimizer over each rank's shards of
    both its stages. ``stages[pos]`` as for :func:`moesim.engine.fast.dp.gradient_phase`
    (``last_bwd``: each layer's last weight-gradient end); ``links`` counts every ring's
    bytes (:class:`moesim.engine.fast.links.LinkBytes`). Returns (tails, finish): per
    rank ``(kind, start, end, stream, blocking rank or -1)``."""
    lay, scn, d = res.layout, res.scenario, b.dual
    zero, overlap = scn.parallel.zero, scn.overlap.dp_overlap
    grad_op = "all_reduce" if zero == 0 else "reduce_scatter"
    world = lay.world
    wb = res.model.weight_bytes
    ready_cf = np.zeros(world)
    tails: dict[int, list[tuple[str, float, float, str]]] = {r: [] for r in range(world)}
    busy = {}
    for st in stages.values():
        a, e = st.get("ep_iv", (np.zeros((0, 0)), np.zeros((0, 0))))
        for i, r in enumerate(st["ranks"]):
            busy[int(r)] = sorted(zip(a[:, i].tolist(), e[:, i].tolist(), strict=True))
    busy_of: dict[tuple[int, ...], list[tuple[float, float]]] = {}
    memo: dict[tuple, tuple[int, ...]] = {}

    def group(r: int, st: int, kind: str) -> tuple[int, ...]:
        hit = memo.get((r, st, kind))
        if hit is None:
            pp_group = lay.group_of(r, "pp")
            g: set[int] = set()
            for c in {d.rank_of[k][st] for k in range(len(d.rank_of))}:
                peer = pp_group[c]
                g |= set(lay.group_of(peer, "dp") if kind == "dp"
                         else b.expert_dp_group(peer))
            hit = memo[(r, st, kind)] = tuple(sorted(g))
        return hit

    def run_coll(kind, name_op, ranks, ready_at, nbytes, st, gk) -> None:
        # every member of a group has that group (the union over the stage's holders
        # of the DP or EDP groups of the same coordinates): members of a group already
        # run are skipped, so the groups are found once each, in the same order
        covered: set[int] = set()
        for r in ranks.tolist():
            if r in covered:
                continue
            g = group(r, st, gk)
            covered.update(g)
            if len(g) < 2 or nbytes <= 0:
                continue
            group_collective(g, kind, name_op, nbytes, ready_at, ready_cf, busy, busy_of,
                             rings, tails, links)

    shard = np.zeros(world)
    gathers = []
    for st in range(d.stages - 1, -1, -1):
        holders = sorted({d.rank_of[k][st] for k in range(len(d.rank_of))})
        ranks = np.concatenate([stages[h]["ranks"] for h in holders])
        layers = list(reversed(b.chunks[st]))
        bks = buckets(res, st, layers, first=st == 0, last=st == d.stages - 1)
        for layer, d_b, e_b in bks:
            ready = np.zeros(world)
            for h in holders:
                ready[stages[h]["ranks"]] = (stages[h]["last_bwd"][layer] if overlap
                                             else stages[h]["end"])
            run_coll("dp", grad_op, ranks, ready, d_b, st, "dp")
            run_coll("dp", grad_op, ranks, ready, e_b, st, "edp")
        tot_d = sum(x[1] for x in bks)
        tot_e = sum(x[2] for x in bks)
        r0 = int(ranks[0])
        n_d = len(group(r0, st, "dp")) if zero >= 1 else 1
        n_e = len(group(r0, st, "edp")) if zero >= 1 else 1
        shard[ranks] += tot_d / wb / n_d + tot_e / wb / n_e
        gathers.append((st, ranks, tot_d, tot_e))
    opt_end = np.zeros(world)
    for st in stages.values():
        ranks, end = st["ranks"], st["end"]
        optimizer_tail(timer, tails, ranks, end, ready_cf, float(shard[ranks[0]]), opt_end)
    if zero in (1, 2):
        for st, ranks, tot_d, tot_e in gathers:
            run_coll("zero", "all_gather", ranks, opt_end, tot_d, st, "dp")
            run_coll("zero", "all_gather", ranks, opt_end, tot_e, st, "edp")
    return tails, np.maximum(opt_end, ready_cf)
