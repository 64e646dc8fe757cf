"""Multi-token prediction (model.mtp_layers): one more layer per depth, with its projection,
output head and loss, on the last stage; FLOPs and memory worked out by hand."""

from __future__ import annotations

import pytest

from moesim.memory.report import memory_table
from moesim.model import PRESETS, costs, mtp
from moesim.program.build import build_step
from moesim.scenario import load_scenario
from moesim.wiring import resolve

TOY = PRESETS["toy"]            # 2 MoE layers, h 512, 8 experts top-2, f 1024, vocab 32000
BASE = ["parallel.pp=2", "parallel.ep=1", "schedule.microbatches=2"]


def plan(*sets):
    res = resolve(load_scenario("toy-cpu", [*BASE, *sets]))
    return res, build_step(res)


def flops(ks):
    return sum(k.flops for k in ks)


def test_mtp_adds_one_layer_and_a_head_per_depth_on_the_last_stage():
    res, p0 = plan()
    _, p1 = plan("model.mtp_layers=1")
    T, S, m = res.scenario.schedule.tokens_per_microbatch, res.scenario.schedule.seq_len, 2
    k = TOY.top_k

    def layer(phase):   # one MoE layer of the toy, every routed token kept
        return flops(costs.norm_kernels(TOY, T, 1, phase)
                     + costs.attention_kernels(TOY, T, S, 1, phase)
                     + costs.router_kernels(TOY, T, phase)
                     + costs.permute_kernels(TOY, T * k, phase)
                     + costs.unpermute_kernels(TOY, T * k, phase)
                     + costs.expert_kernels(TOY, T * k, phase))
    head = flops(mtp.head_kernels(TOY, T, 1, "fwd") + mtp.head_kernels(TOY, T, 1, "bwd"))
    assert p1.model_flops - p0.model_flops == pytest.approx(
        m * (layer("fwd") + layer("bwd") + head), rel=1e-9)
    # the MTP layer (index 2) and its head sit on the last stage (rank 1) only
    assert {op.layer for op in p1.programs[1] if op.name == "fwd.mtp"} == {2}
    assert not any(op.name.endswith(".mtp") or op.layer == 2 for op in p1.programs[0])
    assert p1.moe_layers == [0, 1, 2]


def test_mtp_memory_on_the_last_stage_by_hand():
    r0, _ = plan()
    r1, _ = plan("model.mtp_layers=1")
    a, b = memory_table(r0)["stages"], memory_table(r1)["stages"]
    assert a[0]["weights"] == b[0]["weights"]
    h, V = TOY.hidden, TOY.vocab
    layer = b[1]["dense_params"] - a[1]["dense_params"] - (2 * h * h + 3 * h) - V * h
    # the extra dense parameters are one layer's attention, norms and router
    assert layer == 4 * h * h + 2 * h + h * TOY.n_experts
    assert b[1]["expert_params"] - a[1]["expert_params"] == 8 * 3 * h * 1024


def test_mtp_with_dualpipe_counts_the_same_flops():
    # DualPipeV splits the MTP head's backward into B (dgrad) and W (wgrad): the step's
    # model FLOPs grow by exactly what they grow by under 1F1B
    four = ["model.layers=4", "schedule.microbatches=4"]

    def grow(kind):
        _, a = plan(*four, f"schedule.kind={kind}")
        _, b = plan(*four, f"schedule.kind={kind}", "model.mtp_layers=1")
        return b.model_flops - a.model_flops
    assert grow("dualpipev") == pytest.approx(grow("1f1b"), rel=1e-12)
    _, b = plan(*four, "schedule.kind=dualpipev", "model.mtp_layers=1")
    names = {op.name for prog in b.programs for op in prog}
    assert {"fwd.mtp", "bwd.mtp", "bwd.w_mtp"} <= names
