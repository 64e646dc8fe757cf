"""Gradients of replicated experts in a training step: the extra expert weights a rank
holds and the all-reduce that keeps the copies identical (pure).

An expert with R replicas in an EP group (EPLB's redundant experts,
``routing.placement``, or ``routing.replicate``) has its tokens split among them (the
logical -> physical map of :class:`moesim.gating.placement.Placement`), so after the
backward pass each replica holds the gradient of its share of the expert's tokens only.
Before the optimizer the replicas' gradients are summed: one all-reduce among the GPUs
of the EP group holding a replica of the expert (a GPU with two replicas adds them
locally), as training systems that replicate hot experts do (FlexMoE, Nie et al.,
SIGMOD 2023, arXiv:2304.03946: replicas of an expert synchronise their gradients).
Experts of one layer with the same set of GPUs share one all-reduce (their gradients
concatenated, as a gradient bucket does); groups are ordered by (layer, their EP
positions) so every rank issues its collectives in one global order.

The sum then reduces over the expert-data-parallel group like any expert gradient: each
rank's EDP bucket carries its replicas too (the data-parallel reduce of a bucket waits
for the replica all-reduces of the bucket's layers, which run just before it).

**Optimizer state per replica.** Every GPU holding a replica keeps that replica's
master weights and Adam moments and applies the same update from the same summed
gradient, so the copies stay identical without a broadcast; this is what moesim's
memory model counts (each replica with its weights, gradients and optimizer states,
:func:`moesim.memory.model.memory_per_rank`) and what the optimizer op prices (its
parameters include the replicas). It is the coupled layout that Symi (Skiadopoulos et
al., arXiv:2504.19925, abstract and §1) attributes to DeepSpeed-MoE and FlexMoE, whose
re-balancing moves expert parameters together with their optimizer state; Symi's own
design, the optimizer state sharded per logical expert across all nodes, is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moesim.errors import InputError
from moesim.model.params import ffn_params
from moesim.schedule.dualpipe import KINDS as DUAL_KINDS

#: op-name tag and key tag of a replica all-reduce
TAG = "replicas"


@dataclass
class ReplicaGrads:
    """The replica gradient all-reduces of every MoE layer.

    ``placement``: a :class:`~moesim.gating.placement.Placement` or the EPLB
    :class:`~moesim.gating.eplb_placement.LayerPlacements` (``.layer(j)``);
    ``moe_index``: model layer -> MoE layer index ``j``; ``expert_bytes``: one routed
    expert's gradient bytes on one rank (its matrices / etp x the bucket's bytes per
    weight)."""

    lay: object                 # moesim.layout Layout
    placement: object
    moe_index: dict[int, int]
    expert_bytes: float
    _per_pos: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, scn, lay, spec, routes) -> ReplicaGrads | None:
        """From the step's token routing (:class:`moesim.program.token_routing.TokenRouting`);
        None when no MoE layer has a replicated expert (nothing changes). Refuses (one
        line) what the engines do not plan with replicas: ZeRO-3's expert gathers and
        DualPipe's gradient stage."""
        if routes is None or not spec.n_experts or routes.placement is None:
            return None
        pl = routes.placement
        if not any(pl.layer(j).replicated for j in range(len(routes.moe_layers))):
            return None
        rt = routes.config
        where = ("routing.placement.redundant" if rt.placement is not None
                 else "routing.replicate")
        got = rt.placement.redundant if rt.placement is not None else len(rt.replicate)
        if scn.parallel.zero >= 3 or scn.schedule.kind in DUAL_KINDS:
            raise InputError(scn.source, where, "no replicated experts in a training step "
                             "with ZeRO-3 or a DualPipe schedule (their replicas' gradient "
                             "all-reduce is not planned there)", got)
        per = ffn_params(spec, spec.expert_ffn) / lay.etp * spec.weight_bytes
        return cls(lay, pl, dict(routes.moe_index), per)

    def _layer(self, layer: int) -> tuple[np.ndarray, list[tuple[tuple[int, ...], int]]]:
        """(slots each EP position holds, [(EP positions of a replica set, experts sharing
        it)] in position order) of model layer ``layer``."""
        hit = self._per_pos.get(layer)
        if hit is None:
            pl = self.placement.layer(self.moe_index[layer])
            held = np.zeros(pl.ep, dtype=np.int64)
            sets: dict[tuple[int, ...], int] = {}
            for h in pl.holders:
                np.add.at(held, np.asarray(h, dtype=np.int64), 1)
                u = tuple(sorted(set(h)))
                if len(u) > 1:
                    sets[u] = sets.get(u, 0) + 1
            hit = self._per_pos[layer] = (held, sorted(sets.items()))
        return hit

    def extra_experts(self, rank: int, layer: int) -> int:
        """Expert slots ``rank`` holds in ``layer`` beyond E / ep (its replicas)."""
        if layer not in self.moe_index:
            return 0
        held, _ = self._layer(layer)
        g = self.lay.group_of(rank, "ep")
        pl = self.placement.layer(self.moe_index[layer])
        return int(held[g.index(rank)]) - pl.n_experts // pl.ep

    def syncs(self, rank: int, layer: int) -> list[tuple[tuple[int, ...], float]]:
        """``rank``'s replica all-reduces of ``layer``: (group of global ranks, bytes),
        in the global order."""
        if layer not in self.moe_index:
            return []
        _, sets = self._layer(layer)
        g = self.lay.group_of(rank, "ep")
        pos = g.index(rank)
        return [(tuple(g[p] for p in u), n * self.expert_bytes) for u, n in sets if pos in u]

    def group_syncs(self, group: tuple[int, ...], layer: int
                    ) -> list[tuple[tuple[int, ...], float]]:
        """Every replica all-reduce of ``layer`` in EP group ``group`` (global ranks in EP
        order): (its ranks, bytes), in the global order."""
        if layer not in self.moe_index:
            return []
        _, sets = self._layer(layer)
        return [(tuple(group[p] for p in u), n * self.expert_bytes) for u, n in sets]

    def layer_bytes(self, layer: int) -> float:
        """Bytes of every replica all-reduce of ``layer`` in one EP group, summed (each
        all-reduce counted once, by its buffer size)."""
        if layer not in self.moe_index:
            return 0.0
        _, sets = self._layer(layer)
        return sum(n for _, n in sets) * self.expert_bytes
