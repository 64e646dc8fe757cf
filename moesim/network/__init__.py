"""Network models: how bytes move over the topology's links.

``FlowNetwork`` (flow-level, max-min fair sharing) and ``AnalyticalNetwork``
(contention-free) implement :class:`moesim.network.base.NetworkModel`.
"""
