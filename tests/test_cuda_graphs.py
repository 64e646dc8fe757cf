"""CUDA graphs (overlap.cuda_graphs): captured kernels pay one graph launch instead of
one launch each; worked out by hand on the toy model."""

from __future__ import annotations

import pytest

from moesim.errors import InputError
from moesim.model import PRESETS, costs
from moesim.program.build import build_step
from moesim.program.cuda_graphs import graphed
from moesim.scenario import load_scenario, resolve

TOY = PRESETS["toy"]


def _plan(*sets):
    res = resolve(load_scenario("toy-cpu", list(sets), resolve=False))
    return res, build_step(res)


def launches(ks):
    return sum(k.count for k in ks)


def test_graphed_kernels_keep_their_work_and_launch_once():
    ks = costs.norm_kernels(TOY, 256) + costs.attention_kernels(TOY, 256, 128)
    g = graphed(ks)
    assert launches(ks) > 1 and launches(g) == 1
    assert sum(k.flops for k in g) == sum(k.flops for k in ks)
    assert sum(k.bytes for k in g) == sum(k.bytes for k in ks)


def test_attention_and_router_graphs_in_the_program():
    res, base = _plan()
    _, cg = _plan("overlap.cuda_graphs=[attn,moe_router]")
    launch = res.compute.launch_overhead_s          # the cpu device's 10 µs
    T, S = res.scenario.schedule.tokens_per_microbatch, res.scenario.schedule.seq_len

    def dur(plan, name):
        return next(op.duration_s for op in plan.programs[0] if op.name == name)
    # n launches of the attention block (norms, residual adds, projections, core) become 1
    for phase in ("fwd", "bwd"):
        n = launches(costs.norm_kernels(TOY, T, 1, phase)
                     + costs.attention_kernels(TOY, T, S, 1, phase))
        assert dur(base, f"{phase}.attn") - dur(cg, f"{phase}.attn") == pytest.approx(
            (n - 1) * launch)
        r = launches(costs.router_kernels(TOY, T, phase))   # router GEMM(s) and top-k
        assert dur(base, f"{phase}.router") - dur(cg, f"{phase}.router") == pytest.approx(
            (r - 1) * launch)


def test_unknown_graph_module_is_refused():
    with pytest.raises(InputError) as ei:
        load_scenario("toy-cpu", ["overlap.cuda_graphs=[router]"], resolve=False)
    assert ei.value.field.endswith("overlap.cuda_graphs")
