"""A device calibration from one GPU trace's kernels (``moesim calibrate TRACE --device D``).

Samples (each one launching CPU op; its time = the summed durations of the non-comm
GPU events it launched, so a cuBLAS split-K reduction counts with its GEMM):

- GEMM: ops ``aten::mm/addmm/bmm/baddbmm/matmul/linear`` with recorded shapes
  (:func:`moesim.validation.kineto.op_cost.gemm_dims`) that launched a GEMM kernel; x = FLOPs
  (2·b·m·k·n); fitted per dtype (the GEMM kernel's name, else the op's ``Input type``:
  fp8, bf16, fp16, fp32), so FP8 and BF16 GEMMs get rates of their own;
- attention: ``aten::_scaled_dot_product_{flash,efficient,cudnn}_attention`` (q, k as
  [batch, heads, seq, head_dim]); x = 4·b·h·s_q·s_k·d FLOPs (QKᵀ and PV, no causal mask);
- memory-bound: ``gpu_memcpy``/``gpu_memset`` events (x = their ``bytes``) and ops with
  shapes that launched only cast/norm/elementwise kernels
  (x = :func:`moesim.validation.kineto.op_cost.tensor_bytes`);
- communication: NCCL kernels launched by ``record_param_comms`` (x = the larger of
  ``In msg nelems``/``Out msg nelems`` × the dtype's size), per NCCL kind; DeepEP kernels
  carry no byte count in a trace, so for them only count, time per kernel and SMs;
- kernel gaps: on each stream, the idle time between one GPU event's end and the
  next one's start; the median on the busiest non-comm stream is ``host.op_gap_s``.

Each fit is ``t = overhead + x / rate`` (:func:`moesim.validation.calibration.calibrate.fit_line`,
weights 1/t, coefficients >= 0); one size only: the rate through the origin.
What the trace cannot give (no shapes recorded: DeepSeek's published profile has none)
comes from the ``--device`` catalog entry and is marked ``"source": "catalog"``.
"""

from __future__ import annotations

import numpy as np

from moesim.compute.calibrated import FORMAT
from moesim.compute.devices import get_device
from moesim.errors import InputError
from moesim.validation.calibration.calibrate import LineFit, fit_line, line_stats, with_rate
from moesim.validation.gpu.summary import summarize
from moesim.validation.gpu.trace import GpuKernel, GpuTrace
from moesim.validation.kineto.events import DTYPE_BYTES, MATMUL_OPS
from moesim.validation.kineto.op_cost import gemm_dims, tensor_bytes

GPU_FORMAT = "moesim-gpu-calibration/1"
ATTENTION_OPS = {"aten::_scaled_dot_product_flash_attention",
                 "aten::_scaled_dot_product_efficient_attention",
                 "aten::_scaled_dot_product_cudnn_attention"}
MEMORY_CLASSES = {"cast", "norm", "elementwise"}
_TYPE_DTYPE = {"c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::BFloat16": "bf16",
               "c10::Half": "fp16", "float": "fp32"}


def _by_op(tr: GpuTrace) -> dict[int, list[GpuKernel]]:
    out: dict[int, list[GpuKernel]] = {}
    for k in tr.kernels:
        if k.op is not None and k.cls != "comm":
            out.setdefault(k.op.idx, []).append(k)
    return out


def gemm_samples(tr: GpuTrace) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """dtype → (FLOPs, seconds) of the GEMM ops with shapes."""
    out: dict[str, list[tuple[float, float]]] = {}
    for ks in _by_op(tr).values():
        op = ks[0].op
        gk = [k for k in ks if k.cls == "gemm"]
        dims = gemm_dims(op) if gk and op.name in MATMUL_OPS else None
        if dims is None:
            continue
        b, m, k, n = dims
        dtype = gk[0].dtype or next((_TYPE_DTYPE[t] for t in op.types if t in _TYPE_DTYPE), "")
        out.setdefault(dtype or "unknown", []).append((2.0 * b * m * k * n,
                                                       sum(x.dur_s for x in ks)))
    return {d: (np.array([f for f, _ in v]), np.array([t for _, t in v]))
            for d, v in out.items()}


def attention_samples(tr: GpuTrace) -> tuple[np.ndarray, np.ndarray]:
    xs, ts = [], []
    for ks in _by_op(tr).values():
        op = ks[0].op
        if op.name not in ATTENTION_OPS or not any(k.cls == "attention" for k in ks):
            continue
        d = op.dims
        try:
            (b, h, sq, hd), (_, _, sk, _) = d[0], d[1]
        except (IndexError, TypeError, ValueError):
            continue
        xs.append(4.0 * b * h * sq * sk * hd)
        ts.append(sum(k.dur_s for k in ks))
    return np.array(xs), np.array(ts)


def memory_samples(tr: GpuTrace) -> tuple[np.ndarray, np.ndarray]:
    xs, ts = [], []
    for k in tr.kernels:
        if k.cls in ("memcpy", "memset") and k.nbytes > 0:
            xs.append(k.nbytes)
            ts.append(k.dur_s)
    for ks in _by_op(tr).values():
        if all(k.cls in MEMORY_CLASSES for k in ks):
            nbytes = tensor_bytes(ks[0].op)
            if nbytes > 0:
                xs.append(nbytes)
                ts.append(sum(k.dur_s for k in ks))
    return np.array(xs), np.array(ts)


def comm_samples(tr: GpuTrace) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """NCCL kind → (bytes, seconds) of kernels launched by ``record_param_comms``."""
    out: dict[str, list[tuple[float, float]]] = {}
    for k in tr.kernels:
        if k.cls != "comm" or not k.kind.startswith("nccl:") or k.op is None:
            continue
        a = k.op.args
        elem = DTYPE_BYTES.get(str(a.get("dtype", "")), 0)
        nel = max([v for v in (a.get("In msg nelems"), a.get("Out msg nelems"))
                   if isinstance(v, int)] + [0])
        if elem and nel > 0:
            out.setdefault(k.kind, []).append((float(nel * elem), k.dur_s))
    return {kd: (np.array([x for x, _ in v]), np.array([t for _, t in v]))
            for kd, v in out.items()}


def fit_rate(x: np.ndarray, t: np.ndarray, what: str) -> LineFit | None:
    """``t = overhead + x / rate`` over the samples with x, t > 0; with one size only,
    the rate through the origin; None when no such sample."""
    keep = (t > 0) & (x > 0)
    x, t = x[keep], t[keep]
    if not len(t):
        return None
    if len(t) >= 2 and np.ptp(x) > 0:
        return with_rate(fit_line(x, t, what), x, t)
    b = float(np.sum(t) / np.sum(x))
    return line_stats(b * x, t, 0.0, b)


def kernel_gaps(tr: GpuTrace) -> np.ndarray:
    """Idle gaps (s, > 0) between consecutive GPU events on the busiest non-comm stream."""
    load: dict[tuple[int, int], float] = {}
    for k in tr.kernels:
        if k.cls != "comm":
            load[(k.device, k.stream)] = load.get((k.device, k.stream), 0.0) + k.dur_s
    if not load:
        return np.array([])
    dev, st = max(load, key=lambda s: load[s])
    ks = [k for k in tr.kernels if (k.device, k.stream) == (dev, st)]
    gaps = [b.start_s - a.end_s for a, b in zip(ks, ks[1:], strict=False)]
    return np.array([g for g in gaps if g > 0])


def _fit(f: LineFit | None, rate_key: str) -> dict | None:
    if f is None:
        return None
    return {rate_key: f.rate, "overhead_s": f.overhead_s, "n_samples": f.n_samples,
            "r2": f.r2, "median_rel": f.median_rel, "max_rel": f.max_rel, "source": "trace"}


def gpu_calibration(tr: GpuTrace, device: str) -> dict:
    """The calibration JSON doc (format ``moesim-calibration/1`` plus a ``gpu`` section,
    ``moesim-gpu-calibration/1``) from one GPU trace."""
    spec = get_device(device, "command line", "--device")
    if not tr.kernels:
        raise InputError(tr.source, "traceEvents", "GPU kernels", "none")
    gemms = {d: _fit(fit_rate(x, t, f"{tr.source} ({d} GEMMs)"), "flops_per_s")
             for d, (x, t) in sorted(gemm_samples(tr).items())}
    gemms = {d: f for d, f in gemms.items() if f is not None}
    comm = {kd: _fit(fit_rate(x, t, f"{tr.source} ({kd})"), "bandwidth_Bps")
            for kd, (x, t) in sorted(comm_samples(tr).items())}
    comm = {kd: f for kd, f in comm.items() if f is not None}
    attention = _fit(fit_rate(*attention_samples(tr), f"{tr.source} (attention)"),
                     "flops_per_s")
    summary = summarize(tr)
    # the top-level GEMM rate: the dtype with the most GEMM samples; else the catalog
    main = max(gemms, key=lambda d: gemms[d]["n_samples"]) if gemms else ""
    gemm = ({"flops_per_s": gemms[main]["flops_per_s"], "overhead_s": gemms[main]["overhead_s"],
             "dtype": main, "source": "trace"} if main else
            {"flops_per_s": spec.peak_bf16_flops, "overhead_s": spec.launch_overhead_s,
             "dtype": "bf16", "source": "catalog"})
    mem = (_fit(fit_rate(*memory_samples(tr), f"{tr.source} (memory-bound)"), "bytes_per_s")
           or {"bytes_per_s": spec.hbm_Bps, "overhead_s": spec.launch_overhead_s,
               "source": "catalog"})
    gaps = kernel_gaps(tr)
    doc = {
        "format": FORMAT, "device": spec.name,
        "gemm": gemm,
        "memory": {"bytes_per_s": mem["bytes_per_s"], "overhead_s": mem["overhead_s"],
                   "source": mem["source"]},
        "host": {"op_gap_s": float(np.median(gaps)) if len(gaps) else 0.0},
        "gpu": {
            "format": GPU_FORMAT,
            "gemm_by_dtype": gemms,
            "attention": attention,
            "memory": mem,
            "comm_bandwidth": comm,
            "comm_kernels": {kd: {"count": d["count"], "mean_s": d["total_s"] / d["count"],
                                  "sms": d["sms"]} for kd, d in summary["comm"].items()},
            "classes_s": summary["classes"],
            "kernel_gap": {"median_s": float(np.median(gaps)) if len(gaps) else 0.0,
                           "mean_s": float(np.mean(gaps)) if len(gaps) else 0.0,
                           "n_samples": int(len(gaps))},
            "kernels_with_shapes": sum(k.op is not None and bool(k.op.dims)
                                       for k in tr.kernels),
            "kernels": len(tr.kernels),
        },
        "sources": [tr.source],
    }
    if doc["gpu"]["attention"] is not None:
        a = doc["gpu"]["attention"]
        doc["attention"] = {"flops_per_s": a["flops_per_s"], "overhead_s": a["overhead_s"]}
    if comm:    # an all-to-all kind if there is one, else the most sampled collective
        kd = next((k for k in comm if k in ("nccl:SendRecv", "nccl:AllToAll")),
                  max(comm, key=lambda k: comm[k]["n_samples"]))
        doc["comm"] = {"latency_s": comm[kd]["overhead_s"],
                       "bandwidth_Bps": comm[kd]["bandwidth_Bps"], "backend": "nccl",
                       "duplex": True, "kind": kd}
    return doc
