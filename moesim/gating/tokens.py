"""Per-token routing and the deduplicated counts a DeepEP-style exchange needs.

:func:`sample_choices` draws each token's top-k experts (one ``(T_s, k)`` array per
source EP rank) with the same router as :func:`moesim.gating.route_microbatch`'s
per-token path, node-limited routing included, from its own random stream
``default_rng([seed, STREAM_CHOICES, step, layer, microbatch])``.

:func:`dedup_counts` turns those choices into exact counts (pure numpy):

* ``pair_tokens[s, d]``: (token, expert) assignments of source s whose expert lives
  on rank d: what a per-assignment all-to-all (Megatron, NCCL) sends;
* ``gpu_tokens[s, d]``: tokens of s with at least one expert on rank d: one copy per
  (token, GPU) however many of its experts that GPU holds (DeepEP's layout step,
  ``is_token_in_rank``, deepseek-ai/DeepEP csrc/kernels/legacy/layout.cu);
* ``node_tokens[s, n]``: tokens of s with at least one expert on node n: one copy
  per (token, node) (``num_tokens_per_rdma_rank`` in the same file).

An expert id of -1 means the slot was dropped (DeepEP's ``topk_idx == -1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moesim.errors import InputError
from moesim.gating.config import RoutingConfig
from moesim.gating.dedup import from_choices
from moesim.gating.placement import Placement
from moesim.gating.router import assign_tokens
from moesim.gating.skew import exact_shares, expert_shares, inclusion_probs

#: random stream of :func:`sample_choices` (route_microbatch uses 0, skew 1-3)
STREAM_CHOICES = 4


@dataclass(frozen=True, eq=False)
class DedupCounts:
    """Exact counts of one micro-batch's exchange; S ranks, N nodes (int64)."""

    pair_tokens: np.ndarray   # (S, S) (token, expert) assignments src -> dst rank
    gpu_tokens: np.ndarray    # (S, S) distinct (token, dst rank) pairs
    node_tokens: np.ndarray   # (S, N) distinct (token, dst node) pairs
    tokens: np.ndarray        # (S,) tokens held by each source rank
    ranks_per_node: int


def sample_choices(cfg: RoutingConfig, *, n_experts: int, top_k: int,
                   tokens_per_rank: Sequence[int], placement: Placement,
                   ranks_per_node: int, seed: int = 0, step: int = 0, layer: int = 0,
                   microbatch: int = 0, source: str = "routing") -> list[np.ndarray]:
    """Each source rank's (T_s, k) expert ids, node-limited to ``cfg.max_nodes``."""
    k = int(cfg.top_k if cfg.top_k is not None else top_k)
    if not 1 <= k <= n_experts:
        raise InputError(source, "top_k", f"1 <= top_k <= {n_experts} experts", k)
    q = expert_shares(cfg, n_experts, seed=seed, step=step, layer=layer, source=source)
    pi = inclusion_probs(q, k, strict=exact_shares(cfg), source=source)
    node = placement.node_of_expert(ranks_per_node)
    max_nodes = cfg.max_nodes
    if max_nodes is not None:
        held = np.bincount(node)
        if np.sort(held)[::-1][:max_nodes].sum() < k:
            raise InputError(source, "max_nodes",
                             f"enough nodes that {max_nodes} of them hold >= top_k={k} experts",
                             max_nodes)
        if max_nodes >= held.size:
            max_nodes = None  # the limit cannot bind
    rng = np.random.default_rng([seed, STREAM_CHOICES, step, layer, microbatch])
    return [assign_tokens(rng, pi, int(t), k, node if max_nodes else None, max_nodes)
            for t in tokens_per_rank]


def dedup_counts(choices: Sequence[np.ndarray], expert_rank: np.ndarray,
                 ranks_per_node: int) -> DedupCounts:
    """Counts per source rank from its tokens' expert ids (see the module docstring).

    ``choices[s]``: (T_s, k) expert ids of source rank s (-1 = dropped slot);
    ``expert_rank[e]``: the EP rank holding expert e; rank r lives on node
    ``r // ranks_per_node``.
    """
    expert_rank = np.asarray(expert_rank, dtype=np.int64)
    n = len(choices)
    if ranks_per_node < 1 or n % ranks_per_node:
        raise InputError("routing", "ranks_per_node",
                         f"a divisor of the {n} EP ranks", ranks_per_node)
    pair = np.zeros((n, n), dtype=np.int64)
    tokens = np.zeros(n, dtype=np.int64)
    cs = []
    for s, c in enumerate(choices):
        c = np.asarray(c, dtype=np.int64)
        if c.ndim != 2:
            raise InputError("routing", "choices", "a (tokens, top_k) array per rank",
                             list(c.shape))
        tokens[s] = c.shape[0]
        valid = c >= 0
        pair[s] = np.bincount(expert_rank[c[valid]], minlength=n)
        cs.append(c)
    gpu, node = from_choices(cs, expert_rank, ranks_per_node)
    return DedupCounts(pair, gpu, node, tokens, ranks_per_node)
