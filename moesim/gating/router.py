"""Token → expert assignment for one micro-batch of one MoE layer.

The synthetic router. Each token picks exactly ``k`` distinct experts; expert e
is included with probability ``pi[e]`` (from :mod:`moesim.gating.skew`), by the
randomized systematic design of :mod:`moesim.gating.sampling`.

Node-limited routing (DeepSeek-V3: at most 4 nodes per token, report §2.1.2) is
two-stage. Stage 1 picks M distinct nodes per token, node n with probability
rho_n = min(1, c·m_n), m_n = sum of pi over the experts homed on n, sum rho = M.
Stage 2 picks k distinct experts among the experts on the chosen nodes, with
probabilities ∝ pi_e / rho_node(e) (capped at 1, summing to k). When no cap
binds, rho_n = M·m_n/k, the stage-2 scale is 1 and an expert's overall inclusion
is rho_n · pi_e/rho_n = pi_e exactly; when a hot node's rho is capped at 1 it is
close (zipf s=1, 256 experts on 8 nodes, M=4, top-8, 64 × 4096 tokens: measured
max |f_i - pi_i/k| = 0.00014, the sampling noise of the unlimited router). Every token's experts lie on at most M nodes, exactly. Nodes
are those of each expert's home rank (replicas are ignored for the limit).

The node limit is enforced on the per-token path. The counts path (large calls)
samples per-(source, expert) counts from their marginal law with inclusion pi,
which is what the two-stage design preserves; the within-token clustering of
experts on <= M nodes does not change counts under per-assignment dispatch.

Capacity and dropping (Megatron-Core moe_utils.get_capacity): capacity is per source rank
and expert, ``ceil(tokens_on_source * k / E * capacity_factor)``; a source drops
its assignments over capacity *before* the exchange, so kept = min(assign, cap).
Which tokens lose their slot is the drop policy (only visible per token):
``position`` keeps the earliest tokens, ``probability`` keeps the tokens with the
highest router probability for that expert (ties by position).
"""

from __future__ import annotations

import math

import numpy as np

from moesim.gating.sampling import cap_probs, sample_counts_fast, sample_tokens


def capacity(tokens_per_rank: np.ndarray, top_k: int, n_experts: int,
             capacity_factor: float | None) -> np.ndarray:
    """Capacity per source rank per expert in tokens, float64 (inf if None):
    ceil(tokens * top_k / n_experts * capacity_factor) (Megatron-Core)."""
    t = np.asarray(tokens_per_rank, dtype=np.int64)
    if capacity_factor is None:
        return np.full(t.shape, np.inf)
    return np.array([math.ceil(int(x) * top_k / n_experts * capacity_factor) for x in t],
                    dtype=np.float64)


def padded_counts(kept: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Rows each (source, expert) slot sends when padded to capacity (Megatron-Core
    moe_pad_expert_input_to_capacity, token_dispatcher.py ``drop_and_pad``): its capacity,
    whatever it kept; (S, E) int64."""
    if not np.all(np.isfinite(cap)):
        raise ValueError("padding to capacity needs a capacity_factor")
    return np.broadcast_to(cap.astype(np.int64)[:, None], kept.shape).copy()


def node_probs(pi: np.ndarray, node_of_expert: np.ndarray, max_nodes: int) -> np.ndarray:
    """rho: inclusion probability of each node (sum = min(M, nodes with mass))."""
    n_nodes = int(node_of_expert.max()) + 1
    mass = np.bincount(node_of_expert, weights=pi, minlength=n_nodes)
    m = min(max_nodes, int(np.count_nonzero(mass > 0)))
    return cap_probs(mass, m)


def _within_nodes(pi: np.ndarray, rho: np.ndarray, node_of_expert: np.ndarray,
                  chosen_mask: np.ndarray, k: int) -> np.ndarray:
    """Stage 2: inclusion probabilities per row over the experts of the chosen
    nodes, ∝ pi_e / rho_node(e), summing to k. Experts with zero share on a chosen
    node get a negligible weight, so there are always >= k candidates."""
    on = chosen_mask[:, node_of_expert]  # (R, E)
    w = np.where(on, pi / np.maximum(rho[node_of_expert], 1e-300), 0.0)
    w = w + on * 1e-12
    return cap_probs(w, k)


def assign_tokens(rng: np.random.Generator, pi: np.ndarray, n_tokens: int, k: int,
                  node_of_expert: np.ndarray | None = None,
                  max_nodes: int | None = None) -> np.ndarray:
    """Per-token path: (n_tokens, k) distinct expert ids for one source rank."""
    e_ = pi.shape[0]
    if node_of_expert is None or max_nodes is None:
        return sample_tokens(rng, np.broadcast_to(pi, (n_tokens, e_)), k)
    rho = node_probs(pi, node_of_expert, max_nodes)
    n_nodes = rho.shape[0]
    m = int(round(rho.sum()))
    nodes = sample_tokens(rng, np.broadcast_to(rho, (n_tokens, n_nodes)), m)  # (T, m)
    mask = np.zeros((n_tokens, n_nodes), dtype=bool)
    np.put_along_axis(mask, nodes, True, axis=1)
    return sample_tokens(rng, _within_nodes(pi, rho, node_of_expert, mask, k), k)


def assign_counts(rng: np.random.Generator, pi: np.ndarray, tokens_per_rank: np.ndarray,
                  k: int) -> np.ndarray:
    """Counts path: (sources, E) assignments, row s summing to exactly k·tokens[s],
    each entry <= tokens[s] (:func:`sample_counts_fast`).

    The node limit is not applied here: under the per-assignment (Megatron)
    dispatch it changes which experts share a token, not the per-(source, expert)
    count law, whose mean stays n·pi_e (see the module docstring)."""
    return sample_counts_fast(rng, np.asarray(tokens_per_rank, dtype=np.int64), pi, k)


def assign_from_tokens(chosen: np.ndarray, n_experts: int) -> np.ndarray:
    """Assignments per expert from (T, k) expert ids."""
    return np.bincount(chosen.ravel(), minlength=n_experts).astype(np.int64)


def drop_tokens(chosen: np.ndarray, scores: np.ndarray | None, cap: float,
                policy: str) -> np.ndarray:
    """Which (token, slot) assignments survive capacity ``cap`` on one source.

    ``chosen`` (T, k) expert ids; ``scores`` (T, E) router probabilities (needed
    for ``probability``). Returns a (T, k) bool mask; per expert, exactly
    min(assigned, cap) survive.
    """
    t_, k = chosen.shape
    flat = chosen.ravel()
    tok = np.repeat(np.arange(t_), k)
    if policy == "probability" and scores is not None:
        pri = -scores[tok, flat]
    else:
        pri = np.zeros(flat.shape)
    # order slots by expert, then priority (high probability first), then position
    order = np.lexsort((tok, pri, flat))
    sorted_e = flat[order]
    first = np.searchsorted(sorted_e, sorted_e, side="left")
    rank_in_expert = np.arange(flat.size) - first
    keep = np.empty(flat.size, dtype=bool)
    keep[order] = rank_in_expert < cap
    return keep.reshape(t_, k)


def router_logits(rng: np.random.Generator, pi: np.ndarray, k: int, n_tokens: int,
                  jitter: float) -> np.ndarray:
    """Synthetic router logits ln(pi/k) + jitter·N(0, 1), (n_tokens, E)."""
    base = np.log(np.maximum(pi / k, 1e-300))
    if jitter == 0.0:
        return np.broadcast_to(base, (n_tokens, pi.shape[0]))
    return base + jitter * rng.standard_normal((n_tokens, pi.shape[0]))


def softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=-1, keepdims=True)
    ez = np.exp(z)
    return ez / ez.sum(axis=-1, keepdims=True)
