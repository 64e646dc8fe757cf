"""Gradient buckets, optimizer and ZeRO parameter gathers after the pipeline, for the
fast path (pure: no simpy). Same bucketing as :mod:`moesim.engine.build`; ring
collectives are charged in closed form: ``steps × (chunk × k + latency)``, with ``k``
the slowest seconds-per-byte of one ring step under the link bound (all rings of
the step on the network together) — exact for the phases the exact engine runs,
each phase's flows being equal (tests/test_fast_path.py)."""

from __future__ import annotations

import numpy as np

from moesim.collectives.algorithms import ring_orders
from moesim.memory import rank_params
from moesim.model import costs


class RingCost:
    """Seconds of ring all_reduce / reduce_scatter / all_gather on a group."""

    def __init__(self, topo, gpus, rank_host) -> None:
        self.topo, self.gpus, self.rank_host = topo, list(gpus), list(rank_host)
        self.cap = np.asarray(topo.capacity_Bps, dtype=float)
        self._k: dict[tuple[int, ...], tuple[float, float, int]] = {}

    def _step(self, group: tuple[int, ...]) -> tuple[float, float, int]:
        hit = self._k.get(group)
        if hit is None:
            rings = ring_orders(group, self.rank_host)
            n = len(group)
            load: dict[int, float] = {}
            paths = []
            for ring in rings:
                for i in range(n):
                    path = self.topo.route(self.gpus[ring[i]], self.gpus[ring[(i + 1) % n]])
                    paths.append(path)
                    for lk in path:
                        load[lk] = load.get(lk, 0.0) + 1.0
            k = lat = 0.0
            for path in paths:
                if path:
                    k = max(k, max(load[lk] / self.cap[lk] for lk in path))
                    lat = max(lat, float(self.topo.latency_s[list(path)].sum()))
            hit = self._k[group] = (k, lat, len(rings))
        return hit

    def time(self, op: str, group: tuple[int, ...], nbytes: float) -> float:
        n = len(group)
        if n < 2 or nbytes <= 0:
            return 0.0
        k, lat, rings = self._step(group)
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        return steps * (nbytes / n / rings * k + lat)


def buckets(res, stage: int, layer_order: list[int]) -> list[tuple[int, float, float]]:
    """(ready layer, dense bytes, expert bytes) per bucket, as the exact builder cuts them."""
    spec, par = res.model, res.scenario.parallel
    wb = spec.weight_bytes
    extra, _ = rank_params(spec, [], tp=par.tp, ep=par.ep, first=stage == 0,
                           last=stage == par.pp - 1)
    size = res.scenario.schedule.dp_bucket_bytes
    out, acc_d, acc_e = [], 0.0, 0.0
    for j, layer in enumerate(layer_order):
        d, e = rank_params(spec, [layer], tp=par.tp, ep=par.ep, first=False, last=False)
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


def gradient_phase(res, rings: RingCost, timer, stages: dict[int, dict], step_hint=None):
    """Run buckets, optimizer and ZeRO gathers for every rank.

    ``stages[s]``: ``ranks`` (array), ``last_bwd`` (layer -> end per rank, same order),
    ``end`` (compute stream end per rank). Returns per rank (dict rank -> list of tail
    spans as (kind, start, end, stream)) and the end of every rank's work."""
    lay, scn = res.layout, res.scenario
    zero, overlap = scn.parallel.zero, scn.overlap.dp_overlap
    grad_op = "all_reduce" if zero == 0 else "reduce_scatter"
    world = lay.world
    ready_cf = np.zeros(world)          # comm stream free
    tails: dict[int, list[tuple[str, float, float, str]]] = {r: [] for r in range(world)}
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

    def run_coll(kind, name_op, grp_kind, ranks_s, ready_at, nbytes_of, tag):
        done = {}
        for r in ranks_s:
            g = lay.group_of(int(r), grp_kind)
            if g in done:
                continue
            nbytes = nbytes_of
            if len(g) < 2 or nbytes <= 0:
                done[g] = None
                continue
            ga = np.asarray(g)
            own = np.maximum(ready_at[ga], ready_cf[ga])
            start = own.max()
            end = start + rings.time(name_op, tuple(g), nbytes)
            for x, o in zip(g, own, strict=True):
                if start > o:
                    tails[x].append(("stall", float(o), float(start), "comm"))
                tails[x].append((kind, float(start), float(end), "comm"))
            ready_cf[ga] = end
            done[g] = end
    for s, ranks, lb, end, bks in per_stage:
        for layer, d_b, e_b in bks:
            ready = np.zeros(world)
            ready[ranks] = lb[layer] if overlap else end
            run_coll("dp", grad_op, "dp", ranks, ready, d_b, "dense")
            run_coll("dp", grad_op, "edp", ranks, ready, e_b, "experts")
    opt_end = np.zeros(world)
    for s, ranks, lb, end, bks in per_stage:
        tot_d = sum(b[1] for b in bks)
        tot_e = sum(b[2] for b in bks)
        dpn, edpn = lay.dp, lay.edp
        shard = (tot_d / wb / (dpn if zero >= 1 else 1) + tot_e / wb / (edpn if zero >= 1 else 1))
        t_opt, _ = timer(("opt", shard), lambda sh=shard: costs.optimizer_kernels(sh))
        anyc = np.asarray([bool(tails[int(r)]) for r in ranks])
        start = np.where(anyc, np.maximum(end, ready_cf[ranks]), end)
        opt_end[ranks] = start + t_opt
        for r, a in zip(ranks, start, strict=True):
            tails[int(r)].append(("compute", float(a), float(a) + t_opt, "compute"))
        if zero in (1, 2):
            run_coll("zero", "all_gather", "dp", ranks, opt_end, tot_d, "dense")
            run_coll("zero", "all_gather", "edp", ranks, opt_end, tot_e, "experts")
    finish = np.maximum(opt_end, ready_cf)
    return tails, finish
