"""MLA under sequence parallelism, worked by hand (a 1-layer MLA toy: hidden 512,
q_lora 256, kv_lora 128, RoPE key 32; TP 2 on two H100s joined by one 100 GB/s NVLink
switch, 1 us a link; 512 tokens a micro-batch, 2 micro-batches).

Megatron-LM d98e8a6 ``multi_latent_attention.py``: with ``sequence_parallel`` the
down-projections run on the rank's 256-token shard, the latents (256 + 128 + 32
features) are all-gathered instead of the hidden state (512), and ``mla_up_proj``'s
recompute re-runs the latent norms inside Transformer Engine's LayerNormLinear."""

from __future__ import annotations

from dataclasses import replace

import pytest

from moesim.engine.api import simulate
from moesim.model import costs
from moesim.program import recipe
from moesim.program.build import Builder
from moesim.program.folding import attn_input_width, sp_exchange
from moesim.scenario import load_scenario
from moesim.wiring import resolve
from tests._util import two_gpu_scenario

MLA = {"attention": "mla", "q_lora_rank": 256, "kv_lora_rank": 128, "qk_rope_dim": 32,
       "qk_nope_dim": 64, "v_head_dim": 64, "head_dim": 96}
T, H = 512, 512


def mla_res(tmp_path, sp: bool, mode: str = "exact", recompute: bool = False,
            sets: tuple[str, ...] = ()):
    tmp_path.mkdir(parents=True, exist_ok=True)
    over = dict(model={"preset": "toy", "layers": 1, **MLA},
                parallel={"tp": 2, "pp": 1, "ep": 1, "sequence_parallel": sp},
                schedule={"microbatches": 2, "seq_len": T}, engine={"mode": mode})
    if recompute:
        over["memory"] = {"recompute": "selective", "recompute_modules": ["mla_up_proj"]}
    return resolve(load_scenario(two_gpu_scenario(tmp_path, **over), list(sets)))


def test_down_projections_on_the_shard_by_hand(tmp_path):
    spec = mla_res(tmp_path, True).model
    for sp, rows in ((True, 256), (False, 512)):
        ks = costs.attention_kernels(spec, T, T, 2, "fwd", sp)
        down = [(k.m, k.n, k.k, k.flops) for k in ks if k.name == "attention_gemm" and k.k == H]
        # q_a: 512 -> 256, kv_a: 512 -> 128 + 32; 2·m·n·k FLOPs each
        assert down == [(rows, 256, H, 2 * rows * 256 * H), (rows, 160, H, 2 * rows * 160 * H)]
    # backward: dgrad and wgrad of both on the shard, 2·m·n·k each: SP saves 256 rows' worth
    bwd = {sp: sum(k.flops for k in costs.attention_kernels(spec, T, T, 2, "bwd", sp)
                   if k.name.startswith("attention_gemm")) for sp in (True, False)}
    assert bwd[False] - bwd[True] == 2 * (2 * 256 * 256 * H + 2 * 256 * 160 * H)
    # the up-projections stay on all 512 tokens (after the gather)
    ks = costs.attention_kernels(spec, T, T, 2, "fwd", True)
    # (q_b: 256 -> 4 heads x 96, kv_b: 128 -> 4 heads x (64 + 64), the output projection)
    assert [(k.m, k.n, k.k) for k in ks if k.name == "attention_gemm" and k.k != H] == \
        [(T, 384, 256), (T, 512, 128), (T, H, 256)]


def test_latent_all_gather_bytes_by_hand(tmp_path):
    res = mla_res(tmp_path, True)
    assert attn_input_width(res.model) == 256 + 128 + 32
    b = Builder(res, 0)
    got = {(ph, w): [(t.name, t.nbytes) for t in b.folded.tp_reduce(0, 0, 0, ph, w)]
           for ph in ("fwd", "bwd") for w in ("attn", "mlp")}
    # the MoE layer's reduce-scatter of the attention output: T·h·2 B; the all-gather in
    # front of the next attention (and its backward twin): T·(256 + 128 + 32)·2 B
    assert got[("fwd", "attn")] == [("fwd.sp_attn_reduce_scatter", T * H * 2)]
    assert got[("fwd", "mlp")] == [("fwd.sp_mlp_all_gather", T * 416 * 2)] == \
        [("fwd.sp_mlp_all_gather", 425984)]
    assert got[("bwd", "attn")] == [("bwd.sp_attn_reduce_scatter", T * H * 2)]
    assert got[("bwd", "mlp")] == [("bwd.sp_mlp_all_gather", 425984)]


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_step_tp_time_by_hand(tmp_path, mode):
    # 2 micro-batches x (forward + backward) x (reduce-scatter of 524288 B + all-gather
    # of 425984 B); two ranks: each sends half over its link and the switch's (100 GB/s,
    # 1 us each)
    s = simulate(mla_res(tmp_path, True, mode)).summary
    per = [2e-6 + (T * H * 2 / 2) / 100e9, 2e-6 + (425984 / 2) / 100e9]
    assert s["breakdown_s"]["tp"] == pytest.approx(4 * sum(per), rel=1e-9)


def test_recompute_adds_the_latent_norms_by_hand(tmp_path):
    spec = mla_res(tmp_path, True).model
    mods = frozenset({"mla_up_proj"})

    def norms(sp, tp=2):
        ks = recipe.recompute_layer(spec, 0, mods, tokens=T, seq_len=T, tp=tp, ep_tokens=256,
                                    sent=512, sp=sp)
        return [k.bytes for k in ks if k.name == "recompute.norm"]
    # RMSNorm forward on the 256-row shard: 2·2·rows·d + 4·rows
    assert norms(True) == [4 * 256 * 256 + 4 * 256, 4 * 256 * 128 + 4 * 256]
    # without SP (or at TP 1) on all 512 rows: the source recomputes them at any TP
    full = [4 * 512 * 256 + 4 * 512, 4 * 512 * 128 + 4 * 512]
    assert norms(False) == full and norms(True, tp=1) == full


@pytest.mark.parametrize("recompute,sets", [(False, ()), (True, ()),
                                             (False, ("overlap.tp_comm=true",))])
def test_exact_and_fast_agree(tmp_path, recompute, sets):
    # the MLA TP 2 SP step, plain, with mla_up_proj's recompute, and with TE's TP overlap
    out = {}
    for mode in ("exact", "fast"):
        s = simulate(mla_res(tmp_path / mode, True, mode, recompute, sets)).summary
        out[mode] = (s["step_time_s"], s["breakdown_s"]["compute"], s["breakdown_s"]["tp"])
    assert out["fast"] == pytest.approx(out["exact"], rel=1e-9)


def test_dense_layer_exchanges_by_hand(tmp_path):
    # a dense MLA layer keeps both collectives of each exchange: after attention the
    # reduce-scatter and the MLP input's all-gather (hidden, 524288 B); after the MLP the
    # reduce-scatter (hidden) and the next attention's all-gather of the latents (425984 B),
    # in the backward that gather's reduce-scatter first
    spec = replace(mla_res(tmp_path, True).model, first_dense_layers=1)
    assert not spec.is_moe_layer(0)
    h, lat = float(T * H * 2), 425984.0
    for ph in ("fwd", "bwd"):
        assert sp_exchange(spec, T, 0, ph, "attn", False) == (("reduce_scatter", h),
                                                             ("all_gather", h))
    assert sp_exchange(spec, T, 0, "fwd", "mlp", False) == (("reduce_scatter", h),
                                                           ("all_gather", lat))
    assert sp_exchange(spec, T, 0, "bwd", "mlp", False) == (("reduce_scatter", lat),
                                                           ("all_gather", h))
    # GQA: the hidden state everywhere, as before
    gqa = replace(spec, attention="gqa")
    assert attn_input_width(gqa) == H
    assert sp_exchange(gqa, T, 0, "fwd", "mlp", False)[1] == ("all_gather", h)
