"""``moesim calibrate``: fit compute and communication models to recorded traces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_dirs", nargs="+", metavar="TRACE_DIR",
                        help="directories written by moesim record (or any rank traces); "
                             "or one GPU trace (a Kineto JSON with kernels)")
    parser.add_argument("-o", "--output", required=True, metavar="CALIB_JSON",
                        help="calibration file to write")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    parser.add_argument("--shape-sweep", nargs="+", default=[], metavar="SWEEP_DIR",
                        help="shape sweeps of the same layer (moesim record --shape-sweep): "
                             "GEMM and memory-bound times interpolated by shape inside the "
                             "swept range, scaled to the recordings' level")
    parser.add_argument("--shape-sweep-memory", action="store_true",
                        help="with --shape-sweep: interpolate the memory-bound ops by shape "
                             "too (GEMMs only by default; docs/validation.md)")
    parser.add_argument("--backend", default=None, choices=("gloo", "nccl"),
                        help="backend name to store (default: from the traces, else gloo)")
    parser.add_argument("--device", default=None,
                        help="GPU trace: the device catalog entry (e.g. H800) whose figures "
                             "stand in for what the trace cannot measure (default: from the "
                             "trace's deviceProperties)")


def _routing(trace_dir: str) -> dict:
    try:
        doc = json.loads((Path(trace_dir) / "routing.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _backend(trace_dir: str) -> str | None:
    try:
        return str(_routing(trace_dir)["args"]["backend"])
    except (KeyError, TypeError):
        return None


def device_of(trace_dir: str, backend: str) -> str:
    """The device catalog entry a calibration feeds: ``cpu`` for gloo recordings; for
    nccl ones, the catalog name found in the GPU name ``record`` logged
    (``host.cuda_device``, e.g. "NVIDIA H200" → "H200"), else that name as it is."""
    if backend != "nccl":
        return "cpu"
    from moesim.compute.devices import DEVICES

    host = _routing(trace_dir).get("host")
    gpu = str(host.get("cuda_device", "")) if isinstance(host, dict) else ""
    for name in sorted(DEVICES, key=len, reverse=True):
        if name != "cpu" and name.lower() in gpu.lower():
            return name
    return gpu or "gpu"


def run(args: argparse.Namespace) -> int:
    from moesim.compute.calibrated import BACKENDS, save_calibration
    from moesim.compute.devices import DEVICES
    from moesim.errors import InputError
    from moesim.outputs import check_file_target
    from moesim.validation.runs import calibrate_recordings

    out = check_file_target(args.output, args.force)  # before the slow part
    from moesim.validation.cpu.ingest import trace_files
    from moesim.validation.gpu.trace import gpu_traces

    gpu = gpu_traces(trace_files(args.trace_dirs[:1]))
    if gpu is not None:
        return _run_gpu(args, gpu, out)
    if args.device is not None:
        raise InputError(args.trace_dirs[0], "traceEvents", "GPU events (cat 'kernel', "
                         "'gpu_memcpy' or 'gpu_memset') for --device", "only CPU events")
    backend = args.backend or _backend(args.trace_dirs[0]) or "gloo"
    if backend not in BACKENDS:
        raise InputError(str(Path(args.trace_dirs[0]) / "routing.json"), "args.backend",
                         f"one of {', '.join(BACKENDS)}", backend)
    device = device_of(args.trace_dirs[0], backend)
    if device not in DEVICES:  # checked before the slow part
        raise InputError(str(Path(args.trace_dirs[0]) / "routing.json"), "host.cuda_device",
                         f"a GPU of the device catalog ({', '.join(DEVICES)}; "
                         "moesim/compute/devices.py)", device)
    doc = calibrate_recordings(args.trace_dirs, backend, device, args.shape_sweep,
                               args.shape_sweep_memory)
    save_calibration(doc, out, force=args.force)
    g, m, c, f = doc["gemm"], doc["memory"], doc["comm"], doc["fit"]
    traffic = (f" + operand bytes / {g['bytes_per_s'] / 1e9:.2f} GB/s"
               if g.get("bytes_per_s") else "")
    print(f"gemm:   {g['overhead_s'] * 1e6:.1f} µs/kernel + FLOPs / {g['flops_per_s'] / 1e9:.2f} "
          f"GFLOP/s{traffic}  (R² {f['gemm']['r2']:.3f}, n={f['gemm']['n_samples']})")
    print(f"memory: {m['bytes_per_s'] / 1e9:.2f} GB/s + {m['overhead_s'] * 1e6:.2f} µs/op"
          f"  (R² {f['memory']['r2']:.3f}, n={f['memory']['n_samples']})")
    print(f"comm:   {c['latency_s'] * 1e6:.1f} µs + bytes / {c['bandwidth_Bps'] / 1e9:.3f} GB/s"
          f" ({c['backend']}, R² {f['comm']['r2']:.3f}, n={f['comm']['n_samples']})")
    print("host:   " + ", ".join(f"{k} {v * 1e6:.1f} µs" for k, v in doc["host"].items())
          + " (added to every replayed compute op)")
    if "shape_sweep" in doc:
        print(shape_line(doc["shape_sweep"]))
    elif args.shape_sweep:
        print("shape sweep: no GEMM or memory-bound family with two sizes or more; not used")
    print(f"device: {doc['device']} (the catalog entry a scenario with this calibration "
          "as its compute model takes its peak, bandwidth and overhead from)")
    print("median |residual|/t: " + ", ".join(
        f"{k} {f[k]['residuals']['median_rel']:.1%}" for k in ("gemm", "memory", "comm")))
    print(f"wrote {out}")
    return 0


def shape_line(sec: dict) -> str:
    """One line describing a calibration's ``shape_sweep`` section, with units."""
    rows = [x for g in sec["gemm"] for x in g["x"]]
    sc = sec["scales"]
    fams = sorted(f"{k[5:]} ×{v:.3f}" for k, v in sc.items() if k.startswith("gemm "))
    mem = sorted(f"{k} ×{v:.2f}" for k, v in sc.items() if not k.startswith("gemm"))
    swept = f" (swept dim {min(rows):.0f}–{max(rows):.0f})" if rows else ""
    return (f"shape sweep: {len(sec['gemm'])} GEMM families{swept}, {len(sec['memory'])} "
            f"memory-bound op kinds; times scaled to the recordings: GEMMs ×{sc['gemm']:.3f} "
            f"({', '.join(fams)})" + (f"; {', '.join(mem)}" if mem else ""))


def _run_gpu(args: argparse.Namespace, gpu: list, out: Path) -> int:
    from moesim.compute.calibrated import save_calibration
    from moesim.errors import InputError
    from moesim.validation.runs import calibrate_gpu_trace

    if len(gpu) != 1 or len(args.trace_dirs) != 1:
        raise InputError("command line", "TRACE_DIR", "one GPU trace file",
                         f"{max(len(gpu), len(args.trace_dirs))} traces")
    tr = gpu[0]
    doc = calibrate_gpu_trace(tr, args.device or device_name(tr.device_name),
                              args.shape_sweep, args.shape_sweep_memory)
    save_calibration(doc, out, force=args.force)
    g = doc["gpu"]
    for dt, f in g["gemm_by_dtype"].items():
        print(f"gemm {dt}: {f['overhead_s'] * 1e6:.2f} µs/op + FLOPs / "
              f"{f['flops_per_s'] / 1e12:.1f} TFLOP/s  (n={f['n_samples']}, median "
              f"|residual|/t {f['median_rel']:.1%})")
    if not g["gemm_by_dtype"]:
        print(f"gemm: no GEMM with recorded shapes; {doc['device']} catalog "
              f"{doc['gemm']['flops_per_s'] / 1e12:.0f} TFLOP/s kept")
    a = g["attention"]
    print("attention: " + (f"{a['flops_per_s'] / 1e12:.1f} TFLOP/s (n={a['n_samples']})" if a
                           else "no attention op with recorded shapes"))
    m = g["memory"]
    print(f"memory: {m['bytes_per_s'] / 1e9:.1f} GB/s + {m['overhead_s'] * 1e6:.2f} µs/op "
          f"({m['source']}" + (f", n={m['n_samples']})" if m["source"] == "trace" else ")"))
    for kd, f in g["comm_bandwidth"].items():
        print(f"{kd}: {f['bandwidth_Bps'] / 1e9:.2f} GB/s + {f['overhead_s'] * 1e6:.1f} µs "
              f"(n={f['n_samples']})")
    for kd, c in g["comm_kernels"].items():
        print(f"comm kernels {kd}: {c['count']} × {c['mean_s'] * 1e3:.3f} ms on {c['sms']} SMs")
    gap = g["kernel_gap"]
    print(f"kernel gap on the compute stream: median {gap['median_s'] * 1e6:.1f} µs, mean "
          f"{gap['mean_s'] * 1e6:.1f} µs (n={gap['n_samples']})")
    print(f"{g['kernels_with_shapes']} of {g['kernels']} GPU events carry their op's shapes")
    if "shape_sweep" in doc:
        print(shape_line(doc["shape_sweep"]))
    elif args.shape_sweep:
        print("shape sweep: no GEMM or memory-bound family with two sizes or more; not used")
    print(f"device: {doc['device']}")
    print(f"wrote {out}")
    return 0


def device_name(gpu_name: str) -> str:
    """The catalog entry named in a GPU's name ("NVIDIA H800" → "H800"), else the name."""
    from moesim.compute.devices import DEVICES

    for name in sorted(DEVICES, key=len, reverse=True):
        if name != "cpu" and name.lower() in gpu_name.lower():
            return name
    return gpu_name or "unknown"
