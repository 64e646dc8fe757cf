"""Skewed recordings predicted with and without a shape sweep: the comparison behind the
"Calibration by shape" tables of docs/validation.md (``benchmarks/shape_sweep_table.py``
prints it; the tests check it on ``traces/sweep-study`` and
``traces/sweep-study-repeat``).

Calibrates as ``moesim calibrate UNIFORM...`` does, without a sweep, with
``--shape-sweep SWEEP`` and with ``--shape-sweep-memory`` too (same code), validates every
skewed recording with each (``moesim validate``'s code) and keeps, per calibration,
recording, rank and phase, the error = median over the traced steps of (simulated −
measured) / measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moesim.compute.calibrated import model_from_dict
from moesim.errors import InputError
from moesim.validation.calibration.calibrate import calibrate
from moesim.validation.calibration.shape_fit import sweep_table
from moesim.validation.cpu.ingest import TraceSet, ingest
from moesim.validation.cpu.replay import outside_fitted_range
from moesim.validation.cpu.validate import PHASES, validate

UNIFORM = "uniform fit"
SWEPT = "+ shape sweep"
SWEPT_MEMORY = "+ shape sweep (+ memory)"


@dataclass
class StudyRow:
    """One recording's rank validated with one calibration."""

    trace: str
    calibration: str
    rank: int
    error: dict[str, float]       # phase -> (simulated − measured) / measured
    outside: dict                 # outside_fitted_range: gemm, memory, compute_ops, ...


@dataclass
class Study:
    calibrations: dict[str, dict]     # name -> calibration document
    rows: list[StudyRow]
    traces: dict[str, TraceSet]       # each skewed recording, ingested

    def abs_errors(self, calibration: str, phase: str) -> list[float]:
        """|error| of every recording and rank for one calibration and phase."""
        return [abs(r.error[phase]) for r in self.rows
                if r.calibration == calibration and phase in r.error]


def study_dirs(root: str | Path) -> tuple[list[str], list[str], list[str]]:
    """(uniform recordings, sweeps, skewed recordings) of a folder written by
    ``benchmarks/record_sweep_study.py``: ``uniform-R``, ``sweep``, ``hot-R``, ``zipf-R``."""
    p = Path(root)
    if not p.is_dir():
        raise InputError(str(p), "", "a folder written by benchmarks/record_sweep_study.py",
                         "missing")

    def names(prefix: str) -> list[str]:
        return [str(d) for d in sorted(p.glob(prefix)) if d.is_dir()]
    uniform, sweep = names("uniform-*"), names("sweep")
    skewed = names("hot-*") + names("zipf-*")
    if not uniform or not sweep or not skewed:
        raise InputError(str(p), "", "uniform-R, hot-R or zipf-R and sweep folders",
                         sorted(d.name for d in p.iterdir()))
    return uniform, sweep, skewed


def compare(calibrate_dirs: list[str], sweep_dirs: list[str], trace_dirs: list[str],
            memory: bool = True) -> Study:
    """Calibrate on ``calibrate_dirs`` without and with the sweep (and, when ``memory``,
    with its memory-bound families too), then validate every ``trace_dirs`` recording."""
    sets = [ingest([d]) for d in calibrate_dirs]
    docs = {UNIFORM: calibrate(sets, calibrate_dirs),
            SWEPT: calibrate(sets, calibrate_dirs, shapes=sweep_table(sweep_dirs),
                             shape_sources=sweep_dirs)}
    if memory:
        docs[SWEPT_MEMORY] = calibrate(sets, calibrate_dirs,
                                       shapes=sweep_table(sweep_dirs, memory=True),
                                       shape_sources=sweep_dirs)
    rows = []
    traces = {d: ingest([d]) for d in trace_dirs}
    for d, ts in traces.items():
        for name, doc in docs.items():
            model = model_from_dict(doc)
            v = validate(ts, model, source=d)
            outside = outside_fitted_range(ts, model)
            rows += [StudyRow(d, name, r, {p: v.error(r)[p] for p in PHASES}, outside)
                     for r in range(v.world)]
    return Study(docs, rows, traces)
