"""Run-to-run noise: how much two recordings of the same configuration differ.

No simulation is involved: both recordings' measured phases are computed exactly as
``moesim validate`` computes its measured timeline (:func:`measured_series`), and the
noise of a phase on a rank is the median over steps of ``(b_i − a_i) / a_i``, steps
paired in order — the same statistic as the simulation error (median over steps of
``(simulated_i − measured_i) / measured_i``), so the two can be read side by side.
An error smaller than this noise cannot be told apart from zero.
"""

from __future__ import annotations

from moesim.errors import InputError
from moesim.validation.cpu.ingest import TraceSet
from moesim.validation.cpu.validate import (
    Interval,
    measured_intervals,
    median_relative_difference,
    op_windows,
    phase_windows,
    timeline_phases,
)


def measured_series(ts: TraceSet, windows: dict[tuple[int, int], dict[str, Interval]]
                    | None = None) -> list[dict[str, list[float]]]:
    """Per rank, per phase: the measured phase (s) of every traced step, in step order."""
    windows = phase_windows(ts) if windows is None else windows
    out: list[dict[str, list[float]]] = []
    for rt in ts.ranks:
        per_phase: dict[str, list[float]] = {}
        for s in sorted(rt.steps, key=lambda s: s.step):
            ph = timeline_phases(s, measured_intervals(s), op_windows(s, windows[(rt.rank, s.step)]),
                                 rt.source)
            for p, v in ph.items():
                per_phase.setdefault(p, []).append(v)
        out.append(per_phase)
    return out


def run_to_run_noise(a: TraceSet, b: TraceSet, source_b: str = "second recording",
                     windows_a: dict | None = None,
                     windows_b: dict | None = None) -> list[dict[str, float]]:
    """Per rank, per phase: median over steps of ``(b_i − a_i) / a_i`` (signed).

    The recordings must have the same number of ranks and of traced steps; steps are
    paired in order (the i-th traced step of each)."""
    sa, sb = measured_series(a, windows_a), measured_series(b, windows_b)
    if len(sa) != len(sb):
        raise InputError(source_b, "ranks", f"{len(sa)} ranks, as the first recording", len(sb))
    na = len(next(iter(sa[0].values()), []))
    nb = len(next(iter(sb[0].values()), []))
    if na != nb:
        raise InputError(source_b, "ProfilerStep", f"{na} traced steps, as the first recording",
                         nb)
    return [median_relative_difference(x, y) for x, y in zip(sa, sb, strict=True)]
