"""Scenarios: what to simulate (cluster, model, routing, layout, schedule)."""

import sys

from moesim.scenario.read import (
    SCENARIO_DIR,
    apply_overrides,
    build_scenario,
    load_scenario,
)
from moesim.scenario.resolve import Resolved, load_cluster, resolve, scenario_layout
from moesim.scenario.schema import (
    ClusterConfig,
    MemoryConfig,
    OverlapConfig,
    ParallelConfig,
    RoutingSection,
    Scenario,
    ScheduleConfig,
)

# blame_overrides' recheck reads the file again (set here: load imports resolve)
sys.modules["moesim.scenario.resolve"].RELOAD = load_scenario

__all__ = [
    "SCENARIO_DIR", "Scenario", "ClusterConfig", "ParallelConfig", "ScheduleConfig",
    "OverlapConfig", "MemoryConfig", "RoutingSection", "load_scenario", "build_scenario",
    "apply_overrides", "scenario_layout", "load_cluster",
    "Resolved", "resolve",
]
