"""``moesim calibrate``: fit compute and communication models to recorded traces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_dirs", nargs="+", metavar="TRACE_DIR",
                        help="directories written by moesim record (or any rank traces)")
    parser.add_argument("-o", "--output", required=True, metavar="CALIB_JSON",
                        help="calibration file to write")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    parser.add_argument("--backend", default=None, choices=("gloo", "nccl"),
                        help="backend name to store (default: from the traces, else gloo)")


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
    from moesim.compute.devices import DEVICES
    from moesim.errors import InputError
    from moesim.validation.calibrate import calibrate
    from moesim.validation.calibration import BACKENDS, save_calibration
    from moesim.validation.ingest import ingest

    out = Path(args.output)
    if out.exists() and not args.force:  # check before the slow part
        raise InputError(str(out), "-o", "a path that does not exist yet (or --force)", "exists")
    backend = args.backend or _backend(args.trace_dirs[0]) or "gloo"
    if backend not in BACKENDS:
        raise InputError(str(Path(args.trace_dirs[0]) / "routing.json"), "args.backend",
                         f"one of {', '.join(BACKENDS)}", backend)
    device = device_of(args.trace_dirs[0], backend)
    if device not in DEVICES:  # checked before the slow part
        raise InputError(str(Path(args.trace_dirs[0]) / "routing.json"), "host.cuda_device",
                         f"a GPU of the device catalog ({', '.join(DEVICES)}; "
                         "moesim/compute/devices.py)", device)
    sets = [ingest([d]) for d in args.trace_dirs]
    doc = calibrate(sets, list(args.trace_dirs), backend=backend, device=device)
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
    print(f"device: {doc['device']} (the catalog entry a scenario with this calibration "
          "as its compute model takes its peak, bandwidth and overhead from)")
    print("median |residual|/t: " + ", ".join(
        f"{k} {f[k]['residuals']['median_rel']:.1%}" for k in ("gemm", "memory", "comm")))
    print(f"wrote {out}")
    return 0
