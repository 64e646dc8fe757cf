"""The entry point the step engine calls: route one micro-batch of one MoE layer.

Randomness comes only from ``numpy.random.default_rng([seed, STREAM_ROUTE, step,
layer, microbatch])`` (plus the popularity streams of :mod:`skew`), so a
micro-batch's routing never depends on the order calls are made in, and the
same arguments give identical arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from moesim.errors import InputError
from moesim.gating import dedup
from moesim.gating.balance import lb_loss
from moesim.gating.config import RoutingConfig, with_top_k
from moesim.gating.matrices import byte_matrices_of, bytes_per_token
from moesim.gating.memo import Memo
from moesim.gating.placement import Placement
from moesim.gating.router import (
    assign_counts,
    assign_from_tokens,
    assign_tokens,
    capacity,
    drop_tokens,
    padded_counts,
    router_logits,
    softmax,
)
from moesim.gating.skew import exact_shares, expert_shares, inclusion_probs

STREAM_ROUTE = 0
#: ``path: auto`` samples per token while tokens × experts is at most this
#: (2**16: measured 6.7 ms CPU per call at the limit; the counts path takes
#: 2.5-3.5 ms at EP64 × 4096 tokens × 256 experts, top-8).
TOKEN_PATH_LIMIT = 1 << 16
#: tokens whose router logits are sampled for P_i on the counts path (jitter > 0)
PROBE_TOKENS = 128


@dataclass(frozen=True, eq=False)
class MicrobatchRouting:
    """Routing of one micro-batch of one MoE layer. Token counts are (token,
    expert) assignments; bytes are float64. S = number of EP ranks (sources),
    E = experts."""

    assign: np.ndarray          # (S, E) int64 routed before dropping; rows sum to k·tokens
    kept: np.ndarray            # (S, E) int64 after capacity
    dropped: np.ndarray         # (S, E) int64 = assign - kept
    capacity: np.ndarray        # (S,) float64 capacity per expert on each source (inf if none)
    expert_tokens: np.ndarray   # (E,) int64 kept, summed over sources
    rank_expert_tokens: np.ndarray  # (S, E) int64 tokens dst EP rank computes for expert e
    rank_tokens: np.ndarray     # (S,) int64 tokens received per destination EP rank
    dispatch_tokens: np.ndarray  # (S, S) int64 src × dst
    token_bytes: tuple[float, float]  # bytes of one token in dispatch, in combine
    router_prob_mean: np.ndarray  # (E,) P_i, mean router probability
    f: np.ndarray               # (E,) fraction of routed assignments per expert
    lb_loss: float              # E · Σ f_i P_i
    shares: np.ndarray          # (E,) target share of assignments per expert (q)
    n_tokens: int               # tokens in the micro-batch (all sources)
    top_k: int
    path: str                   # "token" or "counts"
    # with ``dedup_ranks_per_node``: distinct (token, dst rank) and (token, dst node)
    # copies of kept tokens (moesim.gating.dedup), for DeepEP-style exchanges
    gpu_tokens: np.ndarray | None = None    # (S, S) int64
    node_tokens: np.ndarray | None = None   # (S, nodes) int64
    # routing.pad_to_capacity: empty rows each (source, expert) slot adds to reach its
    # capacity; they travel and are computed (in rank_expert_tokens, rank_tokens,
    # dispatch_*/combine_*), never counted as kept tokens
    padding: np.ndarray | None = None       # (S, E) int64

    # made on first read (the DeepEP paths, which plan their own bytes, read none of them)
    @cached_property
    def combine_tokens(self) -> np.ndarray:
        """(S, S) int64 = dispatch_tokens.T (a copy)."""
        return self.dispatch_tokens.T.copy()

    @cached_property
    def _byte_matrices(self) -> tuple[np.ndarray, np.ndarray]:
        return byte_matrices_of(self.dispatch_tokens, *self.token_bytes)

    @property
    def dispatch_bytes(self) -> np.ndarray:
        """(S, S) float64, bytes src sends to dst in dispatch."""
        return self._byte_matrices[0]

    @property
    def combine_bytes(self) -> np.ndarray:
        """(S, S) float64, bytes src sends to dst in combine."""
        return self._byte_matrices[1]


#: :func:`_check_node_limit`'s result per (homes, ranks per node, max_nodes, top_k) that
#: passed (read-only arrays; None: the limit cannot bind); shared zeros per shape
_NODE_LIMIT = Memo(64)
_ZEROS = Memo(64)


def _check_node_limit(cfg: RoutingConfig, placement: Placement, ranks_per_node: int | None,
                      top_k: int, source: str) -> np.ndarray | None:
    if cfg.max_nodes is None or ranks_per_node is None:
        return None
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise InputError(source, "ranks_per_node", "an integer >= 1", ranks_per_node)
    key = (placement.home.tobytes(), ranks_per_node, cfg.max_nodes, top_k)
    # checked once, for every micro-batch alike
    return _NODE_LIMIT.get(key, lambda: _node_limit(cfg.max_nodes, placement, ranks_per_node,
                                                    top_k, source))


def _node_limit(max_nodes: int, placement: Placement, ranks_per_node: int, top_k: int,
                source: str) -> np.ndarray | None:
    node = placement.node_of_expert(ranks_per_node)
    per_node = np.sort(np.bincount(node))
    per_node = per_node[per_node > 0]
    if max_nodes >= per_node.size:
        return None  # the limit cannot bind
    if per_node[:max_nodes].sum() < top_k:
        raise InputError(source, "routing.max_nodes",
                         f"enough nodes that any {max_nodes} hold >= top_k={top_k} experts",
                         max_nodes)
    return node


def _zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A read-only int64 array of zeros of ``shape``, shared (no drops, no padding)."""
    return _ZEROS.get(shape, lambda: np.zeros(shape, dtype=np.int64))


def route_microbatch(cfg: RoutingConfig, *, n_experts: int, top_k: int,
                     tokens_per_rank: np.ndarray, placement: Placement,
                     ranks_per_node: int | None, hidden: int, dispatch_dtype: str,
                     combine_dtype: str, seed: int, step: int, layer: int, microbatch: int,
                     source: str = "routing", dedup_ranks_per_node: int | None = None,
                     dedup_cache: dict | None = None) -> MicrobatchRouting:
    """Route one micro-batch. ``tokens_per_rank[s]``: tokens EP rank s holds;
    ``layer``: MoE layer index; ``ranks_per_node``: consecutive EP ranks per node
    (None: no node structure; node-limited routing and ``nearest`` replicas then
    ignore nodes). ``cfg.top_k`` overrides ``top_k`` when set. ``dedup_ranks_per_node``
    (EP ranks per node, experts at their home ranks): also count the distinct (token,
    GPU) and (token, node) copies (:mod:`moesim.gating.dedup`); ``dedup_cache`` (a dict
    the caller keeps for one routing config) reuses the expert shares, inclusion
    probabilities and the counts path's probe per (seed, step, layer)."""
    for name, v in (("seed", seed), ("step", step), ("layer", layer), ("microbatch", microbatch)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
            raise InputError(source, name, "an integer >= 0", v)
    k = int(cfg.top_k if cfg.top_k is not None else top_k)
    t = np.asarray(tokens_per_rank)
    if t.ndim != 1 or t.shape[0] != placement.ep or np.any(t < 0) or (
            t.size and t.dtype.kind not in "iu" and not np.all(t == np.floor(t))):
        raise InputError(source, "tokens_per_rank",
                         f"{placement.ep} non-negative integer token counts (one per EP rank)",
                         t.tolist() if t.size < 20 else list(t.shape))
    t = t.astype(np.int64)
    if placement.n_experts != n_experts:
        raise InputError(source, "placement", f"a placement of {n_experts} experts",
                         placement.n_experts)
    if not 1 <= k <= n_experts:
        raise InputError(source, "routing.top_k", f"1 <= top_k <= {n_experts} experts", k)
    node = _check_node_limit(cfg, placement, ranks_per_node, k, source)

    cfg = with_top_k(cfg, k)
    lkey = ("law", seed, step, layer, k, n_experts)
    law = dedup_cache.get(lkey) if dedup_cache is not None else None
    if law is None:     # the same for every micro-batch of a (step, layer)
        q = expert_shares(cfg, n_experts, seed=seed, step=step, layer=layer, source=source)
        pi = inclusion_probs(q, k, strict=exact_shares(cfg), source=source,
                             hot_field="routing.hot_fraction" if cfg.hot_token_fraction is None
                             else "routing.hot_token_fraction")
        law = (q, pi)
        if dedup_cache is not None:
            dedup_cache[lkey] = law
    q, pi = law
    rng = np.random.default_rng([seed, STREAM_ROUTE, step, layer, microbatch])
    n_tok = int(t.sum())
    path = cfg.path
    if path == "auto":
        path = "token" if n_tok * n_experts <= TOKEN_PATH_LIMIT else "counts"
    cap = capacity(t, k, n_experts, cfg.capacity_factor)
    all_kept = False      # kept == assign by construction (no capacity, counts path)

    choices: list[np.ndarray] = []
    if path == "token":
        assign = np.zeros((t.size, n_experts), dtype=np.int64)
        kept = np.zeros_like(assign)
        psum = np.zeros(n_experts)
        for s, ns in enumerate(t):
            chosen = assign_tokens(rng, pi, int(ns), k, node, cfg.max_nodes)
            logits = router_logits(rng, pi, k, int(ns), cfg.jitter)
            probs = softmax(logits)
            psum += probs.sum(axis=0)
            assign[s] = assign_from_tokens(chosen, n_experts)
            keep = drop_tokens(chosen, probs, cap[s], cfg.drop_policy)
            kept[s] = np.bincount(chosen[keep], minlength=n_experts)
            if dedup_ranks_per_node is not None:
                choices.append(np.where(keep, chosen, -1))
        p_mean = psum / n_tok if n_tok else pi / k
    else:
        assign = assign_counts(rng, pi, t, k)
        if cfg.capacity_factor is None and assign.dtype == np.int64:   # no capacity: all kept
            kept = assign       # the same array: nothing reads them to write
            all_kept = True
        else:
            kept = np.minimum(assign, np.minimum(cap, assign.max(initial=0))[:, None]
                              ).astype(np.int64)
        if cfg.jitter == 0.0:
            p_mean = pi / k
        else:
            p_mean = softmax(router_logits(rng, pi, k, PROBE_TOKENS, cfg.jitter)).mean(axis=0)

    # rows sent and computed: the kept tokens, or every slot's capacity when padded
    rows = padded_counts(kept, cap) if cfg.pad_to_capacity else kept
    kept_sum = kept.sum(axis=0)
    dispatch, rank_expert = placement.split_counts(rows, ranks_per_node,
                                                   sums=kept_sum if rows is kept else None)
    bd = bytes_per_token(dispatch_dtype, hidden, source, "dispatch_dtype")
    bc = bytes_per_token(combine_dtype, hidden, source, "combine_dtype")
    col = kept_sum if all_kept else assign.sum(axis=0)
    tot = int(col.sum())
    f = col / tot if tot else np.zeros(n_experts)
    gpu_tok = node_tok = None
    if dedup_ranks_per_node is not None:
        if path == "token":
            gpu_tok, node_tok = dedup.from_choices(choices, placement.home,
                                                   dedup_ranks_per_node)
        else:
            ckey = (seed, step, layer, dedup_ranks_per_node)
            ratios = dedup_cache.get(ckey) if dedup_cache is not None else None
            if ratios is None:
                ratios = dedup.probe_ratios(
                    placement.home, dedup_ranks_per_node, pi, k,
                    placement.node_of_expert(dedup_ranks_per_node) if cfg.max_nodes else None,
                    cfg.max_nodes, np.random.default_rng([seed, dedup.STREAM_DEDUP, step, layer]))
                if dedup_cache is not None:
                    dedup_cache[ckey] = ratios
            # without replicas or padding the dispatch is the assignments per home rank
            same = rows is kept and not placement.replicated
            gpu_tok, node_tok = dedup.estimate(kept, placement.home, dedup_ranks_per_node,
                                               ratios, by_rank=dispatch if same else None)
    return MicrobatchRouting(
        assign=assign, kept=kept,
        dropped=_zeros(assign.shape) if all_kept else assign - kept, capacity=cap,
        padding=_zeros(kept.shape) if rows is kept else rows - kept,
        expert_tokens=kept_sum, rank_expert_tokens=rank_expert,
        rank_tokens=dispatch.sum(axis=0), dispatch_tokens=dispatch,
        token_bytes=(bd, bc),
        router_prob_mean=p_mean, f=f, lb_loss=lb_loss(f, p_mean), shares=q,
        n_tokens=n_tok, top_k=k, path=path, gpu_tokens=gpu_tok, node_tokens=node_tok,
    )
