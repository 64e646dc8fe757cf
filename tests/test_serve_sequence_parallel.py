"""Serving's and RL's log-prob passes' norms under tensor parallelism, worked by hand.

A serving engine runs no sequence parallelism: vLLM's row-parallel output projection
all-reduces (vllm/model_executor/layers/linear.py ``RowParallelLinear.forward``), so every
TP rank runs the layer's RMSNorms and residual adds on all the step's tokens. A Megatron
log-prob pass (NeMo RL) runs the trainer's model, sequence parallelism included: there
they run on the rank's ⌈T/tp⌉ shard (Korthikanti et al. 2022 §4.2.2), and so do MLA's
latent norms (Megatron-LM d98e8a6 multi_latent_attention.py: q_compressed /
kv_compressed are [s/TP, b, ...] under sequence parallelism).

RMSNorm forward bytes per row of ``d`` features: read x, write y (bf16) and 1/rms (fp32),
4·d + 4; a residual add reads two and writes one bf16 row, 6·d.
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from moesim.model import costs
from moesim.model.presets import PRESETS
from moesim.program import recipe
from moesim.serve import costs as serve_costs
from moesim.serve.program import ServeBuilder
from moesim.serve.run import resolve_serve, simulate_serve
from moesim.wiring import resolve

TOY, DSV3 = PRESETS["toy"], PRESETS["deepseek-v3"]
H = 512                     # toy hidden
HBM = 3.35e12 * 0.8         # H100 SXM HBM3 x the roofline's streaming efficiency


def _norms(ks):
    return [k.bytes for k in ks if k.name in ("norm", "residual_add")]


def test_prefill_and_decode_norms_on_all_tokens_without_sp():
    kv = serve_costs.kv_write_kernel(TOY, 512, 2, 2)
    # prefill of 512 tokens at TP 2: all 512 rows on each rank, 256 with SP
    off = recipe.prefill_attn(TOY, 512, 512, 2, kv, sp=False)
    on = recipe.prefill_attn(TOY, 512, 512, 2, kv, sp=True)
    assert _norms(off) == [4 * 512 * H + 4 * 512, 6 * 512 * H] * 2 == [1050624, 1572864] * 2
    assert _norms(on) == [4 * 256 * H + 4 * 256, 6 * 256 * H] * 2 == [525312, 786432] * 2
    # decode of 64 requests at TP 2: 64 rows, 32 with SP
    core = serve_costs.decode_core_kernel(TOY, 64, 1000, 2, 2)
    kv = serve_costs.kv_write_kernel(TOY, 64, 2, 2)
    off = recipe.decode_attn(TOY, 64, 2, core, kv, sp=False)
    on = recipe.decode_attn(TOY, 64, 2, core, kv, sp=True)
    assert _norms(off) == [4 * 64 * H + 4 * 64, 6 * 64 * H] * 2 == [131328, 196608] * 2
    assert _norms(on) == [65664, 98304] * 2
    # serving's default is the engine's: no sequence parallelism
    assert serve_costs.decode_attention_kernels(TOY, 64, 1000, 2, 2) == off
    assert serve_costs.prefill_attention_kernels(TOY, 512, 512, 2, 2) == \
        recipe.prefill_attn(TOY, 512, 512, 2, serve_costs.kv_write_kernel(TOY, 512, 2, 2),
                            sp=False)


def test_mla_latent_norms_on_the_shard_only_with_sp():
    # DeepSeek-V3: q_a_layernorm over q_lora_rank 1536, kv_a_layernorm over kv_lora_rank 512
    def latent(sp, phase="fwd"):
        return [k.bytes for k in costs.attention_kernels(DSV3, 64, 64, 2, phase, sp)
                if k.name in ("norm", "norm_bwd")]
    assert latent(False) == [4 * 64 * 1536 + 4 * 64, 4 * 64 * 512 + 4 * 64] == [393472, 131328]
    assert latent(True) == [4 * 32 * 1536 + 4 * 32, 4 * 32 * 512 + 4 * 32] == [196736, 65664]
    # backward (last to first): read x and dy, write dx (+ 1/rms)
    assert latent(True, "bwd") == [6 * 32 * 512 + 4 * 32, 6 * 32 * 1536 + 4 * 32]
    # TP 1: one shard
    assert costs.attention_kernels(DSV3, 64, 64, 1, "fwd", True) == \
        costs.attention_kernels(DSV3, 64, 64, 1, "fwd", False)


def test_lm_head_final_norm():
    # serving's head: the final norm on every token (2·2·h bytes per row); on the shard
    # with the trainer's SP (RL's log-prob rows)
    off, on = (serve_costs.head_kernels(TOY, 100, 2, sp)[0] for sp in (False, True))
    assert (off.name, off.bytes, on.bytes) == ("norm", 4 * 100 * H, 4 * 50 * H)


def _decode(tmp_path, tp: int = 2):
    """One DGX H100 node, 2 layers (the first dense), 8 experts top-2, EP 8, decode of 4
    requests per GPU (8 per TP-2 group: 8 tokens per rank), roofline prices."""
    data = {"name": "sp", "seed": 1, "cluster": {"topology": "dgx-h100", "nodes": 1},
            "model": {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8,
                      "head_dim": 128, "vocab": 4096, "attention": "mha", "dense_ffn": 4096,
                      "n_experts": 8, "top_k": 2, "expert_ffn": 1024,
                      "first_dense_layers": 1},
            "compute": {"model": "roofline"},
            "serve": {"phase": "decode", "batch_per_gpu": 4, "context": 512, "ep": 8,
                      "tp": tp, "ep_backend": "nccl"}}
    p = tmp_path / "sp.yaml"
    p.write_text(yaml.safe_dump(data))
    return resolve_serve(str(p))


def test_serve_builder_norms_on_all_tokens(tmp_path):
    res, cfg = _decode(tmp_path)
    sb = ServeBuilder(res, cfg)
    assert sb.builder.sp is False and sb.tokens == 8
    # 8 rows of 1024 on each TP rank (before: the 4-row shard, 16400 and 24576 bytes)
    assert _norms(sb.attn_kernels(0)) == [4 * 8 * 1024 + 4 * 8, 6 * 8 * 1024] * 2 \
        == [32800, 49152] * 2


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_step_compute_with_and_without_sp_by_hand(tmp_path, mode):
    # the same decode step with the step plan's sequence parallelism (as RL's log-prob
    # passes set it from the trainer): per layer the norms save 2 x (32800 - 16400) and
    # the residual adds 2 x 6·4·1024 bytes, over 2 layers; launches unchanged
    res, cfg = _decode(tmp_path)
    scn = dataclasses.replace(res.scenario, engine=dataclasses.replace(
        res.scenario.engine, mode=mode))
    compute = {}
    for sp in (False, True):
        one = dataclasses.replace(scn, parallel=dataclasses.replace(
            scn.parallel, sequence_parallel=sp))
        s = simulate_serve(resolve(one), cfg, record_series=False).summary
        compute[sp] = s["breakdown_s"]["compute"]
    saved = 2 * (2 * 16400 + 2 * 24576)
    assert saved == 163904
    assert compute[False] - compute[True] == pytest.approx(saved / HBM, rel=1e-9)


def test_rl_logprob_pass_takes_the_trainers_sp(tmp_path, monkeypatch):
    from moesim.rl import engine_costs

    res, _ = _decode(tmp_path)
    seen = []
    real = engine_costs._serve_time

    def spy(scn, cfg, sp=False, *rest):
        seen.append(sp)
        return real(scn, cfg, sp, *rest)

    monkeypatch.setattr(engine_costs, "_serve_time", spy)
    for sp in (False, True):
        scn = dataclasses.replace(res.scenario, serve={}, parallel=dataclasses.replace(
            res.scenario.parallel, sequence_parallel=sp))
        tc = engine_costs.EngineTrainerCosts(scn, 8, 8, tp=2, pp=1, ep=8, seq_len=64)
        tc.forward_s(4)
    assert seen == [False, True]
