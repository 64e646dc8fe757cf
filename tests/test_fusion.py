"""Kernel fusion as a what-if (``compute.fusion``, moesim.model.kernels.fusion): figures
worked out by hand on tiny shapes, the knob's check, and the knob off = today's lists."""

from __future__ import annotations

import json
import math

import pytest

from moesim.cli import main
from moesim.compute.base import Kernel
from moesim.compute.catalog import CatalogModel
from moesim.compute.devices import get_device
from moesim.compute.memory_kernels import FUSIONS
from moesim.compute.roofline import RooflineModel
from moesim.compute.select import parse, shipped_catalog
from moesim.errors import InputError
from moesim.model.costs import lm_head_kernels, norm_kernels
from moesim.model.kernels.fusion import fuse
from moesim.model.kernels.linear import CAST_TOKEN, cast_bytes
from moesim.model.kernels.make import mem, residual_add, rmsnorm
from moesim.model.kernels.moe import ffn_kernels, permute_kernels
from moesim.model.presets import TOY
from moesim.program import recipe
from moesim.program.inventory import PASSES, layer_ops
from moesim.scenario import load_scenario
from moesim.wiring import resolve, simulate

H100 = get_device("H100")


def _cast(rows: int, cols: int):
    return mem(CAST_TOKEN, cast_bytes(rows, cols), "fwd", "cast")


# ------------------------------------------------------------------ pairs by hand
def test_norm_cast_pair_by_hand():
    # RMSNorm 4 x 256: reads x, writes y (2 B each) and 1/rms (4 B per row):
    # 4·1024 + 16 = 4112 B; the cast reads y (2 B) and writes FP8 + a 4 B scale per 128:
    # 1024 · 3.03125 = 3104 B; fused, y is neither written nor read: 4112 + 3104 − 4·1024
    norm, cast = rmsnorm(4, 256, "fwd"), _cast(4, 256)
    assert (norm.bytes, cast.bytes) == (4112.0, 3104.0)
    (k,) = fuse([norm, cast], ["norm_cast"])
    assert k.bytes == 3120.0 and k.count == 1 and k.kind == "memory"
    assert k.name == "norm_cast" and k.kclass == "norm" and k.flops == 4096.0
    # priced as a norm of its bytes: Liger's/Megatron's RMSNorm rows (memory_kernels)
    m = CatalogModel(RooflineModel(H100, precision="bf16", launch_overhead_s=4e-6),
                     tuple(shipped_catalog()), memory_kernels="fused")
    as_norm = m.price(Kernel("norm", 0.0, 3120.0, kind="memory", pass_="fwd", kclass="norm"))
    got = m.price(k)
    assert "rmsnorm" in got.detail and math.isclose(got.time_s, as_norm.time_s)
    before = m.price(norm).time_s + m.price(cast).time_s
    assert got.time_s < before
    # two launches became one: 4 µs of the difference is the launch saved
    assert before - got.time_s > 4e-6


def test_residual_norm_forward_and_backward_by_hand():
    r, c = 8, 64
    e = r * c
    fwd = [residual_add(r, c, "fwd"), rmsnorm(r, c, "fwd")]
    (k,) = fuse(fwd, ["residual_norm"])
    # forward: the norm's read of the sum (2 B per element) is saved; the sum is written
    assert k.bytes == 6 * e + (4 * e + 4 * r) - 2 * e and k.name == "add_norm"
    bwd = [rmsnorm(r, c, "bwd"), residual_add(r, c, "bwd")]
    (b,) = fuse(bwd, ["residual_norm"])
    # backward: the norm's dx (2 B) is neither written nor read by the add: 4 B per element
    assert b.bytes == (6 * e + 4 * r) + 6 * e - 4 * e and b.name == "norm_add_bwd"
    assert b.pass_ == "dgrad" and b.count == 1


def test_a_layers_norms_and_adds_pair_two_by_two():
    spec = TOY
    fwd = fuse(norm_kernels(spec, 128, 1, "fwd"), ["residual_norm"])
    assert [k.name for k in fwd] == ["add_norm", "add_norm"]   # the last add: next layer's
    bwd = fuse(norm_kernels(spec, 128, 1, "bwd"), ["residual_norm"])
    assert [k.name for k in bwd] == ["norm_add_bwd", "norm_add_bwd"]


def test_act_cast_and_permute_cast_by_hand():
    spec = TOY
    # a dense FFN in FP8: cast X, fc1, SwiGLU (BF16 out), cast, fc2
    ks = ffn_kernels(spec, 16, 32, "dense", "fwd", True)
    assert [k.name for k in ks] == [CAST_TOKEN, "dense_gemm", "dense_act", CAST_TOKEN,
                                    "dense_gemm"]
    act, cast = ks[2], ks[3]
    out = fuse(ks, ["act_cast"])
    assert [k.name for k in out] == [CAST_TOKEN, "dense_gemm", "dense_act", "dense_gemm"]
    assert out[2].bytes == act.bytes + cast.bytes - 4 * 16 * 32 and out[2].kclass == "cast"
    # the dispatch cast (t x h) and the FP8 permutation of its top-k copies
    t, h = 16, spec.hidden
    perm = permute_kernels(spec, t * spec.top_k, "fwd", True)[0]
    (p,) = fuse([_cast(t, h), perm], ["permute_cast"])
    assert p.bytes == cast_bytes(t, h) + perm.bytes - 2 * (1 + 4 / 128) * t * h
    assert p.name == "permute_cast" and p.kclass == "permute"


def test_ce_chunked_by_hand():
    spec = TOY
    t, v = 8, spec.vocab
    fwd = fuse(lm_head_kernels(spec, t, 1, "fwd"), ["ce_chunked"])
    loss = fwd[-1]
    # reads the BF16 logits and writes their BF16 gradient: 4 B per logit, not 2 + 4
    assert loss.name == "loss_chunked" and loss.bytes == 4 * t * v
    bwd = fuse(lm_head_kernels(spec, t, 1, "bwd"), ["ce_chunked"])
    assert "loss_bwd" not in [k.name for k in bwd]
    assert len(bwd) == len(lm_head_kernels(spec, t, 1, "bwd")) - 1


# ------------------------------------------------------------------ the knob
def test_unknown_fusion_is_refused_in_one_line(capsys):
    with pytest.raises(InputError, match=r"compute\.fusion.*residual_norm"):
        parse({"fusion": ["norm_cast", "fold_everything"]}, "s")
    assert parse({"fusion": "norm_cast, residual_norm"}, "s").fusion == ("norm_cast",
                                                                          "residual_norm")
    assert main(["kernels", "toy-cpu", "--set", "compute.fusion=bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "compute.fusion" in err and "norm_cast" in err


def test_fusion_off_leaves_every_op_list_as_it_was():
    assert fuse(lst := [rmsnorm(4, 256, "fwd"), _cast(4, 256)], []) is lst
    off = resolve(load_scenario("deepseek-v3-1024-h100"))
    empty = resolve(load_scenario("deepseek-v3-1024-h100", ["compute.fusion=[]"]))
    assert off.model == empty.model and off.model.fusion == ()
    for p in PASSES:
        assert layer_ops(off, 3, p) == layer_ops(empty, 3, p)
    on = resolve(load_scenario("deepseek-v3-1024-h100", ["compute.fusion=" + ",".join(FUSIONS)]))
    assert layer_ops(on, 3, "fwd") != layer_ops(off, 3, "fwd")
    # the recipe is where it applies: the same op, fused or not
    spec = on.model
    assert recipe.attn(spec, 64, 64, 1, "fwd") == fuse(
        recipe.attn(off.model, 64, 64, 1, "fwd"), FUSIONS)


def test_both_engines_step_shrinks_by_the_hand_worked_amount():
    # toy-cpu: 2 layers, 2 micro-batches of 128 tokens, hidden 512, BF16, the CPU
    # device's roofline: 24 GB/s · 0.8 = 19.2 GB/s, 10 µs per launch. residual_norm per
    # layer and micro-batch: forward 2 pairs each saving 2·128·512 B and a launch,
    # backward 2 pairs each saving 4·128·512 B and a launch
    e, bw, launch = 128 * 512, 19.2e9, 10e-6
    per_layer = 2 * (2 * e / bw + launch) + 2 * (4 * e / bw + launch)
    expected = 2 * 2 * per_layer                     # 323.84 µs
    assert math.isclose(expected, 323.84e-6, rel_tol=1e-12)
    for engine in ("fast", "exact"):
        off = simulate("toy-cpu", engine=engine).summary["step_time_s"]
        on = simulate("toy-cpu", ["compute.fusion=residual_norm"],
                      engine=engine).summary["step_time_s"]
        assert math.isclose(off - on, expected, rel_tol=1e-9), engine


def test_moesim_kernels_shows_unfused_and_fused_side_by_side(capsys):
    assert main(["kernels", "toy-cpu", "--fusion", "residual_norm", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ops = {(r["pass"], r["op"]): r for r in doc["fusion"]["ops"]}
    e = 128 * 512                          # toy-cpu: 128 tokens, hidden 512, one rank
    fwd, bwd = ops[("fwd", "fwd.attn")], ops[("dgrad", "bwd.attn")]
    assert (fwd["bytes_saved"], fwd["launches_saved"]) == (2 * 2 * e, 2)
    assert (bwd["bytes_saved"], bwd["launches_saved"]) == (2 * 4 * e, 2)
    # the CPU roofline: 19.2 GB/s, 10 µs per launch
    assert math.isclose(fwd["unfused_s"] - fwd["fused_s"], 4 * e / 19.2e9 + 2 * 10e-6)
    assert ops[("fwd", "memory-bound")]["bytes_saved"] == 4 * e
    assert ops[("fwd", "fwd.router")]["bytes_saved"] == 0
    assert main(["kernels", "toy-cpu", "--fusion", "residual_norm", "--pass", "fwd"]) == 0
    out = capsys.readouterr().out
    assert "fusion residual_norm: layer" in out and "unfused us" in out
    assert main(["kernels", "toy-cpu", "--pass", "fwd"]) == 0
    assert "unfused" not in capsys.readouterr().out
