"""The first stage of building a step: token routing (pure: no simpy).

:class:`TokenRouting` draws the routing of every (EP group, MoE layer, micro-batch) once
with :func:`moesim.gating.route_microbatch` and counts the step's expert statistics from
it. Its inputs are explicit: the resolved scenario (routing policy, model, layout, seed),
the step, the experts' placement, the tokens each rank routes per micro-batch, the
micro-batch count, the replica map (identical replicas share one sample, drawn under the representative's
group index) and the EP backend (DeepEP's per-node copy ratios). Its outputs: the
samples (:meth:`route`), and per MoE layer the experts' assigned, kept and capacity
tokens, the load-balancing loss and the most tokens each rank received in one
micro-batch. The later stages (kernels, transfers, schedule: :mod:`moesim.program.build`)
and the fast engine read routing only through it.
"""

from __future__ import annotations

import numpy as np

from moesim.gating import route_microbatch
from moesim.gating.eplb_placement import placement_for
from moesim.program.hot import hot_ranks


class TokenRouting:
    def __init__(self, res, step: int, *, placement, ep_tokens: int, microbatches: int, rmap,
                 dedup: bool, ep_backend, dedup_cache: dict | None = None) -> None:
        self.scn, self.spec, self.lay = res.scenario, res.model, res.layout
        self.config = res.routing
        self.step, self.ep_tokens, self.m = step, ep_tokens, microbatches
        self.rmap, self.dedup, self.ep_backend = rmap, dedup, ep_backend
        self.gpn = self.scn.gpus_per_node
        self.moe_layers = [i for i in range(self.spec.blocks) if self.spec.is_moe_layer(i)]
        self.moe_index = {layer: j for j, layer in enumerate(self.moe_layers)}
        self.placement = placement      # experts on EP ranks (moesim.gating.make_placement)
        E, L = self.spec.n_experts, len(self.moe_layers)
        self._rpn: dict[tuple[int, ...], int | None] = {}
        if self.config.placement is not None and E:    # routing.placement: one per layer
            self.placement = placement_for(
                self.config, n_experts=E, ep=placement.ep, source=self.scn.source,
                top_k=self.spec.top_k, moe_layers=self.moe_layers, blocks=self.spec.blocks,
                ranks_per_node=self._ep_ranks_per_node(tuple(self.lay.ep_groups[0])),
                tokens_per_rank=ep_tokens, microbatches=microbatches, seed=self.scn.seed,
                step=step)
        self.expert_tokens = np.zeros((L, E), dtype=np.int64)
        self.expert_kept = np.zeros((L, E), dtype=np.int64)
        self.expert_capacity = np.full(L, np.inf)
        self.lb = np.zeros(L)
        self.lb_n = np.zeros(L)
        self.received = np.zeros((self.lay.world, L), dtype=np.int64)
        # the routing law per (seed, step, layer) and DeepEP's copy ratios (a caller may
        # keep them across steps: moesim.serve.steps)
        self.dedup_cache: dict = {} if dedup_cache is None else dedup_cache
        # (group index, layer, micro-batch) already counted in the expert statistics
        self.counted: set[tuple[int, int, int]] = set()
        self.journal: list[tuple] | None = None    # account's calls (fast/workers.py)
        self._samples: dict[tuple[int, int, int], object] = {}

    def route(self, group_idx: int, group: tuple[int, ...], layer: int, mb: int):
        """The routing sample of MoE layer ``layer``, micro-batch ``mb`` on EP ``group``
        (first call: drawn and counted in the statistics)."""
        # identical replicas: the EP groups of one replica class share one sample, drawn
        # under the representative's group index (so edp = 1 draws exactly as before)
        canon = int(self.rmap.rep[group_idx]) if self.rmap is not None else group_idx
        key = (canon, layer, mb)
        r = self._samples.get(key)
        if r is None:
            spec, scn = self.spec, self.scn
            j = self.moe_index[layer]
            r = route_microbatch(
                self.config, n_experts=spec.n_experts, top_k=spec.top_k,
                tokens_per_rank=np.full(len(group), self.ep_tokens, dtype=np.int64),
                placement=self.placement.layer(j),
                ranks_per_node=self._ep_ranks_per_node(group),
                hidden=spec.hidden, dispatch_dtype=scn.routing.dispatch_dtype,
                combine_dtype=scn.routing.combine_dtype, seed=scn.seed, step=self.step,
                layer=j, microbatch=canon * self.m + mb, source=scn.source,
                dedup_ranks_per_node=self.ep_backend.ranks_per_node(group, self.gpn)
                if self.ep_backend.needs_dedup else None, dedup_cache=self.dedup_cache)
            self._samples[key] = r
        if (group_idx, layer, mb) not in self.counted:
            self.counted.add((group_idx, layer, mb))
            groups = [group]
            if self.dedup and self.rmap is not None:  # mirror groups are not built: count them
                mir = [self.rmap.mirrors.get(int(x), ()) for x in group]
                groups += [tuple(m[e] for m in mir) for e in range(len(mir[0]))]
            for g in groups:      # assigned (nothing dropped: kept is assign), kept, ...
                self.account(self.moe_index[layer], g, r.expert_tokens if r.kept is
                             r.assign else r.assign.sum(axis=0), r.expert_tokens,
                             float(r.capacity.sum()) if r.capacity.size else np.inf,
                             r.lb_loss, np.asarray(r.rank_tokens))
        return r

    def forget(self, group_idx: int, layer: int, mb: int) -> None:
        """Drop the sample kept for (group, layer, mb): keeps memory flat."""
        canon = int(self.rmap.rep[group_idx]) if self.rmap is not None else group_idx
        self._samples.pop((canon, layer, mb), None)

    def forget_all(self) -> None:
        """Drop every sample kept (the statistics stay counted)."""
        self._samples.clear()

    def account(self, j: int, group: tuple[int, ...], assigned, kept, cap: float,
                lb, tok: np.ndarray) -> None:
        """Count a routed micro-batch of MoE layer ``j`` on ``group`` (+ ``journal``)."""
        if self.journal is not None:
            self.journal.append((j, group, assigned, kept, cap, lb, tok))
        self.expert_tokens[j] += assigned
        self.expert_kept[j] += kept
        # capacity summed over sources and micro-batches (inf: no capacity factor)
        prev = self.expert_capacity[j]
        self.expert_capacity[j] = cap if not np.isfinite(prev) else prev + cap
        self.lb[j] += lb
        self.lb_n[j] += 1
        idx = np.fromiter(group, dtype=np.int64, count=len(group))
        if tok.dtype.kind == "i" and len(set(group)) == len(group):   # whole numbers
            self.received[idx, j] = np.maximum(self.received[idx, j], tok)
            return
        for pos, rank in enumerate(group):
            self.received[rank, j] = max(self.received[rank, j], int(tok[pos]))

    # ---------------------------------------------------------------- outputs
    def stats(self) -> dict:
        """The step's expert statistics, as :class:`moesim.program.build.StepPlan` holds
        them."""
        kept = self.expert_kept
        return {"moe_layers": self.moe_layers, "expert_tokens": self.expert_tokens,
                "expert_kept": kept, "expert_dropped": self.expert_tokens - kept,
                "expert_capacity": self.expert_capacity if self.moe_layers else np.zeros(0),
                "lb_loss": np.divide(self.lb, np.maximum(self.lb_n, 1)),
                "rank_received": self.received, "hot_ranks": self.hot_ranks(),
                "eplb": self.placement if self.config.placement is not None else None}

    def hot_ranks(self) -> list[int]:
        """The ranks holding the most received tokens per stage (:mod:`moesim.program.hot`)."""
        if not self.moe_layers or self.received.size == 0:
            return []
        return hot_ranks(self.received, self.lay.coords["pp"])

    def _ep_ranks_per_node(self, group: tuple[int, ...]) -> int | None:
        """Consecutive EP ranks per node of ``group`` (None: no node structure, or not
        equally many consecutive ranks per node); remembered per group."""
        hit = self._rpn.get(group, False)
        if hit is False:
            hit = self._rpn[group] = self._ranks_per_node_of(group)
        return hit

    def _ranks_per_node_of(self, group: tuple[int, ...]) -> int | None:
        if not self.gpn:
            return None
        hosts = [g // self.gpn for g in group]
        counts = np.bincount(hosts)
        counts = counts[counts > 0]
        # node-limited routing needs consecutive EP ranks per node, equally many
        if len(set(counts.tolist())) == 1 and hosts == sorted(hosts):
            return int(counts[0])
        return None
