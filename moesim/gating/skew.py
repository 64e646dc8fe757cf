"""Expert popularity: the target share of routed assignments per expert.

The shares of one layer come from the routing kind (:mod:`moesim.gating.kinds`); this
module adds the drift over layers and steps.

``expert_shares(cfg, ...)`` returns, for one (step, layer), a vector q over
experts with q >= 0 and sum q = 1: the expected fraction f_i of (token, expert)
assignments that go to expert i. The router turns it into inclusion
probabilities pi = k·q (a token picks an expert at most once, so pi <= 1; shares
above 1/k are capped by water-filling, see :func:`inclusion_probs`).

Randomness: the base shape (dirichlet draw) and the per-layer relabelling come
from ``default_rng([seed, STREAM_LAYER, layer])``; the per-step relabelling and
the random walk from ``default_rng([seed, STREAM_STEP, step, layer])`` — never
from evaluation order.
"""

from __future__ import annotations

import numpy as np

from moesim.errors import InputError
from moesim.gating.config import RoutingConfig
from moesim.gating.kinds import STREAM_LAYER, get_kind
from moesim.gating.sampling import cap_probs

STREAM_STEP = 2
STREAM_WALK = 3


def base_shares(cfg: RoutingConfig, n_experts: int, seed: int, layer: int,
                source: str = "routing") -> np.ndarray:
    """Shares of one layer before drift, by the registered kind ``cfg.kind``
    (:mod:`moesim.gating.kinds`; expert 0 is the most popular for zipf)."""
    return get_kind(cfg.kind, source).shares(cfg, n_experts, seed, layer, source)


def exact_shares(cfg: RoutingConfig) -> bool:
    """Whether ``cfg``'s kind asks for exact shares (hot): one above 1/top_k is refused
    by :func:`inclusion_probs`, not capped."""
    return get_kind(cfg.kind).exact


def expert_shares(cfg: RoutingConfig, n_experts: int, *, seed: int, step: int, layer: int,
                  source: str = "routing") -> np.ndarray:
    """Target share of assignments per expert for (step, layer), summing to 1."""
    q = base_shares(cfg, n_experts, seed, layer, source)
    if cfg.drift in ("layer", "walk"):
        perm = np.random.default_rng([seed, STREAM_LAYER, layer, 1]).permutation(n_experts)
        q = q[perm]
    elif cfg.drift == "step":
        perm = np.random.default_rng([seed, STREAM_STEP, step, layer]).permutation(n_experts)
        q = q[perm]
    if cfg.drift == "walk" and cfg.drift_rate > 0 and step > 0:
        # ln q performs a Gaussian random walk, std drift_rate per step
        rng = np.random.default_rng([seed, STREAM_WALK, layer])
        walk = rng.standard_normal((step, n_experts)).sum(axis=0) * cfg.drift_rate
        w = q * np.exp(walk - walk.max())
        q = w / w.sum()
    return q


def inclusion_probs(q: np.ndarray, top_k: int, *, strict: bool, source: str = "routing",
                    field: str = "routing.kind", hot_field: str = "routing.hot_fraction"
                    ) -> np.ndarray:
    """pi = k·q capped at 1 (water-filling). With ``strict`` (kind hot, where the
    user asked for an exact share) a share above what k distinct picks allow is an
    InputError instead, naming ``hot_field``."""
    n_pos = int(np.count_nonzero(q > 0))
    if n_pos < top_k:
        raise InputError(source, field,
                         f"at least top_k={top_k} experts with a non-zero share", n_pos)
    if strict and np.any(q * top_k > 1.0 + 1e-12):
        raise InputError(source, hot_field,
                         f"a share per hot expert <= 1/top_k = {1.0 / top_k:.4g} "
                         "(a token picks an expert at most once)", float(q.max()))
    return cap_probs(q, top_k)
