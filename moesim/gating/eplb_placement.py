"""``routing.placement: {kind: eplb, ...}``: the EPLB plan (:mod:`moesim.gating.eplb`)
of a scenario's expert loads, as the per-layer placements the routing already
understands (pure, no simpy).

Each MoE layer gets a :class:`~moesim.gating.placement.Placement` whose ``holders[e]``
are the EP ranks of expert e's replicas (slot order; an expert with two replicas on one
GPU lists it twice); a source splits its tokens for a replicated expert evenly over the
replicas (``replica_split: even``), so each replica takes its share of the expert's
tokens, as EPLB assumes. Loads (tokens: (token, expert) assignments per step):

* ``policy``: expected tokens, the routing policy's inclusion probability of each expert
  (after drift, for the simulated step) times the step's routed tokens per EP group;
* ``trace``: the counts the router draws for the simulated step on the first EP group,
  summed over its micro-batches (what an expert-distribution recorder logs for that step,
  with the default placement): the plan then fits the step's own draw;
* a file path (relative to the scenario file): per-layer, per-expert counts
  (:mod:`moesim.gating.loads`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import InputError
from moesim.gating.config import EPLB_LOADS, EPLB_MODES, EplbSpec, RoutingConfig, with_top_k
from moesim.gating.eplb import EplbPlan, choose_mode, rebalance
from moesim.gating.loads import layer_table, read_loads
from moesim.gating.placement import Placement, make_placement
from moesim.gating.skew import exact_shares, expert_shares, inclusion_probs

FIELD = "routing.placement"
KEYS = ("kind", "redundant", "mode", "loads", "groups")


def read_placement(d: Any, source: str) -> EplbSpec:
    """Check ``routing.placement`` (a mapping) into an :class:`EplbSpec`; a counts file is
    read here (relative to ``source``'s folder)."""
    if not isinstance(d, Mapping):
        raise InputError(source, FIELD, "a mapping {kind: eplb, redundant: N, mode: ..., "
                         "loads: ...}", d)
    unknown = sorted(set(d) - set(KEYS), key=str)
    if unknown:
        raise InputError(source, f"{FIELD}.{unknown[0]}", "one of the keys " + ", ".join(KEYS),
                         unknown[0])
    if d.get("kind") != "eplb":
        raise InputError(source, f"{FIELD}.kind", "eplb", d.get("kind"))
    out: dict[str, Any] = {}
    for key, lo in (("redundant", 0), ("groups", 1)):
        v = d.get(key, lo)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise InputError(source, f"{FIELD}.{key}", f"an integer >= {lo}", v)
        out[key] = v
    mode = d.get("mode", "auto")
    if mode not in EPLB_MODES:
        raise InputError(source, f"{FIELD}.mode", "one of " + ", ".join(EPLB_MODES), mode)
    loads = d.get("loads", "policy")
    if not isinstance(loads, str) or not loads:
        raise InputError(source, f"{FIELD}.loads", "policy, trace or a counts file path", loads)
    counts, sparse = None, False
    if loads not in EPLB_LOADS:
        path = Path(loads)
        if not path.is_absolute():
            path = Path(source).parent / path
        arr, sparse = read_loads(path, source, f"{FIELD}.loads")
        counts = tuple(tuple(float(x) for x in row) for row in arr)
    return EplbSpec(redundant=out["redundant"], mode=mode, loads=loads, groups=out["groups"],
                    counts=counts, sparse=sparse)


@dataclass(frozen=True)
class LayerPlacements:
    """One placement per MoE layer (:meth:`layer`) and the EPLB plan they come from."""

    layers: tuple[Placement, ...]
    plan: EplbPlan

    @property
    def n_experts(self) -> int:
        return self.layers[0].n_experts

    @property
    def ep(self) -> int:
        return self.layers[0].ep

    def layer(self, j: int) -> Placement:
        return self.layers[j]


def policy_loads(cfg: RoutingConfig, *, n_experts: int, top_k: int, layers: int,
                 tokens: int, seed: int, step: int, source: str) -> np.ndarray:
    """(layers, E) expected tokens: each expert's inclusion probability x ``tokens``."""
    k = int(cfg.top_k if cfg.top_k is not None else top_k)
    c = with_top_k(cfg, k)
    out = np.zeros((layers, n_experts))
    for j in range(layers):
        q = expert_shares(c, n_experts, seed=seed, step=step, layer=j, source=source)
        out[j] = inclusion_probs(q, k, strict=exact_shares(c), source=source) * tokens
    return out


def trace_loads(cfg: RoutingConfig, *, n_experts: int, top_k: int, layers: int, ep: int,
                tokens_per_rank: int, microbatches: int, ranks_per_node: int | None,
                seed: int, step: int, source: str) -> np.ndarray:
    """(layers, E) tokens the router draws for ``step`` on the first EP group (micro-batch
    indices 0 .. m-1, the default placement), summed over its micro-batches."""
    from moesim.gating.microbatch import route_microbatch

    home = make_placement(n_experts, ep, source=source)
    out = np.zeros((layers, n_experts))
    t = np.full(ep, tokens_per_rank, dtype=np.int64)
    for j in range(layers):
        for mb in range(microbatches):
            r = route_microbatch(cfg, n_experts=n_experts, top_k=top_k, tokens_per_rank=t,
                                 placement=home, ranks_per_node=ranks_per_node, hidden=1,
                                 dispatch_dtype="bf16", combine_dtype="bf16", seed=seed,
                                 step=step, layer=j, microbatch=mb, source=source)
            out[j] += r.assign.sum(axis=0)
    return out


def check_spec(spec: EplbSpec, *, n_experts: int, ep: int, nodes: int, source: str) -> str:
    """Refuse a plan EPLB cannot make; returns the mode that runs."""
    r = spec.redundant
    if r > n_experts * (ep - 1):
        raise InputError(source, f"{FIELD}.redundant", f"at most experts x (ep - 1) = "
                         f"{n_experts} x {ep - 1} = {n_experts * (ep - 1)} redundant experts "
                         "(every expert on every GPU of the EP group)", r)
    if (n_experts + r) % ep:
        raise InputError(source, f"{FIELD}.redundant", f"a count making experts + redundant "
                         f"({n_experts} + N) a multiple of ep = {ep}", r)
    if n_experts % spec.groups:
        raise InputError(source, f"{FIELD}.groups", f"a divisor of the {n_experts} experts",
                         spec.groups)
    mode = choose_mode(spec.mode, spec.groups, nodes)
    if mode == "hierarchical" and spec.groups % nodes:
        raise InputError(source, f"{FIELD}.mode", f"global, or groups ({spec.groups}) a "
                         f"multiple of the EP group's {nodes} nodes", spec.mode)
    return mode


def plan_placements(cfg: RoutingConfig, *, n_experts: int, top_k: int, ep: int,
                    moe_layers: list[int], blocks: int, ranks_per_node: int | None,
                    tokens_per_rank: int, microbatches: int, seed: int, step: int,
                    source: str) -> LayerPlacements:
    """The EPLB placements of ``cfg.placement`` for every MoE layer."""
    spec = cfg.placement
    assert spec is not None
    nodes = ep // ranks_per_node if ranks_per_node and ep % ranks_per_node == 0 else 1
    mode = check_spec(spec, n_experts=n_experts, ep=ep, nodes=nodes, source=source)
    layers = len(moe_layers)
    if spec.counts is not None:
        loads = layer_table(np.asarray(spec.counts), spec.sparse, n_experts=n_experts,
                            blocks=blocks, moe_layers=moe_layers, where=spec.loads)
    elif spec.loads == "trace":
        loads = trace_loads(cfg, n_experts=n_experts, top_k=top_k, layers=layers, ep=ep,
                            tokens_per_rank=tokens_per_rank, microbatches=microbatches,
                            ranks_per_node=ranks_per_node, seed=seed, step=step,
                            source=source)
    else:
        loads = policy_loads(cfg, n_experts=n_experts, top_k=top_k, layers=layers,
                             tokens=tokens_per_rank * ep * microbatches, seed=seed,
                             step=step, source=source)
    plan = rebalance(loads, slots=n_experts + spec.redundant, gpus=ep, nodes=nodes,
                     groups=spec.groups, mode=mode)
    return LayerPlacements(
        layers=tuple(Placement(n_experts=n_experts, ep=ep, holders=plan.holders(j),
                               split="even") for j in range(layers)),
        plan=plan)


def placement_for(cfg: RoutingConfig, *, n_experts: int, ep: int, source: str,
                  **plan_args) -> Placement | LayerPlacements:
    """The scenario's placement: contiguous plus ``routing.replicate`` when
    ``routing.placement`` is not set (every layer the same), else the EPLB placements."""
    if cfg.placement is None:
        return make_placement(n_experts, ep, cfg.replicate, cfg.replica_split, source)
    if cfg.replicate:
        raise InputError(source, "routing.replicate", "no replicate with routing.placement "
                         "(EPLB places the replicas)", f"{len(cfg.replicate)} replica specs")
    check_slots(cfg, n_experts=n_experts, ep=ep, source=source)
    return plan_placements(cfg, n_experts=n_experts, ep=ep, source=source, **plan_args)


def check_slots(cfg: RoutingConfig, *, n_experts: int, ep: int, source: str) -> None:
    """EPLB's EP size: a divisor of the experts, or (``redundant`` > 0) of the experts
    plus their redundant copies, the slots (SGLang's EP72: 288 slots, 4 per GPU); the
    ``trace`` loads need the default placement, hence an EP that divides the experts."""
    spec = cfg.placement
    assert spec is not None
    if n_experts % ep == 0 or (spec.redundant > 0 and (n_experts + spec.redundant) % ep == 0
                               and n_experts >= 1):
        if n_experts % ep and spec.loads == "trace" and spec.counts is None:
            raise InputError(source, f"{FIELD}.loads", f"policy or a counts file with ep = "
                             f"{ep} not dividing the {n_experts} experts (trace loads are "
                             "drawn on the default placement, E / ep per rank)", spec.loads)
        return
    make_placement(n_experts, ep, source=source)        # refused: ep divides neither


def step_placement(cfg: RoutingConfig, *, n_experts: int, ep: int,
                   source: str) -> Placement:
    """The placement a step starts from before :func:`placement_for` replaces it with the
    EPLB plan: contiguous plus ``routing.replicate``; with an EPLB placement over an EP
    size that divides only the slots (:func:`check_slots`), expert e's stand-in home is
    rank ``e * ep // E`` (every rank one or more experts) until the plan replaces it."""
    if cfg.placement is None or n_experts % ep == 0:
        return make_placement(n_experts, ep, cfg.replicate, cfg.replica_split, source)
    check_slots(cfg, n_experts=n_experts, ep=ep, source=source)
    return Placement(n_experts=n_experts, ep=ep,
                     holders=tuple((e * ep // n_experts,) for e in range(n_experts)))


def experts_held(cfg: RoutingConfig, *, n_experts: int, ep: int, source: str) -> int:
    """Routed experts the fullest GPU of an EP group holds per MoE layer, replicas
    included: E / ep; with EPLB (E + redundant) / ep on every GPU (its packing gives
    each GPU the same number of slots); with ``routing.replicate`` the most any rank
    holds (home experts plus the replicas listed on it). Refuses what the plan would."""
    if cfg.placement is None:
        pl = make_placement(n_experts, ep, cfg.replicate, cfg.replica_split, source)
        count = np.bincount(np.asarray([r for h in pl.holders for r in h], dtype=np.int64),
                            minlength=ep)
        return int(count.max())
    check_slots(cfg, n_experts=n_experts, ep=ep, source=source)
    check_spec(cfg.placement, n_experts=n_experts, ep=ep, nodes=1, source=source)
    return (n_experts + cfg.placement.redundant) // ep


def plan_summary(placements: LayerPlacements, moe_layers: list[int], spec: EplbSpec
                 ) -> dict:
    """The summary's ``eplb`` block: the plan's mode, slots, and per MoE layer the
    replicas of every expert that has more than one (``{expert id: replicas}``), the
    plan's max and mean GPU load (tokens) and their ratio (EPLB's figure of merit)."""
    plan = placements.plan
    mom = plan.max_over_mean
    layers = []
    for j, layer in enumerate(moe_layers):
        cnt = plan.logcnt[j]
        layers.append({
            "layer": int(layer),
            "replicas": {str(e): int(cnt[e]) for e in np.flatnonzero(cnt > 1)},
            "max_gpu_tokens": float(plan.gpu_load[j].max()),
            "mean_gpu_tokens": float(plan.gpu_load[j].mean()),
            "max_over_mean": float(mom[j])})
    return {"mode": plan.mode, "loads": spec.loads,
            "redundant": spec.redundant, "groups": spec.groups,
            "slots_per_gpu": plan.slots_per_gpu,
            "max_over_mean_mean": float(mom.mean()) if mom.size else 0.0,
            "layers": layers}
