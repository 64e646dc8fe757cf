"""DeepEP's low-latency send and receive kernels on the compute stream
(``serve.ll_sms: compute``, moesim/serve/ll_sms.py): the rules fitted per device family on
DeepEP's hook-mode logs and their SM times by hand, each device's family, the refusal
of a device without logs, where they sit in a layer's attention, the step
they add, the knob's checks, and the default left as it was."""

from __future__ import annotations

from types import SimpleNamespace

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


def _on(device: str) -> SimpleNamespace:
    """A compute model as :func:`ll_sms.price` reads it: its device's catalog name."""
    return SimpleNamespace(device=SimpleNamespace(name=device))


# The Hopper rates by hand. Dispatch: least squares over Ant Group's H20 EP16 table, 7 rows
# at 8, 64, 128, 256, 384, 512, 1,024 messages: sum x = 2,376, sum x^2 = 1,544,256, so
# Sxx = 1,544,256 - 2,376^2 / 7 = 5,164,416 / 7. Send: sum y = 130.56 us, sum xy =
# 49,715.52, Sxy = (7 x 49,715.52 - 2,376 x 130.56) / 7 = 37,798.08 / 7; receive: sum y =
# 46.48, sum xy = 19,442.96, Sxy = 25,664.24 / 7. Fixed = mean y - slope x mean x.
# Combine: PR 425's one message count (1,024): the means of its 7 ranks, send 280.39 / 7
# and receive 71.27 / 7 us, with the fixed part of the dispatch kernel of the same phase.
H_SLOPE = {"send": 37798.08 / 5164416, "recv": 25664.24 / 5164416}          # us
H_FIXED = {"send": 130.56 / 7 - H_SLOPE["send"] * 2376 / 7,
           "recv": 46.48 / 7 - H_SLOPE["recv"] * 2376 / 7}
H_COMB = {"send": 280.39 / 7, "recv": 71.27 / 7}                              # at 1,024
HOPPER = {f"dispatch_{ph}": (H_FIXED[ph], H_SLOPE[ph]) for ph in ("send", "recv")}
HOPPER.update({f"combine_{ph}": (H_FIXED[ph], (H_COMB[ph] - H_FIXED[ph]) / 1024)
               for ph in ("send", "recv")})


def _hopper_us(side: str, msgs: int, scale: float) -> float:
    """The hand Hopper rule: ``side``'s send + receive for ``msgs`` messages whose bytes are
    ``scale`` times the test's."""
    return sum(HOPPER[f"{side}_{ph}"][0] + HOPPER[f"{side}_{ph}"][1] * msgs * scale
               for ph in ("send", "recv"))


def test_blackwell_rule_is_fitted_on_pr_385s_two_48_rank_rows_by_hand():
    # dispatch send 29.5 us at 1,024 messages (128 x 8) and 99.0 at 6,144 (768 x 8):
    # 69.5 us / 5,120 messages = 13.57421875 ns each, fixed 29.5 - 1,024 x 69.5 / 5,120
    # = 29.5 - 13.9 = 15.6 us; likewise recv (7.5, 18.5): 5.3 us + 11 / 5,120 us; combine
    # send (33, 134): 12.8 + 101 / 5,120; combine recv (9.5, 21): 7.2 + 11.5 / 5,120
    want = {"dispatch_send": (15.6, 69.5), "dispatch_recv": (5.3, 11.0),
            "combine_send": (12.8, 101.0), "combine_recv": (7.2, 11.5)}
    for part, (fixed_us, span_us) in want.items():
        fixed, per = ll_sms.RATES["blackwell"][part]
        assert fixed == pytest.approx(fixed_us * 1e-6, rel=1e-12)
        assert per == pytest.approx(span_us / 5120 * 1e-6, rel=1e-12)


def test_hopper_rule_by_hand():
    # about 16.17 us + 7.32 ns, 4.95 + 4.97, 16.17 + 23.33, 4.95 + 5.11
    for part, (fixed_us, per_us) in HOPPER.items():
        fixed, per = ll_sms.RATES["hopper"][part]
        assert fixed == pytest.approx(fixed_us * 1e-6, rel=1e-9)
        assert per == pytest.approx(per_us * 1e-6, rel=1e-9)
    assert HOPPER["dispatch_send"][0] == pytest.approx(16.167, abs=1e-3)
    assert HOPPER["combine_send"][1] == pytest.approx(0.0233287, rel=1e-5)


def test_the_split_is_per_family_and_unidentified_logs_set_nothing():
    fit = {fam: {g.source.split(",")[0] for g in ll_logs.fit_logs(fam)}
           for fam in ll_logs.FAMILIES}
    assert fit == {"hopper": {"Ant Group Theta", "deepseek-ai/DeepEP PR 425"},
                   "blackwell": {"deepseek-ai/DeepEP PR 385"}}
    assert all(g.role == "shown" for g in ll_logs.shown_logs())
    assert {g.device for g in ll_logs.held_out_logs("hopper")} == {
        "H200 (inferred)", "H20", "H100"}


def test_fit_parts_least_squares_and_one_count_combine():
    # three logs at 10, 20, 40 messages (tokens 1, 2, 4 x top-10): dispatch send 3, 5, 9
    # us lie on 1 + 0.2 x; receive 2, 2, 2: 2 + 0; combine at 10 messages only (the first
    # log): send 5 us -> fixed 1 (the dispatch send's), per (5 - 1) / 10 = 0.4; receive
    # 3 us -> fixed 2, per 0.1
    a = ll_logs.HookLog("a", "", 1, 10, 2, 3.0, 2.0, 5.0, 3.0, "fit")
    b = ll_logs.HookLog("b", "", 2, 10, 2, 5.0, 2.0, None, None, "fit")
    c = ll_logs.HookLog("c", "", 4, 10, 2, 9.0, 2.0, None, None, "fit")
    got = ll_sms.fit_parts((a, b, c))
    for part, (fixed, per) in {"dispatch_send": (1.0, 0.2), "dispatch_recv": (2.0, 0.0),
                               "combine_send": (1.0, 0.4),
                               "combine_recv": (2.0, 0.1)}.items():
        assert got[part][0] == pytest.approx(fixed * 1e-6, rel=1e-12, abs=1e-18)
        assert got[part][1] == pytest.approx(per * 1e-6, rel=1e-12, abs=1e-18)
    # two logs: the line through them
    d = ll_logs.HookLog("d", "", 3, 10, 2, 5.0, 2.0, 9.0, 1.5, "fit")     # 30 messages
    got = ll_sms.fit_parts((a, d))
    assert got["combine_recv"][0] == pytest.approx(3.75e-6, rel=1e-12)   # 3 - 10 x 0.075
    assert got["combine_recv"][1] == pytest.approx(-0.075e-6, rel=1e-12)


@pytest.mark.parametrize("device, family", [
    ("H100", "hopper"), ("H800", "hopper"), ("H200", "hopper"), ("H200-NVL", "hopper"),
    ("H20", "hopper"), ("B200", "blackwell"), ("GB200", "blackwell")])
def test_each_device_takes_its_familys_rates(device, family):
    comb, disp = ll_sms.kernels(128, 8, 7168, "fp8", "bf16")
    want = {"hopper": (_hopper_us("dispatch", 1024, 1), _hopper_us("combine", 1024, 1)),
            "blackwell": (37.0, 42.5)}[family]
    assert ll_sms.family_of(device) == family
    assert ll_sms.price(_on(device), disp)[0] == pytest.approx(want[0] * 1e-6, rel=1e-9)
    assert ll_sms.price(_on(device), comb)[0] == pytest.approx(want[1] * 1e-6, rel=1e-9)


def test_hopper_test_case_combine_is_pr_425s_sum():
    # at 1,024 messages the fixed part cancels: (280.39 + 71.27) / 7 = 50.2371... us
    comb, _ = ll_sms.kernels(128, 8, 7168, "fp8", "bf16")
    assert ll_sms.price(_on("H800"), comb)[0] == pytest.approx(351.66 / 7 * 1e-6, rel=1e-9)


@pytest.mark.parametrize("device", ["A100", "cpu"])
def test_a_device_without_logs_is_refused(device):
    with pytest.raises(InputError) as e:
        ll_sms.family_of(device, "x.yaml")
    assert "cluster.device" in str(e.value) and "x.yaml" in str(e.value)


def test_one_token_top_1_by_hand():
    # Blackwell, DeepEP's messages (hidden 7,168: FP8 dispatch 7,408 B, BF16 combine
    # 14,336 B), one message each way: dispatch (15.6 + 5.3) us + (69.5 + 11) / 5,120 us =
    # 20.91572265625 us; combine (12.8 + 7.2) + (101 + 11.5) / 5,120 = 20.02197265625 us
    comb, disp = ll_sms.kernels(1, 1, 7168, "fp8", "bf16")
    assert (disp.bytes, comb.bytes, disp.seq, comb.seq) == (7408, 14336, 1, 1)
    assert disp.count == comb.count == 2                     # send and receive
    gb = _on("GB200")
    assert ll_sms.price(gb, disp)[0] == pytest.approx(20.91572265625e-6, rel=1e-12)
    assert ll_sms.price(gb, comb)[0] == pytest.approx(20.02197265625e-6, rel=1e-12)
    # hidden 1,024: FP8 16 + 1,024 + 4 x 8 = 1,072 B, BF16 2,048 B: the per-message part
    # scales by the bytes, the fixed part does not
    comb, disp = ll_sms.kernels(1, 1, 1024, "fp8", "bf16")
    assert ll_sms.price(gb, disp)[0] == pytest.approx(
        (20.9 + 80.5 / 5120 * 1072 / 7408) * 1e-6, rel=1e-12)
    assert ll_sms.price(gb, comb)[0] == pytest.approx(
        (20.0 + 112.5 / 5120 * 2048 / 14336) * 1e-6, rel=1e-12)
    assert ll_sms.price(_on("H100"), disp)[0] == pytest.approx(
        _hopper_us("dispatch", 1, 1072 / 7408) * 1e-6, rel=1e-9)


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
    # 8 tokens x top-2 = 16 messages, hidden 1,024 (FP8 1,072 B, BF16 2,048 B), H100: the
    # Hopper rule (above) at 16 messages of 1,072 / 7,408 and 2,048 / 14,336 of the test's
    # bytes, plus their four launches; one MoE layer, one micro-batch: nothing overlaps
    # them
    on = _scenario(tmp_path, ll_sms="compute")
    res, cfg = resolve_serve(on)
    comb, disp = ll_sms.kernels(8, 2, 1024, "fp8", "bf16")
    assert (disp.bytes, comb.bytes, disp.seq) == (17_152, 32_768, 16)
    sm_d = _hopper_us("dispatch", 16, 1072 / 7408) * 1e-6
    sm_c = _hopper_us("combine", 16, 2048 / 14336) * 1e-6
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


def test_a_scenario_on_a_device_without_logs_is_refused_in_one_line(tmp_path):
    path = _scenario(tmp_path, ll_sms="compute")
    with pytest.raises(InputError) as e:
        ServeBuilder(*resolve_serve(path, ["cluster.device=A100"]))
    assert "cluster.device" in str(e.value) and path in str(e.value)
    ServeBuilder(*resolve_serve(_scenario(tmp_path), ["cluster.device=A100"]))   # off: runs


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
