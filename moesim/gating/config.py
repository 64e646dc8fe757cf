"""Routing configuration: the ``routing:`` section of a scenario as plain data.

:class:`RoutingConfig` is frozen plain data;
:func:`moesim.gating.section.routing_from_dict` is the one place that validates it, with
the kinds of routing and the keys each reads from :mod:`moesim.gating.kinds`.

Quantities and units:

* shares and fractions are dimensionless (0..1); ``zipf_s`` and ``alpha`` are
  dimensionless shape parameters; ``drift_rate`` is the standard deviation of
  the natural log of an expert's popularity added per training step;
* token counts are integers; ``capacity_factor`` is dimensionless
  (Megatron-Core: capacity = ceil(tokens * top_k / experts * factor),
  megatron/core/transformer/moe/moe_utils.py get_capacity).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DRIFTS = ("none", "layer", "step", "walk")
DROP_POLICIES = ("probability", "position")
REPLICA_SPLITS = ("even", "nearest")
PATHS = ("auto", "token", "counts")
EPLB_MODES = ("auto", "hierarchical", "global")
EPLB_LOADS = ("policy", "trace")


@dataclass(frozen=True)
class EplbSpec:
    """``routing.placement: {kind: eplb, ...}``: experts and their redundant replicas
    placed by DeepSeek's EPLB (moesim.gating.eplb) from per-layer expert loads.

    redundant   extra physical expert slots per layer (0 = rearrange only); the EP group
                then holds E + redundant slots, (E + redundant) / ep per GPU
    mode        auto | hierarchical | global (auto: hierarchical when the EP group's
                node count divides ``groups``, as EPLB chooses)
    loads       policy (expected tokens from the routing policy), trace (the tokens the
                router draws for the simulated step) or a counts file's path
    groups      expert groups (DeepSeek-V3: 8, its n_group); 1 = no groups
    counts      the file's counts (layers x experts), loaded when the section is read
    sparse      the file was SGLang's long form (layer_id,expert_id,count): its rows are
                the model's layer indices, missing entries zeros
    """

    redundant: int = 0
    mode: str = "auto"
    loads: str = "policy"
    groups: int = 1
    counts: tuple[tuple[float, ...], ...] | None = None
    sparse: bool = False


@dataclass(frozen=True)
class ReplicaSpec:
    """Extra copies of one expert: ``ranks`` are EP ranks holding a replica in
    addition to the expert's home rank."""

    expert: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class RoutingConfig:
    """How tokens pick experts.

    kind            a registered routing kind (moesim.gating.kinds): uniform | zipf | hot |
                    dirichlet | file as shipped (see docs/routing.md)
    zipf_s          zipf exponent: share of the r-th most popular expert ∝ 1/r**s
    hot_experts     hot set: tuple of expert ids, or an int n meaning experts 0..n-1
    hot_fraction    share of routed (token, expert) assignments going to the hot set
                    (with top-k, a token makes k assignments: 0.4 at top-2 means 80 %
                    of the tokens pick the hot expert)
    hot_token_fraction  share of TOKENS that pick a hot expert among their top-k (summed
                    over the hot set); None = use hot_fraction. With k distinct picks
                    per token, hot_fraction = hot_token_fraction / k. Exclusive with
                    hot_fraction.
    alpha           dirichlet concentration per expert (small = skewed)
    file            path of a counts file (layers × experts) the shares come from
    counts          the loaded counts (filled by routing_from_dict from ``file``)
    drift           none | layer (fixed random relabelling of experts per layer) |
                    step (new relabelling every step and layer) |
                    walk (per-layer relabelling + a random walk of log-popularity)
    drift_rate      walk: std of ln(popularity) added per step
    top_k           experts per token; None = the model's
    capacity_factor None = no dropping; else capacity per (source rank, expert) =
                    ceil(tokens_on_source * top_k / experts * factor) (Megatron-Core)
    pad_to_capacity Megatron-Core moe_pad_expert_input_to_capacity: every (source rank,
                    expert) slot is padded up to its capacity, so each expert receives and
                    computes exactly sources x capacity rows (token_dispatcher.py,
                    MoEAlltoAllTokenDispatcher, drop_and_pad); needs capacity_factor
    drop_policy     probability | position: which tokens lose an over-capacity slot
                    (changes token identity only, never the counts)
    max_nodes       node-limited routing: each token's experts lie on at most this
                    many nodes (DeepSeek-V3: 4, report §2.1.2); None = unlimited
    jitter          std of Gaussian noise added to the router logits ln(share)
                    (affects the mean router probability P_i and probability drops)
    replicate       extra replicas of hot experts (see placement.py)
    replica_split   even | nearest: how tokens for a replicated expert are split
    path            auto | token | counts: per-token sampling, counts-level sampling,
                    or token when tokens × experts <= TOKEN_PATH_LIMIT
    placement       None (contiguous, plus ``replicate``) or an :class:`EplbSpec`
    """

    kind: str = "uniform"
    zipf_s: float = 1.0
    hot_experts: tuple[int, ...] | int = 1
    hot_fraction: float = 0.5
    hot_token_fraction: float | None = None
    alpha: float = 1.0
    file: str | None = None
    counts: tuple[tuple[float, ...], ...] | None = None
    drift: str = "none"
    drift_rate: float = 0.0
    top_k: int | None = None
    capacity_factor: float | None = None
    pad_to_capacity: bool = False
    drop_policy: str = "probability"
    max_nodes: int | None = None
    jitter: float = 0.0
    replicate: tuple[ReplicaSpec, ...] = ()
    replica_split: str = "even"
    path: str = "auto"
    placement: EplbSpec | None = None


def with_top_k(cfg: RoutingConfig, top_k: int) -> RoutingConfig:
    """``cfg`` with ``hot_fraction`` (a share of assignments) worked out from
    ``hot_token_fraction`` (a share of tokens) for ``top_k`` distinct picks per token:
    each token makes k assignments, so hot_fraction = hot_token_fraction / k."""
    if cfg.hot_token_fraction is None:
        return cfg
    return replace(cfg, hot_fraction=cfg.hot_token_fraction / top_k)
