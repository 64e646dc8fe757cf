"""Network models: how bytes move over the topology's links.

``FlowNetwork`` (flow-level, max-min fair sharing) and ``AnalyticalNetwork``
(contention-free) implement :class:`moesim.network.base.NetworkModel`.
"""

from moesim.network.analytical import AnalyticalNetwork
from moesim.network.base import LinkSet, NetworkModel
from moesim.network.flow import FlowNetwork
from moesim.network.maxmin import link_load, maxmin_pairs, maxmin_rates

__all__ = [
    "AnalyticalNetwork",
    "FlowNetwork",
    "LinkSet",
    "NetworkModel",
    "link_load",
    "maxmin_pairs",
    "maxmin_rates",
]
