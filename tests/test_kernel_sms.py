"""Kernels as DeepSeek's profile ran them (issue 21): its in-house CUTLASS GEMMs priced from
DeepGEMM's published speedups over them, GEMMs on the SMs an overlapped pair leaves
(wave quantisation), FlashAttention-3's backward, and kernel classes measured as GPU
time when two streams overlap. Every figure below is worked out by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from moesim.cli import main
from moesim.compute.base import Kernel
from moesim.compute.catalog import CatalogModel
from moesim.compute.devices import get_device
from moesim.compute.roofline import RooflineModel
from moesim.compute.select import compute_model, shipped_catalog
from moesim.compute.sm_share import OnSms, gemm_tiles, pair_sms, sm_ratio
from moesim.errors import InputError
from moesim.scenario import load_scenario
from moesim.validation.gpu.classes import measured, recompute_kernels
from moesim.validation.gpu.trace import Annotation, GpuKernel
from moesim.wiring import resolve

H800 = get_device("H800")


def catalog(lib="", overhead=0.0, precision="fp8") -> CatalogModel:
    return CatalogModel(RooflineModel(H800, precision=precision, launch_overhead_s=overhead),
                        shipped_catalog(), gemm_library=lib)


def gemm(kind, m, n, k, pass_="fwd", groups=1, count=1):
    return Kernel("g", 2.0 * m * n * k * count, 0.0, m=m, n=n, k=k, kind=kind, pass_=pass_,
                  groups=groups, count=count)


# ------------------------------------------------- DeepSeek's in-house CUTLASS GEMMs
def test_dpsk_cutlass_row_is_deepgemms_rate_over_its_speedup():
    # DeepGEMM README @a6d97a1c: M=4096 N=7168 K=16384 at 1358 TFLOPS, 1.2x over the
    # internal CUTLASS 3.6 kernel -> 1131.67 TFLOP/s
    p = catalog("dpsk-cutlass").price(gemm("gemm", 4096, 7168, 16384))
    assert p.source == "catalog" and "dpsk-cutlass-normal" in p.detail
    assert p.time_s == pytest.approx(2.0 * 4096 * 7168 * 16384 / (1358e12 / 1.2), rel=1e-12)
    # PR #95 wgrad: M=16384 (k) N=7168 (n) K=4096 (tokens) at 994 TFLOPS, "~20%" faster
    w = catalog("dpsk-cutlass").price(gemm("gemm", 4096, 7168, 16384, pass_="wgrad"))
    assert w.time_s == pytest.approx(2.0 * 4096 * 7168 * 16384 / (994e12 / 1.2), rel=1e-12)


def test_default_library_is_deepgemm_and_libraries_do_not_mix():
    k = gemm("gemm", 4096, 7168, 16384)
    assert "deepgemm-normal" in catalog().price(k).detail           # 1520 TFLOP/s @327ec92f
    assert catalog().price(k).time_s == 2.0 * 4096 * 7168 * 16384 / 1520e12
    lib = catalog("dpsk-cutlass")
    assert all(t.library == "dpsk-cutlass" for t in lib.tables
               if t.kind in ("gemm", "grouped_gemm", "kgrouped_gemm"))
    assert any(t.kind == "attn_fwd" for t in lib.tables)          # the rest is shared


def test_gemm_library_from_the_scenario_and_bad_names(tmp_path):
    m = compute_model({"kind": "roofline", "precision": "fp8", "gemm_library": "dpsk-cutlass"},
                      "s.yaml", H800)
    assert m.gemm_library == "dpsk-cutlass" and m.name == "catalog(H800,fp8,dpsk-cutlass,memory=fused)"
    with pytest.raises(InputError, match="compute.gemm_library.*dpsk-cutlass.*got 'cublas'"):
        compute_model({"precision": "fp8", "gemm_library": "cublas"}, "s.yaml", H800)
    # the roofline has no library: the field is ignored, as --set compute.model=roofline
    # on scenarios/deepseek-v3-fb-pair.yaml needs
    r = compute_model({"model": "roofline", "gemm_library": "dpsk-cutlass"}, "s.yaml", H800)
    assert isinstance(r, RooflineModel)
    bad = tmp_path / "bad.yaml"
    bad.write_text("tables:\n  - {id: x, kind: memory, dtype: any, passes: [fwd], "
                   "devices: [H800], source: s, gbps: 1000, library: foo}\n")
    with pytest.raises(InputError, match=r"tables\[0\].library"):
        compute_model({"catalog": str(bad)}, "s.yaml", H800)
    neg = tmp_path / "neg.yaml"
    neg.write_text("tables:\n  - {id: x, kind: gemm, dtype: fp8, passes: [fwd], "
                   "devices: [H800], source: s, columns: [m, n, k, tflops, speedup], "
                   "rows: [[64, 64, 64, 100, 0]]}\n")
    with pytest.raises(InputError, match=r"rows\[0\].speedup"):
        compute_model({"catalog": str(neg)}, "s.yaml", H800)


def test_fb_pair_scenario_prices_gemms_as_the_profile_ran_them(capsys):
    res = resolve(load_scenario("scenarios/deepseek-v3-fb-pair.yaml"))
    assert res.compute.gemm_library == "dpsk-cutlass"
    assert main(["kernels", "scenarios/deepseek-v3-fb-pair.yaml", "--pass", "wgrad"]) == 0
    assert "dpsk-cutlass-kgrouped-wgrad" in capsys.readouterr().out


# --------------------------------------------------------- SMs and wave quantisation
def test_gemm_tiles_by_pass_and_layout():
    assert gemm_tiles(gemm("gemm", 4096, 7168, 2048)) == (32 * 56, 1)        # Y: m x n
    assert gemm_tiles(gemm("gemm", 4096, 7168, 2048, "dgrad")) == (32 * 16, 1)  # dX: m x k
    assert gemm_tiles(gemm("gemm", 4096, 7168, 2048, "wgrad")) == (16 * 56, 1)  # dW: k x n
    assert gemm_tiles(gemm("gemm", 4096, 576, 7168)) == (32 * 5, 1)           # 576 -> 5 tiles
    # four experts' shares of one grouped launch, 8192 rows each
    assert gemm_tiles(gemm("grouped_gemm", 8192, 4096, 7168, count=4)) == (4 * 64 * 32, 1)
    assert gemm_tiles(gemm("kgrouped_gemm", 8192, 4096, 7168, "wgrad", count=4)) == \
        (4 * 56 * 32, 1)
    assert gemm_tiles(gemm("gemm", 4096, 7168, 2048, count=3)) == (32 * 56, 3)


def test_wave_quantisation_by_hand():
    big = gemm("gemm", 4096, 7168, 2048)            # 1792 tiles: 14 waves on 132, 16 on 112
    assert sm_ratio(big, 112, 132) == 16 / 14
    small = gemm("gemm", 4096, 576, 7168)           # 160 tiles: 2 waves on 132 and on 112
    assert sm_ratio(small, 112, 132) == 1.0
    q = gemm("gemm", 4096, 1536, 7168)              # 384 tiles: 3 waves on 132, 4 on 112
    assert sm_ratio(q, 112, 132) == 4 / 3
    mem = Kernel("norm", 0.0, 1e8, kind="memory")   # not tiled: the SM share, as the engines
    assert sm_ratio(mem, 112, 132) == 132 / 112
    assert sm_ratio(big, 132, 132) == 1.0


def test_on_sms_scales_all_but_the_launch_overhead():
    base = catalog(overhead=4e-6)
    k = gemm("gemm", 4096, 7168, 2048)
    t = base.time_s(k)
    assert OnSms(base, 112).time_s(k) == pytest.approx(4e-6 + (t - 4e-6) * 16 / 14, rel=1e-12)
    assert OnSms(base, 132).time_s(k) == t
    assert OnSms(base, 112).name == "catalog(H800,fp8) on 112 SMs"


def test_pair_sms_is_the_device_less_the_ep_kernels_in_a_dualpipe_pair():
    res = resolve(load_scenario("scenarios/deepseek-v3-fb-pair.yaml"))
    assert pair_sms(res) == 132 - 20
    one_f_one_b = SimpleNamespace(scenario=SimpleNamespace(
        schedule=SimpleNamespace(kind="1f1b"), parallel=res.scenario.parallel,
        overlap=res.scenario.overlap), device=res.device)
    assert pair_sms(one_f_one_b) is None


# ------------------------------------------------------ FlashAttention-3's backward
def attn_bwd(seq, head_dim, causal, flops=1e12):
    return Kernel("attention_bwd", flops, 0.0, kind="attn_bwd", dtype="bf16", seq=seq,
                  head_dim=head_dim, causal=causal)


def test_fa3_backward_rows_and_the_causal_ratio_of_the_forward_figure():
    m = catalog(precision="bf16")
    assert m.price(attn_bwd(4096, 128, False)).time_s == 1e12 / 542e12   # Figure 6, 4k
    # causal: FA3 Figure 5 forward at 4k, head dim 128: causal 579, non-causal 638
    p = m.price(attn_bwd(4096, 128, True))
    assert p.time_s == pytest.approx(1e12 / (542e12 * 579 / 638), rel=1e-12)
    assert "causal/non-causal forward 579/638" in p.detail
    # between published seqs: log-log in both factors, still monotone in FLOPs
    ts = [m.price(attn_bwd(s, 128, True, flops=s * s)).time_s for s in (512, 1500, 3000, 4096)]
    assert ts == sorted(ts)


# ------------------------------------------ classes measured as GPU time, not a sum
def kern(name, cls, stream, start, dur, phase):
    return GpuKernel(name, cls, "", 0, stream, start, dur, 112, 0.0, "fp8", None, phase)


def test_two_streams_count_their_overlap_once():
    w = Annotation("mlp(W)", 0, 0.0, 1.0)
    f = Annotation("mlp(F)", 0, 0.0, 1.0)
    tr = SimpleNamespace(kernels=[
        kern("gemm_a", "gemm", 7, 0.0, 4e-3, w), kern("gemm_b", "gemm", 23, 1e-3, 4e-3, w),
        kern("cast", "cast", 7, 5e-3, 1e-3, w), kern("gemm_c", "gemm", 7, 0.0, 2e-3, f),
        kern("comm", "comm", 27, 0.0, 9e-3, w)])
    got, layers = measured(tr)
    assert layers == 1
    assert got["W"]["gemm"] == pytest.approx(5e-3)     # [0, 4] and [1, 5] ms: 5 ms, not 8
    assert got["W"]["cast"] == pytest.approx(1e-3)
    assert got["F"]["gemm"] == pytest.approx(2e-3)
    assert "" not in got["W"] and "comm" not in got["W"]


def test_recomputed_kernels_go_to_the_part_that_launches_them():
    res = resolve(load_scenario("scenarios/deepseek-v3-fb-pair.yaml"))
    rc = recompute_kernels(res)
    gemms = [k for k in rc["attn"] if k.kind == "gemm"]
    # MLA's up-projections (report §3.2.3): q_b 1536 -> 128 x 192, kv_b 512 -> 128 x 256
    assert sorted((k.n, k.k) for k in gemms) == [(24576, 1536), (32768, 512)]
    assert all(k.m == 4096 for k in gemms)
    assert not [k for k in rc["mlp"] if k.kind in ("gemm", "grouped_gemm")]
    assert math.isclose(sum(k.flops for k in gemms), 2 * 4096 * (24576 * 1536 + 32768 * 512))
