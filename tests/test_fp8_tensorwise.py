"""``compute.fp8_recipe: tensorwise``: Transformer Engine's per-tensor current scaling
around the FP8 GEMMs (moesim.model.kernels.tensorwise), worked by hand.

One quantised rows × cols BF16 tensor: ``amax_kernel`` reads 2 bytes per element (and
writes a 4-byte amax), ``compute_scale_from_amax_kernel`` reads the amax and writes the
scale (8 bytes), ``cast_transpose_kernel`` reads 2 bytes and writes 1 row-wise and 1
transposed per element (and reads the scale, writes the inverse: 8 bytes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from moesim.compute.select import parse
from moesim.errors import InputError
from moesim.model.kernels import tensorwise as T
from moesim.model.kernels.linear import linear
from moesim.model.kernels.moe import expert_kernels, router_kernels, shared_expert_kernels
from moesim.model.presets import PRESETS
from moesim.program.inventory import layer_ops
from moesim.scenario import load_scenario
from moesim.wiring import resolve

ROOT = Path(__file__).resolve().parents[1]
DS1024 = ROOT / "scenarios" / "deepseek-v3-1024-h100.yaml"


def names(ks):
    return [k.name for k in ks]


def test_one_tensor_is_three_kernels():
    amax, scale, ct = T.quantize(4096, 7168, "fwd")
    e = 4096 * 7168
    assert (amax.name, scale.name, ct.name) == (T.AMAX, T.SCALE, T.CAST_T)
    assert amax.bytes == 2 * e + 4
    assert scale.bytes == 8
    assert ct.bytes == 4 * e + 8
    assert {k.kclass for k in (amax, scale, ct)} == {"cast"}


def test_a_linear_forward_and_backward():
    m, n, k = 4096, 2048, 7168
    fwd = linear("dense_gemm", m, n, k, "fwd", True, recipe="tensorwise")
    assert names(fwd) == [T.AMAX, T.SCALE, T.CAST_T, "dense_gemm"]
    assert fwd[0].bytes == 2 * m * k + 4                  # X, m x k
    bwd = linear("dense_gemm", m, n, k, "bwd", True, recipe="tensorwise")
    # dY quantised once for both GEMMs; no weight transpose, no per-channel casts
    assert names(bwd) == [T.AMAX, T.SCALE, T.CAST_T, "dense_gemm_dgrad", "dense_gemm_wgrad"]
    assert bwd[2].bytes == 4 * m * n + 8                  # dY, m x n
    # the same GEMMs as the blockwise recipe's
    block = linear("dense_gemm", m, n, k, "bwd", True)
    gemms = [x for x in block if x.kind == "gemm"]
    assert [x for x in bwd if x.kind == "gemm"] == gemms
    # bf16: the recipe changes nothing
    assert linear("g", m, n, k, "bwd", False, recipe="tensorwise") == linear("g", m, n, k,
                                                                            "bwd", False)


def test_experts_quantise_their_own_inputs_and_nothing_before_the_dispatch():
    import dataclasses
    spec = dataclasses.replace(PRESETS["deepseek-v3"], precision="fp8",
                               fp8_recipe="tensorwise")
    block = dataclasses.replace(spec, fp8_recipe="blockwise")
    rows, h, ffn = 4096, spec.hidden, spec.expert_ffn
    fwd = expert_kernels(spec, rows, "fwd", True)
    assert names(fwd) == [T.AMAX, T.SCALE, T.CAST_T, "expert_gemm", "expert_act",
                          T.AMAX, T.SCALE, T.CAST_T, "expert_gemm"]
    assert fwd[0].bytes == 2 * rows * h + 4               # the dispatched BF16 rows
    assert fwd[5].bytes == 2 * rows * ffn + 4             # the SwiGLU's BF16 output
    act = fwd[4]
    assert act.kclass == "elementwise"                    # no cast fused into it
    assert act.bytes == 2 * 2 * rows * ffn + 2 * rows * ffn
    # the blockwise recipe's experts take FP8 rows and cast inside the SwiGLU
    assert names(expert_kernels(block, rows, "fwd", True)) == ["expert_gemm", "expert_act",
                                                               "expert_gemm"]
    # the router casts nothing for the dispatch under tensorwise; blockwise does
    assert "per_token_cast_to_fp8" not in names(router_kernels(spec, rows, "fwd", True))
    assert "per_token_cast_to_fp8" in names(router_kernels(block, rows, "fwd", True))
    shared = shared_expert_kernels(spec, rows, 1, "fwd", True)
    assert names(shared)[:4] == [T.AMAX, T.SCALE, T.CAST_T, "shared_gemm"]


def _layer(*sets):
    res = resolve(load_scenario(DS1024, list(sets)))
    layer = next(i for i in range(res.model.layers) if res.model.is_moe_layer(i))
    return res, {p: [k for o in layer_ops(res, layer, p) for k in o.kernels]
                 for p in ("fwd", "dgrad", "wgrad")}


def test_the_scenario_reaches_the_inventory():
    res, ks = _layer("compute.fp8_recipe=tensorwise")
    assert res.model.fp8_recipe == "tensorwise"
    every = [k.name for p in ks.values() for k in p]
    assert T.AMAX in every and T.CAST_T in every
    assert not {"per_token_cast_to_fp8", "per_channel_cast_and_transpose",
                "batched_transpose"} & set(every)
    # nothing is cast in the wgrad pass: the forward kept X's transpose, dgrad dY's
    assert all(k.kclass != "cast" for k in ks["wgrad"])
    # one quantisation (three kernels) per GEMM input in the forward, per dY backward
    fwd_gemms = [k for k in ks["fwd"] if k.kind in ("gemm", "grouped_gemm")
                 and k.kclass == "gemm"]
    assert sum(k.name == T.CAST_T for k in ks["fwd"]) == len(fwd_gemms)
    # and per dY in the backward, and again before each recomputed GEMM (mla_up_proj)
    dgrads = [k for k in ks["dgrad"] if k.kclass == "gemm"]
    assert sum(k.name.endswith(T.CAST_T) for k in ks["dgrad"]) == len(dgrads)
    assert sum(k.name == "recompute." + T.CAST_T for k in ks["dgrad"]) == 2
    # under bf16 the recipe is inert
    _, bf = _layer("compute.fp8_recipe=tensorwise", "compute.precision=bf16")
    _, bf0 = _layer("compute.precision=bf16")
    assert bf == bf0


@pytest.mark.parametrize("sets, field", [
    (["routing.dispatch_dtype=fp8"], "routing.dispatch_dtype"),
    (["memory.activation_dtype=fp8"], "memory.activation_dtype"),
    (["compute.memory_kernels=deepseek"], "compute.memory_kernels"),
])
def test_what_only_the_blockwise_recipe_runs_is_refused_in_one_line(sets, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.") + ".*tensorwise"):
        resolve(load_scenario(DS1024, ["compute.fp8_recipe=tensorwise", *sets]))


def test_serving_and_rl_scenarios_refuse_it_in_one_line():
    for name in ("deepseek-v3-decode", "grpo-deepseek-v3-nemo-rl"):
        with pytest.raises(InputError, match=r"compute\.fp8_recipe.*training recipe"):
            resolve(load_scenario(name, ["compute.precision=fp8",
                                         "compute.fp8_recipe=tensorwise"]))


def test_bad_value_is_one_line():
    with pytest.raises(InputError, match=r"compute\.fp8_recipe.*blockwise or tensorwise"):
        parse({"fp8_recipe": "delayed"}, "s.yaml")
    assert parse({"fp8_recipe": "tensorwise"}, "s.yaml").fp8_recipe == "tensorwise"


def test_sequence_parallel_all_gathers_carry_fp8():
    # DeepSeek-V3's MLA layer (hidden 7168; latents q 1536 + kv 512, shared RoPE key 64)
    # for 1024 tokens: a reduce-scatter stays BF16; an all-gather carries one byte per
    # element, except the RoPE key MLA gathers itself (BF16)
    import dataclasses

    from moesim.program.folding import sp_exchange
    base = dataclasses.replace(PRESETS["deepseek-v3"], first_dense_layers=1, precision="fp8")
    te = dataclasses.replace(base, fp8_recipe="tensorwise")
    t, h = 1024, 7168
    assert not te.is_moe_layer(0)
    assert sp_exchange(te, t, 0, "fwd", "attn", False) == (("reduce_scatter", 2.0 * t * h),
                                                          ("all_gather", 1.0 * t * h))
    assert sp_exchange(te, t, 0, "fwd", "mlp", False) == (
        ("reduce_scatter", 2.0 * t * h), ("all_gather", t * ((1536 + 512) * 1.0 + 64 * 2)))
    # the backward's all-gather (a row-parallel output's gradient) is quantised too
    assert sp_exchange(te, t, 0, "bwd", "attn", False)[1] == ("all_gather", 1.0 * t * h)
    # the blockwise recipe and BF16 keep BF16 on the wire
    for spec in (base, dataclasses.replace(te, precision="bf16")):
        assert sp_exchange(spec, t, 0, "fwd", "attn", False)[1] == ("all_gather",
                                                                   2.0 * t * h)


@pytest.mark.parametrize("model", [{}, {"attention": "mla", "q_lora_rank": 256,
                                        "kv_lora_rank": 128, "qk_rope_dim": 32,
                                        "qk_nope_dim": 64, "v_head_dim": 64,
                                        "head_dim": 96}])
def test_both_engines_price_the_fp8_gathers_alike(tmp_path, model):
    # a 1-layer toy on TP 2 with sequence parallelism and FP8 GEMMs (GQA and MLA): the
    # fast engine prices the exchange collective by collective, as the step plan lists
    # them, so the two engines agree, and the FP8 gathers shorten the TP time
    from moesim.engine.api import simulate
    from tests._util import two_gpu_scenario

    def run(mode, recipe):
        folder = tmp_path / f"{mode}-{recipe}"
        folder.mkdir(exist_ok=True)
        path = two_gpu_scenario(folder,
                                model={"preset": "toy", "layers": 1, **model},
                                parallel={"tp": 2, "pp": 1, "ep": 1,
                                          "sequence_parallel": True},
                                schedule={"microbatches": 2, "seq_len": 512},
                                compute={"kind": "roofline", "precision": "fp8",
                                         "fp8_recipe": recipe},
                                engine={"mode": mode})
        s = simulate(resolve(load_scenario(path))).summary
        return s["step_time_s"], s["breakdown_s"]["tp"]

    for recipe in ("blockwise", "tensorwise"):
        assert run("fast", recipe) == pytest.approx(run("exact", recipe), rel=1e-9)
    assert run("exact", "tensorwise")[1] < run("exact", "blockwise")[1]


def test_moesim_kernels_names_the_recipe(capsys):
    import json

    from moesim.cli import main
    assert main(["kernels", "deepseek-v3-1024-h100", "--pass", "fwd"]) == 0
    assert "fp8 GEMMs (tensorwise recipe)" in capsys.readouterr().out.splitlines()[0]
    assert main(["kernels", "deepseek-v3-1024-h100", "--pass", "fwd", "--json", "--set",
                 "compute.fp8_recipe=blockwise"]) == 0
    assert json.loads(capsys.readouterr().out)["fp8_recipe"] == "blockwise"
    assert main(["kernels", "toy-cpu", "--pass", "fwd", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fp8_recipe"] is None
    # a bad value on the command line: one line, exit 2
    assert main(["kernels", "toy-cpu", "--set", "compute.fp8_recipe=delayed"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "compute.fp8_recipe" in err


def test_a_layernorm_linear_takes_its_amax_from_the_norm():
    # Megatron's LayerNormLinear (a dense model's QKV and fc1): the norm kernel writes the
    # amax, so the forward quantisation is the scale and the cast-transpose only; the
    # output projection and fc2 quantise with their own amax pass
    import dataclasses

    from moesim.model.kernels.attention import attention_kernels
    from moesim.model.kernels.moe import dense_ffn_kernels
    spec = dataclasses.replace(PRESETS["llama-3.1-8b"], precision="fp8",
                               fp8_recipe="tensorwise")
    t, h = 1024, spec.hidden
    ks = attention_kernels(spec, t, t, 1, "fwd", True)
    att = names(ks)
    first = att.index("attention_gemm")
    assert att[:first] == [T.SCALE, T.CAST_T]                  # QKV: no amax
    assert ks[1].bytes == 4 * t * h + 8                        # the normed input, t x h
    assert att[-4:] == [T.AMAX, T.SCALE, T.CAST_T, "attention_gemm"]   # the projection
    ffn = dense_ffn_kernels(spec, t, 1, "fwd", True)
    assert names(ffn) == [T.SCALE, T.CAST_T, "dense_gemm", "dense_act",
                          T.AMAX, T.SCALE, T.CAST_T, "dense_gemm"]
    # the backward quantises dY with its own amax either way
    assert names(dense_ffn_kernels(spec, t, 1, "bwd", True))[:3] == [T.AMAX, T.SCALE, T.CAST_T]
    # MLA's up-projections fuse their latent norms; the down-projections do not
    ds = dataclasses.replace(PRESETS["deepseek-v3"], precision="fp8", fp8_recipe="tensorwise")
    mla = names(attention_kernels(ds, t, t, 1, "fwd", True))
    gemms = [i for i, n in enumerate(mla) if n == "attention_gemm"]
    # q_down, q_up, kv_down, kv_up: an amax pass three kernels before the GEMM or not
    assert [mla[i - 3] == T.AMAX for i in gemms[:4]] == [True, False, True, False]
    assert [mla[i - 3] for i in gemms[:4]][1::2] == ["norm", "norm"]
