"""compute.expert_launches: a rank's routed experts launched one by one (per_expert, the
default for training: Transformer Engine's GroupedLinear) or in one launch per kernel for
all of them (grouped: vLLM's fused MoE, DeepGEMM's grouped GEMMs; serving's default).
Worked out by hand on the toy model: the same work, (experts - 1) x launches fewer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from moesim.compute.base import Kernel, fused_launches
from moesim.compute.devices import get_device
from moesim.compute.roofline import RooflineModel
from moesim.errors import InputError
from moesim.model import PRESETS
from moesim.program import recipe
from moesim.program.build import build_step
from moesim.scenario import load_scenario
from moesim.wiring import resolve

TOY = PRESETS["toy"]


def _experts_ops(*sets):
    res = resolve(load_scenario("toy-cpu", list(sets)))
    plan = build_step(res)
    return res, [op for op in plan.programs[0] if op.name.endswith(".experts")]


def test_a_fused_kernel_pays_no_launch_of_its_own():
    m = RooflineModel(get_device("H100"))
    k = Kernel("expert_act", 0.0, 3.35e12 * 0.8 * 1e-6, count=2)    # 1 µs of HBM traffic
    (f,) = fused_launches([k])
    assert f.fused and not k.fused
    assert m.time_s(k) == pytest.approx(2 * 4e-6 + 1e-6)
    assert m.time_s(f) == pytest.approx(1e-6)
    assert fused_launches([k], on=False) == [k]


def test_grouped_launches_save_one_set_per_later_expert():
    res, per = _experts_ops()
    _, grouped = _experts_ops("compute.expert_launches=grouped")
    launch = res.compute.launch_overhead_s                  # the cpu device's 10 µs
    assert len(per) == len(grouped) > 0
    checked = 0
    for a, b in zip(per, grouped, strict=True):
        assert (a.name, a.layer, a.microbatch) == (b.name, b.layer, b.microbatch)
        assert a.experts == b.experts and a.flops == b.flops   # the same work
        n = len(a.experts)
        # launches of one expert's kernels in this phase (the same for every token count)
        per_expert = sum(k.count for k in recipe.expert(TOY, 1, 1, a.phase))
        assert a.duration_s - b.duration_s == pytest.approx(
            (n - 1) * per_expert * launch, rel=1e-9, abs=1e-15)
        checked += n > 1
    assert checked > 0          # the toy's ranks hold 4 experts each: most ops have several


def test_serving_defaults_to_grouped_and_training_to_per_expert():
    from moesim.compute.select import grouped_experts
    from moesim.scenario.sections.serve import ServeConfig
    from moesim.serve.config import serving_scenario
    scn = load_scenario("toy-cpu", [])
    assert not grouped_experts(scn.compute)
    cfg = ServeConfig(phase="decode", batch_per_gpu=4, ep=2)
    assert grouped_experts(serving_scenario(scn, cfg).compute)
    mine = load_scenario("toy-cpu", ["compute.expert_launches=per_expert"])
    assert not grouped_experts(serving_scenario(mine, cfg).compute)    # the scenario's own


def test_bad_expert_launches_is_one_line():
    with pytest.raises(InputError) as ei:
        resolve(load_scenario("toy-cpu", ["compute.expert_launches=fused"]))
    assert ei.value.field.endswith("compute.expert_launches")
    p = subprocess.run([sys.executable, "-m", "moesim", "run", "toy-cpu", "--no-files",
                        "--set", "compute.expert_launches=fused"], capture_output=True,
                       text=True, check=False)
    assert p.returncode == 2
    assert "compute.expert_launches" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("sets", [
    [], ["memory.recompute=full"],
    ["schedule.kind=dualpipe", "parallel.pp=2", "cluster.params.gpus_per_node=4",
     "schedule.microbatches=4", "overlap.kind=static"]])
def test_grouped_training_step_fast_matches_exact(sets):
    # grouped launches in every expert phase (forward, backward, weight-gradient part,
    # recompute) of both engines: the fast path agrees with the exact engine as without
    from moesim.wiring import simulate
    out = {}
    for grouped in (False, True):
        for mode in ("exact", "fast"):
            extra = ["compute.expert_launches=grouped"] if grouped else []
            res = resolve(load_scenario("toy-cpu", [*sets, *extra, f"engine.mode={mode}"]))
            out[grouped, mode] = simulate(res).summary["step_time_s"]
    for grouped in (False, True):
        assert out[grouped, "fast"] == pytest.approx(out[grouped, "exact"], rel=2e-3)
    assert out[True, "exact"] < out[False, "exact"]      # fewer launches, same work
