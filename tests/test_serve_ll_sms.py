"""DeepEP's low-latency send and receive kernels on the compute stream
(``serve.ll_sms: compute``, moesim/serve/ll_sms.py): the rule fitted on DeepEP's
hook-mode logs and its SM times by hand, where they sit in a layer's attention, the step
they add, the knob's checks, and the default left as it was."""

from __future__ import annotations

import pytest
import yaml

from moesim.errors import InputError
from moesim.serve import ll_logs, ll_sms
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


def test_the_rule_is_fitted_on_pr_385s_two_48_rank_rows_by_hand():
    # dispatch send 29.5 us at 1,024 messages (128 x 8) and 99.0 at 6,144 (768 x 8):
    # 69.5 us / 5,120 messages = 13.57421875 ns each, fixed 29.5 - 1,024 x 69.5 / 5,120
    # = 29.5 - 13.9 = 15.6 us; likewise recv (7.5, 18.5): 5.3 us + 11 / 5,120 us; combine
    # send (33, 134): 12.8 + 101 / 5,120; combine recv (9.5, 21): 7.2 + 11.5 / 5,120
    want = {"dispatch_send": (15.6, 69.5), "dispatch_recv": (5.3, 11.0),
            "combine_send": (12.8, 101.0), "combine_recv": (7.2, 11.5)}
    for part, (fixed_us, span_us) in want.items():
        fixed, per = ll_sms.RATES[part]
        assert fixed == pytest.approx(fixed_us * 1e-6, rel=1e-12)
        assert per == pytest.approx(span_us / 5120 * 1e-6, rel=1e-12)


def test_fit_parts_on_two_logs_of_its_own():
    a = ll_logs.HookLog("a", "", 1, 10, 2, 3.0, 2.0, 5.0, 1.0, "fit")     # 10 messages
    b = ll_logs.HookLog("b", "", 3, 10, 2, 5.0, 2.0, 9.0, 1.5, "fit")     # 30 messages
    got = ll_sms.fit_parts((a, b))
    # slopes 2/20, 0, 4/20, 0.5/20 us per message; fixed 3 - 1, 2, 5 - 2, 1 - 0.25 us
    for part, (fixed, per) in {"dispatch_send": (2.0, 0.1), "dispatch_recv": (2.0, 0.0),
                               "combine_send": (3.0, 0.2),
                               "combine_recv": (0.75, 0.025)}.items():
        assert got[part][0] == pytest.approx(fixed * 1e-6, rel=1e-12, abs=1e-18)
        assert got[part][1] == pytest.approx(per * 1e-6, rel=1e-12, abs=1e-18)


def test_one_token_top_1_by_hand():
    # DeepEP's messages (hidden 7,168: FP8 dispatch 7,408 B, BF16 combine 14,336 B), one
    # message each way: dispatch (15.6 + 5.3) us + (69.5 + 11) / 5,120 us = 20.91572265625
    # us; combine (12.8 + 7.2) + (101 + 11.5) / 5,120 = 20.02197265625 us
    comb, disp = ll_sms.kernels(1, 1, 7168, "fp8", "bf16")
    assert (disp.bytes, comb.bytes, disp.seq, comb.seq) == (7408, 14336, 1, 1)
    assert disp.count == comb.count == 2                     # send and receive
    assert ll_sms.price(None, disp)[0] == pytest.approx(20.91572265625e-6, rel=1e-12)
    assert ll_sms.price(None, comb)[0] == pytest.approx(20.02197265625e-6, rel=1e-12)
    # hidden 1,024: FP8 16 + 1,024 + 4 x 8 = 1,072 B, BF16 2,048 B: the per-message part
    # scales by the bytes, the fixed part does not
    comb, disp = ll_sms.kernels(1, 1, 1024, "fp8", "bf16")
    assert ll_sms.price(None, disp)[0] == pytest.approx(
        (20.9 + 80.5 / 5120 * 1072 / 7408) * 1e-6, rel=1e-12)
    assert ll_sms.price(None, comb)[0] == pytest.approx(
        (20.0 + 112.5 / 5120 * 2048 / 14336) * 1e-6, rel=1e-12)


def test_deepeps_test_case_combine_is_1_15_times_the_dispatch():
    # 1,024 messages: the 48-rank log's own sums, 37.0 and 42.5 us (was 60 and 116.1)
    comb, disp = ll_sms.kernels(128, 8, 7168, "fp8", "bf16")
    assert ll_sms.price(None, disp)[0] == pytest.approx(37.0e-6, rel=1e-12)
    assert ll_sms.price(None, comb)[0] == pytest.approx(42.5e-6, rel=1e-12)


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
    # 8 tokens x top-2 = 16 messages, hidden 1,024 (FP8 1,072 B, BF16 2,048 B): dispatch
    # 20.9 + 16 x 80.5 / 5,120 x 1,072 / 7,408 = 20.936403 us, combine 20.0 + 16 x
    # 112.5 / 5,120 x 2,048 / 14,336 = 20.050223 us, plus their four launches; one MoE
    # layer, one micro-batch: nothing overlaps them
    on = _scenario(tmp_path, ll_sms="compute")
    res, cfg = resolve_serve(on)
    comb, disp = ll_sms.kernels(8, 2, 1024, "fp8", "bf16")
    assert (disp.bytes, comb.bytes, disp.seq) == (17_152, 32_768, 16)
    sm_d = (20.9 + 16 * 80.5 / 5120 * 1072 / 7408) * 1e-6
    sm_c = (20.0 + 16 * 112.5 / 5120 * 2048 / 14336) * 1e-6
    model = ServeBuilder(res, cfg).builder.timer.model
    launches = model.time_s(disp) - sm_d
    assert launches > 0
    assert model.time_s(comb) - sm_c == pytest.approx(launches, rel=1e-9)
    added = sm_d + sm_c + 2 * launches
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
