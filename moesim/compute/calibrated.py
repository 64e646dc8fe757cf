"""A compute model fitted to recorded traces, and its file format.

File (JSON, written by ``moesim calibrate``)::

    {"format": "moesim-calibration/1", "device": "cpu",
     "gemm":   {"flops_per_s": ..., "overhead_s": ..., "bytes_per_s": ...},
               # bytes_per_s: operand traffic; optional (older files), 0 = no term
     "memory": {"bytes_per_s": ..., "overhead_s": ...,
                "bytes_per_s_by_op": {"aten::mul": ..., ...}},   # optional, per op kind
     "comm":   {"latency_s": ..., "bandwidth_Bps": ..., "backend": "gloo",
                "duplex": false},   # duplex optional (older files: true); the section is
               # absent from a GPU calibration whose trace had no NCCL byte counts
     "attention": {"flops_per_s": ..., "overhead_s": ...},   # optional (GPU calibrations)
     "gpu": {"format": "moesim-gpu-calibration/1", ...},       # optional, see gpu_calibrate
     "host":   {"op_gap_s": ..., "op_gap_forward_s": ..., "op_gap_backward_s": ...},
               # optional (older files: 0); per-phase gaps default to op_gap_s
     "shape_sweep": {"gemm": [{"axis", "fixed", "x", "t_s"}], "memory": [{"op", "x", "t_s"}],
                     "sources": [...]},
               # optional: times interpolated by shape (moesim.compute.shape_table)
     "fit": {"gemm": {"range": {"flops": [lo, hi]}, ...},
             "memory": {"range": {"bytes": [lo, hi]}, ...}, ...},
               # range: the sizes the line fits saw (optional; older files have none)
     "sources": [...]}

All values SI (s, FLOP/s, bytes/s).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from moesim.compute.base import Kernel
from moesim.compute.devices import DEVICES
from moesim.compute.shape_table import ShapeTable, table_from_doc
from moesim.errors import InputError
from moesim.outputs import check_file_target, write_text

#: the calibration file's ``format``
FORMAT = "moesim-calibration/1"


@dataclass(frozen=True)
class CommCalibration:
    """Measured all-to-all cost: ``latency_s + bytes / bandwidth_Bps`` (bytes = the
    busiest rank's off-rank traffic: the larger direction if ``duplex``, else sent +
    received). A network model maps it onto its links."""

    latency_s: float
    bandwidth_Bps: float
    backend: str
    duplex: bool = True     # each direction has its own rate (False: gloo's CPU copies)

    def all_to_all_s(self, busiest_rank_bytes: float) -> float:
        return self.latency_s + busiest_rank_bytes / self.bandwidth_Bps


@dataclass(frozen=True)
class CalibratedComputeModel:
    """``ComputeModel`` from a calibration: a GEMM (``m > 0`` or a name ending in
    ``gemm``) costs ``overhead·count + flops/rate + bytes/gemm_bytes_per_s`` (the last
    term only when the calibration has it); anything else
    ``overhead·count + bytes/rate``."""

    gemm_flops_per_s: float
    gemm_overhead_s: float
    memory_bytes_per_s: float
    memory_overhead_s: float
    comm: CommCalibration | None    # None: the calibration has no all-to-all fit
    device: str = "cpu"
    name: str = "calibrated"
    op_gap_s: float = 0.0   # host time between consecutive ops (dispatch), s; 0 if absent
    op_gap_forward_s: float | None = None    # forward ops (Python dispatch); None: op_gap_s
    op_gap_backward_s: float | None = None   # backward ops (autograd engine); None: op_gap_s
    gemm_bytes_per_s: float = 0.0   # GEMM operand traffic rate, bytes/s; 0: no such term
    #: memory-bound rate per op kind (kernel name, e.g. "aten::mul"), bytes/s; others
    #: take memory_bytes_per_s
    memory_bytes_per_s_by_op: tuple[tuple[str, float], ...] = ()
    #: attention FLOP rate (a GPU calibration's flash-attention fit); 0: attention is
    #: costed as any other non-GEMM kernel
    attention_flops_per_s: float = 0.0
    attention_overhead_s: float = 0.0
    #: times by shape (a shape sweep): used inside a family's range, the fits outside
    shapes: ShapeTable | None = None
    #: per-kernel FLOPs / bytes the GEMM / memory-bound line fits saw; None: unknown
    gemm_flops_range: tuple[float, float] | None = None
    memory_bytes_range: tuple[float, float] | None = None

    @cached_property
    def _by_op(self) -> dict[str, float]:
        return dict(self.memory_bytes_per_s_by_op)

    def gap_s(self, backward: bool) -> float:
        """Host time charged before one compute op of the forward / backward."""
        g = self.op_gap_backward_s if backward else self.op_gap_forward_s
        return self.op_gap_s if g is None else g

    def time_s(self, kernel: Kernel) -> float:
        if kernel.graphed or kernel.fused:  # graph replay / grouped: no op overheads
            kernel = replace(kernel, count=0, graphed=False, fused=False)
        if kernel.name == "attention" and self.attention_flops_per_s > 0:
            return (kernel.count * self.attention_overhead_s
                    + kernel.flops / self.attention_flops_per_s)
        shaped = self._shaped(kernel)
        if shaped is not None:
            return kernel.count * shaped
        if self._is_gemm(kernel):
            t = kernel.count * self.gemm_overhead_s + kernel.flops / self.gemm_flops_per_s
            if self.gemm_bytes_per_s > 0:
                t += kernel.bytes / self.gemm_bytes_per_s
            return t
        rate = self._by_op.get(kernel.name, self.memory_bytes_per_s)
        return kernel.count * self.memory_overhead_s + kernel.bytes / rate

    @staticmethod
    def _is_gemm(kernel: Kernel) -> bool:
        return kernel.m > 0 or kernel.name.endswith("gemm")

    def _shaped(self, kernel: Kernel) -> float | None:
        """Seconds of one of the kernel's launches from the shape table, or None."""
        if not self.shapes or kernel.name == "attention" or kernel.count < 1:
            return None
        if self._is_gemm(kernel):
            one = kernel.flops / kernel.count
            if not math.isclose(one, 2.0 * kernel.m * kernel.k * kernel.n, rel_tol=1e-9):
                return None     # batched, or no dims: not a swept shape
            return self.shapes.gemm_time(kernel.m, kernel.k, kernel.n)
        return self.shapes.memory_time(kernel.name, kernel.bytes / kernel.count)

    def in_range(self, kernel: Kernel) -> bool:
        """Whether the kernel's time is interpolated (a swept shape, or a size inside
        the range the line fit saw) rather than extrapolated. Unknown ranges (older
        files) and attention count as inside."""
        if kernel.name == "attention" and self.attention_flops_per_s > 0:
            return True
        if self._shaped(kernel) is not None:
            return True
        gemm = self._is_gemm(kernel)
        rng = self.gemm_flops_range if gemm else self.memory_bytes_range
        if rng is None:
            return True
        size = (kernel.flops if gemm else kernel.bytes) / max(kernel.count, 1)
        return rng[0] * (1 - 1e-9) <= size <= rng[1] * (1 + 1e-9)


def _num(doc: dict, src: str, section: str, key: str, positive: bool) -> float:
    sec = doc.get(section)
    val = sec.get(key) if isinstance(sec, dict) else None
    ok = isinstance(val, int | float) and not isinstance(val, bool) and math.isfinite(val)
    if not ok or val < 0 or (positive and val == 0):
        raise InputError(src, f"{section}.{key}", "a finite number " + ("> 0" if positive
                                                                         else ">= 0"), val)
    return float(val)


def _flag(doc: dict, src: str, section: str, key: str, default: bool) -> bool:
    val = doc[section].get(key, default)
    if not isinstance(val, bool):
        raise InputError(src, f"{section}.{key}", "true or false", val)
    return val


#: communication backends a recording can use (moesim record --backend)
BACKENDS = ("gloo", "nccl")
#: the keys each fitted section may hold (a misspelt one would be silently ignored)
_SECTION_KEYS = {
    # a GPU calibration (moesim.validation.calibration.gpu_calibrate) also says the GEMMs' dtype and
    # whether a figure came from the trace or the device catalog
    "gemm": {"flops_per_s", "overhead_s", "bytes_per_s", "dtype", "source"},
    "memory": {"bytes_per_s", "overhead_s", "bytes_per_s_by_op", "source"},
    "comm": {"latency_s", "bandwidth_Bps", "backend", "duplex", "kind"},  # kind: GPU traces
}


def _names(doc: dict, src: str) -> None:
    """``device`` a device-catalog name and ``comm.backend`` a known backend, when
    given (older files have neither): an unknown name would silently leave the
    scenario's device uncalibrated or the replay machine's links unnamed."""
    device = doc.get("device")
    if device is not None and (not isinstance(device, str)
                               or device.lower() not in {d.lower() for d in DEVICES}):
        raise InputError(src, "device", f"a device of the catalog ({', '.join(DEVICES)})",
                         device)
    for section, keys in _SECTION_KEYS.items():
        sec = doc.get(section)
        extra = sorted(set(sec) - keys) if isinstance(sec, dict) else []
        if extra:
            raise InputError(src, f"{section}.{extra[0]}", f"one of the {section} keys "
                             f"{sorted(keys)}", extra[0])
    sec = doc.get("comm")
    backend = sec.get("backend") if isinstance(sec, dict) else None
    if backend is not None and backend not in BACKENDS:
        raise InputError(src, "comm.backend", f"one of {', '.join(BACKENDS)}", backend)


def model_from_dict(doc: dict, src: str = "calibration") -> CalibratedComputeModel:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise InputError(src, "format", f'"{FORMAT}"', got)
    _names(doc, src)
    comm = CommCalibration(_num(doc, src, "comm", "latency_s", False),
                           _num(doc, src, "comm", "bandwidth_Bps", True),
                           str(doc["comm"].get("backend", "")),
                           _flag(doc, src, "comm", "duplex", True)) if (
        "comm" in doc or "gpu" not in doc) else None
    attn = ((_num(doc, src, "attention", "flops_per_s", True),
             _num(doc, src, "attention", "overhead_s", False)) if "attention" in doc
            else (0.0, 0.0))
    gap = _num(doc, src, "host", "op_gap_s", False) if "host" in doc else 0.0
    host = doc.get("host") if isinstance(doc.get("host"), dict) else {}
    fwd, bwd = (_num(doc, src, "host", k, False) if k in host else None
                for k in ("op_gap_forward_s", "op_gap_backward_s"))
    return CalibratedComputeModel(
        _num(doc, src, "gemm", "flops_per_s", True), _num(doc, src, "gemm", "overhead_s", False),
        _num(doc, src, "memory", "bytes_per_s", True),
        _num(doc, src, "memory", "overhead_s", False), comm, str(doc.get("device", "")),
        op_gap_s=gap, op_gap_forward_s=fwd, op_gap_backward_s=bwd,
        gemm_bytes_per_s=(_num(doc, src, "gemm", "bytes_per_s", False)
                          if "bytes_per_s" in doc["gemm"] else 0.0),
        memory_bytes_per_s_by_op=_by_op(doc, src),
        attention_flops_per_s=attn[0], attention_overhead_s=attn[1],
        shapes=table_from_doc(doc["shape_sweep"], src) if "shape_sweep" in doc else None,
        gemm_flops_range=_range(doc, src, "gemm", "flops"),
        memory_bytes_range=_range(doc, src, "memory", "bytes"))


def _range(doc: dict, src: str, section: str, key: str) -> tuple[float, float] | None:
    """``fit.<section>.range.<key>``: [lo, hi] sizes the line fit saw; optional."""
    fit = doc.get("fit")
    sec = fit.get(section) if isinstance(fit, dict) else None
    rng = sec.get("range") if isinstance(sec, dict) else None
    if rng is None:
        return None
    val = rng.get(key) if isinstance(rng, dict) else None
    ok = (isinstance(val, list) and len(val) == 2
          and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                  for v in val) and 0 <= val[0] <= val[1])
    if not ok:
        raise InputError(src, f"fit.{section}.range.{key}", "[lo, hi] with 0 <= lo <= hi", val)
    return float(val[0]), float(val[1])


def _by_op(doc: dict, src: str) -> tuple[tuple[str, float], ...]:
    """``memory.bytes_per_s_by_op``: {op name: bytes/s > 0}; optional."""
    table = doc["memory"].get("bytes_per_s_by_op", {})
    if not isinstance(table, dict):
        raise InputError(src, "memory.bytes_per_s_by_op", "an object {op name: bytes/s}",
                         type(table).__name__)
    out = []
    for name, val in sorted(table.items()):
        ok = isinstance(val, int | float) and not isinstance(val, bool) and math.isfinite(val)
        if not ok or val <= 0:
            raise InputError(src, f"memory.bytes_per_s_by_op.{name}", "a finite number > 0",
                             val)
        out.append((str(name), float(val)))
    return tuple(out)


def load_calibration(path: str | Path) -> CalibratedComputeModel:
    """Read a calibration JSON; any problem is an :class:`InputError` naming the field."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as err:
        raise InputError(str(p), "", "a readable calibration file", str(err)) from err
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(str(p), "", "a JSON calibration file (moesim calibrate -o)",
                         "not JSON") from err
    return model_from_dict(doc, str(p))


def save_calibration(doc: dict, path: str | Path, force: bool = False) -> Path:
    """Write the calibration JSON; an existing file is kept unless ``force``."""
    p = check_file_target(path, force)
    model_from_dict(doc, str(p))  # never write a file we could not read back
    return write_text(p, json.dumps(doc, indent=2) + "\n", force=force)  # checked again
