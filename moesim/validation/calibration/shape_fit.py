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
from pathlib import Path

import numpy as np

from moesim.compute.shape_table import Family, ShapeTable, key_text, table_from_samples
from moesim.errors import InputError
from moesim.validation.cpu.ingest import MATMULS, NO_BYTES, NOT_MEMORY
from moesim.validation.gpu.trace import GpuTrace, gpu_trace_from_doc, has_gpu_events
from moesim.validation.kineto.events import ancestors, complete_events, load_trace
from moesim.validation.kineto.op_cost import gemm_dims, tensor_bytes

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
    scales = {"gemm": common, **{"gemm " + key_text(k): v for k, v in fam_scale.items()}}
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
