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


def test_graphed_kernels_keep_their_work_and_launch_once():
    ks = costs.norm_kernels(TOY, 256) + costs.attention_kernels(TOY, 256, 128)
    g = graphed(ks)
    assert sum(k.count for k in ks) == 4 + 1 + 1 + 1        # norms, QKV, core, output
    assert sum(k.count for k in g) == 1
    assert sum(k.flops for k in g) == sum(k.flops for k in ks)


def test_attention_and_router_graphs_in_the_program():
    res, base = _plan()
    _, cg = _plan("overlap.cuda_graphs=[attn,moe_router]")
    launch = res.compute.launch_overhead_s          # the cpu device's 10 µs

    def dur(plan, name):
        return next(op.duration_s for op in plan.programs[0] if op.name == name)
    # forward attention: 7 launches become 1; backward: norms 4, QKV 2, core 1, output 2
    assert dur(base, "fwd.attn") - dur(cg, "fwd.attn") == pytest.approx(6 * launch)
    assert dur(base, "bwd.attn") - dur(cg, "bwd.attn") == pytest.approx(8 * launch)
    # router GEMM and top-k: 2 launches forward, 3 backward (the GEMM's dX and dW)
    assert dur(base, "fwd.router") - dur(cg, "fwd.router") == pytest.approx(1 * launch)
    assert dur(base, "bwd.router") - dur(cg, "bwd.router") == pytest.approx(2 * launch)


def test_unknown_graph_module_is_refused():
    with pytest.raises(InputError) as ei:
        load_scenario("toy-cpu", ["overlap.cuda_graphs=[router]"], resolve=False)
    assert ei.value.field.endswith("overlap.cuda_graphs")
