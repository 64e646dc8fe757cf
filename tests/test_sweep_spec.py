"""Sweep files: parsing, validation and grid/zip expansion. Expansion tests are pure
(no Dask, no simpy); validation tests also load the base scenario."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.errors import InputError
from moesim.sweep.spec import expand, format_value, load_sweep, parse_sweep, point_id

BASE = {"scenario": "hot-expert", "set": ["model.layers=1"]}


def spec_of(check: bool = False, **kw):
    return parse_sweep({**BASE, **kw}, "s.yaml", check_scenario=check)


def test_grid_is_every_combination_last_axis_fastest_seeds_innermost():
    spec = spec_of(axes={"routing.hot_fraction": [0.2, 0.4], "cluster.topology": ["a", "b", "c"]},
                   seeds=[5, 6])
    pts = expand(spec)
    assert len(pts) == 2 * 3 * 2
    assert [p.index for p in pts] == list(range(12))
    assert [dict(p.values)["cluster.topology"] for p in pts[:6]] == ["a", "a", "b", "b", "c", "c"]
    assert [p.seed for p in pts[:4]] == [5, 6, 5, 6]
    assert pts[0].overrides == ("model.layers=1", "routing.hot_fraction=0.2",
                                "cluster.topology=a", "seed=5")
    assert len({p.point_id for p in pts}) == 12


def test_zip_pairs_the_ith_values():
    spec = spec_of(mode="zip", axes={"parallel.ep": [2, 4, 8], "routing.zipf_s": [0.0, 0.5, 1.0]})
    combos = [dict(p.values) for p in expand(spec)]
    assert combos == [{"parallel.ep": 2, "routing.zipf_s": 0.0},
                      {"parallel.ep": 4, "routing.zipf_s": 0.5},
                      {"parallel.ep": 8, "routing.zipf_s": 1.0}]


def test_ranges_inclusive_and_linspace_ints_stay_ints():
    spec = spec_of(axes={"routing.zipf_s": {"start": 0, "stop": 1.5, "step": 0.5},
                         "schedule.microbatches": {"start": 1, "stop": 7, "num": 4},
                         "routing.hot_fraction": {"start": 0.1, "stop": 0.3, "step": 0.1}})
    vals = {a.key: a.values for a in spec.axes}
    assert vals["routing.zipf_s"] == (0.0, 0.5, 1.0, 1.5)
    assert vals["schedule.microbatches"] == (1, 3, 5, 7)
    assert all(type(v) is int for v in vals["schedule.microbatches"])
    assert vals["routing.hot_fraction"] == (0.1, 0.2, 0.3)   # no 0.30000000000000004


def test_seed_count_default_and_point_id_stable():
    assert spec_of(axes={"parallel.ep": [8]}, seeds=3).seeds == (0, 1, 2)
    assert spec_of(True, axes={"parallel.ep": [8]}).seeds == (1,)   # hot-expert.yaml: seed 1
    assert spec_of(axes={"parallel.ep": [8]}).seeds == (0,)   # unchecked: Scenario default
    a = expand(spec_of(axes={"parallel.ep": [4, 8]}))
    b = expand(spec_of(axes={"parallel.ep": [4, 8]}))
    assert [p.point_id for p in a] == [p.point_id for p in b]
    assert point_id("x", ("a=1",), 1) != point_id("x", ("a=1",), 2)


@pytest.mark.parametrize("v", [0.1, 1e-7, 2.5e20, float("inf"), 3, True, False, None, "dgx-h100", [1, 2]])
def test_format_value_round_trips_through_yaml(v):
    assert yaml.safe_load(format_value(v)) == v


@pytest.mark.parametrize("data,field", [
    ({"axes": {"parallel.ep": [8]}, "bogus": 1}, "bogus"),
    ({"axes": {"parallel.ep": [8]}, "mode": "cross"}, "mode"),
    ({"axes": {}}, "axes"),
    ({"axes": {"parallel.ep": []}}, "axes.parallel.ep"),
    ({"axes": {"parallel.ep": 8}}, "axes.parallel.ep"),
    ({"axes": {"parallel.ep": [8, 8]}}, "axes.parallel.ep"),
    ({"axes": {"seed": [1, 2]}}, "axes.seed"),
    ({"axes": {"routing.nosuch": [1]}}, "axes.routing.nosuch"),
    ({"axes": {"cluster.nosuch": [1]}}, "axes.cluster.nosuch"),
    ({"axes": {"cluster.topology": ["dgx-h100x", "nvl"]}}, "axes.cluster.topology"),
    ({"axes": {"model.layers": [1, 2]}}, "axes.model.layers"),   # also fixed in set
    ({"axes": {"parallel.ep": [2, 4], "routing.zipf_s": [1.0]}, "mode": "zip"}, "axes"),
    ({"axes": {"routing.zipf_s": {"start": 0, "stop": 1}}}, "axes.routing.zipf_s"),
    ({"axes": {"routing.zipf_s": {"start": 1, "stop": 0, "step": 0.5}}},
     "axes.routing.zipf_s.step"),
    ({"axes": {"parallel.ep": [8]}, "seeds": [1, 1]}, "seeds"),
    ({"axes": {"parallel.ep": [8]}, "seeds": 0}, "seeds"),
    ({"axes": {"parallel.ep": [8]}, "plots": {"skew": "routing.zipf_s"}}, "plots.skew"),
])
def test_bad_sweep_fields_name_the_field(data, field):
    with pytest.raises(InputError) as e:
        parse_sweep({**BASE, **data}, "s.yaml")
    assert e.value.source == "s.yaml"
    assert e.value.field == field


def test_bad_scenario_and_base_override_fail_before_any_point():
    with pytest.raises(InputError):
        parse_sweep({"scenario": "no-such-scenario", "axes": {"parallel.ep": [8]}}, "s.yaml")
    with pytest.raises(InputError):
        parse_sweep({"scenario": "hot-expert", "set": ["routing.nosuch=1"],
                     "axes": {"parallel.ep": [8]}}, "s.yaml")


def test_load_sweep_file_relative_scenario_and_malformed_yaml(tmp_path: Path):
    scn = Path("scenarios/hot-expert.yaml").resolve()
    (tmp_path / "base.yaml").write_text(scn.read_text())
    f = tmp_path / "sw.yaml"
    f.write_text("scenario: base.yaml\naxes:\n  parallel.ep: [4, 8]\n")
    spec = load_sweep(f)
    assert spec.name == "sw" and spec.scenario == str((tmp_path / "base.yaml").resolve())
    bad = tmp_path / "bad.yaml"
    bad.write_text("scenario: hot-expert\naxes: [\n")
    with pytest.raises(InputError) as e:
        load_sweep(bad)
    assert e.value.source == str(bad) and e.value.field.startswith("line ")


def test_shipped_sweeps_load():
    files = sorted(Path("scenarios/sweeps").glob("*.yaml"))
    assert any(f.name == "skew-vs-topology.yaml" for f in files)
    for f in files:
        spec = load_sweep(f)
        assert len(expand(spec)) <= 200   # small enough for minutes on 2 cores


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       seeds=st.lists(st.integers(0, 50), min_size=1, max_size=3, unique=True),
       zipped=st.booleans())
def test_expansion_counts_and_unique_ids(lens, seeds, zipped):
    keys = ["routing.zipf_s", "parallel.ep", "schedule.microbatches"][: len(lens)]
    if zipped:
        lens = [lens[0]] * len(lens)
    axes = {k: [i + 1 for i in range(n)] for k, n in zip(keys, lens, strict=True)}
    spec = spec_of(axes=axes, seeds=seeds, mode="zip" if zipped else "grid")
    pts = expand(spec)
    n = lens[0] if zipped else int(np.prod(lens))
    assert len(pts) == n * len(seeds)
    assert len({p.point_id for p in pts}) == len(pts)
    for p in pts:   # every point carries each axis once, then its seed last
        assert [o.split("=")[0] for o in p.overrides] == ["model.layers", *keys, "seed"]
        assert p.overrides[-1] == f"seed={p.seed}"


def _rl_sweep(tmp_path, **kw):
    from tests.test_rl_run import scenario

    p = scenario(tmp_path)          # an rl scenario of 3 steps, max_lag 0
    return parse_sweep({"scenario": str(p), **kw}, "s.yaml", check_scenario=True)


def test_rl_max_lag_sweep_needs_steps_past_the_fill_and_the_drain(tmp_path):
    from moesim.sweep.spec import RL_STEADY_STEPS

    axes = {"rl.max_lag": [0, 1, 2]}
    need = 2 * 2 + RL_STEADY_STEPS          # 2 to fill, 2 steady, 2 to drain
    with pytest.raises(InputError) as e:    # the scenario's own 3 steps
        _rl_sweep(tmp_path, axes=axes)
    assert e.value.field == "set: rl.steps" and f"rl.steps={need}" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="set: rl.steps"):
        _rl_sweep(tmp_path, axes=axes, set=[f"rl.steps={need - 1}"])
    spec = _rl_sweep(tmp_path, axes=axes, set=[f"rl.steps={need}"])
    assert len(expand(spec)) == 3
    with pytest.raises(InputError, match="axes.rl.steps"):
        _rl_sweep(tmp_path, axes={**axes, "rl.steps": [4, need]})
    # a sweep that does not vary max_lag is not held to it
    assert len(expand(_rl_sweep(tmp_path, axes={"rl.rollout.gpus": [8]}))) == 1


def test_shipped_grpo_split_sweep_has_steady_steps():
    from moesim.rl.summary import STEADY, step_window

    spec = load_sweep(Path(__file__).parents[1] / "scenarios" / "sweeps" / "grpo-split.yaml")
    steps = int(dict(s.split("=") for s in spec.base_overrides)["rl.steps"])
    lags = dict((a.key, a.values) for a in spec.axes)["rl.max_lag"]
    for lag in lags:
        kind, first, last = step_window(steps, lag)
        assert kind == STEADY and last - first + 1 >= 2
