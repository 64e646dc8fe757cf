"""Scenarios as data: what to simulate (cluster, model, routing, layout, schedule), read
from YAML with ``--set`` overrides and checked field by field. Building the named parts
into objects is :mod:`moesim.wiring`'s (it returns a :class:`Resolved`)."""

from moesim.scenario.read import (
    SCENARIO_DIR,
    apply_overrides,
    build_scenario,
    load_scenario,
)
from moesim.scenario.resolved import Resolved, scenario_layout
from moesim.scenario.schema import (
    ClusterConfig,
    MemoryConfig,
    OverlapConfig,
    ParallelConfig,
    RoutingSection,
    Scenario,
    ScheduleConfig,
)

__all__ = [
    "SCENARIO_DIR", "Scenario", "ClusterConfig", "ParallelConfig", "ScheduleConfig",
    "OverlapConfig", "MemoryConfig", "RoutingSection", "load_scenario", "build_scenario",
    "apply_overrides", "scenario_layout", "Resolved",
]
