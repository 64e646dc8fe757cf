"""CUDA graphs (overlap.cuda_graphs): captured kernels pay one graph launch instead of
one host launch each, and the device's graph floor per kernel; worked out by hand on the
toy model."""

from __future__ import annotations

import pytest

from moesim.errors import InputError
from moesim.model import PRESETS, costs
from moesim.program.build import build_step
from moesim.program.cuda_graphs import graphed
from moesim.scenario import load_scenario
from moesim.wiring import resolve

TOY = PRESETS["toy"]


def _plan(*sets):
    res = resolve(load_scenario("toy-cpu", list(sets)))
    return res, build_step(res)


def launches(ks):
    """Host launches: the kernels not replayed from a graph."""
    return sum(k.count for k in ks if not k.graphed)


def test_graphed_kernels_keep_their_work_and_launch_once():
    ks = costs.norm_kernels(TOY, 256) + costs.attention_kernels(TOY, 256, 128)
    g = graphed(ks)
    assert launches(ks) > 1 and launches(g) == 1
    assert sum(k.count for k in g if k.graphed) == launches(ks)   # each still runs
    assert sum(k.flops for k in g) == sum(k.flops for k in ks)
    assert sum(k.bytes for k in g) == sum(k.bytes for k in ks)


def test_graphed_kernel_pays_the_graph_floor_on_hopper():
    # gpu-benches' H200 graph replay: 65,536 bytes per kernel at 52 GB/s = 1.26 µs each
    from moesim.compute.base import Kernel
    from moesim.compute.devices import get_device
    from moesim.compute.roofline import RooflineModel
    h100 = get_device("H100")
    assert h100.graph_kernel_s == pytest.approx(65536 / 52e9)
    assert get_device("H800").graph_kernel_s == get_device("H200").graph_kernel_s == \
        h100.graph_kernel_s
    m = RooflineModel(h100)
    k = Kernel("norm", 0.0, 3.35e12 * 0.8 * 1e-6, count=3)     # 1 µs of HBM traffic
    g = graphed([k])
    assert m.time_s(k) == pytest.approx(3 * 4e-6 + 1e-6)
    assert m.time_s(g[0]) == pytest.approx(3 * 65536 / 52e9 + 1e-6)
    assert m.time_s(g[1]) == pytest.approx(4e-6)        # the graph's own host launch


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
        load_scenario("toy-cpu", ["overlap.cuda_graphs=[router]"])
    assert ei.value.field.endswith("overlap.cuda_graphs")
