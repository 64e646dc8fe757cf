"""NCCL's own cost model and algorithm/protocol choice (NVIDIA/nccl src/graph/tuning.cc):
tuning constants (:mod:`.constants`), the communicator facts the model reads
(:mod:`.graphs`) and the model with its selection rule (:mod:`.model`)."""

from moesim.collectives.nccl.constants import ALGORITHMS, PROTOCOLS
from moesim.collectives.nccl.graphs import GraphFacts, NcclFacts, facts_from_params
from moesim.collectives.nccl.model import NCCL_OPS, algo_time, estimate, tune

__all__ = ["ALGORITHMS", "PROTOCOLS", "GraphFacts", "NcclFacts", "facts_from_params",
           "NCCL_OPS", "algo_time", "estimate", "tune"]
