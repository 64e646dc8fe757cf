"""Calibration by shape: interpolation over a shape sweep, its file section, the
out-of-range warning of ``validate``, and the sweep recorder (torch)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from moesim.cli import main
from moesim.compute.base import Kernel
from moesim.compute.calibrated import load_calibration, model_from_dict, save_calibration
from moesim.compute.shape_table import (
    Family,
    ShapeTable,
    family,
    monotone,
    table_from_doc,
    table_from_samples,
)
from moesim.errors import InputError
from moesim.validation.calibration.calibrate import calibrate
from moesim.validation.calibration.shape_fit import anchor

ROOT = Path(__file__).resolve().parents[1]
TORCH_REASON = "needs torch (the torch extra): pip install -e '.[torch]'"


# ----------------------------------------------------------------- interpolation
def test_family_exact_at_points_and_log_log_between():
    f = Family((1.0, 10.0, 100.0), (1e-3, 2e-3, 8e-3))
    for x, t in zip(f.x, f.t_s, strict=True):
        assert f.time(x) == t
    # halfway in log(size) between 1 and 10: the geometric mean of the two times
    assert f.time(math.sqrt(10.0)) == pytest.approx(math.sqrt(1e-3 * 2e-3), rel=1e-12)
    # log-log straight line between 10 and 100: t ∝ x^log10(4), so at 20, 2e-3·2^0.602
    assert f.time(20.0) == pytest.approx(2e-3 * 2 ** math.log10(4.0), rel=1e-12)
    dense = [f.time(x) for x in np.geomspace(1.0, 100.0, 400)]
    assert all(b >= a for a, b in zip(dense, dense[1:], strict=False))
    assert f.time(0.99) is None and f.time(100.5) is None


def test_monotone_pools_adjacent_violators():
    assert monotone([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert monotone([5.0, 1.0, 0.0]) == [2.0, 2.0, 2.0]
    assert monotone([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]


def test_family_median_or_mean_per_size():
    f = family([10, 10, 10, 20], [1.0, 2.0, 9.0, 5.0], "median")
    assert f == Family((10.0, 20.0), (2.0, 5.0))
    g = family([10, 10, 10, 20], [1.0, 2.0, 9.0, 5.0], "mean")
    assert g == Family((10.0, 20.0), (4.0, 5.0))
    assert family([10, 10], [1.0, 2.0], "mean") is None   # one size: no family


def _table() -> ShapeTable:
    gemm = [(m, 512, 1024, 1e-5 * m) for m in (10, 100, 1000)]          # forward, rows
    gemm += [(1024, k, 512, 2e-5 * k) for k in (10, 100, 1000)]         # weight grad, k
    gemm += [(2048, 512, 8, 3e-4)]                                      # router: one shape
    memory = [("aten::mul", b, b / 1e10) for b in (1e3, 1e5, 1e7)]
    return table_from_samples(gemm, memory)


def test_table_families_from_samples():
    tab = _table()
    assert sorted(tab.gemm) == [("k", 1024, 512), ("m", 512, 1024)]
    assert tab.gemm_time(100, 512, 1024) == pytest.approx(1e-3)
    assert tab.gemm_time(1024, 1000, 512) == pytest.approx(2e-2)
    # linear in size between points (t ∝ x is a straight line in log-log too)
    assert tab.gemm_time(316, 512, 1024) == pytest.approx(3.16e-3, rel=1e-9)
    assert tab.gemm_time(2048, 512, 8) is None          # no family: the line fit's
    assert tab.gemm_time(2000, 512, 1024) is None       # beyond the swept rows
    assert tab.memory_time("aten::mul", 1e6) == pytest.approx(1e-4, rel=1e-9)
    assert tab.memory_time("aten::silu", 1e6) is None


def test_anchor_scales_each_family_to_the_recording():
    tab = _table()
    # the recording runs the forward family 1.5x slower, the weight grads 1.2x; one
    # GEMM outside every family does not count; mul's total 2x
    rec = [(100, 512, 1024, 1.5e-3), (1000, 512, 1024, 1.5e-2), (1024, 100, 512, 2.4e-3),
           (2048, 512, 8, 1.0)]
    out, scales = anchor(tab, rec, [("aten::mul", 1e5, 2e-5), ("aten::mul", 1e7, 2e-3)])
    assert scales["gemm m×512×1024"] == pytest.approx(1.5)
    assert scales["gemm k×1024×512"] == pytest.approx(1.2)
    assert scales["gemm"] == pytest.approx(1.5)             # median of 1.5, 1.5, 1.2
    assert scales["aten::mul"] == pytest.approx(2.0)
    assert out.gemm_time(10, 512, 1024) == pytest.approx(1.5e-4)
    assert out.memory_time("aten::mul", 1e3) == pytest.approx(2e-7)


# ----------------------------------------------------------------- calibration model
CALIB = {"format": "moesim-calibration/1", "device": "cpu",
         "gemm": {"flops_per_s": 1e11, "overhead_s": 0.0},
         "memory": {"bytes_per_s": 1e10, "overhead_s": 0.0},
         "comm": {"latency_s": 1e-4, "bandwidth_Bps": 1e9, "backend": "gloo"},
         "fit": {"gemm": {"range": {"flops": [1e6, 1e9]}},
                 "memory": {"range": {"bytes": [1e3, 1e7]}}}}


def _gemm(m: int, k: int, n: int, count: int = 1) -> Kernel:
    return Kernel("gemm", 2.0 * m * k * n * count, 0.0, m=m, n=n, k=k, count=count)


def test_model_interpolates_inside_and_fits_outside():
    doc = CALIB | {"shape_sweep": _table().to_doc()}
    model = model_from_dict(doc)
    k = _gemm(100, 512, 1024)
    assert model.time_s(k) == pytest.approx(1e-3)
    assert model.time_s(_gemm(100, 512, 1024, count=3)) == pytest.approx(3e-3)
    big = _gemm(4000, 512, 1024)                       # beyond the sweep: the line fit
    assert model.time_s(big) == pytest.approx(big.flops / 1e11)
    assert model.in_range(k) and not model.in_range(big)
    router = _gemm(2048, 512, 8)                       # no family, inside the FLOP range
    assert model.in_range(router) and model.time_s(router) == pytest.approx(router.flops / 1e11)
    mem = Kernel("aten::mul", 0.0, 1e6)
    assert model.time_s(mem) == pytest.approx(1e-4) and model.in_range(mem)
    assert not model.in_range(Kernel("aten::add", 0.0, 1e8))   # bytes beyond the fit's
    plain = model_from_dict(CALIB)
    assert plain.time_s(k) == pytest.approx(k.flops / 1e11)
    old = model_from_dict({key: v for key, v in CALIB.items() if key != "fit"})
    assert old.in_range(big)                           # no range recorded: nothing to say


def test_calibration_file_round_trip(tmp_path):
    doc = CALIB | {"shape_sweep": {**_table().to_doc(), "scales": {"gemm": 1.0}}}
    path = save_calibration(doc, tmp_path / "c.json")
    back = load_calibration(path)
    assert back.shapes == table_from_doc(doc["shape_sweep"], "x") == _table()
    assert back.gemm_flops_range == (1e6, 1e9) and back.memory_bytes_range == (1e3, 1e7)
    assert json.loads(path.read_text())["shape_sweep"]["gemm"][0]["axis"] == "k"
    assert hash(back) == hash(load_calibration(path))     # still a hashable model


@pytest.mark.parametrize("section, field", [
    ({"gemm": [{"axis": "m", "fixed": [512, 1024], "x": [1, 10], "t_s": [2e-3, 1e-3]}]},
     "shape_sweep.gemm[0]"),                            # times decreasing
    ({"gemm": [{"axis": "q", "fixed": [512, 1024], "x": [1, 10], "t_s": [1e-3, 2e-3]}]},
     "shape_sweep.gemm[0]"),
    ({"memory": [{"op": "aten::mul", "x": [1], "t_s": [1e-3]}]}, "shape_sweep.memory[0]"),
    ("table", "shape_sweep"),
])
def test_bad_shape_section_names_the_field(section, field):
    with pytest.raises(InputError) as err:
        model_from_dict(CALIB | {"shape_sweep": section}, "c.json")
    assert err.value.field == field and "c.json" in str(err.value)


def test_bad_range_names_the_field():
    with pytest.raises(InputError) as err:
        model_from_dict(CALIB | {"fit": {"gemm": {"range": {"flops": [5, 1]}}}}, "c.json")
    assert err.value.field == "fit.gemm.range.flops"


# ----------------------------------------------------------------- on the shipped traces
@pytest.fixture(scope="module")
def uniform():
    from moesim.validation.cpu.ingest import ingest

    return ingest([str(ROOT / "traces/uniform")])


def test_empty_sweep_gives_the_same_calibration(uniform):
    src = ["traces/uniform"]
    assert calibrate([uniform], src, shapes=ShapeTable({}, {}), shape_sources=["x"]) \
        == calibrate([uniform], src)


def test_calibration_records_the_fitted_ranges(uniform):
    from moesim.validation.calibration.calibrate import gemm_samples

    doc = calibrate([uniform], ["traces/uniform"])
    flops, _, t = gemm_samples(uniform)
    assert doc["fit"]["gemm"]["range"]["flops"] == [flops[t > 0].min(), flops[t > 0].max()]
    lo, hi = doc["fit"]["memory"]["range"]["bytes"]
    assert 0 < lo < hi


@pytest.mark.slow
def test_validate_warns_once_outside_the_fitted_range(tmp_path, capsys):
    calib = str(ROOT / "traces/calib-uniform-cpu.json")     # has no range: written earlier
    plain = tmp_path / "plain.json"
    swept = tmp_path / "swept.json"
    assert main(["calibrate", str(ROOT / "traces/uniform"), "-o", str(plain)]) == 0
    assert main(["calibrate", str(ROOT / "traces/uniform"), "-o", str(swept),
                 "--shape-sweep", str(ROOT / "traces/sweep")]) == 0
    out = capsys.readouterr().out
    assert "shape sweep: 4 GEMM families" in out
    hot = str(ROOT / "traces/hot")
    assert main(["validate", hot, "--calibration", str(plain), "--json"]) == 0
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    # rank 0's hot expert: 4060-odd rows, 4x the uniform recording's largest GEMMs
    assert len(err) == 1 and "warning" in err[0] and "outside the fitted range" in err[0]
    outside = json.loads(cap.out)["outside_fitted_range"]
    assert outside["gemm"] > 0 and outside["compute_ops"] == 1620
    assert f"({outside['gemm']} GEMMs, {outside['memory']} memory-bound)" in err[0]
    # with the sweep every GEMM is inside (memory-bound ops may still be outside)
    assert main(["validate", hot, "--calibration", str(swept), "--json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["outside_fitted_range"]["gemm"] == 0
    assert not cap.err.strip() or (len(cap.err.strip().splitlines()) == 1
                                   and "(0 GEMMs" in cap.err)
    # a calibration file without fitted ranges (written before them): nothing to say
    assert main(["validate", hot, "--calibration", calib, "--json"]) == 0
    assert capsys.readouterr().err.strip() == ""


def test_calibrate_refuses_a_directory_without_a_sweep(tmp_path, capsys):
    rc = main(["calibrate", str(ROOT / "traces/uniform"), "-o", str(tmp_path / "c.json"),
               "--shape-sweep", str(ROOT / "traces/hot")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "shape_sweep.json" in err[0]
    assert not (tmp_path / "c.json").exists()


# ----------------------------------------------------------------- recording (torch)
@pytest.mark.torch
@pytest.mark.slow
def test_record_a_tiny_sweep_and_read_it_back(tmp_path):
    pytest.importorskip("torch", reason=TORCH_REASON)
    from moesim.validation.calibration.shape_fit import sweep_samples, sweep_table
    from moesim.validation.recorder.sweep_record import row_grid

    out = tmp_path / "sweep"
    assert main(["record", str(out), "--shape-sweep", "--world", "2", "--experts", "4",
                 "--hidden", "32", "--ffn", "64", "--top-k", "2", "--tokens", "16",
                 "--points", "4", "--repeats", "2"]) == 0
    meta = json.loads((out / "sweep.json").read_text())
    rows = row_grid(2 * 16 * 2, 4)
    assert rows == [1, 4, 16, 64] and meta["rows"] == rows
    assert meta["format"] == "moesim-shape-sweep/1" and meta["host"]["cpu_count"] >= 1
    gemm, memory = sweep_samples(out)
    # per pass and row count, 2 local experts × (3 forward + 3 input-grad + 3 weight-grad)
    assert len(gemm) == 2 * len(rows) * 2 * 9
    tab = sweep_table([str(out)])
    assert sorted(tab.gemm) == [("k", 32, 64), ("k", 64, 32), ("m", 32, 64), ("m", 64, 32)]
    assert all(f.x == tuple(map(float, rows)) for f in tab.gemm.values())
    assert {name for name, _, _ in memory} >= {"aten::silu", "aten::mul", "aten::index_select"}
    assert sweep_table([str(out)], memory=True).memory


@pytest.mark.parametrize("flags, field", [(["--points", "1"], "--points"),
                                          (["--experts", "3"], "--experts"),
                                          (["--repeats", "0"], "--repeats"),
                                          (["--backend", "nccl"], "--backend")])
def test_record_sweep_bad_flags_one_line(tmp_path, capsys, flags, field):
    rc = main(["record", str(tmp_path / "s"), "--shape-sweep", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and field in err[0] and "command line" in err[0]
    assert not (tmp_path / "s").exists()


# ------------------------------------------------- the study: does the sweep help skew?
@pytest.fixture(scope="module", params=["traces/sweep-study", "traces/sweep-study-repeat"])
def study(request):
    from moesim.validation.calibration.shape_study import compare, study_dirs

    return compare(*study_dirs(ROOT / request.param), memory=False)


@pytest.mark.slow
def test_sweep_predicts_the_skewed_expert_phase_better(study):
    """Each shipped study (three interleaved rounds, benchmarks/record_sweep_study.py),
    calibrated on its three uniform recordings: with the sweep, the expert phase of the
    three hot and three zipf recordings has a smaller median and worst |error|.
    (Forward and backward go either way within a point, docs/validation.md.)"""
    from moesim.validation.calibration.shape_study import SWEPT, UNIFORM

    plain, swept = study.abs_errors(UNIFORM, "experts_s"), study.abs_errors(SWEPT, "experts_s")
    assert len(plain) == len(swept) == 6 * 2          # recordings × ranks
    assert np.median(swept) < np.median(plain)
    assert max(swept) < max(plain)
    # the forward dispatch waits only for work the sweep does not cover (router, gather)
    assert study.abs_errors(SWEPT, "dispatch_s") == pytest.approx(
        study.abs_errors(UNIFORM, "dispatch_s"), rel=1e-9, abs=1e-12)
    # the hot experts' GEMMs are extrapolated by the line fit, interpolated with the sweep
    for row in study.rows:
        assert row.outside["gemm"] == (0 if row.calibration == SWEPT else
                                       (54 if "hot" in row.trace else 108))


def test_study_dirs_refuses_a_folder_that_is_not_a_study(tmp_path):
    from moesim.validation.calibration.shape_study import study_dirs

    with pytest.raises(InputError) as err:
        study_dirs(tmp_path / "none")
    assert err.value.got == "missing"
    (tmp_path / "uniform-1").mkdir()
    with pytest.raises(InputError) as err:
        study_dirs(tmp_path)
    assert "sweep" in err.value.expected
    for d in ("sweep", "hot-1", "zipf-2", "zipf-1"):
        (tmp_path / d).mkdir()
    (tmp_path / "hot-2").write_text("a file, not a recording")
    u, s, k = study_dirs(tmp_path)
    assert [p.rsplit("/", 1)[1] for p in u + s + k] == ["uniform-1", "sweep", "hot-1",
                                                        "zipf-1", "zipf-2"]
