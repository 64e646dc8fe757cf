"""DeepEP's low-latency send and receive kernels on the compute stream
(``serve.ll_sms: compute``, moesim/serve/ll_sms.py): their bytes and published time by
hand, where they sit in a layer's attention, the step they add, the knob's checks, and the
default left as it was."""

from __future__ import annotations

import pytest
import yaml

from moesim.errors import InputError
from moesim.serve import ll_sms
from moesim.serve.program import ServeBuilder
from moesim.serve.run import resolve_serve, simulate_serve


def _scenario(tmp_path, **serve) -> str:
    """16 GPUs over two DGX H100 nodes, EP16, 2 layers (layer 0 dense, layer 1 MoE), 16
    experts top-2, hidden 1024, uniform routing, FP8 dispatch and BF16 combine, the
    kernel catalog, one micro-batch, on the fast engine."""
    data = {"name": "llsms", "seed": 3,
            "cluster": {"topology": "dgx-h100", "nodes": 2},
            "model": {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "head_dim": 128,
                      "vocab": 4096, "attention": "mha", "dense_ffn": 4096, "n_experts": 16,
                      "top_k": 2, "expert_ffn": 1024, "first_dense_layers": 1},
            "routing": {"kind": "uniform", "dispatch_dtype": "fp8", "combine_dtype": "bf16"},
            "serve": {"phase": "decode", "batch_per_gpu": 8, "context": 1024, "ep": 16,
                      "ep_backend": "deepep-ll", **serve},
            "engine": {"mode": "fast"}}
    p = tmp_path / "llsms.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_deepeps_test_case_takes_the_blogs_0_06_ms_and_the_combine_its_bytes():
    # DeepEP's low-latency test: 128 tokens x top-8 = 1,024 messages per rank; FP8
    # dispatch 16 + 7,168 + 4 x 56 = 7,408 B each, BF16 combine 2 x 7,168 = 14,336 B
    comb, disp = ll_sms.kernels(128, 8, 7168, "fp8", "bf16")
    assert disp.bytes == 1024 * 7408 == 7_585_792
    assert comb.bytes == 1024 * 14336 == 14_680_064
    assert disp.count == comb.count == 2                     # send and receive
    assert ll_sms.price(None, disp)[0] == pytest.approx(60e-6, rel=1e-12)
    # the combine at the dispatch's bytes per second: 60 us x 14,336 / 7,408 = 116.11 us
    assert ll_sms.price(None, comb)[0] == pytest.approx(60e-6 * 14336 / 7408, rel=1e-12)


def test_a_moe_layers_attention_carries_them_a_dense_layers_does_not(tmp_path):
    res, cfg = resolve_serve(_scenario(tmp_path, ll_sms="compute"))
    sb = ServeBuilder(res, cfg)
    moe = [k.name for k in sb.attn_kernels(1)]
    assert moe[0] == ll_sms.COMBINE and moe[-1] == ll_sms.DISPATCH
    assert ll_sms.COMBINE not in [k.name for k in sb.attn_kernels(0)]
    assert sb.attn_key(1) != sb.attn_key(0)          # priced apart
    off, cfg0 = resolve_serve(_scenario(tmp_path))
    sb0 = ServeBuilder(off, cfg0)
    assert [k.name for k in sb0.attn_kernels(1)] == moe[1:-1]
    assert sb0.attn_key(1) == sb0.attn_key(0) == ("attn", "fwd")


def test_one_micro_batch_step_grows_by_the_two_kernels(tmp_path):
    # 8 tokens x top-2 = 16 messages: dispatch 16 x (16 + 1,024 + 4 x 8) = 17,152 B,
    # combine 16 x 2,048 = 32,768 B, at 1,024 x 7,408 B / 60 us = 126.43 GB/s, plus
    # their four launches; one MoE layer, one micro-batch: nothing overlaps them
    on = _scenario(tmp_path, ll_sms="compute")
    res, cfg = resolve_serve(on)
    comb, disp = ll_sms.kernels(8, 2, 1024, "fp8", "bf16")
    assert (disp.bytes, comb.bytes) == (17_152, 32_768)
    model = ServeBuilder(res, cfg).builder.timer.model
    rate = 1024 * 7408 / 60e-6
    launches = model.time_s(disp) - disp.bytes / rate
    assert launches > 0
    assert model.time_s(comb) - comb.bytes / rate == pytest.approx(launches, rel=1e-9)
    added = (disp.bytes + comb.bytes) / rate + 2 * launches
    a = simulate_serve(res, cfg).summary
    b = simulate_serve(*resolve_serve(_scenario(tmp_path))).summary
    assert a["step_time_s"] - b["step_time_s"] == pytest.approx(added, rel=1e-6)
    assert a["breakdown_s"]["compute"] - b["breakdown_s"]["compute"] == pytest.approx(
        added, rel=1e-6)


@pytest.mark.parametrize("serve, field", [
    ({"phase": "prefill", "prompt": 64}, "serve.phase"),
    ({"ep_backend": "nccl"}, "serve.ep_backend"),
    ({"ll_sms": "always"}, "serve.ll_sms"),
])
def test_checks(tmp_path, serve, field):
    with pytest.raises(InputError) as e:
        resolve_serve(_scenario(tmp_path, **{"ll_sms": "compute", **serve}))
    assert field in str(e.value)


def test_both_engines_take_them_alike(tmp_path):
    # two micro-batches: under segments the engines give one step; under five_stage (whose
    # engines differ on this tiny case without the kernels) each step grows by as much
    # in both, the kernels sitting in ATTN-0 (the combine's) and ATTN-1 (the dispatch's)
    path = _scenario(tmp_path, two_microbatch=True)
    step = {}
    for mode in ("fast", "exact"):
        for overlap in ("segments", "five_stage"):
            for ll in ("none", "compute"):
                res, cfg = resolve_serve(path, [f"engine.mode={mode}",
                                                f"serve.decode_overlap={overlap}",
                                                f"serve.ll_sms={ll}"])
                step[mode, overlap, ll] = simulate_serve(res, cfg).summary["step_time_s"]
    for ll in ("none", "compute"):
        assert step["fast", "segments", ll] == pytest.approx(step["exact", "segments", ll],
                                                             rel=1e-9)
    grow = {m: step[m, "five_stage", "compute"] - step[m, "five_stage", "none"]
            for m in ("fast", "exact")}
    assert grow["fast"] > 0
    assert grow["fast"] == pytest.approx(grow["exact"], rel=1e-6)
