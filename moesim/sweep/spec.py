"""Sweep files: a base scenario plus axes of ``--set``-style dotted keys.

Pure planning code (no Dask, no simpy). ``load_sweep(path)`` reads and validates a
sweep YAML file (``yaml.safe_load``); ``expand(spec)`` turns it into the list of
:class:`Point` objects (one per axis combination and seed), each with a stable
``point_id`` (a hash of scenario, overrides and seed) that resuming relies on.

File format::

    name: skew-vs-topology         # optional, default: the file's stem
    scenario: hot-expert           # shipped scenario name, or a path relative to this file
    set: [model.layers=1]          # fixed overrides for every point (alias: base_overrides)
    mode: grid                     # grid (every combination) | zip (i-th values together)
    axes:
      routing.hot_fraction: [0.125, 0.25, 0.5]
      cluster.topology: [dgx-h100, pcie-8gpu]
      routing.zipf_s: {start: 0, stop: 1.5, step: 0.5}    # inclusive range
      schedule.microbatches: {start: 1, stop: 8, num: 4}  # linspace (ints stay ints)
    seeds: [1, 2, 3]               # or an int n: seeds 0..n-1 (default [scenario seed])
    plots: {skew: routing.hot_fraction, by: cluster.topology, layout: [parallel.ep]}
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moesim.errors import InputError
from moesim.outputs import check_name
from moesim.yamlio import read_yaml

KEYS = ("name", "scenario", "set", "base_overrides", "mode", "axes", "seeds", "plots",
        "description")
MODES = ("grid", "zip")
PLOT_KEYS = ("skew", "by", "heatmap", "layout", "metric")
MAX_POINTS = 100_000   # a guard against a typo like step: 1e-9


@dataclass(frozen=True)
class Axis:
    """One swept key and its values (YAML scalars: int, float, str, bool)."""

    key: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file. ``scenario`` is a shipped name or an absolute path."""

    name: str
    scenario: str
    base_overrides: tuple[str, ...]
    axes: tuple[Axis, ...]
    mode: str = "grid"
    seeds: tuple[int, ...] = (0,)
    plots: tuple[tuple[str, Any], ...] = ()
    description: str = ""
    source: str = "<sweep>"

    @property
    def axis_keys(self) -> tuple[str, ...]:
        return tuple(a.key for a in self.axes)

    def plot_option(self, key: str, default: Any = None) -> Any:
        return dict(self.plots).get(key, default)

    def to_dict(self) -> dict:
        return {"name": self.name, "scenario": self.scenario, "set": list(self.base_overrides),
                "mode": self.mode, "axes": {a.key: list(a.values) for a in self.axes},
                "seeds": list(self.seeds), "plots": dict(self.plots),
                "description": self.description, "source": self.source}


@dataclass(frozen=True)
class Point:
    """One simulation to run: the axis values, the seed and the full override list."""

    point_id: str
    index: int
    values: tuple[tuple[str, Any], ...]
    seed: int
    scenario: str
    overrides: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"point_id": self.point_id, "index": self.index, "values": dict(self.values),
                "seed": self.seed, "scenario": self.scenario, "overrides": list(self.overrides)}


def format_value(v: Any) -> str:
    """The text of ``key=value`` that YAML parses back to ``v`` (floats by repr)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return repr(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return ".nan" if math.isnan(v) else (".inf" if v > 0 else "-.inf")
        text = repr(v)
        mant, _, exp = text.partition("e")
        # YAML 1.1 reads 1e-07 as a string: the mantissa needs a dot (1.0e-07)
        return f"{mant}.0e{exp}" if exp and "." not in mant else text
    if isinstance(v, list | tuple):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    return str(v)


def point_id(scenario: str, overrides: tuple[str, ...], seed: int) -> str:
    """Stable id: the same scenario, overrides and seed always give the same id."""
    blob = json.dumps({"scenario": scenario, "overrides": list(overrides), "seed": seed},
                      sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def _range(src: str, key: str, r: dict) -> tuple[Any, ...]:
    field = f"axes.{key}"
    unknown = set(r) - {"start", "stop", "step", "num"}
    if unknown or "start" not in r or "stop" not in r or ("step" in r) == ("num" in r):
        raise InputError(src, field, "a list, or a range {start, stop, step} or "
                         "{start, stop, num}", r)
    nums = {k: r[k] for k in r}
    for k, v in nums.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InputError(src, f"{field}.{k}", "a finite number", v)
    start, stop = nums["start"], nums["stop"]
    ints = all(isinstance(nums[k], int) for k in nums if k != "num")
    if "num" in r:
        n = nums["num"]
        if not isinstance(n, int) or n < 1:
            raise InputError(src, f"{field}.num", "an integer >= 1", n)
        vals = [start + (stop - start) * i / (n - 1) for i in range(n)] if n > 1 else [start]
    else:
        step = nums["step"]
        if step == 0 or (stop - start) / step < 0:
            raise InputError(src, f"{field}.step", "a non-zero step towards stop", step)
        n = int(math.floor((stop - start) / step + 1e-9)) + 1
        if n > MAX_POINTS:
            raise InputError(src, f"{field}.step", f"at most {MAX_POINTS} values", n)
        vals = [start + i * step for i in range(n)]
    if ints and all(float(v).is_integer() for v in vals):
        return tuple(int(round(v)) for v in vals)
    # round away binary noise such as 0.30000000000000004 (12 significant digits)
    return tuple(float(f"{v:.12g}") for v in vals)


def _axis(src: str, key: Any, raw: Any) -> Axis:
    if not isinstance(key, str) or "." not in key and key != "name":
        raise InputError(src, f"axes.{key}", "a dotted scenario key such as "
                         "routing.hot_fraction", key)
    if key == "seed":
        raise InputError(src, "axes.seed", "seeds in the top-level 'seeds' list", key)
    if isinstance(raw, dict):
        values = _range(src, key, raw)
    elif isinstance(raw, list):
        values = tuple(tuple(v) if isinstance(v, list) else v for v in raw)
    else:
        raise InputError(src, f"axes.{key}", "a non-empty list or a range mapping", raw)
    if not values:
        raise InputError(src, f"axes.{key}", "a non-empty list of values", raw)
    for v in values:
        if isinstance(v, dict):
            raise InputError(src, f"axes.{key}", "scalar values (number, string, bool, null)",
                             v)
    if len(set(map(format_value, values))) != len(values):
        raise InputError(src, f"axes.{key}", "distinct values", list(values))
    return Axis(key, values)


def _seeds(src: str, raw: Any, default: int) -> tuple[int, ...]:
    if raw is None:
        return (default,)
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 1:
            raise InputError(src, "seeds", "a positive count or a list of integers", raw)
        return tuple(range(raw))
    if (not isinstance(raw, list) or not raw
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in raw)):
        raise InputError(src, "seeds", "a positive count or a non-empty list of integers >= 0",
                         raw)
    if len(set(raw)) != len(raw):
        raise InputError(src, "seeds", "distinct seeds", raw)
    return tuple(raw)


def _scenario(src: str, raw: Any, base_dir: Path | None) -> str:
    if not isinstance(raw, str) or not raw:
        raise InputError(src, "scenario", "a shipped scenario name or a YAML path", raw)
    p = Path(raw)
    if p.suffix in (".yaml", ".yml") or len(p.parts) > 1:
        if not p.is_absolute() and base_dir is not None and (base_dir / p).is_file():
            p = base_dir / p
        if not p.is_file():
            raise InputError(src, "scenario", "an existing scenario file", raw)
        return str(p.resolve())
    return raw


def _check_axis(src: str, scenario: str, base: tuple[str, ...], axis: Axis) -> None:
    """An axis whose key is unknown, or all of whose values are rejected for that very
    key (or for a key fixed in ``set``), is an error of the sweep file; a value rejected
    for another reason (a layout that fails only with some other axes' values) is left
    to its points, which are then skipped with the reason."""
    from moesim.scenario.read import apply_overrides, load_scenario
    from moesim.wiring import resolve

    try:
        apply_overrides({}, [f"{axis.key}={format_value(axis.values[0])}"])
    except InputError as err:
        raise InputError(src, f"axes.{axis.key}", err.expected, err.got) from None
    base_keys = {b.split("=", 1)[0].strip() for b in base}
    errors = []
    for v in axis.values:
        try:
            resolve(load_scenario(scenario, [*base, f"{axis.key}={format_value(v)}"]))
            return
        except InputError as err:
            key = err.field.removeprefix("--set ")  # the value came from the sweep's overrides
            if key != axis.key and key not in base_keys:
                return
            errors.append((key, err))
    key, err = errors[0]
    field = f"axes.{axis.key}" if key == axis.key else f"set: {key}"
    raise InputError(src, field, *err.args[2:])


#: steady RL steps a sweep over ``rl.max_lag`` needs between the ``max_lag`` steps that
#: fill the pipeline and the ``max_lag`` that drain it, so that its step times compare
#: steady states (moesim.rl.summary.step_window)
RL_STEADY_STEPS = 2


def _check_rl_steps(src: str, rl: Any, axes: tuple[Axis, ...]) -> None:
    """A sweep over ``rl.max_lag`` runs enough steps at every point for a steady state:
    ``2 * max_lag + RL_STEADY_STEPS`` (else one line saying which ``rl.steps`` to set)."""
    by_key = {a.key: a.values for a in axes}
    if "rl.max_lag" not in by_key or rl is None:
        return
    lags = [v for v in by_key["rl.max_lag"] if isinstance(v, int) and not isinstance(v, bool)]
    steps = by_key.get("rl.steps", (rl.steps,))
    counts = [v for v in steps if isinstance(v, int) and not isinstance(v, bool)]
    if not lags or not counts:
        return      # a bad value: its points are skipped with the reason
    need = 2 * max(lags) + RL_STEADY_STEPS
    if min(counts) < need:
        field = "axes.rl.steps" if "rl.steps" in by_key else "set: rl.steps"
        raise InputError(src, field, f"at least {need} RL steps per point with rl.max_lag up "
                         f"to {max(lags)} (the first and the last max_lag steps fill and "
                         f"drain the pipeline; {RL_STEADY_STEPS} steady steps between them "
                         f"are compared): add rl.steps={need} to set", min(counts))


def parse_sweep(data: Any, source: str = "<sweep>", base_dir: Path | None = None,
                default_name: str = "sweep", check_scenario: bool = True) -> SweepSpec:
    """Validate a loaded sweep mapping. With ``check_scenario`` the base scenario plus
    the fixed overrides are loaded once, so a typo there fails before any point runs,
    and every axis key is checked to be a key ``--set`` accepts."""
    src = source
    if not isinstance(data, dict):
        raise InputError(src, "", "a mapping with scenario and axes", type(data).__name__)
    unknown = sorted(set(map(str, data)) - set(KEYS))
    if unknown:
        raise InputError(src, unknown[0], f"one of the keys {list(KEYS)}", unknown[0])
    if "set" in data and "base_overrides" in data:
        raise InputError(src, "set", "either 'set' or 'base_overrides', not both", "both")
    scenario = _scenario(src, data.get("scenario"), base_dir)
    raw_set = data.get("set", data.get("base_overrides", [])) or []
    if not isinstance(raw_set, list) or any(not isinstance(s, str) or "=" not in s
                                            for s in raw_set):
        raise InputError(src, "set", "a list of 'dotted.key=value' strings", raw_set)
    mode = data.get("mode", "grid")
    if mode not in MODES:
        raise InputError(src, "mode", f"one of {list(MODES)}", mode)
    raw_axes = data.get("axes")
    if not isinstance(raw_axes, dict) or not raw_axes:
        raise InputError(src, "axes", "a mapping of dotted keys to lists of values", raw_axes)
    axes = tuple(_axis(src, k, v) for k, v in raw_axes.items())
    set_keys = {s.split("=", 1)[0].strip() for s in raw_set}
    for a in axes:
        if a.key in set_keys:
            raise InputError(src, f"axes.{a.key}", "a key not also fixed in 'set'", a.key)
    if mode == "zip" and len({len(a.values) for a in axes}) > 1:
        raise InputError(src, "axes", "lists of equal length in zip mode",
                         {a.key: len(a.values) for a in axes})
    name = data.get("name", default_name)
    check_name(src, "name", name)
    plots = data.get("plots", {}) or {}
    if not isinstance(plots, dict) or set(plots) - set(PLOT_KEYS):
        raise InputError(src, "plots", f"a mapping with keys among {list(PLOT_KEYS)}", plots)
    for k in ("skew", "by"):
        if plots.get(k) is not None and plots[k] not in {a.key for a in axes}:
            raise InputError(src, f"plots.{k}", "one of the axis keys", plots[k])
    serving = [k for k in [*(a.key for a in axes), *set_keys]
               if k.split(".")[0] in ("serve", "load")]
    if serving:     # a sweep runs training steps: never ignore a serving axis (issue 20)
        k = serving[0]
        raise InputError(src, f"axes.{k}" if k in {a.key for a in axes} else f"set: {k}",
                         "a training-step field (sweeps simulate `moesim run` steps; "
                         "serving is simulated by `moesim serve SCENARIO --set ...` per "
                         "point)", k)
    base_seed = 0
    if check_scenario:
        from moesim.scenario.read import load_scenario

        scn = load_scenario(scenario, list(raw_set))
        base_seed = scn.seed
        if scn.serve:
            raise InputError(src, "scenario", "a training scenario (this one has a serve: "
                             "section; a sweep would simulate training steps in its place)",
                             data.get("scenario"))
        for a in axes:
            _check_axis(src, scenario, tuple(raw_set), a)
        if scn.rl:
            _check_rl_steps(src, scn.rl, axes)
    seeds = _seeds(src, data.get("seeds"), base_seed)
    desc = data.get("description", "")
    n = math.prod(len(a.values) for a in axes) if mode == "grid" else len(axes[0].values)
    if n * len(seeds) > MAX_POINTS:
        raise InputError(src, "axes", f"at most {MAX_POINTS} points", n * len(seeds))
    return SweepSpec(name=name, scenario=scenario, base_overrides=tuple(raw_set), axes=axes,
                     mode=mode, seeds=seeds, plots=tuple(sorted(plots.items())),
                     description=str(desc), source=src)


def load_sweep(path: str | Path, check_scenario: bool = True) -> SweepSpec:
    """Read and validate a sweep YAML file (``yaml.safe_load``)."""
    p = Path(path)
    data = read_yaml(p, "a sweep mapping (scenario, axes, ...)", empty_ok=True)
    return parse_sweep(data, str(p), p.parent, p.stem, check_scenario)


def combinations(spec: SweepSpec) -> list[tuple[tuple[str, Any], ...]]:
    """Axis value combinations in order (grid: last axis fastest; zip: i-th together)."""
    keys = spec.axis_keys
    if spec.mode == "zip":
        rows = zip(*(a.values for a in spec.axes), strict=True)
    else:
        rows = itertools.product(*(a.values for a in spec.axes))
    return [tuple(zip(keys, row, strict=True)) for row in rows]


def expand(spec: SweepSpec) -> list[Point]:
    """Every point of the sweep: each combination × each seed, seeds innermost."""
    points = []
    for combo in combinations(spec):
        for seed in spec.seeds:
            ovr = (*spec.base_overrides, *(f"{k}={format_value(v)}" for k, v in combo),
                   f"seed={seed}")
            points.append(Point(point_id(spec.scenario, ovr, seed), len(points), combo, seed,
                                spec.scenario, ovr))
    return points
