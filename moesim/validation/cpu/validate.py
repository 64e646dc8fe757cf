"""Replay traced steps in the simulator and compare measured with simulated phases.

Each traced step is simulated on its own (:mod:`moesim.validation.cpu.replay` builds the
programs; simpy, the flow network and the communicator run them on a topology of the
recording machine). Phases are computed by one function from a timeline of op
intervals, applied to the measured timeline (the trace's op start/end) and to the
simulated one (the executor's spans), so both use the same definition:

- ``forward_s``: first start → last end of the ops inside the forward window;
- ``backward_s``: the same for the backward window;
- ``dispatch_s`` / ``combine_s``: the rank's arrival at the forward dispatch / combine
  all-to-all → its end (includes waiting for peers, in both timelines);
- ``experts_s``: dispatch end → combine arrival.

The windows are ingest's: the ``moe/forward`` / ``moe/backward`` labels when present,
else first matmul → backward start (first ``autograd::engine`` / ``*Backward*`` op) →
end of the last autograd op or grad all-to-all. An op belongs to a window when its
measured start lies in it. Per rank and phase the summary is the median over the
traced steps (measured, simulated) and the median over steps of the per-step relative
error ``(simulated − measured) / measured``; means are kept beside them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import simpy

from moesim.collectives.communicator import Communicator
from moesim.compute.calibrated import CalibratedComputeModel
from moesim.engine.exact.execute import Executor
from moesim.errors import InputError
from moesim.network import FlowNetwork
from moesim.program.ops import Op
from moesim.topology import Topology
from moesim.topology.machine import machine_topology
from moesim.trace.spans import Span
from moesim.validation.cpu.ingest import TraceSet, TraceStep
from moesim.validation.cpu.replay import COLL_KINDS, ROLE_KIND, build_programs
from moesim.validation.cpu.steps import step_events
from moesim.validation.kineto.events import load_trace

PHASES = ("forward_s", "backward_s", "dispatch_s", "experts_s", "combine_s")
_EPS = 1e-9

Interval = tuple[float, float]


@dataclass(frozen=True)
class StepComparison:
    """One rank in one traced step: phases (s) measured and simulated, and timelines."""

    rank: int
    step: int
    measured: dict[str, float]
    simulated: dict[str, float]
    measured_spans: tuple[Span, ...]
    simulated_spans: tuple[Span, ...]


@dataclass(frozen=True)
class Validation:
    """Per-step comparisons of one recording. Summaries per rank and phase:

    - :meth:`median` — median over the traced steps of the measured / simulated phase;
    - :meth:`error` — median over the steps of the per-step relative error
      ``(simulated − measured) / measured`` (the headline figure: robust to the few
      steps a shared machine slows down);
    - :meth:`mean` / :meth:`mean_error` — means over steps and the error of the means.
    """

    source: str
    world: int
    steps: tuple[int, ...]
    per_step: tuple[StepComparison, ...]

    def rows(self, rank: int) -> list[StepComparison]:
        return [c for c in self.per_step if c.rank == rank]

    def series(self, rank: int, which: str) -> dict[str, list[float]]:
        """Per phase, the rank's ``which`` ("measured"/"simulated") values in step order."""
        rows = sorted(self.rows(rank), key=lambda c: c.step)
        return {p: [getattr(c, which)[p] for c in rows] for p in PHASES}

    def mean(self, rank: int, which: str) -> dict[str, float]:
        return {p: float(np.mean(v)) for p, v in self.series(rank, which).items()}

    def median(self, rank: int, which: str) -> dict[str, float]:
        return {p: float(np.median(v)) for p, v in self.series(rank, which).items()}

    def error(self, rank: int) -> dict[str, float]:
        """Median over steps of ``(simulated − measured) / measured`` per phase."""
        return median_relative_difference(self.series(rank, "measured"),
                                          self.series(rank, "simulated"))

    def mean_error(self, rank: int) -> dict[str, float]:
        """``(simulated − measured) / measured`` of the means over steps."""
        return relative_error(self.mean(rank, "measured"), self.mean(rank, "simulated"))

    def median_abs_error(self) -> float:
        errs = [abs(e) for r in range(self.world) for e in self.error(r).values()
                if np.isfinite(e)]
        return float(np.median(errs)) if errs else float("nan")

    def to_json(self) -> dict:
        ranks = []
        for r in range(self.world):
            meas = self.series(r, "measured")
            ranks.append({
                "rank": r, "measured": self.median(r, "measured"),
                "simulated": self.median(r, "simulated"),
                "error": {p: _finite(e) for p, e in self.error(r).items()},
                "mean": {"measured": self.mean(r, "measured"),
                         "simulated": self.mean(r, "simulated"),
                         "error": {p: _finite(e) for p, e in self.mean_error(r).items()}},
                "measured_step_cv": {p: _cv(v) for p, v in meas.items()},
            })
        return {"source": self.source, "steps": list(self.steps),
                "averaging": AVERAGING,
                "units": "s", "ranks": ranks, "median_abs_error": _finite(self.median_abs_error()),
                "per_step": [{"rank": c.rank, "step": c.step, "measured": c.measured,
                              "simulated": c.simulated} for c in self.per_step]}


AVERAGING = ("measured, simulated: median over the traced steps; error: median over the "
             "steps of (simulated - measured) / measured; mean: the same as means over steps "
             "and the error of the means; measured_step_cv: std/mean of the measured phase "
             "over steps; median_abs_error: median of |error| over ranks and phases")


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _cv(xs: list[float]) -> float | None:
    m = float(np.mean(xs))
    return float(np.std(xs) / m) if m > 0 else None


def median_relative_difference(base: dict[str, list[float]],
                               other: dict[str, list[float]]) -> dict[str, float]:
    """Per phase, the median over steps of ``(other_i − base_i) / base_i`` (steps paired
    in order; a step whose base value is 0 is skipped; nan when none is left). Used for
    the simulation error (base = measured) and for the run-to-run noise of two
    recordings (base = the first recording)."""
    out = {}
    for p, b in base.items():
        o = other[p]
        if len(o) != len(b):
            raise ValueError(f"{p}: {len(b)} base steps but {len(o)} other steps")
        rel = [(y - x) / x for x, y in zip(b, o, strict=True) if x > 0]
        out[p] = float(np.median(rel)) if rel else float("nan")
    return out


def relative_error(measured: dict[str, float], simulated: dict[str, float]) -> dict[str, float]:
    """``(simulated − measured) / measured`` per phase (nan where measured is 0)."""
    return {p: (simulated[p] - measured[p]) / measured[p] if measured[p] > 0 else float("nan")
            for p in PHASES}


# --------------------------------------------------------------------------- windows
def _backward_event(name: str) -> bool:
    return name.startswith("autograd::engine") or "Backward" in name


def phase_windows(ts: TraceSet) -> dict[tuple[int, int], dict[str, Interval]]:
    """(rank, step) → {"forward": (a, b), "backward": (a, b)}, step-relative seconds,
    found as ingest finds them (labels, else matmuls and autograd ops)."""
    out: dict[tuple[int, int], dict[str, Interval]] = {}
    for rt in ts.ranks:
        src = rt.source
        events = step_events(load_trace(Path(src)), src)
        marks = {int(m.group(1)): (e.start_s, e.end_s) for e in events
                 if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.name))}
        if not marks:
            marks = {0: (min(e.start_s for e in events), max(e.end_s for e in events))}
        for s in rt.steps:
            t0, t1 = marks[s.step]
            inside = [e for e in events if t0 - _EPS <= e.start_s < t1]
            lab = {n: next((e for e in inside if e.name == n), None)
                   for n in ("moe/forward", "moe/backward")}
            bwd = [e for e in inside if _backward_event(e.name)]
            bstart = (lab["moe/backward"].start_s if lab["moe/backward"] else
                      min(e.start_s for e in bwd) if bwd else t1) - t0
            gemms = [o.start_s for o in s.ops if o.kind == "gemm"]
            fwd_lab = lab["moe/forward"]
            fwd = ((fwd_lab.start_s - t0, fwd_lab.end_s - t0) if fwd_lab else
                   (min(gemms) if gemms else 0.0, bstart))
            if lab["moe/backward"]:
                back = (bstart, lab["moe/backward"].end_s - t0)
            else:
                ends = [e.end_s - t0 for e in bwd] + [o.start_s + o.dur_s for o in s.ops
                                                      if o.role.endswith("_grad")]
                back = (bstart, max(ends) if ends else bstart)
            out[(rt.rank, s.step)] = {"forward": fwd, "backward": back}
    return out


def op_windows(step: TraceStep, windows: dict[str, Interval]) -> dict[str, list[int]]:
    """Indices of the ops whose measured start lies in each window ``[a, b)``."""
    return {name: [i for i, o in enumerate(step.ops) if a - _EPS <= o.start_s < b - _EPS]
            for name, (a, b) in windows.items()}


# --------------------------------------------------------------------------- phases
def timeline_phases(step: TraceStep, iv: list[Interval], members: dict[str, list[int]],
                    source: str = "") -> dict[str, float]:
    """The five phases of one rank from op intervals ``iv[i] = (start, end)`` of
    ``step.ops[i]`` (a collective's start = the rank's arrival)."""
    def span(idx: list[int]) -> float:
        return max(iv[i][1] for i in idx) - min(iv[i][0] for i in idx) if idx else 0.0

    role = {o.role: i for i, o in reversed(list(enumerate(step.ops))) if o.kind == "all_to_all"}
    if "dispatch" not in role or "combine" not in role:
        raise InputError(source or f"rank {step.rank}", f"ProfilerStep#{step.step}",
                         "a forward dispatch and combine all-to-all", sorted(role))
    d, c = iv[role["dispatch"]], iv[role["combine"]]
    return {"forward_s": span(members["forward"]), "backward_s": span(members["backward"]),
            "dispatch_s": d[1] - d[0], "experts_s": c[0] - d[1], "combine_s": c[1] - c[0]}


def measured_intervals(step: TraceStep) -> list[Interval]:
    return [(o.start_s, o.start_s + o.dur_s) for o in step.ops]


def simulated_intervals(spans: list[Span], program: list[Op], rank: int) -> list[Interval]:
    """Op intervals of one rank from the executor's spans. The rank runs one op at a
    time, so its spans come in program order: one per compute op, an optional
    ``stall`` then the collective's own span per collective."""
    mine = [s for s in spans if s.rank == rank]
    out: list[Interval] = []
    j = 0
    for op in program:
        sp = mine[j]
        j += 1
        if op.coll is not None and sp.kind == "stall":
            start, sp = sp.start_s, mine[j]
            j += 1
        else:
            start = sp.start_s
        if sp.name != op.name:
            raise RuntimeError(f"span {sp.name} does not match op {op.name}")
        out.append((start, sp.end_s))
    return out


def measured_spans(step: TraceStep, min_dur: list[float]) -> list[Span]:
    """The trace's ops as spans; a collective's time beyond the fastest rank's duration
    of the same collective (``min_dur[k]``) is drawn as a stall."""
    out = []
    k = 0
    for o in step.ops:
        a, b = o.start_s, o.start_s + o.dur_s
        if o.kind in COLL_KINDS:
            wait = max(0.0, o.dur_s - min_dur[k])
            k += 1
            if wait > 0:
                out.append(Span(step.rank, "comm", "stall", o.role, a, a + wait))
            out.append(Span(step.rank, "comm", ROLE_KIND.get(o.role, "ep_dispatch"), o.role,
                            a + wait, b))
        else:
            out.append(Span(step.rank, "compute", "compute", o.name, a, b))
    return out


# --------------------------------------------------------------------------- running
def simulate_programs(programs: list[list[Op]], topo: Topology) -> tuple[float, list[Span]]:
    """Run the programs once on simpy with the flow network; (end time s, spans)."""
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    gpus = list(topo.gpus)
    comm = Communicator(env, net, gpus, rank_host=[topo.host_of(g) for g in gpus])
    ex = Executor(env, net, comm, gpus, programs)
    end = ex.run()
    return end, list(ex.spans)


def validate(ts: TraceSet, model: CalibratedComputeModel,
             windows: dict[tuple[int, int], dict[str, Interval]] | None = None,
             source: str = "") -> Validation:
    """Simulate every traced step of ``ts`` with ``model``; compare phases per rank."""
    windows = phase_windows(ts) if windows is None else windows
    if model.comm is None:
        raise InputError("calibration", "comm", "an all-to-all fit to replay a recording's "
                         "collectives (a GPU calibration without NCCL byte counts has none)",
                         "none")
    topo = machine_topology(ts.world, model.comm)
    rows = []
    steps = tuple(ts.step_ids())
    if not steps:
        raise InputError(source or ts.ranks[0].source, "ProfilerStep", "steps traced on every "
                         "rank", "none in common")
    for sid in steps:
        programs = build_programs(ts, sid, model)
        _, spans = simulate_programs(programs, topo)
        colls = [[o.dur_s for o in ts.step(r, sid).ops if o.kind in COLL_KINDS]
                 for r in range(ts.world)]
        min_dur = [min(c) for c in zip(*colls, strict=True)]
        for r in range(ts.world):
            s = ts.step(r, sid)
            members = op_windows(s, windows[(r, sid)])
            sim_iv = simulated_intervals(spans, programs[r], r)
            src = ts.ranks[r].source
            rows.append(StepComparison(
                r, sid, timeline_phases(s, measured_intervals(s), members, src),
                timeline_phases(s, sim_iv, members, src), tuple(measured_spans(s, min_dur)),
                tuple(sp for sp in spans if sp.rank == r)))
    return Validation(source, ts.world, steps, tuple(rows))
