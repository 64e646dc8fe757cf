"""GEMMs pinned to the SMs the EP kernels leave (``serve.gemm_sms: left_by_ep``, SGLang's
prefill two-batch overlap): priced by wave quantisation on S - held SMs, not slowed a
second time while a communication kernel holds SMs, in both engines.

Hand case: a device of S = 100 SMs, a communication kernel holding 20. One FP8 GEMM of
1,408 x 1,408 output (11 x 11 = 121 tiles of 128 x 128) takes 1 ms on all 100 SMs (two
waves: ceil(121 / 100) = 2); on the 80 left it is still two waves (ceil(121 / 80) = 2):
1 ms. A GEMM of 1,280 x 1,024 (10 x 8 = 80 tiles): one wave on 100 and on 80: 1 ms. One of
1,408 x 1,152 (11 x 9 = 99 tiles): one wave on 100, two on 80: 2 ms.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from moesim.cli import main
from moesim.compute.base import Kernel
from moesim.compute.pinned_sms import PinnedGemms, is_pinned
from moesim.engine.fast.forward import ForwardChain
from moesim.program.ops import Op
from moesim.serve.program import ServeBuilder
from moesim.serve.run import resolve_serve, simulate_serve
from tests.test_sm_sharing import RECV, compute_span, run, send


class OneMs:
    """Every kernel 1 ms, no launch cost."""
    name = "one_ms"

    def time_s(self, k: Kernel) -> float:
        return 1e-3


def gemm(m: int, n: int, dtype: str = "fp8", kind: str = "gemm") -> Kernel:
    return Kernel("dense_gemm", 2.0 * m * n * 1024, 0.0, m=m, n=n, k=1024, kind=kind,
                  dtype=dtype)


MEM = Kernel("norm", 0.0, 1e6, kind="memory")


def test_pinned_gemm_priced_by_waves_on_the_sms_left():
    pm = PinnedGemms(OneMs(), 80, 100, "fp8")
    assert pm.time_s(gemm(1408, 1408)) == pytest.approx(1e-3)       # 2 waves -> 2 waves
    assert pm.time_s(gemm(1280, 1024)) == pytest.approx(1e-3)       # 1 wave -> 1 wave
    assert pm.time_s(gemm(1408, 1152)) == pytest.approx(2e-3)       # 1 wave -> 2 waves
    # BF16 GEMMs (cuBLAS, not DeepGEMM) and memory-bound kernels keep the whole GPU
    assert pm.time_s(gemm(1408, 1152, dtype="bf16")) == pytest.approx(1e-3)
    assert pm.time_s(MEM) == pytest.approx(1e-3)
    # a GEMM of no dtype takes the scenario's precision
    assert is_pinned(gemm(8, 8, dtype=""), "fp8") and not is_pinned(gemm(8, 8, ""), "bf16")
    ks = (gemm(1408, 1152), MEM, gemm(1408, 1152, dtype="bf16"))
    assert pm.pinned_s(ks) == pytest.approx(2e-3)                   # the FP8 GEMM only


def test_launch_cost_is_not_scaled():
    class WithLaunch(OneMs):
        def time_s(self, k):
            return 1e-3 + 1e-4            # 0.1 ms launch + 1 ms of waves

    pm = PinnedGemms(WithLaunch(), 80, 100, "fp8", launch_s=1e-4)
    assert pm.time_s(gemm(1408, 1152)) == pytest.approx(1e-4 + 2e-3)


# ------------------------------------------------------------ the exact engine
# One link: a 1 GB send takes 10 ms and its kernel holds 20 of the 100 SMs.

def op(duration: float, pinned: float) -> Op:
    return Op(stream="compute", kind="compute", name="c", duration_s=duration,
              pinned_s=pinned)


@pytest.mark.parametrize("pinned, expect", [
    (0.0, 0.004 * 100 / 80),              # nothing pinned: (S - held)/S of the rate
    (0.004, 0.004),                       # the GEMM pinned: not slowed
    (0.002, 0.004 * (0.5 + 0.5 * 100 / 80)),   # half pinned: 4.5 ms
])
def test_exact_pinned_part_is_not_slowed_under_a_send(pinned, expect):
    c = compute_span(run([[send(20), op(0.004, pinned)], RECV]))
    assert c.end_s - c.start_s == pytest.approx(expect, rel=1e-12)


def test_exact_without_a_concurrent_send_takes_its_duration():
    c = compute_span(run([[op(0.004, 0.004)], []]))
    assert c.end_s - c.start_s == pytest.approx(0.004, rel=1e-12)


def test_exact_send_ending_midway():
    # a 0.2 GB send holds the SMs 2 ms: half-pinned work progresses at 1 / 1.125 for
    # 2 ms (1.778 ms of work), the remaining 2.222 ms at full rate: 4.222 ms
    p0 = [dataclasses.replace(send(20), nbytes=0.2e9), op(0.004, 0.002)]
    c = compute_span(run([p0, RECV]))
    assert c.end_s - c.start_s == pytest.approx(0.004 + 0.002 * (1 - 1 / 1.125), rel=1e-9)


# ------------------------------------------------------------ the fast engine

def chain(ep_free: float):
    ch = ForwardChain.__new__(ForwardChain)
    ch.c = type("C", (), {"ep_sm_frac": 0.2})()
    ch.pairing, ch.ep_free, ch.t = True, np.array([ep_free]), [np.array([0.0])]
    return ch


@pytest.mark.parametrize("ep_free, pinned, expect", [
    (0.010, None, 0.004 * 100 / 80),
    (0.010, 0.004, 0.004),
    (0.010, 0.002, 0.0045),
    (0.002, 0.002, 0.004 + 0.002 * (1 - 1 / 1.125)),
    (0.0, 0.004, 0.004),                  # nothing in flight
])
def test_fast_rate_matches_the_exact_cases(ep_free, pinned, expect):
    p = None if pinned is None else np.array([pinned])
    got = chain(ep_free)._rate(0, np.array([0.004]), p)
    assert got[0] == pytest.approx(expect, rel=1e-12)


# ------------------------------------------------------------ a serving step

def _scenario(tmp_path, **serve) -> str:
    model = {"layers": 2, "hidden": 1024, "heads": 8, "kv_heads": 8, "head_dim": 128,
             "vocab": 4096, "attention": "mha", "dense_ffn": 4096, "n_experts": 8,
             "top_k": 2, "expert_ffn": 2048}
    s = {"phase": "prefill", "batch_per_gpu": 2, "prompt": 256, "ep": 8,
         "ep_backend": "deepep", "two_microbatch": True, **serve}
    data = {"name": "pin", "cluster": {"topology": "dgx-h100"}, "model": model,
            "serve": s, "compute": {"model": "roofline", "precision": "fp8"}}
    p = tmp_path / "pin.yaml"
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_ops_carry_the_pinned_gemms(tmp_path):
    res, cfg = resolve_serve(_scenario(tmp_path, gemm_sms="left_by_ep"))
    sb = ServeBuilder(res, cfg)
    prog = sb.rank_program(0)
    pm = sb.builder.timer.model
    assert isinstance(pm, PinnedGemms) and (pm.sms, pm.total) == (112, 132)
    attn = next(o for o in prog if o.name == "fwd.attn")
    want = sum(pm.time_s(k) for k in attn.kernels if k.kind == "gemm")
    assert attn.pinned_s == pytest.approx(want)
    assert 0 < attn.pinned_s < attn.duration_s
    off, cfg_off = resolve_serve(_scenario(tmp_path))
    assert all(o.pinned_s == 0 for o in ServeBuilder(off, cfg_off).rank_program(0))


def test_engines_agree_and_the_step_is_longer(tmp_path):
    path = _scenario(tmp_path, gemm_sms="left_by_ep")
    steps = {}
    for mode in ("exact", "fast"):
        res, cfg = resolve_serve(path, [f"engine.mode={mode}"])
        steps[mode] = simulate_serve(res, cfg).summary
    assert steps["fast"]["step_time_s"] == pytest.approx(steps["exact"]["step_time_s"],
                                                         rel=1e-3)
    step = steps["exact"]["step_time_s"]
    for k, v in steps["exact"]["breakdown_s"].items():
        assert steps["fast"]["breakdown_s"][k] == pytest.approx(v, abs=5e-3 * step)
    assert steps["exact"]["serve"]["gemm_sms"] == "left_by_ep"
    res, cfg = resolve_serve(_scenario(tmp_path), ["engine.mode=exact"])
    off = simulate_serve(res, cfg).summary
    assert "gemm_sms" not in off["serve"]
    assert off["step_time_s"] < step


def test_left_by_ep_needs_two_microbatches(tmp_path, capsys):
    path = _scenario(tmp_path, gemm_sms="left_by_ep", two_microbatch=False)
    assert main(["serve", path]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "serve.two_microbatch" in err


def test_bad_choice_is_one_line(tmp_path, capsys):
    assert main(["serve", _scenario(tmp_path), "--set", "serve.gemm_sms=half"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "serve.gemm_sms" in err


# ------------------------------------------------------------ one GEMM, end to end
# The GEMM of 99 tiles (1,408 x 1,152): 1 ms on all 100 SMs, 2 ms pinned to the 80 a
# communication kernel leaves (one wave -> two). As an op: 2 ms, all of it pinned.

def test_one_gemm_of_known_tiles_on_both_engines():
    pm = PinnedGemms(OneMs(), 80, 100, "fp8")
    k = (gemm(1408, 1152),)
    o = op(sum(pm.time_s(x) for x in k), pm.pinned_s(k))
    assert (o.duration_s, o.pinned_s) == pytest.approx((2e-3, 2e-3))
    # exact engine: with a concurrent 10 ms send holding 20 SMs, and without one: 2 ms
    with_a2a = compute_span(run([[send(20), o], RECV]))
    alone = compute_span(run([[o], []]))
    assert with_a2a.end_s - with_a2a.start_s == pytest.approx(2e-3, rel=1e-12)
    assert alone.end_s - alone.start_s == pytest.approx(2e-3, rel=1e-12)
    # fast engine: the same, with and without the all-to-all in flight
    for ep_free in (0.010, 0.0):
        got = chain(ep_free)._rate(0, np.array([o.duration_s]), np.array([o.pinned_s]))
        assert got[0] == pytest.approx(2e-3, rel=1e-12)
    # unpinned (gemm_sms: all): 1 ms on 100 SMs alone, 1.25 ms under the send in both
    u = op(OneMs().time_s(k[0]), 0.0)
    c = compute_span(run([[send(20), u], RECV]))
    assert c.end_s - c.start_s == pytest.approx(1e-3 * 100 / 80, rel=1e-12)
    assert chain(0.010)._rate(0, np.array([1e-3]), None)[0] == pytest.approx(1.25e-3)
