"""Medians over steps (validate) and run-to-run noise (two recordings), worked by hand.

The one-step trace of ``tests/test_validate.py`` is repeated as several ProfilerSteps,
each stretched in time by a factor f (every timestamp and duration of the step times
f). Every measured phase of that step is then f × the one-step value (MEASURED), while
the simulation, which reads only routing and shapes, stays SIMULATED in every step.

With factors (1.0, 1.25, 4.0) — the last a step a busy machine slowed down:

- median measured = 1.25 × MEASURED (the mean would be 2.083 × MEASURED);
- per-step error SIM / (f·MEAS) − 1 decreases with f, so its median is the f = 1.25
  step's: SIM / (1.25·MEAS) − 1; the error of the means is SIM / (2.083·MEAS) − 1.

Noise of recording B (1.5, 1.25, 2.0) against A (1.0, 1.25, 4.0): per-step
(f_b − f_a) / f_a = +0.5, 0, −0.5 for every phase → median 0.0; against
C (1.1, 1.5, 4.4): +0.1, +0.2, +0.1 → median +0.1.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from moesim.cli import main
from moesim.compute.calibrated import model_from_dict
from moesim.errors import InputError
from moesim.validation.cpu.ingest import ingest
from moesim.validation.cpu.noise import measured_series, run_to_run_noise
from moesim.validation.cpu.validate import PHASES, median_relative_difference, validate
from tests.test_validate import CALIB, MEASURED, SIMULATED, rank_events, write_calib

US = 1e-6
STEP_SPACING_US = 20_000.0
A = (1.0, 1.25, 4.0)


def stretched_events(rank: int, factors: tuple[float, ...]) -> list[dict]:
    """ProfilerStep#1..n; step i is the one-step trace with every time × factors[i]."""
    out = []
    for i, f in enumerate(factors):
        t0 = i * STEP_SPACING_US
        for ev in rank_events(rank):
            e = dict(ev, ts=t0 + f * ev["ts"], dur=f * ev["dur"])
            if e["name"].startswith("ProfilerStep#"):
                e["name"] = f"ProfilerStep#{i + 1}"
            out.append(e)
    return out


def write_steps(d: Path, factors: tuple[float, ...]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for r in (0, 1):
        doc = {"distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2},
               "traceEvents": stretched_events(r, factors)}
        (d / f"rank{r}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    return d


def test_median_relative_difference_pairs_steps_and_skips_zero_base():
    base = {"forward_s": [1.0, 2.0, 4.0], "combine_s": [0.0, 0.0, 0.0]}
    other = {"forward_s": [1.5, 2.0, 1.0], "combine_s": [1.0, 1.0, 1.0]}
    d = median_relative_difference(base, other)
    assert d["forward_s"] == pytest.approx(0.0)     # +0.5, 0, -0.75 -> 0
    assert np.isnan(d["combine_s"])
    with pytest.raises(ValueError):
        median_relative_difference(base, {"forward_s": [1.0], "combine_s": [1.0]})


def test_validate_reports_medians_over_steps(tmp_path):
    v = validate(ingest([str(write_steps(tmp_path / "a", A))]), model_from_dict(CALIB))
    assert v.steps == (1, 2, 3)
    mean_f = float(np.mean(A))
    for r in (0, 1):
        meas = {p: MEASURED[r][p] * US for p in PHASES}
        sim = {p: SIMULATED[r][p] * US for p in PHASES}
        for p in PHASES:
            assert v.median(r, "measured")[p] == pytest.approx(1.25 * meas[p], rel=1e-9)
            assert v.mean(r, "measured")[p] == pytest.approx(mean_f * meas[p], rel=1e-9)
            assert v.median(r, "simulated")[p] == pytest.approx(sim[p], rel=1e-9)
            assert v.error(r)[p] == pytest.approx(sim[p] / (1.25 * meas[p]) - 1, rel=1e-9)
            assert v.mean_error(r)[p] == pytest.approx(sim[p] / (mean_f * meas[p]) - 1,
                                                       rel=1e-9)
    # rank 0 forward by hand: simulated 1915 µs, measured 2040 µs × 1.25 = 2550 µs
    assert v.error(0)["forward_s"] == pytest.approx(1915 / 2550 - 1)
    errs = [abs(SIMULATED[r][p] / (1.25 * MEASURED[r][p]) - 1) for r in (0, 1) for p in PHASES]
    assert v.median_abs_error() == pytest.approx(float(np.median(errs)))


def test_validate_json_carries_medians_and_means(tmp_path, capsys):
    d = write_steps(tmp_path / "a", A)
    calib = write_calib(tmp_path / "c.json")
    assert main(["validate", str(d), "--calibration", str(calib), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "median over the traced steps" in doc["averaging"]
    r1 = doc["ranks"][1]
    assert r1["measured"]["combine_s"] == pytest.approx(1.25 * 1350 * US)
    assert r1["simulated"]["combine_s"] == pytest.approx(1250 * US)
    assert r1["error"]["combine_s"] == pytest.approx(1250 / (1.25 * 1350) - 1)
    assert r1["mean"]["measured"]["combine_s"] == pytest.approx(np.mean(A) * 1350 * US)
    assert r1["mean"]["error"]["combine_s"] == pytest.approx(1250 / (np.mean(A) * 1350) - 1)
    cv = np.std(A) / np.mean(A)
    assert r1["measured_step_cv"]["forward_s"] == pytest.approx(cv)


def test_measured_series_are_the_stretched_phases(tmp_path):
    series = measured_series(ingest([str(write_steps(tmp_path / "a", A))]))
    for r in (0, 1):
        for p in PHASES:
            assert series[r][p] == pytest.approx([f * MEASURED[r][p] * US for f in A], rel=1e-9)


def test_run_to_run_noise_by_hand(tmp_path):
    a = ingest([str(write_steps(tmp_path / "a", A))])
    b = ingest([str(write_steps(tmp_path / "b", (1.5, 1.25, 2.0)))])
    c = ingest([str(write_steps(tmp_path / "c", (1.1, 1.5, 4.4)))])
    for noise, want in ((run_to_run_noise(a, b), 0.0), (run_to_run_noise(a, c), 0.1),
                        (run_to_run_noise(a, a), 0.0)):
        assert len(noise) == 2
        for r in (0, 1):
            assert noise[r] == pytest.approx(dict.fromkeys(PHASES, want), abs=1e-9)


def test_noise_needs_the_same_number_of_steps(tmp_path):
    a = ingest([str(write_steps(tmp_path / "a", A))])
    b = ingest([str(write_steps(tmp_path / "b", (1.0, 1.0)))])
    with pytest.raises(InputError, match="3 traced steps"):
        run_to_run_noise(a, b, "b")


SHIPPED = Path(__file__).resolve().parents[1] / "traces"


@pytest.mark.slow
def test_shipped_hot_study_stall_and_noise():
    """On the shipped hot recording, the cold rank 1 waits in the combine for rank 0
    (hot expert 0) in the measurement and in the simulation alike; the noise of a
    recording against itself is exactly 0 and against its repeat is finite."""
    from moesim.compute.calibrated import load_calibration

    hot, rep = SHIPPED / "hot", SHIPPED / "hot-repeat"
    assert hot.is_dir() and rep.is_dir(), "the shipped traces are part of the repository"
    ts = ingest([str(hot)])
    v = validate(ts, load_calibration(SHIPPED / "calib-uniform-cpu.json"))
    for which in ("measured", "simulated"):
        cold, warm = v.median(1, which), v.median(0, which)
        assert cold["combine_s"] > 10 * warm["combine_s"]      # the stall
        assert cold["experts_s"] < warm["experts_s"] / 2       # fewer rows to compute
    for r in range(2):
        assert all(x == 0.0 for x in run_to_run_noise(ts, ts)[r].values())
    noise = run_to_run_noise(ts, ingest([str(rep)]))
    assert all(np.isfinite(noise[r][p]) for r in range(2) for p in ("forward_s", "backward_s"))
