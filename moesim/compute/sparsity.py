"""2:4 structured sparsity: ``compute.sparsity: none | 2:4``.

Storage (NVIDIA A100 Tensor Core GPU Architecture whitepaper, "Fine-Grained Structured
Sparsity": a 2:4 matrix keeps 2 of every 4 values, stored compressed with "2-bit indices"
of the kept values; cuSPARSELt documentation, "structured sparsity" metadata): a weight
matrix keeps half its values at their format's bits plus 2 bits of metadata per kept
value, so a dense element costs ``0.5 · bytes + 0.5 · 2/8`` bytes
(:func:`sparse_weight_bytes`; BF16: 1.125 bytes for 2).

Math: the sparse tensor cores skip the pruned half, "twice the math throughput of dense
matrix units" (Mishra et al., "Accelerating Sparse Deep Neural Networks",
arXiv:2104.08378 §1; the A100/H100 datasheets list every tensor-core peak "with sparsity"
at 2× dense). What kernels reach is less, and that is what prices them where published:

- A100 (Ampere): CUTLASS's 2:4 FP16 GEMM through PyTorch's
  ``to_sparse_semi_structured``: a 3072 × 10240 → 3072 Linear on 3072 rows, dense
  0.870 ms, sparse 0.630 ms, 1.382x (pytorch/tutorials
  ``advanced_source/semi_structured_sparse.py`` @065c9d23, "On an A100 80GB");
- every other device with sparse tensor cores (Hopper, Blackwell): no per-shape figure
  was found, so the roofline's 2× (the datasheets' sparse peak), counted as roofline.

The speed-up divides a sparse GEMM's math; its bytes are the sparse bytes, so a
memory-bound (decode) GEMM gains from the bytes alone.
"""

from __future__ import annotations

from typing import Any

from moesim.errors import InputError

SPARSITY = ("none", "2:4")
#: metadata bits per kept value (A100 whitepaper: 2-bit index per non-zero of a 2:4 group)
META_BITS = 2
#: published compute speed-up of a sparse GEMM over the dense one, by device: (speed-up,
#: the source in words); rows measured large enough to be compute-bound
PUBLISHED_SPEEDUP: dict[str, tuple[float, str]] = {
    "A100": (0.870 / 0.630, "pytorch/tutorials semi_structured_sparse.py @065c9d23: "
             "CUTLASS 2:4 FP16 3072x10240x3072 on A100 80GB, 0.870 -> 0.630 ms"),
}
#: the sparse tensor-core peak over the dense one (datasheets' "with sparsity" figures)
ROOFLINE_SPEEDUP = 2.0
#: devices with sparse tensor cores: Ampere (A100 whitepaper), Hopper (H100, H200, H800,
#: H20 datasheets: "with sparsity" peaks); a device with an FP4 peak is a Blackwell
#: (B200/GB200 datasheets list sparse peaks too)
SPARSE_DEVICES = ("A100", "H100", "H200", "H200-NVL", "H800", "H20")


#: an unquoted ``2:4`` is the integer 124 to a YAML 1.1 reader (base-60 numbers, PyYAML's
#: ``int`` resolver; also ``--set compute.sparsity=2:4``): read as the mode
_YAML_BASE60 = {124: "2:4"}


def check(value: Any, source: str) -> str:
    """The mode ``value`` names (``none`` or ``2:4``); one line, exit 2, for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = _YAML_BASE60.get(value, value)
    if value not in SPARSITY:
        raise InputError(source, "compute.sparsity", " or ".join(SPARSITY), value)
    return value


def has_sparse_cores(device: Any) -> bool:
    name = str(getattr(device, "name", ""))
    return name in SPARSE_DEVICES or float(getattr(device, "peak_fp4_flops", 0.0) or 0) > 0


def check_device(sparsity: str, device: Any, source: str) -> None:
    """One line, exit 2, when ``device`` has no sparse tensor cores."""
    if sparsity != "none" and not has_sparse_cores(device):
        raise InputError(source, "compute.sparsity", f"none (device "
                         f"{getattr(device, 'name', '?')} has no sparse tensor cores)",
                         sparsity)


def sparse_weight_bytes(dense_bytes: float) -> float:
    """Bytes per (dense) weight element of a 2:4 matrix whose kept values take
    ``dense_bytes`` each: half the values plus 2 bits of metadata per kept value."""
    return 0.5 * dense_bytes + 0.5 * META_BITS / 8


def speedup(device: Any) -> tuple[float, str, bool]:
    """(compute speed-up, source, published) of a 2:4 GEMM on ``device``."""
    name = str(getattr(device, "name", ""))
    if name in PUBLISHED_SPEEDUP:
        s, src = PUBLISHED_SPEEDUP[name]
        return s, src, True
    return ROOFLINE_SPEEDUP, "sparse tensor-core peak 2x dense (datasheet)", False
