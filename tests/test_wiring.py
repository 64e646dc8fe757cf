"""Schema below, wiring above: the scenario package reads data only, Resolved is typed
with the lower packages' own types, and a file or name reaches an engine through
moesim.wiring (issue 37)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from moesim.compute.devices import DeviceSpec
from moesim.engine import api
from moesim.errors import InputError
from moesim.gating.config import RoutingConfig
from moesim.layout.mesh import Layout
from moesim.model.spec import ModelSpec
from moesim.scenario import Resolved, load_scenario
from moesim.topology.graph import Topology
from moesim.wiring import resolve, resolve_path, simulate
from tests._util import two_gpu_scenario

PKG = Path(__file__).resolve().parents[1] / "moesim"
#: what moesim.scenario may import: the base modules and the packages below it
BELOW_SCENARIO = {"errors", "units", "paths", "yamlio", "jitenv", "outputs", "topology",
                  "network", "collectives", "compute", "layout", "model", "gating",
                  "schedule", "ep", "scenario"}


def _imported_packages(path: Path) -> set[str]:
    """moesim packages a module imports, at top level or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        out |= {n.split(".")[1] for n in names if n.startswith("moesim.")}
    return out


def test_scenario_imports_only_packages_below_it():
    above = {f"{p.name}: {sorted(_imported_packages(p) - BELOW_SCENARIO)}"
             for p in (PKG / "scenario").glob("*.py")
             if _imported_packages(p) - BELOW_SCENARIO}
    assert not above


def test_the_finder_sees_a_function_level_import(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from moesim.engine.api import simulate\n")
    assert _imported_packages(p) == {"engine"}


def test_resolved_fields_carry_the_lower_packages_types():
    hints = typing.get_type_hints(Resolved)
    assert hints["layout"] is Layout
    assert hints["topology"] == Topology | None and hints["model"] == ModelSpec | None
    assert hints["routing"] == RoutingConfig | None and hints["device"] == DeviceSpec | None


def test_a_resolved_hand_scenario_holds_built_objects(tmp_path):
    # two GPUs on one switch, the toy model on H100, hot routing on expert 0 (tests/_util)
    res = resolve_path(two_gpu_scenario(tmp_path))
    assert isinstance(res.topology, Topology) and len(res.topology.gpus) == 2
    assert isinstance(res.model, ModelSpec) and res.model.layers == 1
    assert isinstance(res.routing, RoutingConfig) and res.routing.kind == "hot"
    assert isinstance(res.device, DeviceSpec) and res.device.name == "H100"
    assert res.scenario.world == 2 and res.layout.dp == 2 and res.layout.ep == 2


def test_load_scenario_reads_data_and_resolve_checks_the_cluster(tmp_path):
    # dp=3 on a 2-GPU topology: the file reads as data; the cluster's check is the wiring's
    p = two_gpu_scenario(tmp_path, parallel={"dp": 3})
    scn = load_scenario(p)
    assert scn.parallel.dp == 3 and scn.world is None
    with pytest.raises(InputError) as ei:
        resolve(scn)
    assert ei.value.field == "parallel.dp" and "world size 2" in str(ei.value)


def test_engine_simulate_takes_a_resolved_scenario_and_wiring_a_name():
    sets = ["model.layers=1", "engine.mode=fast"]
    by_name = simulate("toy-cpu", sets).summary
    by_res = api.simulate(resolve_path("toy-cpu", sets)).summary
    assert by_name["step_time_s"] == by_res["step_time_s"] > 0
    assert api.simulate.__code__.co_varnames[0] == "res"
