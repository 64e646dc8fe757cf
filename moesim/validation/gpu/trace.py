"""GPU kernels of a Kineto (torch.profiler) trace, per CUDA stream, each with the CPU op
that launched it and the annotation it ran under.

What is read (all times seconds):

- Times: seconds from the trace's first complete event.
- GPU events: cats ``kernel``, ``gpu_memcpy``, ``gpu_memset``; stream ``args.stream``
  (else the event's tid), device ``args.device`` (else its pid); ``args.grid`` (blocks
  in x, y, z); ``args.bytes`` of a copy or set; class from the name
  (:func:`moesim.validation.gpu.kernel_names.classify`).
- The launch: the CPU event of cat ``cuda_runtime``/``cuda_driver`` (``cudaLaunchKernel``,
  ``cuLaunchKernel``, ``cudaMemcpyAsync``, ...) whose ``args.correlation`` equals the
  GPU event's; without one, the start of the ``ac2g`` flow (``ph`` ``s``) whose ``id`` is
  that correlation. The launching op is the innermost ``cpu_op`` on the launching thread
  that encloses the launch; a GEMM kernel takes the innermost matmul among it and its
  enclosing ops (``aten::mm``, ``aten::addmm``, ...), so it carries that op's
  ``Input Dims`` and ``Input type``.
- Phases: ``user_annotation`` events (``torch.profiler.record_function``, other than
  ``ProfilerStep#N``). A kernel belongs to the innermost one (the latest-starting) whose
  CPU span holds its launch, on any thread of the trace: the autograd engine launches backward
  kernels from a thread of its own while the annotation is open on the main thread.
  The k-th annotation of one name (trace order) has index k, so a trace that
  annotates each layer's phases once per layer (DeepSeek's ``attn(F)``,
  ``dispatch(F)``, ``mlp(F)``, ``combine(F)``, ``attn(B)``, ... ) gives layer k.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moesim.errors import InputError
from moesim.validation.gpu.kernel_names import classify, gemm_dtype
from moesim.validation.kineto.events import (
    MATMUL_OPS,
    Event,
    ancestors,
    complete_events,
    load_trace,
    rank_of,
    world_of,
)

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
ANNOTATION_CAT = "user_annotation"


@dataclass(frozen=True, slots=True)
class Annotation:
    """One ``record_function`` span: its name, index among those of that name, CPU span."""

    name: str
    index: int
    start_s: float
    dur_s: float


@dataclass(frozen=True, slots=True)
class GpuKernel:
    """One GPU event. ``op`` is the launching CPU op (None: launched outside any op, or
    no link found); ``phase`` the innermost annotation holding the launch (None: none)."""

    name: str
    cls: str               # a class of moesim.validation.gpu.kernel_names.CLASSES
    kind: str              # the communication kind ("" unless cls == "comm")
    device: int
    stream: int
    start_s: float
    dur_s: float
    blocks: int            # thread blocks of the grid (x·y·z), 0 when not recorded
    nbytes: float          # bytes of a memcpy/memset, 0 otherwise
    dtype: str             # a GEMM's dtype from its name ("" when not said)
    op: Event | None
    phase: Annotation | None
    launch_s: float | None = None   # when the CPU launched it (None: no link found)

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s


@dataclass(frozen=True)
class GpuTrace:
    source: str
    kernels: tuple[GpuKernel, ...]          # sorted by start
    annotations: tuple[Annotation, ...]     # sorted by start
    device_name: str = ""
    num_sms: int = 0                        # from deviceProperties; 0 when absent
    rank: int | None = None
    world: int | None = None


def has_gpu_events(doc: dict[str, Any]) -> bool:
    """Whether a loaded trace holds GPU events (cat ``kernel``, ``gpu_memcpy``, ``gpu_memset``)."""
    return any(isinstance(e, dict) and e.get("cat") in GPU_CATS for e in doc["traceEvents"])


def _int(x: Any, default: int) -> int:
    return int(x) if isinstance(x, int) and not isinstance(x, bool) else default


def _blocks(grid: Any) -> int:
    if isinstance(grid, list) and grid and all(isinstance(g, int) and g > 0 for g in grid):
        out = 1
        for g in grid:
            out *= g
        return out
    return 0


def origin_us(doc: dict[str, Any]) -> float:
    """The first timestamp (µs) of the trace's complete events, 0 when none."""
    ts = [e["ts"] for e in doc["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"
          and isinstance(e.get("ts"), int | float) and math.isfinite(e["ts"])]
    return float(min(ts)) if ts else 0.0


def _flow_starts(doc: dict[str, Any], t0_us: float) -> dict[int, tuple[str, float]]:
    """``ac2g`` flow starts: id → (thread, time s from ``t0_us``)."""
    out = {}
    for e in doc["traceEvents"]:
        if (isinstance(e, dict) and e.get("cat") == "ac2g" and e.get("ph") == "s"
                and isinstance(e.get("id"), int) and isinstance(e.get("ts"), int | float)):
            out[e["id"]] = (f"{e.get('pid', '')}/{e.get('tid', '')}", (e["ts"] - t0_us) * 1e-6)
    return out


class _Spans:
    """Spans sorted by start; :meth:`at` finds the latest-starting one holding a time
    (the innermost, when spans nest), scanning back only while an earlier span can
    still reach that time (a running maximum of ends)."""

    def __init__(self, spans: list):
        """``spans``: objects with ``start_s`` and ``dur_s``."""
        self.items = sorted(spans, key=lambda x: (x.start_s, -x.dur_s))
        self.starts = [x.start_s for x in self.items]
        self.ends = [x.start_s + x.dur_s for x in self.items]
        self.reach, hi = [], float("-inf")
        for e in self.ends:
            hi = max(hi, e)
            self.reach.append(hi)

    def at(self, t: float, eps: float = 1e-12):
        i = bisect.bisect_right(self.starts, t + eps) - 1
        while i >= 0 and self.reach[i] >= t - eps:
            if self.ends[i] >= t - eps:
                return self.items[i]
            i -= 1
        return None


class _Launcher:
    """Finds the CPU op that launched a GPU event, and the annotation it ran under."""

    def __init__(self, doc: dict[str, Any], events: list[Event], t0_us: float):
        cpu = [e for e in events if e.cat not in GPU_CATS]
        self.by_idx = {e.idx: e for e in cpu}
        self.anc = ancestors(cpu)
        self.launch = {e.args["correlation"]: e for e in cpu if e.cat in LAUNCH_CATS
                       and isinstance(e.args.get("correlation"), int)}
        self.flows = _flow_starts(doc, t0_us)
        by_tid: dict[str, list[Event]] = {}
        for e in cpu:
            if e.cat == "cpu_op":
                by_tid.setdefault(e.tid, []).append(e)
        self.ops_by_tid = {tid: _Spans(v) for tid, v in by_tid.items()}
        ann = [e for e in cpu if e.cat == ANNOTATION_CAT and not e.name.startswith(
            "ProfilerStep#")]
        seen: dict[str, int] = {}
        self.annotations: list[Annotation] = []
        for e in ann:
            self.annotations.append(Annotation(e.name, seen.get(e.name, 0), e.start_s, e.dur_s))
            seen[e.name] = seen.get(e.name, 0) + 1
        self._ann = _Spans(self.annotations)

    def op_of(self, corr: int | None) -> tuple[Event | None, float | None]:
        """(launching op, launch time) of a correlation id."""
        rt = self.launch.get(corr) if corr is not None else None
        if rt is not None:
            chain = [self.by_idx[i] for i in self.anc[rt.idx]]
            ops = [e for e in chain if e.cat == "cpu_op"]
            return (ops[-1] if ops else None), rt.start_s
        flow = self.flows.get(corr) if corr is not None else None
        if flow is None:
            return None, None
        tid, t = flow
        ops = self.ops_by_tid.get(tid)
        return (ops.at(t) if ops is not None else None), t

    def gemm_op(self, op: Event | None) -> Event | None:
        """The innermost matmul among ``op`` and the ops enclosing it."""
        if op is None:
            return None
        if op.name in MATMUL_OPS:
            return op
        chain = [self.by_idx[i] for i in self.anc.get(op.idx, [])]
        mm = [e for e in chain if e.name in MATMUL_OPS]
        return mm[-1] if mm else op

    def phase_at(self, t: float | None) -> Annotation | None:
        if t is None:
            return None
        return self._ann.at(t)


def gpu_trace_from_doc(doc: dict[str, Any], source: str) -> GpuTrace:
    """The GPU events of a loaded trace; a trace without kernels is an InputError."""
    if not has_gpu_events(doc):
        raise InputError(source, "traceEvents", "GPU events (cat 'kernel', 'gpu_memcpy' or "
                         "'gpu_memset'; record with ProfilerActivity.CUDA)", "only CPU events")
    t0 = origin_us(doc)
    events = complete_events(doc, source, t0)
    link = _Launcher(doc, events, t0)
    kernels = []
    for e in events:
        if e.cat not in GPU_CATS:
            continue
        cls, kind = classify(e.name, e.cat)
        corr = e.args.get("correlation")
        op, t_launch = link.op_of(corr if isinstance(corr, int) else None)
        pid, _, tid = e.tid.partition("/")
        device = _int(e.args.get("device"), int(pid) if pid.lstrip("-").isdigit() else 0)
        stream = _int(e.args.get("stream"), int(tid) if tid.lstrip("-").isdigit() else 0)
        nbytes = e.args.get("bytes", 0) if e.cat != "kernel" else 0
        kernels.append(GpuKernel(
            e.name, cls, kind, device, stream, e.start_s, e.dur_s, _blocks(e.args.get("grid")),
            float(nbytes) if isinstance(nbytes, int | float) and nbytes >= 0 else 0.0,
            gemm_dtype(e.name) if cls == "gemm" else "",
            link.gemm_op(op) if cls == "gemm" else op, link.phase_at(t_launch), t_launch))
    kernels.sort(key=lambda k: (k.start_s, k.stream))
    props = doc.get("deviceProperties")
    p0 = props[0] if isinstance(props, list) and props and isinstance(props[0], dict) else {}
    return GpuTrace(source, tuple(kernels), tuple(link.annotations), str(p0.get("name", "")),
                    _int(p0.get("numSms"), 0), None, world_of(doc))


def load_gpu_trace(path: str | Path) -> GpuTrace:
    """Read one GPU trace file (Kineto JSON, plain or gzip)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(str(p), "", "an existing trace file", "missing")
    doc = load_trace(p)
    tr = gpu_trace_from_doc(doc, str(p))
    return GpuTrace(tr.source, tr.kernels, tr.annotations, tr.device_name, tr.num_sms,
                    rank_of(doc, p), tr.world)


def gpu_traces(files: list[Path]) -> list[GpuTrace] | None:
    """The GPU traces of these files, or None when the first one has no GPU kernels
    (a CPU trace: read with :func:`moesim.validation.cpu.ingest.ingest`). Once the first
    has kernels, every file must."""
    out = []
    for i, f in enumerate(files):
        doc = load_trace(f)
        if i == 0 and not has_gpu_events(doc):
            return None
        tr = gpu_trace_from_doc(doc, str(f))
        out.append(GpuTrace(tr.source, tr.kernels, tr.annotations, tr.device_name,
                            tr.num_sms, rank_of(doc, f), tr.world))
    return out
