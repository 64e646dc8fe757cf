"""Cluster topologies: YAML presets and explicit graphs -> :class:`Topology`.

    from moesim.topology import load_topology
    topo = load_topology("dgx-h100", nodes=2)     # 16 GPUs, rail-optimized fabric
    topo.route("n0.gpu0", "n1.gpu3")              # link ids along the path

Planning code only (networkx, numpy); no simpy.
"""

from moesim.topology.graph import NODE_KINDS, Topology
from moesim.topology.link_routing import ROUTINGS
from moesim.topology.loader import load_topology, parse_topology, presets

__all__ = ["NODE_KINDS", "ROUTINGS", "Topology", "load_topology", "parse_topology", "presets"]
