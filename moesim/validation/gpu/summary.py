"""What a GPU trace says: busy time per stream, time per kernel class, communication
kernels and the SMs they hold, compute–communication overlap, exposed communication,
and per annotated phase (and layer) the GPU time of the kernels launched under it.

Definitions (seconds; every interval set is a union, so two kernels running at once on
two streams count once):

- ``span_s``: first GPU event's start to the last one's end;
- per stream: ``busy_s`` = length of the union of its events' intervals; ``classes`` =
  the summed durations of its events per class;
- communication = events of class ``comm`` (NCCL, DeepEP); compute = every other GPU
  event (memcpy/memset included); ``compute_comm_overlap_s`` = length of (union of comm)
  ∩ (union of compute); ``exposed_comm_s`` = length of (union of comm) − that overlap:
  the time communication runs with no computation beside it;
- per communication kind: ``count``, ``total_s`` (summed durations), ``busy_s`` (union),
  ``exposed_s`` (its union minus compute), ``sms`` = the most thread blocks one of its
  kernels was launched with (NCCL and DeepEP run one block per SM: NCCL
  ``src/enqueue.cc`` launches ``grid = {nChannels, 1, 1}``, one block per channel;
  DeepEP ``csrc/kernels/legacy/internode.cu`` launches ``num_channels * 2`` blocks and
  reads ``num_sms = gridDim.x``), capped at the device's SM count when the trace gives it;
- per phase: ``cpu_s`` (the annotation's own span), ``gpu_busy_s`` (union of the
  kernels launched under it), ``gpu_span_s`` (their first start to last end), ``classes``
  and ``comm`` (summed durations by class / kind).
"""

from __future__ import annotations

from collections import Counter

from moesim.validation.gpu.kernel_names import CLASSES
from moesim.validation.gpu.trace import GpuKernel, GpuTrace

Intervals = list[tuple[float, float]]


def union(spans: list[tuple[float, float]]) -> Intervals:
    """Merged, sorted, disjoint intervals covering the given ones."""
    out: Intervals = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def length(iv: Intervals) -> float:
    return float(sum(b - a for a, b in iv))


def overlap(x: Intervals, y: Intervals) -> float:
    """Length of the intersection of two merged interval lists."""
    i = j = 0
    tot = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if hi > lo:
            tot += hi - lo
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return tot


def _iv(ks: list[GpuKernel]) -> Intervals:
    return union([(k.start_s, k.end_s) for k in ks])


def _sum_by(ks: list[GpuKernel], key) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in ks:
        out[key(k)] = out.get(key(k), 0.0) + k.dur_s
    return out


def summarize(tr: GpuTrace) -> dict:
    """The ``gpu`` object of ``moesim ingest --json`` (SI units)."""
    ks = list(tr.kernels)
    multi_dev = len({k.device for k in ks}) > 1
    comm = [k for k in ks if k.cls == "comm"]
    comp_iv = _iv([k for k in ks if k.cls != "comm"])
    comm_iv = _iv(comm)
    ov = overlap(comm_iv, comp_iv)
    streams = []
    for dev, st in sorted({(k.device, k.stream) for k in ks}):
        mine = [k for k in ks if k.device == dev and k.stream == st]
        streams.append({"stream": f"{dev}/{st}" if multi_dev else st, "device": dev,
                        "kernels": len(mine), "busy_s": length(_iv(mine)),
                        "classes": {c: v for c, v in sorted(_sum_by(mine, lambda k: k.cls)
                                                            .items(), key=_class_order)}})
    kinds = {}
    for kind in sorted({k.kind for k in comm}):
        mine = [k for k in comm if k.kind == kind]
        iv = _iv(mine)
        blocks = max(k.blocks for k in mine)
        kinds[kind] = {"count": len(mine), "total_s": sum(k.dur_s for k in mine),
                       "busy_s": length(iv), "exposed_s": length(iv) - overlap(iv, comp_iv),
                       "sms": min(blocks, tr.num_sms) if tr.num_sms else blocks}
    other = Counter(k.name for k in ks if k.cls == "other")
    return {
        "source": tr.source, "device": tr.device_name, "num_sms": tr.num_sms,
        "rank": tr.rank, "world": tr.world,
        "span_s": (max(k.end_s for k in ks) - min(k.start_s for k in ks)) if ks else 0.0,
        "kernels": len(ks),
        "classes": dict(sorted(_sum_by(ks, lambda k: k.cls).items(), key=_class_order)),
        "streams": streams,
        "comm": kinds,
        "compute_busy_s": length(comp_iv),
        "comm_busy_s": length(comm_iv),
        "compute_comm_overlap_s": ov,
        "exposed_comm_s": length(comm_iv) - ov,
        "phases": phases(tr),
        "other_kernels": dict(other.most_common()),
        "unlinked_kernels": sum(k.launch_s is None for k in ks),
        "kernels_outside_ops": sum(k.op is None and k.launch_s is not None for k in ks),
    }


def _class_order(item: tuple[str, float]) -> int:
    return CLASSES.index(item[0]) if item[0] in CLASSES else len(CLASSES)


def phases(tr: GpuTrace) -> list[dict]:
    """Per annotation (name, layer index), in trace order, the GPU time of the kernels
    launched under it; annotations that launched nothing are left out."""
    groups: dict[tuple[str, int], list[GpuKernel]] = {}
    for k in tr.kernels:
        if k.phase is not None:
            groups.setdefault((k.phase.name, k.phase.index), []).append(k)
    out = []
    for a in tr.annotations:
        mine = groups.get((a.name, a.index))
        if not mine:
            continue
        out.append({"phase": a.name, "layer": a.index, "cpu_s": a.dur_s, "kernels": len(mine),
                    "gpu_busy_s": length(_iv(mine)),
                    "gpu_span_s": max(k.end_s for k in mine) - min(k.start_s for k in mine),
                    "classes": dict(sorted(_sum_by(mine, lambda k: k.cls).items(),
                                           key=_class_order)),
                    "comm": _sum_by([k for k in mine if k.cls == "comm"], lambda k: k.kind)})
    return out


def kernel_dicts(tr: GpuTrace) -> list[dict]:
    """Every GPU event with its launching op's shapes and dtypes (``--json`` without
    ``--no-ops``)."""
    out = []
    for k in tr.kernels:
        d = {"name": k.name, "class": k.cls, "stream": k.stream, "start_s": k.start_s,
             "dur_s": k.dur_s}
        if k.kind:
            d["kind"] = k.kind
        if k.blocks:
            d["blocks"] = k.blocks
        if k.nbytes:
            d["bytes"] = k.nbytes
        if k.dtype:
            d["dtype"] = k.dtype
        if k.op is not None:
            d["op"] = k.op.name
            if k.op.dims:
                d["input_dims"], d["input_types"] = k.op.dims, k.op.types
        if k.phase is not None:
            d["phase"], d["layer"] = k.phase.name, k.phase.index
        out.append(d)
    return out
