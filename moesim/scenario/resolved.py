"""A resolved scenario: the checked :class:`~moesim.scenario.schema.Scenario` with its
named parts built (topology, layout, model, routing, device, compute model).

This is the data the engines take (:mod:`moesim.engine`); building it from a file or a
name is the wiring's work (:func:`moesim.wiring.resolve`), above the engines. The
types are the lower packages' own, so an engine needs no import of the wiring.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.compute.base import ComputeModel
from moesim.compute.devices import DeviceSpec
from moesim.errors import InputError
from moesim.gating.config import RoutingConfig
from moesim.layout.mesh import Layout
from moesim.model.spec import ModelSpec
from moesim.scenario.schema import Scenario
from moesim.topology.graph import Topology


@dataclass(frozen=True)
class Resolved:
    scenario: Scenario          # with ``world``, ``gpus_per_node`` and ``parallel.dp`` filled in
    layout: Layout
    warnings: tuple[str, ...]   # e.g. a TP group crossing a node boundary
    topology: Topology | None = None
    model: ModelSpec | None = None
    routing: RoutingConfig | None = None
    device: DeviceSpec | None = None         # None: no device named by scenario or topology
    compute: ComputeModel | None = None      # None where the device is


def scenario_layout(scn: Scenario) -> tuple[Layout, list[str]]:
    """The scenario's :class:`Layout` and its warnings (e.g. TP crossing nodes)."""
    par = scn.parallel
    dp = par.dp
    if dp is None:
        if scn.world is None:
            raise InputError(scn.source, "parallel.dp", "a data-parallel size (no topology to "
                             "derive it from)", None)
        dp = scn.world // (par.tp * par.cp * par.pp)
    world = scn.world if scn.world is not None else par.tp * par.cp * par.pp * dp
    layout = Layout(world=world, tp=par.tp, pp=par.pp, dp=dp, ep=par.ep, order=par.order,
                    source=scn.source, cp=par.cp, etp=par.etp)
    return layout, layout.warnings(scn.gpus_per_node)
