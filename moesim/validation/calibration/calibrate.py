"""Fit compute and communication models to ingested traces (pure numpy, no torch).

Three linear models with every coefficient kept >= 0, plus a host term:

- GEMMs: ``t = overhead + FLOPs / rate + operand bytes / bandwidth`` (a roofline *sum*:
  on a CPU core the arithmetic and the operand traffic do not overlap fully, so a
  skinny matmul such as the router's, n = experts, costs more than its FLOPs say
  without a per-kernel overhead having to absorb it); all-to-alls: ``t = latency +
  bytes / bandwidth``. Non-negative least squares on relative residuals (each sample
  weighted by 1/t, so a 20 µs kernel counts as much as a 20 ms one). Measured on
  the shipped uniform recordings then replayed on a recording with other dims
  (hidden 256, FFN 512, 16 experts, top-4): expert GEMMs +0.4 % with the bytes term,
  +6.0 % with FLOPs and overhead only;
- memory-bound ops: the per-op overhead from that relative fit (small ops), and the
  rate that makes the predicted total equal the measured total (:func:`fit_total`),
  over all ops and, for kinds with enough samples, per op kind (:func:`rates_by_op`;
  a kind not seen in calibration takes the common rate),
  i.e. the *mean* time per byte. On a CPU a fraction of large elementwise ops pays
  first-touch page faults of a fresh output (10-100x the typical time); the simulator
  predicts mean phase times, and a sum of ops has the mean of the sum only if each
  op's cost is its mean, not its typical (median) value;
- host: the time between consecutive traced ops of a rank (framework dispatch and
  untraced Python) per compute op, which a replay adds to each compute op; fitted
  separately for the forward (``op_gap_forward_s``: ops issued one by one from
  Python) and the backward (``op_gap_backward_s``: ops issued by the C++ autograd
  engine, which dispatches faster), plus ``op_gap_s`` for both together:
  total gap time / number of compute ops (so a replay of the calibration trace has
  its measured total gap).

Samples:

- GEMM: FLOPs (2·m·k·n per matmul; the innermost matmul op of each call) and operand
  bytes ((m·k + k·n + m·n) × element size, ``ingest``);
- memory-bound ops (router softmax/top-k, permutation, elementwise, optimizer):
  x = bytes moved, estimated as all tensor inputs read + one output as large as the
  largest input (``op_cost.tensor_bytes``);
- all-to-all: x = the busiest rank's off-rank bytes (max over ranks of the larger of
  bytes sent to and received from other ranks; of their sum for a half-duplex backend,
  gloo, whose ranks copy both ways with their own core), t = the *minimum* over ranks of the backend
  worker's span of that collective. The rank that arrives last waits for nobody, so
  its span is the transfer; the minimum needs no clock shared between ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moesim.compute.calibrated import FORMAT
from moesim.compute.shape_table import ShapeTable
from moesim.errors import InputError
from moesim.validation.calibration.shape_fit import shape_section, trace_samples
from moesim.validation.cpu.host_facts import calibration_facts
from moesim.validation.cpu.ingest import TraceSet


@dataclass(frozen=True)
class LineFit:
    """``t = overhead_s + x * slope``; statistics on the unweighted times."""

    overhead_s: float
    slope: float          # seconds per unit of x
    r2: float
    n_samples: int
    rms_s: float          # root mean square residual, s
    max_rel: float        # largest |residual| / t
    median_rel: float     # median |residual| / t

    @property
    def rate(self) -> float:
        return 1.0 / self.slope if self.slope > 0 else float("inf")


def fit_line(x: np.ndarray, t: np.ndarray, what: str = "samples") -> LineFit:
    """Weighted (1/t) non-negative least squares of t = a + b·x."""
    x = np.asarray(x, dtype=float)
    t = np.asarray(t, dtype=float)
    keep = t > 0
    x, t = x[keep], t[keep]
    if len(t) < 2 or np.ptp(x) <= 0:
        raise InputError(what, "samples", "at least two samples of different size to fit "
                         "t = overhead + size / rate", f"{len(t)} sample(s)")
    w = 1.0 / t
    a_mat = np.column_stack([np.ones_like(x), x]) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(a_mat, t * w, rcond=None)
    if a < 0:   # overhead clamped to 0: fit the slope through the origin
        a, b = 0.0, _origin_slope(x, t)
    if b < 0:   # no size dependence: constant time
        a, b = float(np.sum(w * w * t) / np.sum(w * w)), 0.0
    return line_stats(a + b * x, t, a, b)


def _origin_slope(x: np.ndarray, t: np.ndarray) -> float:
    """Slope of the line through the origin, least squares on relative residuals."""
    w = 1.0 / t
    return float(np.sum(w * w * x * t) / np.sum(w * w * x * x))


def fit_nnls(cols: np.ndarray, t: np.ndarray, what: str = "samples",
             required: tuple[int, ...] = ()) -> np.ndarray | None:
    """Coefficients c >= 0 of ``t ≈ cols @ c`` minimising the relative residuals
    (weights 1/t): the best of the unconstrained least-squares solutions on every
    subset of columns (each containing the ``required`` ones) whose coefficients are
    all >= 0 (exact for a handful of columns; no scipy). None if no such subset."""
    cols = np.asarray(cols, dtype=float)
    t = np.asarray(t, dtype=float)
    keep = t > 0
    cols, t = cols[keep], t[keep]
    if len(t) < cols.shape[1]:
        raise InputError(what, "samples", f"at least {cols.shape[1]} samples to fit",
                         f"{len(t)} sample(s)")
    w = 1.0 / t
    a, y = cols * w[:, None], t * w
    best, best_res = None, np.inf
    n = cols.shape[1]
    for mask in range(1, 2**n):
        idx = [j for j in range(n) if mask >> j & 1]
        if any(j not in idx for j in required):
            continue
        sub = a[:, idx]
        if np.linalg.matrix_rank(sub) < len(idx):
            continue
        c, *_ = np.linalg.lstsq(sub, y, rcond=None)
        if np.any(c < 0):
            continue
        res = float(np.sum((y - sub @ c) ** 2))
        if res < best_res * (1 - 1e-12):
            best, best_res = np.zeros(n), res
            best[idx] = c
    return best


def line_stats(pred: np.ndarray, t: np.ndarray, overhead_s: float, slope: float) -> LineFit:
    """Residual statistics of a fitted model, as a :class:`LineFit`."""
    keep = t > 0
    pred, t = pred[keep], t[keep]
    res = t - pred
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum(res**2)) / ss_tot if ss_tot > 0 else 1.0
    rel = np.abs(res) / t
    return LineFit(float(overhead_s), float(slope), r2, int(len(t)),
                   float(np.sqrt(np.mean(res**2))), float(np.max(rel)), float(np.median(rel)))


def fit_gemm(flops: np.ndarray, nbytes: np.ndarray, t: np.ndarray,
             what: str = "matmuls") -> tuple[LineFit, float]:
    """``t = overhead + flops · slope + bytes · byte_slope`` (all >= 0); returns the fit
    (overhead, seconds per FLOP, statistics) and the seconds per operand byte."""
    flops, nbytes, t = (np.asarray(v, dtype=float) for v in (flops, nbytes, t))
    if np.sum(t > 0) < 2 or np.ptp(flops[t > 0]) <= 0:
        raise InputError(what, "samples", "at least two samples of different size to fit "
                         "t = overhead + FLOPs / rate + bytes / bandwidth",
                         f"{int(np.sum(t > 0))} sample(s)")
    cols = np.column_stack([np.ones_like(flops), flops, nbytes])
    coef = fit_nnls(cols, t, what, required=(1,))   # a GEMM always has a FLOP rate
    if coef is None or coef[1] <= 0:    # no fit with a finite rate: the plain line
        return with_rate(fit_line(flops, t, what), flops, t), 0.0
    a, b, c = coef
    return line_stats(cols @ coef, t, a, b), float(c)


def with_rate(fit: LineFit, x: np.ndarray, t: np.ndarray) -> LineFit:
    """``fit`` if its slope is > 0; otherwise (the samples show no size dependence, e.g.
    a few small, noisy all-to-alls) the least-squares line through the origin
    (relative residuals), so a calibration always has a finite rate (> 0). The
    overhead is then 0: the samples' mean time is carried by the rate."""
    if fit.slope > 0:
        return fit
    x = np.asarray(x, dtype=float)
    t = np.asarray(t, dtype=float)
    keep = (t > 0) & (x > 0)
    if not keep.any():
        return fit
    b = _origin_slope(x[keep], t[keep])
    return line_stats(b * x, t, 0.0, b)


def fit_total(x: np.ndarray, t: np.ndarray, overhead_s: float) -> LineFit:
    """Keep the per-op ``overhead_s`` and choose the rate so that the predicted total
    equals the measured total: slope = (Σt − n·overhead) / Σx, >= 0. The mean time per
    byte, rare slow samples included."""
    x = np.asarray(x, dtype=float)
    t = np.asarray(t, dtype=float)
    keep = t > 0
    x, t = x[keep], t[keep]
    b = max(0.0, float(np.sum(t) - len(t) * overhead_s)) / float(np.sum(x))
    return line_stats(overhead_s + b * x, t, overhead_s, b)


def gap_samples(ts: TraceSet) -> np.ndarray:
    """Host time between consecutive traced ops of a rank (next start − previous end,
    >= 0): framework dispatch and the untraced Python between kernels."""
    gaps = []
    for r in ts.ranks:
        for s in r.steps:
            ends = np.maximum.accumulate([o.start_s + o.dur_s for o in s.ops]) if s.ops else []
            gaps += [max(0.0, b.start_s - e) for e, b in zip(ends, s.ops[1:], strict=False)]
    return np.array(gaps)


def host_gaps(ts: TraceSet) -> dict[str, tuple[float, int]]:
    """(total gap s, compute ops) for ``forward``, ``backward`` and ``all``: every gap
    (as :func:`gap_samples`) counts for the class of the op that follows it."""
    out = {"forward": [0.0, 0], "backward": [0.0, 0], "all": [0.0, 0]}
    for r in ts.ranks:
        for s in r.steps:
            end = -np.inf
            for i, o in enumerate(s.ops):
                cls = "backward" if o.backward else "forward"
                gap = max(0.0, o.start_s - end) if i else 0.0
                end = max(end, o.start_s + o.dur_s)
                compute = o.kind in ("gemm", "memory")
                for c in (cls, "all"):
                    out[c][0] += gap
                    out[c][1] += int(compute)
    return {k: (float(v[0]), int(v[1])) for k, v in out.items()}


def gemm_samples(ts: TraceSet) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FLOPs, operand bytes, seconds) of every matmul in every step of every rank."""
    ops = [o for r in ts.ranks for s in r.steps for o in s.ops if o.kind == "gemm"]
    return (np.array([o.flops for o in ops]), np.array([o.bytes for o in ops]),
            np.array([o.dur_s for o in ops]))


def memory_samples(ts: TraceSet) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, seconds, op name) of every memory-bound op in every step of every rank."""
    ops = [o for r in ts.ranks for s in r.steps for o in s.ops if o.kind == "memory"]
    return (np.array([o.bytes for o in ops]), np.array([o.dur_s for o in ops]),
            np.array([o.name for o in ops], dtype=object))


#: an op kind gets its own memory-bound rate from this many samples on
MIN_KIND_SAMPLES = 6


def rates_by_op(x: np.ndarray, t: np.ndarray, names: np.ndarray,
                overhead_s: float) -> dict[str, float]:
    """Bytes/s per op kind (``aten::mul``, ``aten::gelu``, ...) with at least
    ``MIN_KIND_SAMPLES`` samples: the total-matching rate of :func:`fit_total` over
    that kind's samples, with the common per-op overhead. Kinds differ in work per byte
    (a transcendental ``gelu`` or ``silu`` against a ``copy_``)."""
    out = {}
    for name in sorted(set(names)):
        sel = names == name
        if sel.sum() < MIN_KIND_SAMPLES or x[sel].sum() <= 0:
            continue
        f = fit_total(x[sel], t[sel], overhead_s)
        if f.slope > 0:
            out[str(name)] = f.rate
    return out


#: backends whose ranks move their bytes with their own CPU core (gloo over TCP
#: loopback: the sender's and the receiver's kernel copy each byte), so a rank's
#: sends and receives share one rate. Others (nccl over NVLink / InfiniBand) are
#: full duplex: each direction has its own.
HALF_DUPLEX_BACKENDS = {"gloo"}


def comm_samples(ts: TraceSet, duplex: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(busiest rank's off-rank bytes, min over ranks of the span) per collective.

    A rank's bytes are max(sent, received) on a ``duplex`` transport, sent + received
    on a half-duplex one (``HALF_DUPLEX_BACKENDS``). The k-th all-to-all of a step is
    the same collective on every rank (collectives of one process group are issued in
    the same order everywhere)."""
    xs, ts_ = [], []
    for sid in ts.step_ids():
        per_rank = [[o for o in ts.step(r, sid).ops if o.kind in ("all_to_all", "count_exchange")]
                    for r in range(ts.world)]
        if len({len(p) for p in per_rank}) != 1:
            raise InputError(ts.ranks[0].source, f"ProfilerStep#{sid}",
                             "the same number of all-to-alls on every rank",
                             [len(p) for p in per_rank])
        for k in range(len(per_rank[0])):
            busiest = 0.0
            for r, ops in enumerate(per_rank):
                op = ops[k]
                sent = sum(b for d, b in enumerate(op.send_bytes) if d != r)
                recv = sum(b for s, b in enumerate(op.recv_bytes) if s != r)
                busiest = max(busiest, max(sent, recv) if duplex else sent + recv)
            xs.append(busiest)
            ts_.append(min(ops[k].work_dur_s for ops in per_rank))
    return np.array(xs), np.array(ts_)


def _fit_dict(f: LineFit) -> dict:
    return {"r2": f.r2, "n_samples": f.n_samples,
            "residuals": {"rms_s": f.rms_s, "max_rel": f.max_rel,
                                                           "median_rel": f.median_rel}}


def _size_range(x: np.ndarray, t: np.ndarray) -> list[float]:
    """[smallest, largest] size among the samples a fit used (t > 0)."""
    x = np.asarray(x, dtype=float)[np.asarray(t) > 0]
    return [float(x.min()), float(x.max())] if len(x) else [0.0, 0.0]


def calibrate(sets: list[TraceSet], sources: list[str], backend: str = "gloo",
              device: str = "cpu", shapes: ShapeTable | None = None,
              shape_sources: list[str] | None = None) -> dict:
    """Fit all three models over the given recordings; returns the calibration JSON doc.
    ``shapes`` (a shape sweep's table, :mod:`moesim.validation.calibration.shape_fit`), when not
    empty, is stored as ``shape_sweep``: times by shape, used inside its range."""
    def cat(fn):
        return tuple(np.concatenate(parts) for parts in zip(*(fn(s) for s in sets),
                                                            strict=True))

    src = ", ".join(sources)
    gemm, gemm_byte_slope = fit_gemm(*cat(gemm_samples), what=f"{src} (matmuls)")
    mem_x, mem_t, mem_names = cat(memory_samples)
    mem = fit_total(mem_x, mem_t, fit_line(mem_x, mem_t, f"{src} (memory-bound ops)").overhead_s)
    mem = with_rate(mem, mem_x, mem_t)
    by_op = rates_by_op(mem_x, mem_t, mem_names, mem.overhead_s)
    duplex = backend not in HALF_DUPLEX_BACKENDS
    comm_x, comm_t = cat(lambda s: comm_samples(s, duplex))
    comm = with_rate(fit_line(comm_x, comm_t, what=f"{src} (all-to-alls)"), comm_x, comm_t)
    gaps = np.concatenate([gap_samples(s) for s in sets])
    tot: dict[str, list[float]] = {}
    for s in sets:
        for k, (g, n) in host_gaps(s).items():
            tot.setdefault(k, [0.0, 0])
            tot[k][0] += g
            tot[k][1] += n
    per_op = {k: g / n if n else 0.0 for k, (g, n) in tot.items()}
    gemm_x, _, gemm_t = cat(gemm_samples)
    doc = {
        "format": FORMAT,
        "device": device,
        "gemm": {"flops_per_s": gemm.rate, "overhead_s": gemm.overhead_s,
                 # JSON has no infinity: 0 means "no operand-traffic term"
                 "bytes_per_s": 1.0 / gemm_byte_slope if gemm_byte_slope > 0 else 0.0},
        "memory": {"bytes_per_s": mem.rate, "overhead_s": mem.overhead_s,
                   "bytes_per_s_by_op": by_op},
        "comm": {"latency_s": comm.overhead_s, "bandwidth_Bps": comm.rate, "backend": backend,
                 "duplex": duplex},
        "host": {"op_gap_s": per_op["all"], "op_gap_forward_s": per_op["forward"],
                 "op_gap_backward_s": per_op["backward"]},
        "fit": {"gemm": {**_fit_dict(gemm), "range": {"flops": _size_range(gemm_x, gemm_t)}},
                "memory": {**_fit_dict(mem), "range": {"bytes": _size_range(mem_x, mem_t)}},
                "comm": _fit_dict(comm),
                "host": {"n_samples": int(len(gaps)),
                         "compute_ops": {k: n for k, (_, n) in tot.items()},
                         "median_gap_s": float(np.median(gaps)) if len(gaps) else 0.0},
                "method": "gemm: t = overhead + flops/rate + operand bytes/bandwidth, comm: "
                          "t = latency + bytes/bandwidth, both non-negative least squares on "
                          "relative residuals (weights 1/t); "
                          "memory: overhead from that fit, rate = total bytes / (total time - "
                          "overhead per op); coefficients >= 0; "
                          "comm time = min over ranks of the collective's worker span; host "
                          "op gap = total time between consecutive ops of a rank / compute "
                          "ops, forward and backward apart"},
        "sources": list(sources),
        # the machine the recordings ran on: moesim validate warns on another one
        "recorded_on": calibration_facts(sources),
    }
    if shapes:
        doc["shape_sweep"] = shape_section(shapes, *trace_samples(sets), shape_sources or [])
    return doc

