"""Sequence parallelism's norms and residual adds, worked by hand (toy model: hidden 512;
two H100s, roofline: a memory-bound kernel takes one launch + bytes / (3.35 TB/s x 0.8)).

With ``parallel.sequence_parallel`` and TP 2 the layer's two RMSNorms and two residual
adds run on the rank's 256-token half of a 512-token micro-batch (Korthikanti et al.
2022 §4.2.2); without it each TP rank runs them on all 512 tokens."""

from __future__ import annotations

import pytest

from moesim.engine.api import simulate
from moesim.model import costs, mtp
from moesim.model.presets import PRESETS
from moesim.program.inventory import layer_ops
from moesim.scenario import load_scenario
from moesim.wiring import resolve
from tests._util import two_gpu_scenario

TOY = PRESETS["toy"]
H = 512
HBM = 3.35e12 * 0.8        # H100 SXM HBM3 x the roofline's streaming efficiency
#: a small MLA attention for the toy (DeepSeek-V3's shape, scaled down)
MLA = {"attention": "mla", "q_lora_rank": 256, "kv_lora_rank": 128, "qk_rope_dim": 32,
       "qk_nope_dim": 64, "v_head_dim": 64, "head_dim": 96}


def scenario(tmp_path, sp: bool, mode: str = "exact"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = two_gpu_scenario(tmp_path, parallel={"tp": 2, "pp": 1, "ep": 1,
                                                "sequence_parallel": sp},
                            schedule={"microbatches": 2, "seq_len": 512},
                            engine={"mode": mode})
    return resolve(load_scenario(path))


def test_norm_kernel_rows_by_hand():
    # forward RMSNorm: read x, write y (bf16) and 1/rms (fp32) per row
    on = costs.norm_kernels(TOY, 512, 2, "fwd", sp=True)
    off = costs.norm_kernels(TOY, 512, 2, "fwd", sp=False)
    assert [k.name for k in on] == ["norm", "residual_add", "norm", "residual_add"]
    assert on[0].bytes == 2 * 2 * 256 * H + 4 * 256 == 525312
    assert off[0].bytes == 2 * 2 * 512 * H + 4 * 512 == 1050624
    assert on[1].bytes == 3 * 2 * 256 * H and off[1].bytes == 3 * 2 * 512 * H
    # backward: read x and dy, write dx (+ 1/rms)
    bon = costs.norm_kernels(TOY, 512, 2, "bwd", sp=True)
    boff = costs.norm_kernels(TOY, 512, 2, "bwd", sp=False)
    assert bon[0].bytes == 3 * 2 * 256 * H + 4 * 256 == 787456
    assert boff[0].bytes == 3 * 2 * 512 * H + 4 * 512 == 1574912
    # TP 1: the same rows either way; 513 tokens over TP 2: the larger shard, 257 rows
    assert costs.norm_kernels(TOY, 512, 1, "fwd", sp=True) == costs.norm_kernels(
        TOY, 512, 1, "fwd", sp=False)
    assert costs.norm_kernels(TOY, 513, 2, "fwd", sp=True)[0].bytes == 4 * 257 * H + 4 * 257


def test_final_norm_and_mtp_norms_by_hand():
    # the LM head's final RMSNorm (Megatron-Core's final_layernorm) on the shard with SP
    on, off = (costs.lm_head_kernels(TOY, 512, 2, "fwd", sp=sp)[0] for sp in (True, False))
    assert (on.name, on.bytes, off.bytes) == ("norm", 525312, 1050624)
    # an MTP depth's enorm and hnorm: 2 x (read, write) x 4 bytes per token-feature
    on, off = ([k for k in mtp.head_kernels(TOY, 512, 2, "fwd", sp=sp) if k.name == "mtp_norm"][0]
               for sp in (True, False))
    assert (on.bytes, off.bytes) == (2 * 4 * 256 * H, 2 * 4 * 512 * H) == (1048576, 2097152)


def test_inventory_norm_time_by_hand(tmp_path):
    # moesim kernels' view of layer 0's fwd.attn: one norm kernel, priced by the roofline
    times = {}
    for sp in (False, True):
        res = scenario(tmp_path / str(sp), sp)
        attn = [o for o in layer_ops(res, 0, "fwd") if o.op == "fwd.attn"][0]
        norm = [k for k in attn.kernels if k.name == "norm"][0]
        launch = res.compute.per_launch_s(norm)
        times[sp] = res.compute.time_s(norm)
        assert times[sp] == pytest.approx(launch + norm.bytes / HBM, rel=1e-12)
    assert times[False] - times[True] == pytest.approx((1050624 - 525312) / HBM, rel=1e-9)


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_step_compute_by_hand(tmp_path, mode):
    # per layer and micro-batch the bytes SP saves: forward 2 norms (1050624 - 525312)
    # + 2 adds (3·2·256·512 each); backward 2 norms (1574912 - 787456) + 2 adds
    # (3·2·256·512 each); the LM head's final norm, forward and backward, once per
    # micro-batch; 1 layer x 2 micro-batches; launches unchanged
    layer = 2 * 525312 + 2 * 786432 + 2 * 787456 + 2 * 786432
    final = 525312 + 787456
    saved = layer + final
    assert saved == 5771264 + 1312768
    compute = {}
    for sp in (False, True):
        s = simulate(scenario(tmp_path / f"{mode}{sp}", sp, mode)).summary
        compute[sp] = s["breakdown_s"]["compute"]
    assert compute[False] - compute[True] == pytest.approx(2 * saved / HBM, rel=1e-9)


def test_mla_latent_norms_in_the_step_plan_by_hand(tmp_path):
    # a 1-layer MLA toy (hidden 512, q_lora 256, kv_lora 128) at TP 2 over 512 tokens:
    # fwd.attn's q_a / kv_a RMSNorms (after the layer's two norms and adds) run on 256
    # rows per rank with SP (Megatron-LM d98e8a6 multi_latent_attention.py), on
    # 512 without; forward bytes 4·d + 4 per row
    rows = {}
    for sp in (False, True):
        d = tmp_path / str(sp)
        d.mkdir()
        path = two_gpu_scenario(d, model={"preset": "toy", "layers": 1, **MLA},
                                parallel={"tp": 2, "pp": 1, "ep": 1, "sequence_parallel": sp},
                                schedule={"microbatches": 2, "seq_len": 512})
        res = resolve(load_scenario(path))
        attn = [o for o in layer_ops(res, 0, "fwd") if o.op == "fwd.attn"][0]
        rows[sp] = [k.bytes for k in attn.kernels if k.name == "norm"]
    # the layer's input and pre-MLP norms over hidden 512, the latent norms over 256, 128
    assert rows[False] == [4 * 512 * 512 + 4 * 512] * 2 + [4 * 512 * 256 + 4 * 512,
                                                           4 * 512 * 128 + 4 * 512]
    assert rows[True] == [4 * 256 * 512 + 4 * 256] * 2 + [4 * 256 * 256 + 4 * 256,
                                                          4 * 256 * 128 + 4 * 256]



@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_mla_step_compute_by_hand(tmp_path, mode):
    # the toy step above with MLA: beyond the layer's and the final norms, SP saves the
    # latent norms' half per micro-batch: forward (4·256·256 + 4·256) + (4·256·128 + 4·256),
    # backward (6·256·256 + 4·256) + (6·256·128 + 4·256); and the down-projections
    # (512 -> 256 and 512 -> 128 + 32) run forward, dgrad and wgrad on 256 rows, not 512
    # (tests/test_mla_sequence_parallel.py), the seconds their kernels save
    layer = 2 * 525312 + 2 * 786432 + 2 * 787456 + 2 * 786432
    final = 525312 + 787456
    latent = 263168 + 132096 + 394240 + 197632
    compute, down = {}, {}
    for sp in (False, True):
        d = tmp_path / f"{mode}{sp}"
        d.mkdir()
        path = two_gpu_scenario(d, model={"preset": "toy", "layers": 1, **MLA},
                                parallel={"tp": 2, "pp": 1, "ep": 1, "sequence_parallel": sp},
                                schedule={"microbatches": 2, "seq_len": 512},
                                engine={"mode": mode})
        res = resolve(load_scenario(path))
        down[sp] = sum(res.compute.time_s(k) for ph in ("fwd", "bwd")
                       for k in costs.attention_kernels(res.model, 512, 512, 2, ph, sp)
                       if k.name.startswith("attention_gemm") and k.k == 512
                       and k.n in (256, 160))
        s = simulate(res).summary
        compute[sp] = s["breakdown_s"]["compute"]
    saved = layer + final + latent
    assert compute[False] - compute[True] == pytest.approx(
        2 * saved / HBM + 2 * (down[False] - down[True]), rel=1e-9)
