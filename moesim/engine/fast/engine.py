"""The fast path: one training step without simpy, for thousands of GPUs (issue 7).

``simulate_fast(res)`` returns the same :class:`~moesim.trace.result.SimResult`
summary as :func:`moesim.engine.api.simulate`, computed by a lockstep model:

- the cluster splits into tp × edp *chains* (:mod:`moesim.engine.fast.pipeline`):
  the EP groups of one (tp, edp) coordinate across the pipeline stages; each chain
  is list-scheduled item by item with per-rank numpy vectors;
- routing is the exact engine's: :func:`moesim.gating.route_microbatch` with the
  same seeds (through the exact builder's ``routes`` stage), so token counts, expert
  statistics and memory equal the exact engine's;
- all-to-alls, TP and pipeline transfers are charged by the link bound
  (:mod:`moesim.engine.fast.network`); gradient buckets, the optimizer and ZeRO
  gathers follow the pipeline (:mod:`moesim.engine.fast.dp`);
- with identical replicas only the chains with edp index 0 run; the others copy.

Every approximation is listed in ``summary["shortcuts"]`` with its measured bound.
"""

from __future__ import annotations

import time

import numpy as np

from moesim.collectives.nccl.choice import scenario_tuning
from moesim.compute.pinned_sms import step_gemms
from moesim.compute.select import grouped_experts
from moesim.engine.breakdown import CATEGORIES, rank_breakdown
from moesim.engine.fast.dp import RingCost, gradient_phase
from moesim.engine.fast.dual import a2a_pair, dual_gradient_phase, run_dual_chain
from moesim.engine.fast.links import LinkBytes
from moesim.engine.fast.network import EXACT_FLOW_BUDGET, FastNetwork
from moesim.engine.fast.pinned import PinnedExperts
from moesim.engine.fast.pipeline import Chain, RouteRec
from moesim.engine.fast.plan_stats import make_plan, shortcuts
from moesim.engine.fast.records import _route_rec
from moesim.engine.fast.sampled import chosen_replicas, sampled_count, sampled_map
from moesim.engine.fast.sampled import shortcut as sampled_shortcut
from moesim.engine.fast.spans import choose_span_ranks
from moesim.engine.fast.stash import RecordStash
from moesim.engine.fast.workers import ChainPool, workers_for
from moesim.engine.summary import link_stats, make_result, summarize
from moesim.program import cp as cpx
from moesim.program import etp as etpx
from moesim.program import recipe, recompute, tp_overlap
from moesim.program.build import ACT_BYTES, Builder
from moesim.program.overlap import PairRule
from moesim.program.replicas import replicas_mode
from moesim.program.timer import Timer
from moesim.scenario.resolved import Resolved
from moesim.schedule.a2a_overlap import a2a_1f1b_order
from moesim.trace.result import SimResult
from moesim.trace.spans import Span

#: (token count, phase) expert kernel lists kept for the other parts of the backward
EK_MEMO_MAX = 1 << 16


class Context:
    """What every chain shares: model dims, costs, network, schedule."""

    def __init__(self, res: Resolved, builder: Builder) -> None:
        b = builder
        scn = res.scenario
        self.res, self.spec = res, res.model
        self.tp, self.pp, self.v, self.m = b.tp, b.pp, b.v, b.m
        self.tokens, self.ep_tokens, self.seq = b.tokens, b.ep_tokens, b.seq
        self.cp, self.etp, self.sp = b.cp, b.etp, b.sp
        k = self.spec.top_k if res.routing.top_k is None else res.routing.top_k
        self.sent = self.ep_tokens * k
        self.chunks, self.order = b.chunks, b.order
        self.rc = b.rc          # activation recomputation (moesim.program.recompute)
        self.tpo = tp_overlap.enabled(scn)     # TE userbuffers (moesim.engine.fast.tp_ub)
        # overlap.gemm_sms: left_by_ep, FP8 GEMMs on the SMs the EP kernels leave
        self.pin = step_gemms(res)
        self.timer = Timer(res.compute if self.pin is None else self.pin)
        self.pinned = PinnedExperts(self, self.pin) if self.pin is not None else None
        self.grouped = grouped_experts(scn.compute)    # compute.expert_launches: grouped
        topo = res.topology
        gpus = list(topo.gpus)
        self.rank_host = [topo.host_of(g) for g in gpus]
        self.net = FastNetwork(topo, gpus, self.rank_host,
                               coalesce_rtol=res.scenario.engine.coalesce_rtol)
        nccl = scenario_tuning(res)     # overlap.nccl_tuning (moesim.collectives.nccl.choice)
        self.rings = RingCost(topo, gpus, self.rank_host, nccl=nccl)
        self.act_bytes = self.tokens * self.spec.hidden * ACT_BYTES / self.tp
        self.a2a_algo = scn.routing.a2a_algo
        self.ep_backend = b.ep_backend          # DeepEP plans (moesim.program.ep_backend)
        self.gpn = b.gpn
        self.overlap = scn.overlap.ep_comm_overlap and b.ep > 1
        # share s/S of the GPU's SMs an EP kernel holds: compute hidden under it slows
        sms = int(getattr(res.device, "sms", 0) or 0)
        self.ep_sm_frac = b.ep_sms / sms if sms > 0 and b.ep_sms > 0 else 0.0
        self.dual = b.dual                   # DualPipe(V) order, or None
        self.fb_overlap = b.fb_overlap       # its F&B pairs hide all-to-alls
        # gradient buckets run while the pipeline still sends (dp_overlap): a backward
        # send after a layer's last backward may share a link with a ring flow
        self.grad_share = bool(scn.overlap.dp_overlap) and max(res.layout.dp * res.layout.cp,
                                                                 res.layout.edp) > 1
        self.links = LinkBytes(topo, gpus, self.rank_host,
                               b.rmap.mirrors if b.dedup and b.rmap is not None else None,
                               nccl=nccl)
        self._share: dict[tuple[int, int], float] = {}
        self._tp: dict[object, float] = {}   # by rank; MLA's SP: fast.pipeline._sp_s
        self._cp: dict[tuple[int, str], float] = {}
        self._lut: dict[tuple[str, bool], tuple[np.ndarray, np.ndarray]] = {}
        self.exact_flows = 0    # flows the step would time flow by flow (simulate_fast)
        self._ek: dict[tuple[int, str], tuple] = {}   # (tokens, phase) -> kernels, s, model
        self._rpn: dict[tuple[int, ...], int] = {}   # EP group -> ranks per node

    def _expert_kernels(self, x: int, ph: str, fused: bool = False) -> tuple[list, dict]:
        """One expert's kernel list for ``x`` tokens in phase ``ph`` and each kernel's
        seconds (by ``id``), each kernel priced once: the backward's B and W parts (and the
        activation recompute) are cut from this list, so their kernels are the same objects
        (the memo is dropped when it grows large). ``fused``: an expert after a rank's
        first under grouped launches (``Kernel.fused``)."""
        model = self.timer.model
        hit = self._ek.get((x, ph, fused))
        if hit is None or hit[2] is not model:    # (prices of another compute model)
            if len(self._ek) >= EK_MEMO_MAX:
                self._ek.clear()
            # ETP: the peers' tokens too (taken equal to this rank's), 1/etp wide
            ks = recipe.expert(self.spec, x * self.etp, self.etp, ph, fused)
            hit = self._ek[(x, ph, fused)] = (ks, {id(k): model.time_s(k) for k in ks}, model)
        return hit[0], hit[1]

    def _expert_price(self, x: int, ph: str, part: str, fused: bool = False) -> tuple:
        """(seconds, FLOP) of one expert's ``part`` ("" the whole phase, "B", "W",
        "act") for ``x`` tokens: what ``Timer`` gives for that kernel list (the same
        sums in the same order), under the same key, every kernel priced once."""
        key = (("expert", x, ph, self.etp) + ((part,) if part else ())
               + (("fused",) if fused else ()))
        timer = self.timer
        hit = timer.cache.get(key)
        if hit is None:
            ks, secs = self._expert_kernels(x, ph, fused)
            if part == "act":
                ks = recompute.act_kernels(ks)
            elif part:
                ks = recipe.backward_part(ks, part)
            timer.kernels[key] = tuple(ks)
            hit = timer.cache[key] = (sum(secs[id(k)] for k in ks), sum(k.flops for k in ks))
        return hit

    def expert_cost(self, local: np.ndarray, phase: str, fused: bool = False) -> tuple:
        """(seconds, FLOP) of every (rank, expert) with ``local`` tokens; a lookup
        table per token count (0 tokens: no kernel), filled on demand. ``phase``:
        ``fwd``, ``bwd``, or ``bwd.B`` / ``bwd.W`` (the backward's input- and
        weight-gradient parts, :func:`moesim.model.costs.split_backward`), ``fused``."""
        ph, _, part = phase.partition(".")
        if phase == "act":      # moe_act recompute: the activation function only
            ph, part = "fwd", "act"
        lkey = (phase, fused)
        lut = self._lut.get(lkey)
        top = int(local.max(initial=0))
        if lut is None or len(lut[0]) <= top:
            size = max(top + 1, 2 * (len(lut[0]) if lut else 64))
            new = (np.full(size, np.nan), np.full(size, np.nan))
            if lut is not None:
                new[0][:len(lut[0])], new[1][:len(lut[1])] = lut
            new[0][0] = new[1][0] = 0.0
            lut = self._lut[lkey] = new
        t_lut, f_lut = lut
        miss = np.isnan(t_lut[local])
        if miss.any():
            for x in np.unique(local[miss]).tolist():
                t_lut[x], f_lut[x] = self._expert_price(x, ph, part, fused)
        return t_lut[local], f_lut[local]

    def ep_ranks_per_node(self, group: tuple[int, ...]) -> int:
        """EP ranks per node of ``group`` (DeepEP's check), once per group."""
        hit = self._rpn.get(group)
        if hit is None:
            hit = self._rpn[group] = self.ep_backend.ranks_per_node(group, self.gpn)
        return hit

    def send_share(self, src: int, dst: int) -> float:
        """Flows on the bottleneck of a backward send src→dst while ``src``'s gradient
        buckets run: 2 when its path shares a link with a ring step of src's DP or
        expert-DP group (max-min halves it), else 1."""
        hit = self._share.get((src, dst))
        if hit is None:
            topo, gpus = self.res.topology, self.net.gpus
            path = set(topo.route(gpus[src], gpus[dst]))
            hit = 1.0
            for kind in ("dp_cp", "edp"):
                g = tuple(self.res.layout.group_of(src, kind))
                if len(g) > 1 and path & self.rings.links(g):
                    hit = 2.0
            self._share[(src, dst)] = hit
        return hit

    def tp_bytes(self, group: tuple[int, ...]) -> None:
        """Count the TP all-reduces of ``group``'s members on the links, once per TP
        group (from its member with tp coordinate 0)."""
        lay = self.res.layout
        nbytes = float(self.tokens * self.spec.hidden * ACT_BYTES)
        for r in group:
            if int(lay.coords["tp"][r]) == 0:
                self.links.collective("all_reduce", tuple(lay.group_of(r, "tp")), nbytes,
                                      mirrored=True)

    def cp_time(self, rank: int, phase: str) -> float:
        """Seconds of one layer's ring KV exchange of ``rank``'s CP group (0 without CP)."""
        if self.cp <= 1:
            return 0.0
        key = (rank, phase)
        hit = self._cp.get(key)
        if hit is None:
            g = tuple(self.res.layout.group_of(rank, "cp"))
            spec = cpx.kv_spec(g, self.spec, self.tokens, self.tp, phase)
            hit = self._cp[key] = self.rings.time("all_gather", g, spec.nbytes)
        return hit

    def etp_time(self, group: tuple[int, ...], recv: np.ndarray) -> np.ndarray:
        """Per EP member: its ETP all-gather (or reduce-scatter) of the tokens the ETP
        group received, the peers taken to receive as many as the member."""
        lay, spec = self.res.layout, self.spec
        return np.array([self.rings.time("all_gather", tuple(lay.group_of(r, "etp")),
                                         etpx.gather_bytes(spec, int(recv[e]) * self.etp))
                         for e, r in enumerate(group)], dtype=float)

    def tp_time(self, rank: int) -> float:
        if self.tp <= 1:
            return 0.0
        hit = self._tp.get(rank)
        if hit is None:
            g = self.res.layout.group_of(rank, "tp")
            nbytes = float(self.tokens * self.spec.hidden * ACT_BYTES)
            hit = self._tp[rank] = self.rings.time("all_reduce", tuple(g), nbytes)
        return hit


def _units(ctx: Context, s: int) -> list[list]:
    """Schedule items of stage s, paired as the exact builder interleaves them."""
    if ctx.res.scenario.overlap.kind == "a2a-1f1b":   # Megatron-Core's pairs
        return [list(step) for step in a2a_1f1b_order(ctx.pp, ctx.m, ctx.v)[s]]
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


def _run_chain(ctx: Context, b: Builder, groups, span_pos, progress=None,
               stash: RecordStash | None = None, rerun: bool = False) -> Chain:
    """Run one chain; ``stash`` keeps its records (first run) or hands them back
    (``rerun``), keyed by its first group."""

    def new_rec(s: int, layer: int, mb: int) -> RouteRec:
        key = (groups[0], s, layer, mb)
        if rerun and stash is not None:
            hit = stash.take(key)
            if hit is not None:
                return hit
        g = groups[s]
        r = b.routes.route(g[0], g, layer, mb)
        b.routes.forget(g[0], layer, mb)   # keep memory flat
        rec = _route_rec(ctx, r, g)
        if stash is not None and not rerun and ctx.net.stateless(g):
            stash.put(key, rec)     # (records timed on the flow network: built again)
        return rec

    if ctx.dual is not None:
        return run_dual_chain(ctx, groups, span_pos, new_rec, progress)
    cache: dict[tuple, RouteRec] = {}

    def route(s: int, layer: int, mb: int) -> RouteRec:
        key = (s, layer, mb)
        rec = cache.pop(key, None)       # each record serves its fwd then its bwd
        if rec is None:
            rec = new_rec(s, layer, mb)
            cache[key] = rec
        return rec

    ch = Chain(ctx, groups, route, span_pos)
    units = [_units(ctx, s) for s in range(ctx.pp)]
    a2a = ctx.res.scenario.overlap.kind == "a2a-1f1b"
    pos = [0] * ctx.pp
    left = sum(len(u) for u in units)
    while left:
        moved = False
        for s in range(ctx.pp):
            while pos[s] < len(units[s]) and all(ch.ready(s, it) for it in units[s][pos[s]]):
                unit = units[s][pos[s]]
                if len(unit) == 2 and a2a:
                    a2a_pair(ch, s, unit[0], unit[1])
                elif len(unit) == 2:
                    ch.pair(s, unit[0], unit[1])
                else:
                    ch.item(s, unit[0])
                pos[s] += 1
                left -= 1
                moved = True
                if progress is not None:
                    progress("items", len(unit))
        if not moved and ctx.net.held:      # waiting on held sends only: take them as sent
            ctx.net.held.settle()
            continue
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


def _spans_of(tail, rank: int) -> list[Span]:
    return [Span(rank=rank, stream=stream, kind=kind, name=f"tail.{kind}", start_s=a, end_s=b,
                 waited_on=w, reason=f"waiting for rank {w} at a gradient/ZeRO collective"
                 if kind == "stall" else "")
            for kind, a, b, stream, w in tail if b > a]


def simulate_fast(res: Resolved, *, progress=None, span_ranks: int = 64,
                  replicas: str | None = None, dedup: bool = True) -> SimResult:
    """One step of ``res`` on the lockstep fast path (see module doc). ``spans`` holds
    the ``span_ranks`` lowest ranks and those :func:`choose_span_ranks` picks (listed,
    with the rule, in ``summary["spans_kept"]``); ``summary["per_rank"]`` covers every
    rank. ``dedup=False`` with identical replicas runs every chain on the shared samples
    (the full simulation that one chain per replica class stands for)."""
    t0 = time.perf_counter()
    lay, scn = res.layout, res.scenario
    mode = replicas_mode(scn, replicas)
    sampled, rmap = None, None
    if mode == "sampled":      # N replicas run, the others copy (moesim.engine.fast.sampled)
        n = sampled_count(scn, lay.edp)
        sampled = (n, chosen_replicas(scn.seed, lay.edp, n))
        rmap = sampled_map(lay, sampled[1]) if n < lay.edp else None
    dedup = (dedup and mode == "identical" and lay.edp > 1) or rmap is not None
    b = Builder(res, scn.schedule.step, "identical" if mode == "identical" else "independent",
                dedup, rmap=rmap)
    ctx = Context(res, b)
    world = lay.world
    chains = _chains(lay)
    if dedup:
        chains = [c for c in chains if b.rmap.is_rep(c[0][0])]
    ctx.exact_flows = ctx.net.exact_flow_estimate(chains, len(b.moe_layers), ctx.m)
    ctx.net.exact_ok = ctx.exact_flows <= EXACT_FLOW_BUDGET
    # mirrors of identical replicas have no chain run of their own, hence no spans
    want = {r for r in range(min(span_ranks, world)) if not dedup or b.rmap.is_rep(r)}
    if progress:     # same protocol as the exact engine: ("built", total), then increments
        progress("built", len(chains) * sum(len(o) for o in (
            ctx.order if ctx.dual is None else ctx.dual.items)))

    def copies(r: int) -> list[int]:
        return [r, *b.rmap.mirrors.get(r, ())] if dedup else [r]

    stash = RecordStash()

    def run(ci: int, prog, rerun: bool = False, span_pos=None) -> Chain:
        groups = chains[ci]
        if span_pos is None:
            span_pos = [[e for e, r in enumerate(g) if r in want] for g in groups]
        return _run_chain(ctx, b, groups, span_pos, prog, stash, rerun=rerun)

    pool = ChainPool(run, len(chains), _workers(ctx, b, chains, scn.engine.workers),
                     b, ctx.links, progress)
    try:
        return _finish(res, ctx, b, pool, stash, chains, copies, want, progress, dedup,
                       mode, span_ranks, t0, sampled)
    finally:
        pool.close()


def _workers(ctx: Context, b: Builder, chains, setting: int | None) -> int:
    """Processes for the chains (moesim.engine.fast.workers): ``auto`` (None) only where
    their link counts stay whole bytes (no TP or CP collectives, direct all-to-alls), so
    the blocks merge exactly."""
    if setting == 1 or setting is None and (ctx.tp > 1 or ctx.cp > 1
                                            or ctx.a2a_algo != "direct"):
        return 1
    stateless = all(ctx.net.stateless(g) for groups in chains for g in groups)
    return workers_for(setting, len(chains), len(chains) * len(b.moe_layers) * ctx.m,
                       stateless)


def _finish(res, ctx, b, pool, stash, chains, copies, want, progress, dedup, mode,
            span_ranks, t0, sampled=None):
    """Run the chains in ``pool`` and make the step's result (simulate_fast's second half)."""
    lay = res.layout
    world = lay.world
    acc = {k: np.zeros(world) for k in CATEGORIES if k != "idle"}
    end = np.zeros(world)
    send_end = np.zeros(world)
    last_bwd: dict[int, dict[int, np.ndarray]] = {s: {} for s in range(lay.pp)}
    flops = 0.0
    ep_iv: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    spans: list[Span] = []
    for groups, (out, chain_spans) in zip(chains, pool.first_runs(), strict=True):
        spans += chain_spans
        mult = len(copies(groups[0][0]))
        for s, g in enumerate(groups):
            o = out[s]
            flops += o.flops * mult
            idx = np.asarray([c for r in g for c in copies(r)])
            rep = np.repeat(np.arange(len(g)), mult)
            for k in acc:
                acc[k][idx] = o.acc[k][rep]
            end[idx] = o.end[rep]
            if o.send_end is not None:
                send_end[idx] = o.send_end[rep]
            for j, (a, e) in enumerate(o.ep_iv):
                ep_iv.setdefault((s, j), (np.zeros(world), np.zeros(world)))
                ep_iv[(s, j)][0][idx] = a[rep]
                ep_iv[(s, j)][1][idx] = e[rep]
            for layer, v in o.last_bwd.items():
                last_bwd[s].setdefault(layer, np.zeros(world))[idx] = v[rep]
    plan = make_plan(b, flops)
    # spans of the ranks that explain the step: their chains run again (moesim.engine.fast.spans)
    hot = sorted({int(b.rmap.rep[x]) if dedup else x for x in plan.hot_ranks})
    rerun, kept = choose_span_ranks(chains, acc["stall"], b.routes.received.sum(axis=1), hot,
                                    want, world)
    ctx.links.enabled = False      # counted on the first run
    if progress and rerun:         # the chains run again count as work still to do
        progress("built", (len(chains) + len(rerun)) * sum(len(o) for o in (
            ctx.order if ctx.dual is None else ctx.dual.items)))
    for chain_spans in pool.reruns([(ci, [[e for e, r in enumerate(g) if r in rerun[ci]]
                                          for g in chains[ci]]) for ci in sorted(rerun)]):
        spans += chain_spans
    stash.recs.clear()
    ctx.links.enabled = True
    stages = {}
    pp_coord = lay.coords["pp"]
    for s in range(lay.pp):
        ranks = np.flatnonzero(pp_coord == s)
        iv = [ep_iv[k] for k in sorted(ep_iv) if k[0] == s]
        stages[s] = {"ranks": ranks, "end": end[ranks],
                     "ep_iv": (np.array([a[ranks] for a, _ in iv]).reshape(len(iv), len(ranks)),
                               np.array([e[ranks] for _, e in iv]).reshape(len(iv), len(ranks))),
                     "last_bwd": {layer: v[ranks] for layer, v in last_bwd[s].items()}}
    if ctx.dual is None:
        tails, finish = gradient_phase(res, ctx.rings, ctx.timer, stages, links=ctx.links,
                                       replicas=b.grads.replicas)
    else:
        tails, finish = dual_gradient_phase(res, b, ctx.rings, ctx.timer, stages,
                                            links=ctx.links)
    step = float(max(finish.max(initial=0.0), send_end.max(initial=0.0)))
    rows = []
    keep = set(kept["ranks"])
    # a tail's breakdown depends on its spans' kinds, streams and times only: ranks with
    # the same tail (replicas, members of one DP group) share one computation
    tail_rows: dict[tuple, dict[str, float]] = {}
    for r in range(world):
        tail = list(tails[r])
        if send_end[r] > end[r]:
            tail.append(("pp", float(end[r]), float(send_end[r]), "pp", -1))
        tail = [(k, max(a, float(end[r])), e, st, w) for k, a, e, st, w in tail]
        key = tuple((k, a, e, st) for k, a, e, st, _ in tail if e > a)
        hit = tail_rows.get(key)
        if hit is None:
            hit = tail_rows[key] = rank_breakdown(_spans_of(tail, r), step)
        row = dict(hit)
        pipe = {k: float(acc[k][r]) for k in acc}
        row["idle"] += max(0.0, float(end[r]) - sum(pipe.values())) - float(end[r])
        for k, v in pipe.items():
            row[k] += v
        rows.append(row)
        if r in keep:
            spans += _spans_of(tail, r)
    spans.sort(key=lambda s: (s.rank, s.start_s, s.end_s))
    summary = summarize(res, plan, rows, step)
    summary["engine"] = "fast"
    summary["replicas"] = mode
    summary["shortcuts"] = shortcuts(ctx, dedup and sampled is None, len(chains), world,
                                     span_ranks)
    if sampled is not None:    # each simulated replica's pipeline end: their spread
        edp = lay.coords["edp"]
        ends = [float(end[edp == i].max(initial=0.0)) for i in sampled[1]]
        summary["shortcuts"].append(sampled_shortcut(sampled[0], lay.edp, sampled[1], ends,
                                                     step))
    summary["spans_kept"] = kept
    links = link_stats(res.topology, ctx.links.bytes.copy())
    return make_result(res, plan, spans, summary, step, links, t0)
