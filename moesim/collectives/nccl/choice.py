"""How the engines price a collective as NCCL runs it (``overlap.nccl_tuning``): one pure
choice per (op, nodes, GPUs per node, bytes) that both engines read.

NCCL picks an algorithm and a protocol per call by its own cost model
(:mod:`moesim.collectives.nccl.model`, a reading of NVIDIA/nccl at commit
5067397c2676d5aed50042fc39e5c8ee96eb0027, ``src/graph/tuning.cc`` and
``src/enqueue.cc`` ``topoGetAlgoInfo``). With the knob on, an engine prices a ring
collective (all-reduce, all-gather, reduce-scatter, broadcast) as

    time = NCCL's latency term of its choice
           + the flow network's time for the collective's ring flows, carrying
             bytes / efficiency of the protocol, with no per-hop link latency

where the efficiency is the protocol's share of data on the wire: LL 0.5 (a 16-byte
``union ncclLLFifoLine`` of ``src/include/device.h`` holds two 4-byte data words, each
with its 4-byte flag), LL128 120/128 (``NCCL_LL128_DATAELEMS`` of
``NCCL_LL128_LINEELEMS``: 15 of a 128-byte line's 16 ``uint64_t``, the same header),
Simple 1. When
NCCL's choice is ring with Simple, the collective is priced exactly as without the knob
(the flow network's phases with their link latencies: large messages do not move).

Which algorithms: the flow network carries a ring's flows (and a tree's bytes on the
same flows: NCCL's tree all-reduce moves the same bytes per GPU as its ring to within
2(n-1)/n). NVLS, NVLS-tree and PAT are left out of the choice here
(:data:`ENGINE_ALGORITHMS`): NVLS reduces inside the NVSwitch, traffic the flow network
does not model, so where NCCL would pick them the engine takes NCCL's best ring or tree
choice (for large messages that is ring/Simple: today's pricing). CollNet is never
enabled (:mod:`moesim.collectives.nccl.model`).

Send/recv and all-to-all: NCCL has no tuning model for them; the engines keep the flow
network's pricing (``for_group`` returns None).

``overlap.collective_launch`` adds each call's cost beyond its kernel to the latency
term (:mod:`moesim.collectives.nccl.launch`): eagerly ``max(L, h - t_est)``, inside a
whole-step CUDA graph the graph floor. Where NCCL's choice is ring/Simple the call is
priced as before, without it (large messages: it would be the 2.43 µs launch).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moesim.collectives.nccl import constants as C
from moesim.collectives.nccl import launch as L
from moesim.collectives.nccl.graphs import NcclFacts, facts_from_params
from moesim.collectives.nccl.model import algo_time, tune
from moesim.errors import InputError

#: the algorithms the engines let NCCL's rule choose from (see the module doc); adding
#: "nvls", "nvls_tree", "pat" here would price their bytes on the ring's flows
ENGINE_ALGORITHMS = ("ring", "tree")
#: ops NCCL's tuning model prices that the engines run as phased ring collectives
TUNED_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
#: ``overlap.cuda_graphs`` entry of a step replayed whole from one CUDA graph (the value
#: of moesim.scenario.schema.WHOLE_STEP_GRAPH, a layer above this one)
WHOLE_STEP_GRAPH = "step"
#: share of the bytes on the wire that are data, per protocol (see the module doc)
PROTOCOL_EFFICIENCY = {"LL": 0.5, "LL128": 120.0 / 128.0, "Simple": 1.0}


@dataclass(frozen=True)
class Choice:
    """NCCL's choice for one collective: ``latency_s`` is its latency term (after
    NCCL's corrections), ``bw_efficiency`` the protocol's data share of the wire."""

    algo: str
    protocol: str
    latency_s: float
    bw_efficiency: float

    @property
    def as_before(self) -> bool:
        """Ring with Simple: priced as without the knob (link latencies, all bytes)."""
        return self.algo == "ring" and self.protocol == "Simple"


def choose(op: str, nbytes: float, facts: NcclFacts,
           algorithms: Sequence[str] = ENGINE_ALGORITHMS,
           call_cost: Callable[[float], float] | None = None) -> Choice | None:
    """NCCL's fastest (algorithm, protocol) for ``op`` of ``nbytes`` (nccl-tests S) on
    the communicator ``facts`` describes, among ``algorithms`` (ties as NCCL's loop:
    algorithm then protocol order), or None when none is enabled or ``op`` is not one
    NCCL's model prices. ``call_cost``: seconds a call costs beyond its kernel given
    NCCL's estimate of it (:func:`moesim.collectives.nccl.launch.extra_s`), added to the
    latency term."""
    if op not in TUNED_OPS or facts.n_ranks < 2:
        return None
    table = tune(op, facts)
    best: tuple[tuple[float, int, int], str, str, float] | None = None
    for (algo, proto) in table:
        if algo not in algorithms:
            continue
        t, lat, _bw = algo_time(op, algo, proto, nbytes, facts, table)
        rank = (t, C.ALGORITHMS.index(algo), C.PROTOCOLS.index(proto))
        if best is None or rank < best[0]:
            best = (rank, algo, proto, lat)
    if best is None:
        return None
    (t_us, _, _), algo, proto, lat = best
    extra = 0.0 if call_cost is None else call_cost(t_us * 1e-6)
    return Choice(algo, proto, lat * 1e-6 + extra, PROTOCOL_EFFICIENCY[proto])


def group_shape(group: Sequence[int], rank_host: Sequence[int] | Mapping[int, int]
                ) -> tuple[int, int] | None:
    """(nodes, ranks per node) of ``group``, or None when its nodes hold unequal counts
    (NCCL's model assumes the same number on each)."""
    count: dict[int, int] = {}
    for r in group:
        h = rank_host[r]
        count[h] = count.get(h, 0) + 1
    per = set(count.values())
    if len(per) != 1:
        return None
    return len(count), per.pop()


class NcclTuning:
    """NCCL's choice per collective on one topology, memoized: what both engines ask
    (``for_group``). ``params``/``device``: the topology's parameters and device name
    (:func:`moesim.collectives.nccl.graphs.facts_from_params`). ``launch``: None (no
    cost per call), ``"eager"`` or ``"graph"`` (``overlap.collective_launch``,
    :mod:`moesim.collectives.nccl.launch`; ``graph_floor_s`` the device's floor per
    graphed kernel); only on :data:`~moesim.collectives.nccl.launch.CALIBRATED_DEVICES`."""

    def __init__(self, params: dict[str, Any], device: str,
                 algorithms: Sequence[str] = ENGINE_ALGORITHMS, launch: str | None = None,
                 graph_floor_s: float = 0.0) -> None:
        self.params, self.device = dict(params), str(device)
        self.algorithms = tuple(algorithms)
        self.call_cost: Callable[[float], float] | None = None
        if launch is not None and self.device in L.CALIBRATED_DEVICES:
            floor = float(graph_floor_s) if launch == "graph" else None
            self.call_cost = lambda t_est: L.extra_s(t_est, floor)
        self._facts: dict[tuple[int, int], NcclFacts | None] = {}
        self._choice: dict[tuple, Choice | None] = {}

    def facts(self, nodes: int, per_node: int) -> NcclFacts | None:
        key = (nodes, per_node)
        if key not in self._facts:
            try:
                self._facts[key] = facts_from_params(self.params, self.device, nodes, per_node)
            except (InputError, KeyError, TypeError, ValueError):
                self._facts[key] = None   # a topology NCCL's model does not know
        return self._facts[key]

    def choice(self, op: str, nodes: int, per_node: int, nbytes: float) -> Choice | None:
        """:func:`choose` on ``nodes`` x ``per_node`` ranks (memoized)."""
        key = (op, nodes, per_node, float(nbytes))
        if key not in self._choice:
            facts = self.facts(nodes, per_node)
            ok = facts is not None and math.isfinite(nbytes) and nbytes > 0
            self._choice[key] = (choose(op, nbytes, facts, self.algorithms, self.call_cost)
                                 if ok else None)
        return self._choice[key]

    def for_group(self, op: str, group: Sequence[int], nbytes: float,
                  rank_host: Sequence[int]) -> Choice | None:
        """NCCL's choice for ``op`` of ``nbytes`` on ``group`` (global ranks; node of
        each from ``rank_host``), or None where the engine prices it as without the
        knob: an op NCCL's model does not price (send/recv, all-to-all), a group spread
        unevenly over nodes, a topology the model does not know, or ring/Simple."""
        if op not in TUNED_OPS or len(group) < 2:
            return None
        shape = group_shape(group, rank_host)
        if shape is None:
            return None
        c = self.choice(op, shape[0], shape[1], nbytes)
        return None if c is None or c.as_before else c


def engine_tuning(topology: Any, device: str | None = None, launch: str | None = None,
                  graph_floor_s: float = 0.0) -> NcclTuning | None:
    """The tuning an engine uses on ``topology`` (``device``: the scenario's device name,
    default the topology's; ``launch``, ``graph_floor_s``: as :class:`NcclTuning`), or
    None where NCCL's model cannot describe it (no device it knows, no link
    parameters)."""
    dev = device or getattr(topology, "device", None)
    params = getattr(topology, "params", None)
    if dev is None or not isinstance(params, Mapping):
        return None
    return NcclTuning(params, dev, launch=launch, graph_floor_s=graph_floor_s)


def scenario_tuning(res: Any) -> NcclTuning | None:
    """The engines' one reading of the knob: :func:`engine_tuning` for a resolved
    scenario ``res`` (``moesim.scenario.resolved.Resolved``) with
    ``overlap.nccl_tuning`` on, else None. With ``overlap.collective_launch`` each call
    also pays its launch: from the graph when the whole step is one CUDA graph (a
    serving decode with ``serve.cuda_graphs``), else eagerly (training: Megatron's
    graphed modules leave communication outside)."""
    ov = res.scenario.overlap
    if not getattr(ov, "nccl_tuning", False):
        return None
    launch, floor = None, 0.0
    if getattr(ov, "collective_launch", False):
        if WHOLE_STEP_GRAPH in getattr(ov, "cuda_graphs", ()):
            launch, floor = "graph", float(getattr(res.device, "graph_kernel_s", 0.0))
        else:
            launch, floor = "eager", 0.0
    return engine_tuning(res.topology, getattr(res.device, "name", None), launch, floor)
