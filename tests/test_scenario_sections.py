"""The scenario's sections are typed and checked when it is read (moesim.scenario.sections,
moesim.model.read.ModelSection, moesim.compute.select.ComputeSection); the names the
registries above hold (schedulers, balancers, RL algorithms, length distributions) are
refused by those registries, with their lists, when the section is run."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping

import pytest
import yaml

from moesim.compute.select import ComputeSection
from moesim.errors import InputError
from moesim.model.read import ModelSection
from moesim.rl.algorithms import ALGORITHMS
from moesim.rl.config import rl_config
from moesim.scenario import SCENARIO_DIR, Scenario, load_scenario
from moesim.scenario.sections.lengths import LengthDist
from moesim.scenario.sections.load import Arrival, LoadSection, Surface
from moesim.scenario.sections.rl import RLConfig
from moesim.scenario.sections.serve import ServeConfig
from moesim.serve.config import serving_scenario
from moesim.traffic.balancer import BALANCERS
from moesim.traffic.config import load_from_dict
from moesim.traffic.lengths import DISTRIBUTIONS
from moesim.traffic.schedulers import SCHEDULERS

#: the bags of parameters a lower package's registry defines, checked by it when the
#: scenario is resolved: a topology preset's own parameters (moesim.topology builders)
#: and a routing kind's (moesim.gating.kinds registers each kind's keys); and the two
#: lower sections' copies of what was written (the summary's echo, never read by an engine)
BAGS = {("ClusterConfig", "params"), ("RoutingSection", "policy"),
        ("ModelSection", "written"), ("ComputeSection", "written")}


def _untyped(cls: type, seen: set) -> list[str]:
    """Fields of ``cls`` and of the dataclasses it holds typed Any or a mapping."""
    if cls in seen:
        return []
    seen.add(cls)
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        for t in args:
            origin = typing.get_origin(t) or t
            if (t is typing.Any or origin in (dict, Mapping)) and \
                    (cls.__name__, f.name) not in BAGS:
                out.append(f"{cls.__name__}.{f.name}")
            if dataclasses.is_dataclass(t):
                out += _untyped(t, seen)
    return out


def test_no_section_of_a_scenario_is_an_untyped_mapping():
    assert _untyped(Scenario, set()) == []
    hints = typing.get_type_hints(Scenario)
    assert hints["serve"] == ServeConfig | None and hints["rl"] == RLConfig | None
    assert hints["load"] == LoadSection | None
    assert hints["model"] is ModelSection and hints["compute"] is ComputeSection


@dataclasses.dataclass
class Inner:
    bag: dict


@dataclasses.dataclass
class Outer:
    inner: Inner
    other: typing.Any = None


def test_the_checker_finds_an_untyped_field():
    assert _untyped(Outer, set()) == ["Inner.bag", "Outer.other"]


def test_a_read_scenario_holds_typed_sections():
    serve = load_scenario("mixtral-8x7b-serve-load", ["load.arrival.rate_rps=3",
                                                      "serve.batch_per_gpu=4"])
    assert serve.serve == dataclasses.replace(ServeConfig(), phase="decode", batch_per_gpu=4,
                                              prompt=2048, context=2048, output=512, tp=1,
                                              ep=8, two_microbatch=False, ep_backend="nccl")
    assert serve.load.arrival == Arrival(kind="poisson", rate_rps=3.0)
    assert serve.load.prompt_tokens == LengthDist(dist="lognormal", mean=1024.0, sigma=0.8,
                                                  max=8192)
    assert serve.load.requests == 2500 and serve.load.surface == Surface()
    assert serve.model == ModelSection(preset="mixtral-8x7b")
    assert serve.compute == ComputeSection(kind="catalog") and serve.rl is None
    rl = load_scenario("grpo-qwen3-30b-a3b")
    assert rl.rl.response_tokens == LengthDist(dist="lognormal", mean=2900.0, max=3840)
    assert (rl.rl.train.gpus, rl.rl.train.ep, rl.rl.train.mini_batches) == (32, 8, 4)
    assert rl.serve is None and rl.load is None


@pytest.mark.parametrize("name", ["mixtral-8x7b-serve-load", "grpo-qwen3-30b-a3b",
                                  "deepseek-v3-decode", "toy-cpu"])
def test_to_dict_echoes_each_section_as_written(name):
    raw = yaml.safe_load((SCENARIO_DIR / f"{name}.yaml").read_text())
    out = load_scenario(name).to_dict()
    for k in ("model", "compute", "serve", "rl", "load"):
        if raw.get(k):
            assert json.dumps(out[k]) == json.dumps(raw[k])
        else:
            assert out.get(k, {}) == {}


def test_serving_adds_grouped_launches_to_the_echoed_compute():
    scn = load_scenario("mixtral-8x7b-serve")
    out = serving_scenario(scn, scn.serve)
    assert out.compute.grouped and out.to_dict()["compute"] == {
        "expert_launches": "grouped", **scn.to_dict()["compute"]}


def _one_line(err: InputError, field: str, names) -> None:
    line = str(err)
    assert "\n" not in line and f"{field}: expected one of {list(names)}" in line, line


def test_an_unknown_scheduler_balancer_or_length_is_refused_with_the_registry():
    base = {"arrival": {"rate_rps": 1}, "requests": 3}
    for extra, field, names in (
            ({"scheduler": "fifo"}, "load.scheduler", SCHEDULERS.names()),
            ({"router": "random"}, "load.router", BALANCERS.names()),
            ({"prompt_tokens": {"dist": "zipf", "mean": 9}}, "load.prompt_tokens.dist",
             DISTRIBUTIONS.names())):
        with pytest.raises(InputError) as err:
            load_from_dict({**base, **extra}, "s.yaml")
        _one_line(err.value, field, names)


def test_an_unknown_rl_algorithm_or_length_is_refused_with_the_registry():
    for key, value, field, names in (
            ("algorithm", "ppo", "rl.algorithm", ALGORITHMS.names()),
            ("response_tokens", {"dist": "weibull", "mean": 9}, "rl.response_tokens.dist",
             DISTRIBUTIONS.names())):
        scn = load_scenario("grpo-qwen3-30b-a3b", [f"rl.{key}={json.dumps(value)}"])
        with pytest.raises(InputError) as err:
            rl_config(scn.rl, scn.source, world=64)
        _one_line(err.value, field, names)


def test_a_name_registered_above_is_accepted_without_a_schema_change():
    SCHEDULERS.register("fifo-test", SCHEDULERS.get("vllm").factory,
                        dict(SCHEDULERS.get("vllm").fields))
    try:
        cfg = load_from_dict({"arrival": {"rate_rps": 1}, "requests": 3,
                              "scheduler": "fifo-test"}, "s.yaml")
    finally:
        SCHEDULERS.unregister("fifo-test")
    assert cfg.scheduler == "fifo-test" and cfg.max_seqs == 256


def test_bad_section_values_are_refused_when_the_scenario_is_read():
    for sets, line in (
            (["serve.phase=bogus"], "command line: --set serve.phase: expected one of "
                                    "['prefill', 'decode'], got 'bogus'"),
            (["compute.expert_launches=all"], "command line: --set compute.expert_launches: "
                                              "expected per_expert or grouped, got 'all'"),
            (["load.kv_fraction=2"], "command line: --set load.kv_fraction: expected a "
                                     "share in (0, 1], got 2.0")):
        with pytest.raises(InputError) as err:
            load_scenario("mixtral-8x7b-serve-load", sets)
        assert str(err.value) == line
