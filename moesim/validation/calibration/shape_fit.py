"""Calibration by shape: measured times interpolated over a shape sweep (pure numpy).

A fit of ``t = overhead + FLOPs / rate + bytes / bandwidth`` to a uniform recording
extrapolates when skew makes an expert's GEMMs taller than any it saw (on the shipped
CPU study, GEMMs of ~4000 rows ran 7-11 % slower per FLOP than the uniform fit said).
``moesim record --shape-sweep`` (:mod:`moesim.validation.recorder.sweep_record`) times the
layer's GEMMs and memory-bound ops from 1 row up to every token on one expert; this
module turns those samples into a table that a calibration interpolates in:

- **GEMM families**: samples whose two other dims are fixed and whose third one
  (``axis`` m, k or n: rows for the forward and input-gradient GEMMs, the reduction
  dim k for the weight gradients) takes at least two values. Time per point = the
  median over the point's samples;
- **memory-bound families**: per op kind (``aten::mul``, ...), time against bytes
  moved (as ingest estimates them). Time per point = the mean over its samples
  (as the memory-bound fit: a sum of ops has the mean of the sum);
- per family the point times are made non-decreasing in size (pool-adjacent-violators:
  a larger op is never cheaper), and a size between two points takes the straight
  line between them in log(size)-log(time): exact at the points, monotone between.
  Outside a family's range, or for a shape in no family, :meth:`ShapeTable.gemm_time`
  / :meth:`ShapeTable.memory_time` return None and the calibration's line fit is used.

A sweep recorded on a GPU (``moesim record --shape-sweep --backend nccl``) is read the
same way, with each op's time the GPU time of the kernels it launched (linked by
correlation id, :mod:`moesim.validation.gpu.trace`) instead of its CPU span; a GPU
calibration (``moesim calibrate TRACE --device D --shape-sweep SWEEP``) is anchored on
the traced ops' kernel times likewise.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesim.errors import InputError
from moesim.validation.cpu.ingest import MATMULS, NO_BYTES, NOT_MEMORY
from moesim.validation.gpu.trace import GpuTrace, gpu_trace_from_doc, has_gpu_events
from moesim.validation.kineto.events import ancestors, complete_events, load_trace
from moesim.validation.kineto.op_cost import gemm_dims, tensor_bytes

AXES = ("m", "k", "n")
#: a family needs this many distinct sizes
MIN_POINTS = 2
_LABEL = re.compile(r"sweep/rows=(\d+)")
#: GPU kernel classes of memory-bound ops (moesim.validation.gpu.kernel_names)
_GPU_MEMORY = {"cast", "norm", "elementwise"}
SHAPE_METHOD = ("per family (GEMMs with two dims fixed, time against the third; memory-bound "
                "ops per op kind, time against bytes) the median (GEMM) or mean (memory) time "
                "per swept size, made non-decreasing (pool-adjacent-violators), scaled to the "
                "recording's level (scales: GEMMs by the median measured/interpolated time, "
                "memory-bound kinds by total measured/total interpolated), interpolated "
                "linearly in log(size)-log(time) inside the swept range; the line fits outside; "
                "on a GPU an op's time is its kernels' GPU time")


@dataclass(frozen=True)
class Family:
    """Sizes ``x`` (increasing) and times ``t_s`` (non-decreasing, s) of one family."""

    x: tuple[float, ...]
    t_s: tuple[float, ...]

    def time(self, size: float) -> float | None:
        """Log-log interpolated time at ``size``; None outside [x[0], x[-1]]."""
        x, t = self.x, self.t_s
        if not x or size < x[0] * (1 - 1e-9) or size > x[-1] * (1 + 1e-9):
            return None
        i = int(np.searchsorted(x, size))
        if i < len(x) and math.isclose(x[i], size, rel_tol=1e-9):
            return t[i]
        if i == 0:
            return t[0]
        i = min(i, len(x) - 1)
        lx0, lx1 = math.log(x[i - 1]), math.log(x[i])
        f = (math.log(size) - lx0) / (lx1 - lx0)
        return math.exp((1 - f) * math.log(t[i - 1]) + f * math.log(t[i]))


def monotone(t: list[float]) -> list[float]:
    """Pool-adjacent-violators: the non-decreasing sequence closest (least squares) to
    ``t``; unchanged when ``t`` is already non-decreasing."""
    blocks: list[list[float]] = []   # [mean, count]
    for v in t:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks[-2], blocks[-1]
            blocks[-2:] = [[(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]]
    return [m for m, n in blocks for _ in range(int(n))]


def family(sizes: list[float], times: list[float], stat: str) -> Family | None:
    """A family from samples (size, time): per distinct size the median (``stat`` =
    "median") or mean time, made monotone; None with fewer than ``MIN_POINTS`` sizes."""
    pts: dict[float, list[float]] = {}
    for x, t in zip(sizes, times, strict=True):
        if x > 0 and t > 0:
            pts.setdefault(float(x), []).append(float(t))
    if len(pts) < MIN_POINTS:
        return None
    xs = sorted(pts)
    agg = np.median if stat == "median" else np.mean
    return Family(tuple(xs), tuple(monotone([float(agg(pts[x])) for x in xs])))


@dataclass(frozen=True)
class ShapeTable:
    """Interpolation tables by shape. ``gemm[(axis, a, b)]``: the family whose dims
    other than ``axis`` are ``a``, ``b`` (in m, k, n order); ``memory[op name]``."""

    gemm: dict[tuple[str, int, int], Family]
    memory: dict[str, Family]

    def __bool__(self) -> bool:
        return bool(self.gemm or self.memory)

    def __hash__(self) -> int:     # frozen, so a model holding a table stays hashable
        return hash((tuple(sorted(self.gemm.items())), tuple(sorted(self.memory.items()))))

    def gemm_family(self, m: int, k: int, n: int) -> tuple[tuple[str, int, int], int] | None:
        """(family key, size on its axis) of the first family (axes m, k, n in turn)
        whose range holds the (m, k, n) matmul; None if none does."""
        dims = {"m": m, "k": k, "n": n}
        for axis in AXES:
            a, b = (dims[d] for d in AXES if d != axis)
            fam = self.gemm.get((axis, a, b))
            if fam is not None and fam.time(dims[axis]) is not None:
                return (axis, a, b), dims[axis]
        return None

    def gemm_time(self, m: int, k: int, n: int) -> float | None:
        """Interpolated seconds of one (m, k, n) matmul, or None (no family holds it)."""
        hit = self.gemm_family(m, k, n)
        return None if hit is None else self.gemm[hit[0]].time(hit[1])

    def memory_time(self, name: str, nbytes: float) -> float | None:
        fam = self.memory.get(name)
        return fam.time(nbytes) if fam is not None else None

    def to_doc(self) -> dict:
        def fam(f: Family) -> dict:
            return {"x": list(f.x), "t_s": list(f.t_s)}
        return {"gemm": [{"axis": ax, "fixed": [a, b], **fam(f)}
                         for (ax, a, b), f in sorted(self.gemm.items())],
                "memory": [{"op": name, **fam(f)} for name, f in sorted(self.memory.items())]}


def _key_text(key: tuple[str, int, int]) -> str:
    """``("m", 512, 1024)`` → ``"m×512×1024"``: the varying dim, then the fixed ones."""
    return "×".join(map(str, key))


def table_from_samples(gemm: list[tuple[int, int, int, float]],
                       memory: list[tuple[str, float, float]]) -> ShapeTable:
    """Families from GEMM samples (m, k, n, s) and memory-bound samples (op, bytes, s)."""
    gem: dict[tuple[str, int, int], Family] = {}
    for axis in AXES:
        groups: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        for m, k, n, t in gemm:
            dims = {"m": m, "k": k, "n": n}
            a, b = (dims[d] for d in AXES if d != axis)
            xs, ts = groups.setdefault((a, b), ([], []))
            xs.append(dims[axis])
            ts.append(t)
        for (a, b), (xs, ts) in groups.items():
            f = family(xs, ts, "median")
            if f is not None:
                gem[(axis, a, b)] = f
    mem: dict[str, tuple[list[float], list[float]]] = {}
    for name, nbytes, t in memory:
        xs, ts = mem.setdefault(name, ([], []))
        xs.append(nbytes)
        ts.append(t)
    fams = {name: family(xs, ts, "mean") for name, (xs, ts) in mem.items()}
    return ShapeTable(gem, {k: f for k, f in fams.items() if f is not None})


def _family_doc(d: object, src: str, field: str) -> Family:
    ok = isinstance(d, dict) and isinstance(d.get("x"), list) and isinstance(d.get("t_s"), list)
    xs, ts = (d.get("x"), d.get("t_s")) if ok else ([], [])
    nums = all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
               and v > 0 for v in [*xs, *ts])
    if (not ok or not nums or len(xs) != len(ts) or len(xs) < MIN_POINTS
            or any(b <= a for a, b in zip(xs, xs[1:], strict=False))
            or any(b < a for a, b in zip(ts, ts[1:], strict=False))):
        raise InputError(src, field, f"{{'x': increasing sizes > 0, 't_s': non-decreasing "
                         f"times > 0}} of equal length >= {MIN_POINTS}", d)
    return Family(tuple(float(v) for v in xs), tuple(float(v) for v in ts))


def table_from_doc(doc: object, src: str) -> ShapeTable:
    """The ``shape_sweep`` section of a calibration file (:meth:`ShapeTable.to_doc`)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("gemm", []), list) \
            or not isinstance(doc.get("memory", []), list):
        raise InputError(src, "shape_sweep", "an object with 'gemm' and 'memory' lists", doc)
    gem = {}
    for i, g in enumerate(doc.get("gemm", [])):
        field = f"shape_sweep.gemm[{i}]"
        fixed = g.get("fixed") if isinstance(g, dict) else None
        if (not isinstance(g, dict) or g.get("axis") not in AXES or not isinstance(fixed, list)
                or len(fixed) != 2 or not all(isinstance(v, int) and v > 0 for v in fixed)):
            raise InputError(src, field, "{'axis': 'm', 'k' or 'n', 'fixed': [two dims > 0], "
                             "'x', 't_s'}", g)
        gem[(g["axis"], fixed[0], fixed[1])] = _family_doc(g, src, field)
    mem = {}
    for i, g in enumerate(doc.get("memory", [])):
        field = f"shape_sweep.memory[{i}]"
        if not isinstance(g, dict) or not isinstance(g.get("op"), str):
            raise InputError(src, field, "{'op': name, 'x', 't_s'}", g)
        mem[g["op"]] = _family_doc(g, src, field)
    return ShapeTable(gem, mem)


# --------------------------------------------------------------------- reading a sweep
def sweep_file(path: str | Path) -> Path:
    """The sweep trace of a directory written by ``moesim record --shape-sweep`` (or
    the file itself)."""
    p = Path(path)
    if p.is_dir():
        for name in ("shape_sweep.json.gz", "shape_sweep.json"):
            if (p / name).is_file():
                return p / name
        raise InputError(str(p), "", "a directory written by moesim record --shape-sweep "
                         "(shape_sweep.json[.gz])", "none")
    if not p.is_file():
        raise InputError(str(p), "", "an existing shape-sweep directory or trace", "missing")
    return p


def _is_memory_op(name: str) -> bool:
    return (name.startswith("aten::") and name not in NO_BYTES and name not in NOT_MEMORY
            and name not in MATMULS)


def _unbatched(e) -> tuple[int, int, int] | None:
    dims = gemm_dims(e)
    return dims[1:] if dims is not None and dims[0] == 1 and min(dims[1:]) > 0 else None


def gpu_samples(tr: GpuTrace, inside=None) -> tuple[list[tuple[int, int, int, float]],
                                                     list[tuple[str, float, float]]]:
    """GEMM samples (m, k, n, s) and memory-bound samples (op, bytes, s) of a GPU trace:
    per launching CPU op with shapes, the summed GPU time of its kernels (communication
    kernels left out); ``inside(kernel)``, when given, keeps only the kernels it accepts."""
    per_op: dict[int, list] = {}
    for k in tr.kernels:
        if k.op is not None and k.cls != "comm" and (inside is None or inside(k)):
            per_op.setdefault(k.op.idx, []).append(k)
    gemm, memory = [], []
    for ks in per_op.values():
        op, t = ks[0].op, sum(k.dur_s for k in ks)
        if op.name in MATMULS and any(k.cls == "gemm" for k in ks):
            dims = _unbatched(op)
            if dims is not None:
                gemm.append((*dims, t))
        elif _is_memory_op(op.name) and all(k.cls in _GPU_MEMORY for k in ks):
            nbytes = tensor_bytes(op, 4)
            if nbytes > 0:
                memory.append((op.name, nbytes, t))
    return gemm, memory


def _gpu_sweep_samples(tr: GpuTrace) -> tuple[list, list]:
    """:func:`gpu_samples` of the kernels launched inside ``sweep/rows=R`` labels."""
    spans = [(a.start_s, a.start_s + a.dur_s) for a in tr.annotations if _LABEL.fullmatch(a.name)]
    if not spans:
        raise InputError(tr.source, "traceEvents", "sweep/rows=R labels (moesim record "
                         "--shape-sweep)", "none")

    def inside(k) -> bool:
        return k.launch_s is not None and any(a <= k.launch_s <= b for a, b in spans)
    return gpu_samples(tr, inside)


def sweep_samples(path: str | Path) -> tuple[list[tuple[int, int, int, float]],
                                             list[tuple[str, float, float]]]:
    """GEMM samples (m, k, n, s) and memory-bound samples (op, bytes, s) of a sweep
    trace: the innermost matmuls and the memory-bound ops (as ingest defines them)
    inside ``sweep/rows=R`` labels; on a GPU trace their kernels' GPU time."""
    f = sweep_file(path)
    src = str(f)
    doc = load_trace(f)
    if has_gpu_events(doc):
        gemm, memory = _gpu_sweep_samples(gpu_trace_from_doc(doc, src))
    else:
        gemm, memory = _cpu_sweep_samples(doc, src)
    if not gemm:
        raise InputError(src, "traceEvents", "matmuls with recorded shapes inside the sweep "
                         "labels", "none")
    return gemm, memory


def _cpu_sweep_samples(doc: dict, src: str) -> tuple[list, list]:
    events = complete_events(doc, src)
    labels = [e for e in events if _LABEL.fullmatch(e.name)]
    if not labels:
        raise InputError(src, "traceEvents", "sweep/rows=R labels (moesim record "
                         "--shape-sweep)", "none")
    anc = ancestors(events)
    label_idx = {lb.idx for lb in labels}
    inside = {e.idx for e in events for p in anc[e.idx] if p in label_idx}
    matmul_parent = {p for e in events if e.name in MATMULS for p in anc[e.idx]}
    has_child = {p for e in events if e.name not in NO_BYTES for p in anc[e.idx]}
    gemm, memory = [], []
    for e in events:
        if e.idx not in inside:
            continue
        if e.name in MATMULS and e.idx not in matmul_parent:
            dims = _unbatched(e)
            if dims is not None:
                gemm.append((*dims, e.dur_s))
        elif e.idx not in has_child and _is_memory_op(e.name):
            nbytes = tensor_bytes(e, 4)
            if nbytes > 0:
                memory.append((e.name, nbytes, e.dur_s))
    return gemm, memory


def sweep_table(paths: list[str], memory: bool = False) -> ShapeTable:
    """The interpolation table of one or more sweep recordings (samples pooled): GEMM
    families, and memory-bound families too when ``memory`` (off by default: on the
    shipped CPU study they made the skewed predictions worse, docs/validation.md)."""
    gemm: list = []
    mem: list = []
    for p in paths:
        g, m = sweep_samples(p)
        gemm += g
        mem += m
    return table_from_samples(gemm, mem if memory else [])


def anchor(table: ShapeTable, gemm: list[tuple[int, int, int, float]],
           memory: list[tuple[str, float, float]]) -> tuple[ShapeTable, dict[str, float]]:
    """The table scaled to the level of a recording of the same layer.

    A sweep runs in one process while the recording's ranks share the machine (both
    cores busy, collective threads): on the shipped CPU study the swept GEMMs ran at
    ~116 GFLOP/s against ~95 in the recorded layer. The sweep gives how time varies
    with shape; the recording (its GEMM samples (m, k, n, s) and memory-bound samples
    (op, bytes, s)) gives the level: every GEMM family is scaled by the median over
    the recording's GEMMs inside that family of measured / interpolated time (a
    family the recording has no GEMM in: the median over all families), every
    memory-bound family by its kind's total measured / total interpolated time
    (the total-matching rule of the memory-bound fit; kinds the recording lacks keep
    the scale 1). Returns the scaled table and the scales ({"gemm": s, op: s})."""
    ratios: dict[tuple[str, int, int] | None, list[float]] = {None: []}
    for m, k, n, t in gemm:
        hit = table.gemm_family(m, k, n) if t > 0 else None
        if hit is not None:
            key, size = hit
            r = t / table.gemm[key].time(size)
            ratios[None].append(r)
            ratios.setdefault(key, []).append(r)
    common = float(np.median(ratios[None])) if ratios[None] else 1.0
    fam_scale = {key: float(np.median(ratios[key])) if key in ratios else common
                 for key in table.gemm}
    scales = {"gemm": common, **{"gemm " + _key_text(k): v for k, v in fam_scale.items()}}
    tot: dict[str, list[float]] = {}
    for name, nbytes, t in memory:
        p = table.memory_time(name, nbytes)
        if p is not None and t > 0:
            acc = tot.setdefault(name, [0.0, 0.0])
            acc[0] += t
            acc[1] += p
    scales.update({name: m / p for name, (m, p) in tot.items() if p > 0})

    def scaled(f: Family, s: float) -> Family:
        return Family(f.x, tuple(t * s for t in f.t_s))
    return (ShapeTable({k: scaled(f, fam_scale[k]) for k, f in table.gemm.items()},
                       {k: scaled(f, scales.get(k, 1.0)) for k, f in table.memory.items()}),
            scales)


def shape_section(table: ShapeTable, gemm: list[tuple[int, int, int, float]],
                  memory: list[tuple[str, float, float]], sources: list[str]) -> dict:
    """The ``shape_sweep`` section of a calibration file: ``table`` anchored on a
    recording's samples (:func:`anchor`), with its scales, sources and method."""
    anchored, scales = anchor(table, gemm, memory)
    return {**anchored.to_doc(), "scales": scales, "sources": list(sources),
            "method": SHAPE_METHOD}


def trace_samples(sets: list) -> tuple[list[tuple[int, int, int, float]],
                                       list[tuple[str, float, float]]]:
    """(m, k, n, s) of every unbatched matmul and (op, bytes, s) of every memory-bound
    op of ingested recordings (:class:`~moesim.validation.cpu.ingest.TraceSet`)."""
    ops = [o for ts in sets for r in ts.ranks for s in r.steps for o in s.ops]
    gemm = [(o.m, o.k, o.n, o.dur_s) for o in ops if o.kind == "gemm"
            and math.isclose(o.flops, 2.0 * o.m * o.k * o.n, rel_tol=1e-9)]
    return gemm, [(o.name, o.bytes, o.dur_s) for o in ops if o.kind == "memory"]
