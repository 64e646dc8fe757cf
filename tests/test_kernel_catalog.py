"""The kernel catalog (issue 21 items 2 and 3): kernels at their authors' published rates.

Hand figures: DeepGEMM's normal FP8 GEMM M=4096, N=7168, K=2048 runs at 1168 TFLOP/s on
H800 (README at 327ec92f): 2·4096·7168·2048 = 120 259 084 288 FLOP in 102.96 µs.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import simpy

from moesim.cli import main
from moesim.collectives.communicator import Communicator
from moesim.compute.base import Kernel
from moesim.compute.catalog import CatalogModel, coverage, price
from moesim.compute.catalog_data import curve, families, load_catalog
from moesim.compute.devices import get_device
from moesim.compute.roofline import RooflineModel
from moesim.compute.select import compute_model, shipped_catalog
from moesim.engine.exact.execute import Executor
from moesim.errors import InputError
from moesim.network import FlowNetwork
from moesim.program.ops import Op
from moesim.program.timer import Timer
from moesim.units import GB

H800 = get_device("H800")
A100 = get_device("A100")


def catalog(device=H800, precision="fp8", overhead=0.0) -> CatalogModel:
    return CatalogModel(RooflineModel(device, precision=precision, launch_overhead_s=overhead),
                        shipped_catalog())


def table(tid):
    return next(t for t in shipped_catalog() if t.id == tid)


def gemm(kind, m, n, k, pass_="fwd", groups=1, dtype=""):
    return Kernel("g", 2.0 * m * n * k, 0.0, m=m, n=n, k=k, kind=kind, pass_=pass_,
                  groups=groups, dtype=dtype)


def fa_flops(seq, head_dim, causal):
    """FlashAttention-2 §4.1 benchmark: 16k tokens, hidden 2048; forward FLOPs
    4·seq²·head_dim·heads per sequence, halved with a causal mask."""
    batch, heads = 16384 // seq, 2048 // head_dim
    return 4.0 * seq * seq * head_dim * heads * batch * (0.5 if causal else 1.0)


# ------------------------------------------------------------- rows, exactly
def test_hand_row_deepgemm_4096_7168_2048():
    p = catalog().price(gemm("gemm", 4096, 7168, 2048))
    assert p.source == "catalog" and "exact 1168" in p.detail
    assert p.time_s == 120_259_084_288 / 1168e12
    assert p.time_s == pytest.approx(102.96e-6, abs=0.01e-6)


@pytest.mark.parametrize("tid", ["deepgemm-normal", "deepgemm-grouped", "deepgemm-wgrad",
                                 "deepgemm-kgrouped-wgrad"])
def test_every_gemm_row_returns_its_published_time(tid):
    t, model = table(tid), catalog()
    for r in t.rows:
        k = gemm(t.kind, r.m, r.n, r.k, pass_=t.passes[0], groups=r.groups)
        p = model.price(k)
        assert p.source == "catalog", p
        assert "exact" in p.detail
        assert p.time_s == 2.0 * r.m * r.n * r.k / (r.tflops * 1e12)


def test_launch_overhead_is_added_per_launch_as_the_roofline_does():
    model = catalog(overhead=4e-6)
    one = model.price(gemm("gemm", 4096, 7168, 2048))
    # two launches of the same GEMM (flops and count are totals for the group)
    two = model.price(Kernel("g", 2 * 2.0 * 4096 * 7168 * 2048, 0.0, m=4096, n=7168, k=2048,
                             kind="gemm", pass_="fwd", count=2))
    assert one.time_s == 4e-6 + 120_259_084_288 / 1168e12
    assert two.time_s == pytest.approx(2 * one.time_s, rel=1e-15)


def test_dgrad_is_priced_as_the_transposed_gemm():
    # dX = dY·Wᵀ of a forward (n=2048, k=7168) GEMM is the published N=7168, K=2048 GEMM
    p = catalog().price(gemm("gemm", 4096, 2048, 7168, pass_="dgrad"))
    assert "exact 1168" in p.detail and p.time_s == 120_259_084_288 / 1168e12


@pytest.mark.parametrize("tid", ["fa3-fwd-d64", "fa3-fwd-d128-causal", "fa3-fwd-d256-causal",
                                 "fa3-fwd-d256"])
def test_every_attention_row_returns_its_published_time(tid):
    t, model = table(tid), catalog(precision="bf16")
    for r in t.rows:
        f = fa_flops(r.seq, t.head_dim, t.causal)
        k = Kernel("attention", f, 0.0, kind="attn_fwd", dtype="bf16", seq=r.seq,
                   head_dim=t.head_dim, causal=t.causal)
        p = model.price(k)
        assert p.source == "catalog" and "exact" in p.detail
        assert p.time_s == f / (r.tflops * 1e12)


def test_forward_plus_backward_figure_gives_the_published_pair_time_on_a100():
    # FlashAttention-2 Figure 4d, A100, causal, head dim 128, seq 2k: 155 TFLOP/s for
    # forward + backward (backward = 2.5x forward FLOPs)
    model = catalog(A100, precision="bf16")
    f = fa_flops(2048, 128, True)
    fwd = Kernel("attention", f, 0.0, kind="attn_fwd", seq=2048, head_dim=128, causal=True)
    bwd = Kernel("attention_bwd", 2.5 * f, 0.0, kind="attn_bwd", seq=2048, head_dim=128,
                 causal=True)
    total = model.time_s(fwd) + model.time_s(bwd)
    assert total == pytest.approx(3.5 * f / 155e12, rel=1e-14)


# -------------------------------------------------------------- between rows
def test_interpolation_by_hand():
    # (n=7168, k=2048): 510 TFLOP/s at m=128, 1168 at m=4096; m=1024 sits 3/5 of the way
    # in log m, so the rate is 510·(1168/510)^0.6
    rate = 510 * (1168 / 510) ** 0.6
    p = catalog().price(gemm("gemm", 1024, 7168, 2048))
    assert p.time_s == pytest.approx(2.0 * 1024 * 7168 * 2048 / (rate * 1e12), rel=1e-12)
    assert "interpolated" in p.detail


def _sweep(lo, hi, n=300):
    return np.unique(np.geomspace(lo, hi, n).round().astype(int))


@pytest.mark.parametrize("tid", ["deepgemm-normal", "deepgemm-grouped", "deepgemm-wgrad",
                                 "deepgemm-kgrouped-wgrad"])
def test_time_is_monotone_in_flops_between_rows(tid):
    t, model = table(tid), catalog()
    for (n, k), rows in families(t).items():
        for g in sorted({r.groups for r in rows} | {1}):
            pts = curve(rows, g)
            times = []
            for per in _sweep(pts[0].axis, 2 * pts[-1].axis):   # through rows and above
                p = model.price(gemm(t.kind, int(per) * g, n, k, pass_=t.passes[0], groups=g))
                assert p.source == "catalog", p
                times.append(p.time_s)
            assert all(b >= a for a, b in zip(times, times[1:], strict=False)), (n, k, g)


def test_attention_time_is_monotone_in_seq_at_fixed_tokens():
    model = catalog(precision="bf16")
    for d in (64, 96, 128, 192, 256):
        times = []
        for seq in _sweep(512, 32768):
            f = 2.0 * 16384 * seq * (2048 // 64) * d        # FLOPs ∝ seq at fixed tokens
            p = model.price(Kernel("attention", f, 0.0, kind="attn_fwd", seq=int(seq),
                                   head_dim=d, causal=True))
            assert p.source == "catalog"
            times.append(p.time_s)
        assert all(b >= a for a, b in zip(times, times[1:], strict=False)), d


def test_unpublished_shape_scaled_by_waves_and_hold_above_by_hand():
    model = catalog()
    # n=2048, k=7168 is not published; (2112, 7168) has the same K and the nearest N.
    # At the curve's largest row (4096 tokens = 32 row tiles of 128) it is 32 x 17 = 544
    # tiles, 5 waves on 132 SMs; n=2048 is 32 x 16 = 512 tiles, 4 waves. Time = FLOPs at
    # the published 1127 TFLOP/s x 4/5 waves x (2112 / 2048) FLOPs per wave
    p = model.price(gemm("gemm", 4096, 2048, 7168))
    assert "from n=2112 k=7168: 4/5 waves" in p.detail and "exact 1127" in p.detail
    assert p.time_s == pytest.approx(2.0 * 4096 * 2048 * 7168 / 1127e12 * 4 / 5 * 2112 / 2048,
                                     rel=1e-12)
    # n=576 (MLA's kv_a): 32 x 5 = 160 tiles, 2 waves: 2/5 of the 2112-wide GEMM's time
    p = model.price(gemm("gemm", 4096, 576, 7168))
    assert p.source == "catalog"
    assert p.time_s == pytest.approx(2.0 * 4096 * 2112 * 7168 / 1127e12 * 2 / 5, rel=1e-12)
    # K scales the time of a tile: the input gradient of kv_a, (m, N=7168, K=576), from
    # (32768, 512): 32 x 256 = 8192 tiles, 63 waves; 32 x 56 = 1792 tiles, 14 waves
    p = model.price(gemm("gemm", 4096, 576, 7168, pass_="dgrad"))
    t_ref = 2.0 * 4096 * 32768 * 512 / 775e12
    assert p.time_s == pytest.approx(t_ref * 14 / 63 * 576 / 512, rel=1e-12)
    # K beyond 2x of every published K: the roofline
    p = model.price(gemm("gemm", 4096, 7168, 65536))
    assert p.source == "roofline" and "k within 2x" in p.detail
    # along tokens an unpublished shape keeps one factor: time monotone in FLOPs
    ts = [model.price(gemm("gemm", m, 576, 7168)).time_s for m in (64, 100, 128, 1000, 4096,
                                                                   9000)]
    assert ts == sorted(ts)
    # 16384 tokens: above the largest row (4096), held at its 1168 TFLOP/s
    p = model.price(gemm("gemm", 16384, 7168, 2048))
    assert "held" in p.detail or "above the largest row" in p.detail
    assert p.time_s == 2.0 * 16384 * 7168 * 2048 / 1168e12
    # grouped, priced per expert (groups=1): 512 rows = the masked 2 x 512 row (1040)
    p = model.price(gemm("grouped_gemm", 512, 4096, 7168))
    assert p.time_s == 2.0 * 512 * 4096 * 7168 / 1040e12


def test_attention_head_dim_between_and_above_the_published_ones_by_hand():
    model = catalog(precision="bf16")
    f = 1e12
    # head dim 181 ~ between 128 and 256 at seq 4096, causal: 579 and 612 TFLOP/s,
    # geometric weight log(181/128)/log(2)
    w = math.log(181 / 128) / math.log(2)
    rate = 579 * (612 / 579) ** w
    p = model.price(Kernel("attention", f, 0.0, kind="attn_fwd", seq=4096, head_dim=181,
                           causal=True))
    assert p.time_s == pytest.approx(f / (rate * 1e12), rel=1e-12)
    # backward on H800: FlashAttention-3's backward figure (non-causal, head dims 64 and
    # 128); head dim 192 is wider than its widest and holds 128's rate, 542 TFLOP/s at
    # 4k, times the forward figure's causal / non-causal ratio at head dim 192 (geometric
    # between 128 and 256: causal 579 -> 612, non-causal 638 -> 736 at 4k)
    w = math.log(192 / 128) / math.log(2)
    rate = 542 * (579 * (612 / 579) ** w) / (638 * (736 / 638) ** w)
    p = model.price(Kernel("attention_bwd", f, 0.0, kind="attn_bwd", seq=4096, head_dim=192,
                           causal=True))
    assert p.time_s == pytest.approx(f / (rate * 1e12), rel=1e-12)
    assert "held at 128" in p.detail and "causal/non-causal forward" in p.detail


def test_dtype_follows_the_fp8_recipe_when_unset():
    model = catalog()                               # precision fp8
    assert model.dtype_of(Kernel("router_dgrad", 1.0, 0.0)) == "bf16"
    assert model.dtype_of(Kernel("lm_head_wgrad", 1.0, 0.0)) == "bf16"
    assert model.dtype_of(Kernel("expert_gemm_dgrad", 1.0, 0.0)) == "fp8"
    assert model.dtype_of(Kernel("expert_gemm", 1.0, 0.0, dtype="bf16")) == "bf16"
    assert catalog(precision="bf16").dtype_of(Kernel("expert_gemm", 1.0, 0.0)) == "bf16"


# ----------------------------------------------------------------- fallback
def test_outside_the_catalog_falls_back_to_the_roofline_and_is_counted():
    model = catalog(overhead=4e-6)
    roof = model.roofline
    below = gemm("gemm", 16, 7168, 2048)                 # below the smallest row (64)
    bf16 = gemm("gemm", 4096, 7168, 2048, dtype="bf16")  # no BF16 GEMM table
    odd = gemm("gemm", 4096, 100, 100)                   # no published shape within 2x
    nokind = Kernel("norm", 10.0, 1e6)                   # kind "": today's roofline
    inside = gemm("gemm", 4096, 7168, 2048)
    for k in (below, bf16, odd, nokind):
        p = model.price(k)
        assert p.source == "roofline" and p.detail
        assert p.time_s == roof.time_s(k)
    assert model.price(inside).source == "catalog"
    assert model.tally["roofline"][0] == 4 and model.tally["catalog"][0] == 1
    cov = coverage(model, [below, bf16, odd, nokind, inside])
    fb = sum(roof.time_s(k) for k in (below, bf16, odd, nokind))
    total = fb + model.time_s(inside)
    assert (cov.n_kernels, cov.n_roofline) == (5, 4)
    assert cov.roofline_s == pytest.approx(fb) and cov.total_s == pytest.approx(total)
    assert cov.line() == (f"priced by the roofline: 4 of 5 kernels, "
                          f"{100 * fb / total:.1f} % of compute time")


def test_memory_kernels_run_at_the_published_streaming_bandwidth():
    p = catalog().price(Kernel("norm", 0.0, 3e9, kind="memory"))
    assert p.time_s == 3e9 / 3000e9 and p.source == "catalog"
    a = catalog(A100, "bf16").price(Kernel("norm", 0.0, 1732e6, kind="memory", count=1))
    assert a.time_s == pytest.approx(1e-3, rel=1e-15)


def test_mla_decode_is_the_slower_of_its_two_ceilings():
    model = catalog()
    mem = model.price(Kernel("attention_decode", 660e9, 3e9, kind="mla_decode", dtype="bf16"))
    assert mem.time_s == 1e-3 and "memory-bound" in mem.detail
    comp = model.price(Kernel("attention_decode", 1320e9, 3e9, kind="mla_decode", dtype="bf16"))
    assert comp.time_s == 2e-3 and "compute-bound" in comp.detail


# ------------------------------------------------- devices and model choice
def test_h200_streams_at_gpu_benches_rate_and_prices_the_rest_by_the_roofline():
    # te42kyfo/gpu-benches gpu-stream/h200.txt: "scale" at 100 % occupancy, 3165 GB/s
    for name in ("H200", "H200-NVL"):
        dev = get_device(name)
        model = compute_model({}, "s.yaml", dev)
        assert isinstance(model, CatalogModel)
        p = model.price(Kernel("norm", 0.0, 3165e6, kind="memory"))
        assert p.source == "catalog" and "gpu-benches-stream-h200" in p.detail
        assert p.time_s == pytest.approx(dev.launch_overhead_s + 1e-3, rel=1e-15)
        ref = RooflineModel(dev)
        for k in (gemm("gemm", 4096, 7168, 2048),
                  Kernel("attention", 1e12, 1e6, kind="attn_fwd", seq=4096, head_dim=128)):
            q = model.price(k)
            assert q.source == "roofline" and q.time_s == ref.time_s(k)


@pytest.mark.parametrize("name", ["cpu"])
def test_device_not_covered_keeps_todays_roofline(name):
    dev = get_device(name)
    model = compute_model({}, "s.yaml", dev)
    assert isinstance(model, RooflineModel)
    ref = RooflineModel(dev)
    for k in (gemm("gemm", 4096, 7168, 2048), Kernel("norm", 5.0, 1e6, kind="memory"),
              Kernel("attention", 1e12, 1e6, kind="attn_fwd", seq=4096, head_dim=128)):
        assert model.time_s(k) == ref.time_s(k)
    assert price(model, gemm("gemm", 64, 64, 64)).source == "roofline"


def test_catalog_is_the_default_on_covered_devices_and_roofline_stays_selectable():
    assert isinstance(compute_model({"precision": "fp8"}, "s.yaml", H800), CatalogModel)
    assert isinstance(compute_model(None, "s.yaml", A100), CatalogModel)
    roof = compute_model({"model": "roofline", "precision": "fp8"}, "s.yaml", H800)
    assert isinstance(roof, RooflineModel)
    k = gemm("gemm", 4096, 7168, 2048)
    assert roof.time_s(k) == RooflineModel(H800, precision="fp8").time_s(k)


def test_kernels_without_a_kind_are_priced_exactly_as_before():
    model = compute_model({"precision": "fp8"}, "s.yaml", H800)
    ref = RooflineModel(H800, precision="fp8")
    for k in (Kernel("expert_gemm", 2e12, 1e9, m=300, n=2048, k=7168),
              Kernel("attention", 1e12, 1e8, m=4096), Kernel("router", 1e9, 1e7, m=4096)):
        assert model.time_s(k) == ref.time_s(k)


def test_a_calibration_overrides_the_catalog():
    calib = Path(__file__).resolve().parents[1] / "traces" / "calib-uniform-cpu.json"
    model = compute_model({"kind": "calibration", "file": str(calib)}, "s.yaml", H800)
    assert not isinstance(model, (CatalogModel, RooflineModel))
    k = gemm("gemm", 4096, 7168, 2048)            # a kernel the catalog would price
    assert model.time_s(k) != catalog().time_s(k)
    assert price(model, k).source == model.name and price(model, k).time_s == model.time_s(k)


def test_scenario_field_selects_the_model(tmp_path):
    from moesim.scenario import load_scenario
    from moesim.wiring import resolve
    res = resolve(load_scenario("hot-expert"))
    assert isinstance(res.compute, CatalogModel) and res.compute.device.name == "H100"
    res = resolve(load_scenario("hot-expert", ["compute.model=roofline"]))
    assert isinstance(res.compute, RooflineModel)


# ------------------------------------------------------------ bad catalog data
BAD = {
    "not yaml": ("tables: [\n", "line"),
    "missing tflops": ("tables:\n- {id: x, kind: gemm, dtype: fp8, passes: [fwd], devices: "
                       "[H800], source: s, columns: [m, n, k], rows: [[64, 64, 64]]}\n",
                       "tables[0].columns"),
    "negative rate": ("tables:\n- {id: x, kind: gemm, dtype: fp8, passes: [fwd], devices: "
                      "[H800], source: s, columns: [m, n, k, tflops], rows: [[64, 64, 64, -1]]}\n",
                      "tables[0].rows[0].tflops"),
    "short row": ("tables:\n- {id: x, kind: gemm, dtype: fp8, passes: [fwd], devices: "
                  "[H800], source: s, columns: [m, n, k, tflops], rows: [[64, 64, 64]]}\n",
                  "tables[0].rows[0]"),
    "unknown kind": ("tables:\n- {id: x, kind: conv, dtype: fp8, passes: [fwd], devices: "
                     "[H800], source: s}\n", "tables[0].kind"),
    "unknown device": ("tables:\n- {id: x, kind: memory, dtype: any, passes: [fwd], devices: "
                       "[H900], gbps: 100, source: s}\n", "tables[0].devices"),
    "no source": ("tables:\n- {id: x, kind: memory, dtype: any, passes: [fwd], devices: "
                  "[H800], gbps: 100}\n", "tables[0].source"),
    "time falls between rows": (
        "tables:\n- {id: x, kind: gemm, dtype: fp8, passes: [fwd], devices: [H800], "
        "source: s, columns: [m, n, k, tflops], rows: [[64, 64, 64, 10], [128, 64, 64, 30]]}\n",
        "x.rows"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_catalog_is_one_line_naming_file_and_field(tmp_path, case):
    text, field = BAD[case]
    p = tmp_path / "mine.yaml"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        compute_model({"catalog": str(p)}, "s.yaml", H800)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and field in msg, msg


def test_malformed_catalog_on_the_command_line_exits_2_with_one_line(tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "mine.yaml"
    p.write_text(BAD["negative rate"][0])
    rc = main(["run", "hot-expert", "--set", f"compute.catalog={p}", "-o", "out", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "mine.yaml" in err and "tflops" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("d, field", [
    ({"model": "fast"}, "compute.model"),
    ({"model": "roofline", "catalog": "x.yaml"}, "compute.catalog"),
    ({"catalog": 3}, "compute.catalog"),
    ({"kind": "calibration", "file": "c.json", "model": "catalog"}, "compute.model"),
    ({"catalog": "no/such/file.yaml"}, "no/such/file.yaml"),
])
def test_bad_model_choice_is_one_line(d, field):
    with pytest.raises(InputError) as e:
        compute_model(d, "s.yaml", H800)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_a_users_catalog_replaces_the_shipped_one(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("tables:\n- {id: mine, kind: memory, dtype: any, passes: [fwd], devices: "
                 "[H200], gbps: 4000, source: 'my measurement'}\n")
    model = compute_model({"catalog": str(p)}, "s.yaml", get_device("H200"))
    assert model.price(Kernel("norm", 0, 4e9, kind="memory")).time_s == \
        pytest.approx(1e-3 + get_device("H200").launch_overhead_s)
    # the shipped tables are not used: no H800 table in that file
    assert isinstance(compute_model({"catalog": str(p)}, "s.yaml", H800), RooflineModel)


def test_every_shipped_table_cites_a_source():
    for t in load_catalog():
        assert len(t.source) > 20 and any(w in t.source for w in ("commit", "@", "arXiv",
                                                                   "pull request"))


# --------------------------------------------- item 3: SMs taken by communication
class OneLink:
    capacity_Bps = np.full(2, 100 * GB)
    latency_s = np.zeros(2)
    link_names = ["g0->g1", "g1->g0"]
    link_kinds = ["nvlink"] * 2

    def route(self, src, dst, key=0):
        return (0,) if (src, dst) == ("g0", "g1") else (1,)


def test_catalog_time_is_what_communication_slows():
    # The builder's Timer sums the model's kernel times into an op's full-rate work; a
    # send holding 50 of 100 SMs for 10 ms makes that work run at half rate.
    model = catalog()
    ks = [gemm("grouped_gemm", 2048, 4096, 7168), gemm("grouped_gemm", 2048, 7168, 2048)]
    work, _ = Timer(model)(("mlp",), lambda: ks)
    assert work == sum(model.time_s(k) for k in ks)
    assert work < 0.005
    env = simpy.Environment()
    net = FlowNetwork(env, OneLink())
    comm = Communicator(env, net, ["g0", "g1"], rank_host=[0, 0])
    prog0 = [Op(stream="pp", kind="pp", name="send", send_to=1, key=("m",), nbytes=1 * GB,
                sms=50),
             Op(stream="compute", kind="compute", name="mlp", duration_s=work)]
    prog1 = [Op(stream="compute", kind="pp", name="recv", recv_from=0, key=("m",))]
    ex = Executor(env, net, comm, ["g0", "g1"], [prog0, prog1], sm_total=100)
    ex.run()
    c = next(s for s in ex.spans if s.name == "mlp")
    assert c.end_s - c.start_s == pytest.approx(2 * work, rel=1e-12)
    assert math.isclose(work, 2 * 2048 * 4096 * 7168 / _rate(2048, 1346, 1233, 1024, 4096)
                        + 2 * 2048 * 7168 * 2048 / _rate(2048, 1214, 925, 1024, 4096),
                        rel_tol=1e-12)


def _rate(x, r_hi, r_lo, a, b):
    """Log-log interpolation between (a, r_lo) and (b, r_hi), in FLOP/s."""
    return r_lo * (r_hi / r_lo) ** (math.log(x / a) / math.log(b / a)) * 1e12


def test_shipped_data_path_is_package_data():
    assert all(Path(t.file).parent.name == "kernels" for t in shipped_catalog())
