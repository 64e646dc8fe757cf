"""Collectives: pure expansion into phases of transfers (:mod:`.algorithms`), the simpy
communicator (:mod:`.communicator`), nccl-tests bandwidths (:mod:`.cost`) and a
one-collective simulation (:mod:`.simulate`)."""

from moesim.collectives.algorithms import ALGOS, OPS, expand, hierarchical_routes
from moesim.collectives.communicator import CollectiveRecord, CollectiveSpec, Communicator
from moesim.collectives.cost import algbw_Bps, bus_factor, busbw_Bps
from moesim.collectives.simulate import simulate_collective

__all__ = [
    "ALGOS", "OPS", "expand", "hierarchical_routes", "CollectiveRecord", "CollectiveSpec",
    "Communicator", "algbw_Bps", "bus_factor", "busbw_Bps", "simulate_collective",
]
