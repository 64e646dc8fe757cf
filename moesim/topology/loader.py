"""Load a topology YAML (a preset naming a builder, or an explicit graph).

Preset file::

    name: dgx-h100
    builder: cluster          # or fat_tree
    routing: rail             # shortest | ecmp | rail
    params: {nodes: 1, nvlink_GBps: 450, ...}

Explicit file: ``nodes`` and ``links`` lists (see :mod:`moesim.topology.explicit`),
optional ``routing`` and ``gpu_transit``. Keyword overrides (``--set``) replace
``params`` entries; ``routing`` may be overridden for either kind.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from moesim.errors import InputError
from moesim.paths import shown
from moesim.topology.builders import (
    ClusterSpec,
    build_cluster,
    spec_field_types,
    validate_spec,
)
from moesim.topology.explicit import build_explicit
from moesim.topology.graph import Topology
from moesim.topology.link_routing import ROUTINGS, ClusterRouter, GraphRouter, find_unreachable
from moesim.yamlio import read_yaml as _read_yaml

#: the repository's preset directory (``topologies/`` next to the package)
PRESET_DIR = Path(__file__).resolve().parents[2] / "topologies"

#: builder name -> field defaults it imposes before the file's params
BUILDERS: dict[str, dict[str, Any]] = {
    "cluster": {},
    "fat_tree": {"intra": "none", "rail_optimized": False, "gpus_per_node": 1, "nic_attach": "gpu"},
}
_PRESET_KEYS = {"name", "builder", "routing", "params", "description", "device"}
_EXPLICIT_KEYS = {"name", "routing", "nodes", "links", "efficiency", "gpu_transit", "description",
                  "device"}


def presets() -> list[str]:
    """Names of the shipped presets (files in ``topologies/``)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def resolve(path_or_name: str | Path) -> Path:
    """A path as given if it exists (or relative to the repository root), else
    ``topologies/<name>.yaml`` for a bare preset name."""
    p = Path(path_or_name)
    if p.is_file():
        return p
    if not p.is_absolute() and (PRESET_DIR.parent / p).is_file():
        return shown(PRESET_DIR.parent / p)  # "topologies/x.yaml" from any working directory
    for cand in (PRESET_DIR / p.name, PRESET_DIR / f"{p.name}.yaml"):
        if str(path_or_name) == p.name and cand.is_file():
            return shown(cand)
    if p.is_dir():
        raise InputError(str(path_or_name), "", "a topology YAML file or a preset name",
                         "a directory")
    raise InputError(str(path_or_name), "", f"an existing YAML file or a preset name "
                     f"({', '.join(presets())})", str(path_or_name))


def read_yaml(path: Path) -> dict[str, Any]:
    return _read_yaml(path, "a YAML mapping (builder/params or nodes/links)")


def _coerce(name: str, value: Any, typ: type, source: str) -> Any:
    if typ is bool:
        ok = isinstance(value, bool)
    elif typ is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typ is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool) \
            and math.isfinite(value)
    else:
        ok = isinstance(value, str)
    if not ok:
        what = "a finite number" if typ is float else f"a value of type {typ.__name__}"
        raise InputError(source, f"params.{name}", what, value)
    return float(value) if typ is float else value


def cluster_spec(builder: str, params: dict[str, Any], source: str) -> ClusterSpec:
    types = spec_field_types()
    values: dict[str, Any] = dict(BUILDERS[builder])
    for name, value in params.items():
        if name not in types:
            raise InputError(source, f"params.{name}", f"a parameter of builder {builder} "
                             f"({', '.join(sorted(types))})", name)
        values[name] = _coerce(name, value, types[name], source)
    spec = replace(ClusterSpec(), **values)
    validate_spec(spec, source)
    return spec


def parse_topology(data: dict[str, Any], source: str, routing: str | None = None,
                   **params: Any) -> Topology:
    """Build a Topology from an already-read YAML mapping (see module doc)."""
    name = str(data.get("name", Path(source).stem))
    routing = routing if routing is not None else data.get("routing", "shortest")
    if routing not in ROUTINGS:
        raise InputError(source, "routing", f"one of {', '.join(ROUTINGS)}", routing)
    if "builder" in data:
        extra = set(data) - _PRESET_KEYS
        if extra:
            raise InputError(source, sorted(extra)[0], f"only {sorted(_PRESET_KEYS)} in a preset",
                             sorted(extra)[0])
        builder = data["builder"]
        if builder not in BUILDERS:
            raise InputError(source, "builder", f"one of {', '.join(BUILDERS)}", builder)
        file_params = data.get("params") or {}
        if not isinstance(file_params, dict):
            raise InputError(source, "params", "a mapping of parameter: value", file_params)
        merged = {**file_params, **params}
        spec = cluster_spec(builder, merged, source)
        graph, index = build_cluster(spec)
        structural = spec.structural

        def factory(g: Any, link_id: dict[tuple[str, str], int]) -> Any:
            if structural:
                return ClusterRouter(g, index, routing, link_id)
            return GraphRouter(g, routing)

        topo = Topology(name, graph, routing, factory, source=source, params=merged)
        gpu_transit = False
        connected = spec.connected  # by construction: no reachability search needed
    elif "nodes" in data or "links" in data:
        extra = set(data) - _EXPLICIT_KEYS
        if extra:
            raise InputError(source, sorted(extra)[0], f"only {sorted(_EXPLICIT_KEYS)} in an "
                             "explicit graph", sorted(extra)[0])
        if params:
            raise InputError(source, f"params.{sorted(params)[0]}",
                             "no parameters (an explicit graph has none; edit the file)",
                             sorted(params)[0])
        gpu_transit = data.get("gpu_transit", False)
        if not isinstance(gpu_transit, bool):
            raise InputError(source, "gpu_transit", "true or false", gpu_transit)
        graph = build_explicit(data, source)
        topo = Topology(name, graph, routing,
                        lambda g, _ids: GraphRouter(g, routing, gpu_transit), source=source)
        connected = False
    else:
        raise InputError(source, "builder", "a builder name (preset) or nodes and links "
                         "(explicit graph)", None)
    device = data.get("device")
    if device is not None and not isinstance(device, str):
        raise InputError(source, "device", "a device name (moesim.compute.devices), e.g. H100", device)
    topo.device = device
    bad = None if connected else find_unreachable(topo.graph, topo.gpus, gpu_transit)
    if bad is not None:
        raise InputError(source, "links", "a path between every pair of GPUs",
                         f"no path from {bad[0]} to {bad[1]}")
    return topo


def load_topology(path_or_name: str | Path, routing: str | None = None, **params: Any) -> Topology:
    """Load ``topologies/<name>.yaml`` or a YAML path; ``params`` override the file's
    ``params`` (e.g. ``nodes=2``), ``routing`` its routing rule."""
    path = resolve(path_or_name)
    return parse_topology(read_yaml(path), str(path), routing, **params)


def topology_size(path_or_name: str | Path) -> tuple[int, int, str | None]:
    """(servers, GPUs per server, device name) of a topology file; a builder preset is
    read and checked but not built (the 100,000-GPU preset takes seconds to build)."""
    path = resolve(path_or_name)
    data = read_yaml(path)
    builder = data.get("builder")
    if isinstance(builder, str) and builder in BUILDERS and isinstance(data.get("params"), dict):
        spec = cluster_spec(builder, data["params"], str(path))
        device = data.get("device")
        return spec.nodes, spec.gpus_per_node, device if isinstance(device, str) else None
    topo = parse_topology(data, str(path))
    return topo.n_nodes, topo.gpus_per_node, topo.device
