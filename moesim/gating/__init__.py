"""Expert routing with skew: pure planning code (no simpy).

Entry points:

* :func:`routing_from_dict` — validate the ``routing:`` section into a
  :class:`RoutingConfig` (the kinds of routing: :mod:`moesim.gating.kinds`);
* :func:`make_placement` — experts onto EP ranks (contiguous, plus replicas);
* :func:`route_microbatch` — one micro-batch of one MoE layer → a
  :class:`MicrobatchRouting` (assignments, drops, dispatch/combine matrices,
  router statistics);
* :func:`layer_stats` — per-layer load summary over micro-batches.
"""

from moesim.gating.balance import LoadStats, layer_stats, lb_loss, load_stats
from moesim.gating.config import ReplicaSpec, RoutingConfig
from moesim.gating.matrices import byte_matrices, bytes_per_token
from moesim.gating.microbatch import MicrobatchRouting, route_microbatch
from moesim.gating.placement import Placement, make_placement
from moesim.gating.section import routing_from_dict
from moesim.gating.skew import expert_shares

__all__ = [
    "LoadStats", "MicrobatchRouting", "Placement", "ReplicaSpec", "RoutingConfig",
    "byte_matrices", "bytes_per_token", "expert_shares", "layer_stats", "lb_loss",
    "load_stats", "make_placement", "route_microbatch", "routing_from_dict",
]
