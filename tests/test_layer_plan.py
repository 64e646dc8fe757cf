"""A layer's op order is written once (moesim.program.layer_plan): the exact builder and
the fast engine's chains walk the same template, so a step added to it or two steps
swapped in it change both engines alike, and neither writer restates the order.

Hand figures: toy-cpu shrunk to one rank (tp = pp = ep = dp = 1, no communication) runs
its 2 MoE layers x 2 micro-batches forward and backward on one compute stream, so every
attention op is on the critical path. With the attention op made of one kernel of a
made-up kind registered at 1 ms of work (:mod:`moesim.compute.kinds`), a second
attention step added to the template after the first lengthens the step by
8 x (1 ms + one launch) on either engine.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from moesim.compute import kinds
from moesim.compute.base import Kernel
from moesim.model.presets import DEEPSEEK_V3
from moesim.program import inventory, layer_plan, recipe
from moesim.program.build import build_step
from moesim.program.layer_plan import LayerPlan, layer_steps, moe_block
from moesim.wiring import resolve_path, simulate

ROOT = Path(__file__).resolve().parents[1]
#: the modules that write or price a layer's ops: they walk the template
WALKERS = ("moesim/program/build.py", "moesim/program/dualpipe_build.py",
           "moesim/engine/fast/pipeline.py", "moesim/engine/fast/forward.py",
           "moesim/engine/fast/dual.py", "moesim/serve/program.py")
#: the recipe's functions of a layer's ops (embedding, heads and optimizer are not a layer's)
LAYER_OPS = {"attn", "attn_op", "attn_w", "dense_ffn", "router", "expert", "expert_post",
             "post_op", "shared_part", "mtp_head", "mlp_w", "recompute_op",
             "recompute_layer"}


def _one_rank():
    res = resolve_path(ROOT / "scenarios" / "toy-cpu.yaml",
                       ["cluster.params.gpus_per_node=1", "parallel.ep=1",
                        "cluster.device=H100"])     # the kernel catalog prices on an H100
    assert res.layout.world == 1
    return res


def _names(steps) -> list[str]:
    """The op names a template's steps write on one rank, the MoE block's inlined."""
    out = []
    for st in steps:
        out += _names(st.block) if st.kind == "moe" else [st.name]
    return out


# ------------------------------------------------------------------ the templates
def test_the_forward_and_backward_of_an_moe_layer():
    assert _names(layer_steps(True, False, "fwd")) == [
        "fwd.attn", "fwd.tp_attn", "fwd.router", "fwd.dispatch", "fwd.experts",
        "fwd.combine", "fwd.unpermute", "fwd.tp_mlp"]
    assert _names(layer_steps(True, False, "bwd")) == [
        "bwd.recompute", "bwd.tp_mlp", "bwd.unpermute", "bwd.combine",
        "bwd.recompute_experts", "bwd.experts", "bwd.dispatch", "bwd.router",
        "bwd.tp_attn", "bwd.attn"]


def test_folded_parallelism_and_zero3_fold_into_the_order():
    fwd = layer_steps(False, True, "fwd", zero3=True, cp=True)
    assert _names(fwd) == ["fwd.zero3_gather", "fwd.attn", "fwd.tp_attn", "fwd.ffn",
                           "fwd.tp_mlp", "fwd.mtp"]
    assert fwd[1].cp
    bwd = moe_block("bwd", side=True, etp=True)
    assert _names(bwd) == ["bwd.unpermute", "bwd.combine", "bwd.etp_gather",
                           "bwd.recompute_experts", "bwd.experts", "bwd.etp_scatter",
                           "bwd.dispatch", "bwd.router"]
    # the shared experts' parts beside the pass's first and second all-to-all
    assert [(s.name, s.beside) for s in bwd if s.kind == "a2a"] == [
        ("bwd.combine", 0), ("bwd.dispatch", 1)]
    assert _names(layer_steps(True, True, "W")) == ["bwd.w_mtp", "bwd.w_mlp",
                                                    "bwd.w_experts", "bwd.w_attn"]


def test_a_plan_makes_each_template_once_per_layer_kind_and_phase():
    spec = DEEPSEEK_V3                  # 3 dense layers, then MoE
    plan = LayerPlan(spec)
    assert plan.steps(0, "fwd") is plan.steps(1, "fwd")
    assert plan.steps(5, "bwd") is plan.steps(60, "bwd")
    assert plan.steps(0, "fwd") is not plan.steps(5, "fwd")
    assert plan.steps(5, "fwd")[2].block == plan.moe("fwd")


# ------------------------------------------------------------------ both engines follow it
@pytest.mark.parametrize("engine", ["exact", "fast"])
def test_a_step_added_to_the_template_reaches_both_engines(engine, monkeypatch):
    res = _one_rank()
    secs = 1e-3
    made_up = Kernel("made_up", 0.0, 0.0, kind="made_up")    # one launch
    monkeypatch.setattr(recipe, "attn", lambda *a, **k: [made_up])
    steps = layer_plan.layer_steps

    def again(moe, mtp, phase, **kw):        # a second attention right after the first
        out = steps(moe, mtp, phase, **kw)
        i = next((i for i, s in enumerate(out) if s.kind == "attn"), None)
        if phase == "W" or i is None:
            return out
        return (*out[:i + 1], replace(out[i], name=f"{phase}.attn_again"), *out[i + 1:])

    with kinds.registered_kind("made_up", kinds.fixed_price(secs)):
        before = simulate(res, engine=engine).step_time_s
        monkeypatch.setattr(layer_plan, "layer_steps", again)
        after = simulate(res, engine=engine).step_time_s
    layers, mbs, phases = 2, 2, 2          # toy: 2 layers; 2 micro-batches; fwd and bwd
    per_op = secs + res.device.launch_overhead_s      # its work and its one launch
    assert after - before == pytest.approx(layers * mbs * phases * per_op, rel=1e-9)


def test_two_steps_swapped_in_the_template_swap_in_both_engines(monkeypatch):
    res = _one_rank()
    block = layer_plan.moe_block

    def swapped(phase, **kw):                # the router after the unpermute (made up)
        out = block(phase, **kw)
        return (out[-1], *out[1:-1], out[0])

    monkeypatch.setattr(layer_plan, "moe_block", swapped)
    want = ["fwd.attn", "fwd.unpermute", "fwd.dispatch", "fwd.experts", "fwd.combine",
            "fwd.router", "bwd.router", "bwd.combine", "bwd.experts", "bwd.dispatch",
            "bwd.unpermute", "bwd.attn"]
    prog = build_step(res).programs[0]
    assert [o.name for o in prog if o.layer == 0 and o.microbatch == 0] == want
    spans = simulate(res, engine="fast").spans
    assert [s.name for s in spans if s.rank == 0 and s.layer == 0 and s.microbatch == 0
            and s.kind != "stall"] == want
    # the kernel inventory (``moesim kernels``, kernel-class validation) lists the
    # template's compute steps in the template's order
    computes = [n for n in want if not n.endswith(("dispatch", "combine"))]
    assert [o.op for o in inventory.layer_ops(res, 0, "fwd")] == computes[:4]
    assert [o.op for o in inventory.layer_ops(res, 0, "dgrad")] == computes[4:]


# ------------------------------------------------------------------ nobody restates it
def _recipe_calls(tree: ast.Module) -> set[str]:
    """Names of the recipe's functions called or named as ``recipe.<name>``."""
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "recipe"}


def _layer_op_names() -> set[str]:
    """Every op name the templates write (``fwd.attn``, ``bwd.w_experts`` ...)."""
    names = set()
    for moe in (False, True):
        for mtp in (False, True):
            for phase in ("fwd", "bwd", "W"):
                names |= set(_names(layer_steps(moe, mtp, phase, zero3=True, cp=True,
                                                side=True, etp=True)))
    return names


def test_the_layers_writers_take_order_and_kernels_from_the_template():
    names = _layer_op_names()
    assert {"fwd.attn", "bwd.router", "fwd.dispatch", "bwd.w_attn", "fwd.etp_gather"} <= names
    for path in WALKERS:
        tree = ast.parse((ROOT / path).read_text(), filename=path)
        assert not _recipe_calls(tree) & LAYER_OPS, (path, _recipe_calls(tree) & LAYER_OPS)
        literals = {n.value for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not literals & names, (path, literals & names)


def test_the_checker_sees_a_restated_layer(tmp_path):
    tree = ast.parse("def f(c):\n    c.op('fwd.router', recipe.router(c))\n")
    assert _recipe_calls(tree) & LAYER_OPS == {"router"}
    assert {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)} & \
        _layer_op_names() == {"fwd.router"}


def test_zero3_gathers_over_dp_times_cp_in_both_engines():
    """ZeRO-3 shards the dense weights over DP x CP (Megatron-Core's data-parallel group
    with context parallelism), so DP = 1 with CP = 2 still gathers: the template has its
    gather step and both engines spend the same seconds waiting on it."""
    over = ["model.layers=2", "schedule.microbatches=1", "parallel.tp=4", "parallel.cp=2",
            "parallel.ep=8", "parallel.zero=3"]
    res = resolve_path("mixtral-8x7b-ep8", over)
    assert (res.layout.dp, res.layout.cp) == (1, 2)
    plan = build_step(res)
    names = {op.name for op in plan.programs[0]}
    assert any("zero3_gather" in n for n in names)
    exact = simulate("mixtral-8x7b-ep8", over, engine="exact").summary["breakdown_s"]["zero"]
    fast = simulate("mixtral-8x7b-ep8", over, engine="fast").summary["breakdown_s"]["zero"]
    assert exact > 0
    assert exact == pytest.approx(fast, rel=1e-9)
