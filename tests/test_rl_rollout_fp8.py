"""FP8 rollout weights as NeMo RL runs them (rl.rollout.precision: fp8,
moesim.rl.rollout_fp8): the weights it casts, the cast's ops and bytes, the load, the
engine's memory and the refit, each worked by hand."""

from __future__ import annotations

import pytest

from moesim.cli import main
from moesim.errors import InputError
from moesim.model.spec import ModelSpec
from moesim.program.host_dispatch import EAGER_OP_S
from moesim.rl import refit_async, rollout_fp8
from moesim.rl.memory import replica_weight_bytes
from moesim.rl.run import resolve_rl
from moesim.rl.sync import param_bytes, path_Bps, tensor_count, weight_sync
from moesim.scenario.sections.rl import RolloutPool
from moesim.topology import load_topology
from tests._refit import SPEC

#: GQA, one dense layer then one MoE layer of 4 routed experts and one shared (SwiGLU)
GQA = ModelSpec(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, vocab=1000,
                attention="gqa", dense_ffn=512, first_dense_layers=1, n_experts=4, top_k=2,
                expert_ffn=128, n_shared_experts=1, shared_ffn=128)
#: MLA with a query LoRA rank, one dense layer
MLA = ModelSpec(layers=1, hidden=256, heads=2, attention="mla", q_lora_rank=64,
                kv_lora_rank=32, qk_rope_dim=16, qk_nope_dim=32, v_head_dim=32,
                dense_ffn=512, n_experts=0, vocab=1000)


def test_fp8_weights_by_hand():
    # attention q 256x256 + k, v 256x128 each + o 256x256 = 196,608, 4 tensors a layer;
    # layer 0 dense 3 x 256 x 512 = 393,216 (3 tensors); layer 1: 4 routed and 1 shared
    # expert of 3 x 256 x 128 = 98,304 each (15 tensors); no router, norms or embeddings
    assert rollout_fp8.fp8_weights(GQA) == (4 + 3 + 4 + 15, 2 * 196_608 + 393_216
                                            + 5 * 98_304)
    # MLA: q_a 256x64, q_b 64x(2x48), kv_a 256x48, kv_b 32x(2x64), o 64x256, the two
    # norm vectors left out: 16,384 + 6,144 + 12,288 + 4,096 + 16,384; dense FFN 393,216
    assert rollout_fp8.fp8_weights(MLA) == (5 + 3, 55_296 + 393_216)


def test_cast_kernels_and_bytes_by_hand():
    # per element: to float 2+4, contiguous 8, abs 8, amax 4, mul 8, clamp 8, to fp8 5,
    # the un-permuting copy 2
    assert rollout_fp8.CAST_BYTES == 49 and rollout_fp8.CAST_OPS == 15
    t, e = 26, 1_277_952
    c = rollout_fp8.fp8_cast(GQA, hbm_Bps=1e12, launch_s=2e-6)
    assert (c.tensors, c.elements) == (t, e)
    assert c.host_s == pytest.approx(t * 15 * EAGER_OP_S)
    assert c.gpu_s == pytest.approx(e * 49 / 1e12 + t * 15 * 2e-6)
    assert c.time_s == max(c.host_s, c.gpu_s) == c.host_s      # small tensors: the host's
    # a slow memory makes the GPU the longer
    slow = rollout_fp8.fp8_cast(GQA, hbm_Bps=1e8, launch_s=2e-6)
    assert slow.time_s == slow.gpu_s > slow.host_s


def test_load_entries_and_bytes():
    n = param_bytes(GQA)
    t, e = rollout_fp8.fp8_weights(GQA)
    # every FP8 weight enters load_weights with its _scale_inv
    assert rollout_fp8.load_entries(GQA, 40, "fp8") == 40 + t
    assert rollout_fp8.load_entries(GQA, 40, "bf16") == 40
    # FP8 weights at one byte, a 4-byte scale per 128 x 128 block; the rest in bf16
    assert rollout_fp8.loaded_bytes(GQA, n, "fp8") == pytest.approx(n - e + e / 16384 * 4)
    assert rollout_fp8.loaded_bytes(GQA, n, "bf16") == n


def test_engine_weights_take_one_byte():
    bf16 = replica_weight_bytes(GQA, RolloutPool(tp=2, ep=2))
    fp8 = replica_weight_bytes(GQA, RolloutPool(tp=2, ep=2, precision="fp8"))
    assert fp8 == pytest.approx(bf16 / 2)


def _refit(calls: str, precision: str, *, nodes: int = 1):
    topo = load_topology("dgx-h100", nodes=nodes)
    gpus = topo.gpus
    train, roll, ipc = (gpus, gpus, True) if nodes == 1 else (gpus[:8], gpus[8:], False)
    return weight_sync(topo, SPEC, train, roll, tp=2, pp=1, ep=2, replica_gpus=8,
                       per_tensor_s=40e-6, ipc=ipc, hbm_Bps=3.35e12, per_gpu=True,
                       calls=calls, hbm_bytes=1e9, launch_s=4e-6, precision=precision)


def test_colocated_refit_load_casts_and_loads_scales():
    """The IPC refit of the tiny model: only the load changes, by the cast, the scales'
    entries and the copy at one byte per FP8 weight."""
    bf16, fp8 = _refit("nemo", "bf16"), _refit("nemo", "fp8")
    t, e = rollout_fp8.fp8_weights(SPEC)
    cast = rollout_fp8.fp8_cast(SPEC, 3.35e12, 4e-6)
    assert fp8.phases["fp8_cast"] == cast.as_dict()
    saved = 2 * (e - e / 16384 * 4) / 8 / 3.35e12          # the copy's bytes, read + write
    assert fp8.phases["load_s"] - bf16.phases["load_s"] == pytest.approx(
        cast.time_s + t * 40e-6 - saved)
    assert fp8.phases["gather_s"] == bf16.phases["gather_s"]
    assert fp8.phases["transfer_s"] == bf16.phases["transfer_s"]
    assert fp8.time_s - bf16.time_s == pytest.approx(
        fp8.phases["load_s"] - bf16.phases["load_s"])
    assert "fp8_cast" not in bf16.phases


def test_async_refit_consumer_casts():
    """NeMo RL's chunked non-colocated refit: the consumer's load gains the same."""
    topo = load_topology("dgx-h100", nodes=2)
    train, roll = topo.gpus[:8], topo.gpus[8:16]
    kw = dict(tp=2, pp=1, ep=2, etp=1, replica_gpus=8, per_tensor_s=40e-6,
              hbm_Bps=3.35e12, hbm_bytes=50_000.0, nbytes=param_bytes(SPEC),
              tensors=tensor_count(SPEC), path_Bps=path_Bps, launch_s=4e-6)
    a = refit_async.async_refit(topo, SPEC, train, roll, **kw)
    b = refit_async.async_refit(topo, SPEC, train, roll, precision="fp8", **kw)
    t, e = rollout_fp8.fp8_weights(SPEC)
    saved = 2 * (e - e / 16384 * 4) / 8 / 3.35e12
    assert b.load_s - a.load_s == pytest.approx(
        rollout_fp8.fp8_cast(SPEC, 3.35e12, 4e-6).time_s + t * 40e-6 - saved)
    assert (b.producer_s, b.broadcast_s) == (a.producer_s, a.broadcast_s)
    assert b.time_s > a.time_s


def test_rollout_scenario_prices_fp8():
    bf16 = resolve_rl("grpo-deepseek-v3-nemo-rl-async").scenario
    assert rollout_fp8.rollout_scenario(bf16, "bf16") is bf16     # as written
    setup = resolve_rl("grpo-deepseek-v3-nemo-rl-async-fp8")
    scn = setup.scenario
    one = rollout_fp8.rollout_scenario(scn, "fp8")
    assert one.compute.precision == "fp8" and one.model.as_dict()["weight_bytes"] == 1
    assert scn.model.as_dict().get("weight_bytes") is None     # the trainer's untouched
    # an FP8 trainer beside bf16 engines: the engines' GEMMs in bf16
    assert scn.compute.precision == "fp8"
    assert rollout_fp8.rollout_scenario(scn, "bf16").compute.precision == "bf16"


def test_shipped_fp8_engine_fits_where_bf16_does_not():
    """16 H100 hold DeepSeek-V3 in FP8 (42 GB a GPU) beside a KV cache; in bf16 the
    84 GB of weights are more than the engine's 0.8 of 80 GB."""
    from moesim.rl.memory import rollout_fit
    from moesim.rl.run import kv_capacity
    fp8 = resolve_rl("grpo-deepseek-v3-nemo-rl-async-fp8")
    assert kv_capacity(fp8) > 1408 + 128
    fit = rollout_fit(fp8)
    assert not fit.oom and "fp8 weights" in fit.text()
    bf16 = resolve_rl("grpo-deepseek-v3-nemo-rl-async-fp8", ["rl.rollout.precision=bf16"])
    assert kv_capacity(bf16) == 0


def test_precision_refused_without_nemo_refit(tmp_path, capsys):
    with pytest.raises(InputError, match="rl.rollout.precision"):
        resolve_rl("grpo-deepseek-v3-nemo-rl-async-fp8", ["rl.rollout.precision=fp4"])
    code = main(["rl", "grpo-qwen3-30b-a3b", "--set", "rl.rollout.precision=fp8",
                 "--no-files", "--quiet", "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "rl.rollout.precision" in err
    assert "per_gpu" in err and "Traceback" not in err
