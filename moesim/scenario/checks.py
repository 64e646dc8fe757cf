"""Values checked against what they apply to, once the scenario is resolved and before
any work: a routing share against the model's top-k, hot experts against its experts,
node-limited routing against the nodes an EP group spans, the SMs a communication
kernel holds against the device's. Each failure is one line naming the field the user
wrote (the command line's when it came from ``--set``: the caller blames it, see
:func:`moesim.scenario.blame.blame_overrides`); a value the user never wrote (a
default) is named as such, against the field that made it apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from moesim.errors import InputError
from moesim.gating.config import RoutingConfig, with_top_k
from moesim.gating.skew import base_shares, hot_ids


def check_hot_shares(src: str, policy: Mapping[str, Any], routing: RoutingConfig,
                     n_experts: int, top_k: int) -> None:
    """Hot routing: the hot experts exist, and no expert is given more than 1/top_k of
    the assignments (a token picks an expert at most once)."""
    if routing.kind != "hot" or n_experts <= 0 or top_k <= 0:
        return
    ids = hot_ids(routing, n_experts, src)
    cfg = with_top_k(routing, top_k)
    q = base_shares(cfg, n_experts, 0, 0, src)
    if not np.any(q * top_k > 1.0 + 1e-12):
        return
    limit = f"1/top_k = {1.0 / top_k:.4g}"
    if policy.get("hot_token_fraction") is not None:
        raise InputError(src, "routing.hot_token_fraction", f"at most the {len(ids)} hot "
                         f"expert(s) (a share per hot expert <= {limit} of the assignments: "
                         "a token picks an expert at most once)", routing.hot_token_fraction)
    if policy.get("hot_fraction") is not None:
        raise InputError(src, "routing.hot_fraction", f"a share per hot expert <= {limit} "
                         "(a token picks an expert at most once)", float(q.max()))
    raise InputError(src, "routing.kind", f"hot routing that top_k={top_k} allows: the "
                     f"default routing.hot_fraction {routing.hot_fraction:g} over "
                     f"{len(ids)} hot expert(s) gives one more than {limit} of the "
                     "assignments; set routing.hot_fraction (or hot_token_fraction)",
                     routing.kind)
