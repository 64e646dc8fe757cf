"""Gradient buckets, optimizer and ZeRO parameter gathers after the pipeline, for the
fast path (pure: no simpy). Same bucketing as :mod:`moesim.program.build`; ring
collectives are charged in closed form: ``steps × (chunk × k + latency)``, with ``k``
the slowest seconds-per-byte of one ring step under the link bound (all rings of
the step on the network together) — exact for the phases the exact engine runs,
each phase's flows being equal (tests/test_fast_path.py)."""

from __future__ import annotations

import numpy as np

from moesim.collectives.algorithms import expand, ring_orders
from moesim.memory.model import rank_params
from moesim.network.maxmin import maxmin_pairs
from moesim.program import recipe


def _fill_per_byte(paths, size: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """When each flow of a phase (``size`` bytes) has sent its last byte under max-min
    sharing, re-solved whenever flows finish (exact progressive filling, as the flow
    network does; scaling every size scales every finish time alike)."""
    n = len(paths)
    flow = np.repeat(np.arange(n), [len(p) for p in paths])
    link = np.concatenate([np.asarray(p, dtype=np.int64) for p in paths]) if n else flow
    left = np.asarray(size, dtype=float).copy()
    done = np.zeros(n)
    alive = np.ones(n, dtype=bool)
    t = 0.0
    while alive.any():
        keep = alive[flow]
        ids = np.flatnonzero(alive)
        remap = np.full(n, -1)
        remap[ids] = np.arange(len(ids))
        rates = maxmin_pairs(remap[flow[keep]], link[keep], len(ids), cap)
        dt = float((left[ids] / rates).min())
        left[ids] -= rates * dt
        t += dt
        fin = ids[left[ids] <= 1e-12 * np.asarray(size)[ids]]
        done[fin] = t
        alive[fin] = False
    return done


class RingCost:
    """Seconds of ring all_reduce / reduce_scatter / all_gather on a group. ``nccl``
    (:class:`moesim.collectives.nccl.choice.NcclTuning`, ``overlap.nccl_tuning``):
    where NCCL would run another protocol or algorithm than ring/Simple, NCCL's latency
    term plus the steps' bytes / the protocol's efficiency, without link latencies (as
    the exact engine's communicator runs it)."""

    def __init__(self, topo, gpus, rank_host, nccl=None) -> None:
        self.topo, self.gpus, self.rank_host = topo, list(gpus), list(rank_host)
        self.nccl = nccl
        self.cap = np.asarray(topo.capacity_Bps, dtype=float)
        self._k: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, int]] = {}
        self._links: dict[tuple[int, ...], frozenset[int]] = {}

    def links(self, group: tuple[int, ...]) -> frozenset[int]:
        """Links that a ring step of ``group`` uses."""
        if group not in self._links:
            self._step(group)
        return self._links.get(group, frozenset())

    def _step(self, group: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, int]:
        hit = self._k.get(group)
        if hit is None:
            rings = ring_orders(group, self.rank_host)
            n = len(group)
            # one ring step with a 1-byte chunk, flows merged per pair as expand() does
            step = expand("all_gather", group, float(n * len(rings)),
                          rank_host=self.rank_host)[0]
            flows = [(self.topo.route(self.gpus[a], self.gpus[b]), w) for a, b, w in step]
            flows = [(p, w) for p, w in flows if p]
            self._links[group] = frozenset(lk for p, _ in flows for lk in p)
            ks = _fill_per_byte([p for p, _ in flows], np.array([w for _, w in flows]),
                                self.cap)
            lats = np.array([float(self.topo.latency_s[list(p)].sum()) for p, _ in flows])
            hit = self._k[group] = (np.asarray(ks), np.asarray(lats), len(rings))
        return hit

    def choice(self, op: str, group: tuple[int, ...], nbytes: float):
        """NCCL's choice where it changes the pricing (``nccl`` set), else None."""
        if self.nccl is None:
            return None
        return self.nccl.for_group(op, group, nbytes, self.rank_host)

    def time(self, op: str, group: tuple[int, ...], nbytes: float) -> float:
        n = len(group)
        if n < 2 or nbytes <= 0:
            return 0.0
        k, lat, rings = self._step(group)
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        if len(k) == 0:
            return 0.0
        c = self.choice(op, group, nbytes)
        if c is not None:
            return c.latency_s + steps * float((nbytes / c.bw_efficiency / n / rings * k).max())
        return steps * float((nbytes / n / rings * k + lat).max())


def buckets(res, stage: int, layer_order: list[int], first: bool | None = None,
            last: bool | None = None) -> list[tuple[int, float, float]]:
    """(ready layer, dense bytes, expert bytes) per bucket, as the exact builder cuts them
    (``first``/``last``: whether the chunk holds the embedding / LM head; default from
    ``stage`` among ``parallel.pp`` stages)."""
    spec, par = res.model, res.scenario.parallel
    wb = spec.weight_bytes
    extra, _ = rank_params(spec, [], tp=par.tp, ep=par.ep,
                           first=stage == 0 if first is None else first,
                           last=stage == par.pp - 1 if last is None else last, etp=par.etp)
    size = res.scenario.schedule.dp_bucket_bytes
    out, acc_d, acc_e = [], 0.0, 0.0
    for j, layer in enumerate(layer_order):
        d, e = rank_params(spec, [layer], tp=par.tp, ep=par.ep, first=False, last=False,
                           etp=par.etp)
        acc_d += d * wb
        acc_e += e * wb
        final = j == len(layer_order) - 1
        if final:
            acc_d += extra * wb
        if acc_d + acc_e < size and not final:
            continue
        out.append((layer, acc_d, acc_e))
        acc_d = acc_e = 0.0
    return out


def _merge(intervals) -> list[tuple[float, float]]:
    """Union of (start, end) intervals, sorted and disjoint."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _past_a2a(intervals, start: float, work: float) -> float:
    """End of ``work`` seconds of a DP collective started at ``start`` that makes no
    progress while any of its ranks' EP all-to-alls hold the NICs (``intervals``: their
    union; a ring step waits for its slowest flow, and max-min leaves a ring flow
    1/(k+1) of a NIC shared with k all-to-all flows; taken as 0)."""
    t, left = start, work
    for a, b in intervals:
        if b <= t:
            continue
        if a >= t + left:
            break
        left -= max(0.0, a - t)
        t = b
    return t + left


def gradient_phase(res, rings: RingCost, timer, stages: dict[int, dict], step_hint=None,
                   links=None, replicas=None):
    """Run buckets, optimizer and ZeRO gathers for every rank.

    ``stages[s]``: ``ranks`` (array), ``last_bwd`` (layer -> end per rank, same order),
    ``end`` (compute stream end per rank). Returns per rank (dict rank -> list of tail
    spans as (kind, start, end, stream, waited_on): waited_on is the group member a
    ``stall`` waits for, else -1) and the end of every rank's work. ``links``: a
    :class:`moesim.engine.fast.links.LinkBytes` that counts every ring's bytes.
    ``replicas``: the builder's :class:`moesim.program.replica_grads.ReplicaGrads`
    (replicated experts: their all-reduces before each bucket, their bytes in its EDP
    reduce and the optimizer, as :mod:`moesim.program.grads` plans them)."""
    lay, scn = res.layout, res.scenario
    zero, overlap = scn.parallel.zero, scn.overlap.dp_overlap
    grad_op = "all_reduce" if zero == 0 else "reduce_scatter"
    world = lay.world
    ready_cf = np.zeros(world)          # comm stream free
    tails: dict[int, list[tuple[str, float, float, str, int]]] = {r: [] for r in range(world)}
    finish = np.zeros(world)
    per_stage = []
    for s, st in sorted(stages.items()):
        ranks, lb, end = st["ranks"], st["last_bwd"], st["end"]
        order = sorted(lb, key=lambda layer: float(lb[layer][0]))
        bks = buckets(res, s, order)
        per_stage.append((s, ranks, lb, end, bks))
        finish[ranks] = end
    spec = res.model
    wb = spec.weight_bytes

    busy = {}     # rank -> sorted EP all-to-all intervals of its last backward item
    for st in stages.values():
        a, e = st.get("ep_iv", (np.zeros((0, 0)), np.zeros((0, 0))))
        for i, r in enumerate(st["ranks"]):
            busy[int(r)] = sorted(zip(a[:, i].tolist(), e[:, i].tolist(), strict=True))

    busy_of: dict[tuple[int, ...], list[tuple[float, float]]] = {}

    def run_coll(kind, name_op, grp_kind, ranks_s, ready_at, nbytes_of, tag):
        covered: set[int] = set()     # members of the groups run: each group once, in order
        for r in np.asarray(ranks_s).tolist():
            if r in covered:
                continue
            g = lay.group_of(r, grp_kind)
            covered.update(g)
            nbytes = nbytes_of(r) if callable(nbytes_of) else nbytes_of
            if len(g) < 2 or nbytes <= 0:
                continue
            group_collective(g, kind, name_op, nbytes, ready_at, ready_cf, busy,
                             busy_of, rings, tails, links)
    extra_e: dict[int, float] = {}      # per rank: its replicas' expert bytes
    for _s, ranks, lb, end, bks in per_stage:
        order = sorted(lb, key=lambda layer: float(lb[layer][0]))
        at = 0
        for layer, d_b, e_b in bks:
            ready = np.zeros(world)
            ready[ranks] = lb[layer] if overlap else end
            held = order[at:order.index(layer) + 1]
            at += len(held)
            if replicas is not None:
                e_b = _replica_syncs(replicas, ranks, held, ready, ready_cf, busy, busy_of,
                                     rings, tails, links, e_b, extra_e)
            run_coll("dp", grad_op, "dp_cp", ranks, ready, d_b, "dense")
            run_coll("dp", grad_op, "edp", ranks, ready, e_b, "experts")
    opt_end = np.zeros(world)
    for _s, ranks, _lb, end, bks in per_stage:
        tot_d = sum(b[1] for b in bks)
        tot_e = sum(b[2] for b in bks)
        dpn, edpn = lay.dp * lay.cp, lay.edp
        extra = np.asarray([extra_e.get(int(r), 0.0) for r in ranks])
        for x in np.unique(extra):      # ranks holding as many replicas' bytes, together
            sel = extra == x
            shard = (tot_d / wb / (dpn if zero >= 1 else 1)
                     + (tot_e + x) / wb / (edpn if zero >= 1 else 1))
            optimizer_tail(timer, tails, ranks[sel], end[sel], ready_cf, shard, opt_end)
        if zero in (1, 2):
            run_coll("zero", "all_gather", "dp_cp", ranks, opt_end, tot_d, "dense")
            run_coll("zero", "all_gather", "edp", ranks, opt_end,
                     lambda r, t=tot_e: t + extra_e.get(int(r), 0.0), "experts")
    finish = np.maximum(opt_end, ready_cf)
    return tails, finish


def _replica_syncs(replicas, ranks, held, ready, ready_cf, busy, busy_of, rings, tails,
                   links, e_b, extra_e):
    """The replica all-reduces of a bucket's layers ``held`` on every EP group of
    ``ranks``, in the builder's order (layer, then EP positions); returns each rank's
    EDP bytes of the bucket (``rank -> bytes``) and adds its replicas' bytes to
    ``extra_e`` (for the optimizer)."""
    per: dict[int, float] = {}
    seen: set[tuple[int, ...]] = set()
    for r in np.asarray(ranks).tolist():
        add = sum(replicas.extra_experts(r, lyr) for lyr in held) * replicas.expert_bytes
        extra_e[r] = extra_e.get(r, 0.0) + add
        per[r] = e_b + add
        g = replicas.lay.group_of(r, "ep")
        if g in seen:
            continue
        seen.add(g)
        for lyr in held:
            for grp, nbytes in replicas.group_syncs(g, lyr):
                group_collective(grp, "dp", "all_reduce", nbytes, ready, ready_cf, busy,
                                 busy_of, rings, tails, links)
    return per.__getitem__


def optimizer_tail(timer, tails, ranks, end, ready_cf, shard: float, opt_end) -> None:
    """The optimizer step of ``ranks`` over ``shard`` parameters: after their compute
    stream (``end``) and, where they reduced gradients, after the last reduction
    (``ready_cf``); sets ``opt_end[ranks]`` and appends the compute tail spans."""
    t_opt, _ = timer(("opt", shard), lambda sh=shard: recipe.optimizer(sh))
    anyc = np.asarray([bool(tails[int(r)]) for r in ranks])
    start = np.where(anyc, np.maximum(end, ready_cf[ranks]), end)
    opt_end[ranks] = start + t_opt
    for r, a in zip(ranks, start, strict=True):
        tails[int(r)].append(("compute", float(a), float(a) + t_opt, "compute", -1))


def group_collective(g, kind: str, name_op: str, nbytes: float, ready_at, ready_cf, busy,
                     busy_of, rings: RingCost, tails, links=None) -> float:
    """One gradient-phase collective on group ``g``: it starts when its last member is
    ready (``ready_at``, after the member's previous collective ``ready_cf``), makes no
    progress while any member is in an all-to-all (``busy``), and appends each member's
    stall (naming the member waited for) and collective span to ``tails``; updates
    ``ready_cf`` and returns the end."""
    ga = np.asarray(g)
    own = np.maximum(ready_at[ga], ready_cf[ga])
    start = own.max()
    iv = busy_of.get(g)
    if iv is None:
        iv = busy_of[g] = _merge(x for r in g for x in busy.get(int(r), ()))
    end = _past_a2a(iv, start, rings.time(name_op, tuple(g), nbytes))
    if links is not None:
        links.collective(name_op, tuple(g), nbytes)
    late = int(g[int(own.argmax())])    # the member the others wait for
    for x, o in zip(g, own, strict=True):
        if start > o:
            tails[x].append(("stall", float(o), float(start), "comm", late))
        tails[x].append((kind, float(start), float(end), "comm", -1))
    ready_cf[ga] = end
    return end
