"""One GEMM or one memory-bound kernel in one pass, as a :class:`Kernel`.

GEMM convention (docs/kernels.md): Y(m, n) = X(m, k)·W(k, n); ``m`` is the token (row)
dimension in every pass, ``n``/``k`` the forward weight dimensions.

- ``fwd``:   Y = X·W        reads X (m·k) and W (k·n), writes Y (m·n) in BF16;
- ``dgrad``: dX = dY·Wᵀ     reads dY (m·n) and W (n·k), writes dX (m·k) in BF16;
- ``wgrad``: dW = Xᵀ·dY     reads X (k·m) and dY (m·n), and accumulates into the FP32
  main gradient (k·n read and written: Megatron-Core ``gradient_accumulation_fusion``,
  ``megatron/core/tensor_parallel/layers.py``; DeepSeek's ``fp8_dptp128c_acc`` GEMMs).

Each pass costs 2·m·n·k FLOP. Operands are BF16 (2 bytes) or, with FP8 GEMMs, one byte
plus one FP32 scale per 128 elements of an activation (1×128 tiles) and per 128×128
block of a weight (DeepSeek-V3 report, arXiv:2412.19437, §3.3.2; DeepGEMM README).
"""

from __future__ import annotations

from moesim.compute.base import Kernel

ACT_BYTES = 2            # bf16 activations and gradients (ZeRO §3.1 mixed precision)
FP32_BYTES = 4
TILE = 128               # FP8 scaling tile: 1x128 activations, 128x128 weights (§3.3.2)
FP8_ACT = 1 + FP32_BYTES / TILE           # bytes per FP8 activation element with its scale
FP8_WEIGHT = 1 + FP32_BYTES / TILE ** 2   # bytes per FP8 weight element with its scale
PASSES = ("fwd", "dgrad", "wgrad")


def gemm_pass(name: str, m: int, n: int, k: int, pass_: str, *, fp8: bool = False,
              kind: str = "gemm", dtype: str = "", kclass: str = "gemm",
              groups: int = 1) -> Kernel:
    """One GEMM of a Linear Y(m, n) = X(m, k)·W(k, n) in ``pass_`` (module docstring).

    Named ``name`` (forward), ``name_dgrad``, ``name_wgrad``. ``kind`` is the forward's
    family: "gemm" or "grouped_gemm" (a routed expert's share of a grouped launch); the
    experts' weight gradient is "kgrouped_gemm" (DeepGEMM's k-grouped wgrad layout)."""
    if pass_ not in PASSES:
        raise ValueError(f"pass must be one of {PASSES}, got {pass_!r}")
    a = FP8_ACT if fp8 else ACT_BYTES
    w = FP8_WEIGHT if fp8 else ACT_BYTES
    dt = "fp8" if fp8 else dtype
    if pass_ == "fwd":
        nbytes, label = a * m * k + w * k * n + ACT_BYTES * m * n, name
    elif pass_ == "dgrad":
        nbytes, label = a * m * n + w * n * k + ACT_BYTES * m * k, name + "_dgrad"
    else:
        nbytes, label = a * (k * m + m * n) + 2 * FP32_BYTES * k * n, name + "_wgrad"
        kind = "kgrouped_gemm" if kind == "grouped_gemm" else kind
    return Kernel(label, 2.0 * m * n * k, float(nbytes), m=m, n=n, k=k, kind=kind,
                  dtype=dt, pass_=pass_, kclass=kclass, groups=groups)


def mem(name: str, nbytes: float, pass_: str, kclass: str, flops: float = 0.0,
        count: int = 1, m: int = 0) -> Kernel:
    """A memory-bound kernel moving ``nbytes`` (read + written) in ``pass_``. ``m`` stays
    0 (no GEMM dims), so no GEMM efficiency curve applies."""
    if pass_ not in PASSES:
        raise ValueError(f"pass must be one of {PASSES}, got {pass_!r}")
    return Kernel(name, float(flops), float(nbytes), count=count, kind="memory",
                  pass_=pass_, kclass=kclass, m=m)


def rmsnorm(rows: int, cols: int, phase: str, name: str = "norm") -> Kernel:
    """RMSNorm over ``rows`` × ``cols``: forward reads x and writes y (BF16) and the FP32
    1/rms per row; backward reads x and dy and writes dx (the weight's gradient is a
    per-block partial sum, cols-sized: negligible)."""
    if phase == "fwd":
        return mem(name, 2 * ACT_BYTES * rows * cols + FP32_BYTES * rows, "fwd", "norm",
                   flops=4.0 * rows * cols)
    return mem(name + "_bwd", 3 * ACT_BYTES * rows * cols + FP32_BYTES * rows, "dgrad",
               "norm", flops=8.0 * rows * cols)


def residual_add(rows: int, cols: int, phase: str) -> Kernel:
    """x + f(x): reads two BF16 tensors and writes one, forward and backward (the
    backward adds the branch's input gradient to the residual stream's)."""
    return mem("residual_add" if phase == "fwd" else "residual_add_bwd",
               3 * ACT_BYTES * rows * cols, "fwd" if phase == "fwd" else "dgrad",
               "elementwise", flops=float(rows) * cols)
