"""A Linear layer's kernels in a pass, with the FP8 quantisation around its GEMMs.

BF16 (Megatron-Core + Transformer Engine): one GEMM per pass (forward, dgrad, wgrad).

FP8 (DeepSeek-V3 report arXiv:2412.19437 §3.3, fine-grained 1×128 / 128×128 scaling;
the kernels as DeepSeek's public profile of a DualPipe F&B pair names them):

- forward: ``per_token_cast_to_fp8`` of X (reads m·k BF16, writes m·k FP8 + scales),
  then the FP8 GEMM (the weights are kept in FP8 between optimizer steps);
- dgrad: ``per_token_cast_to_fp8`` of dY, the weight's transposed FP8 copy
  (``batched_transpose``: reads and writes n·k FP8), the dgrad GEMM, and
  ``per_channel_cast_and_transpose`` of dY for the wgrad (128×1 tiles along the tokens);
- wgrad: ``per_channel_cast_and_transpose`` of X, then the wgrad GEMM (FP32 accumulate).

``cast_input=False`` when X already arrives in FP8 (the routed experts' tokens are
dispatched in FP8, the expert down-projection's input is cast inside the fused SwiGLU).

``recipe="tensorwise"``: Transformer Engine's per-tensor current scaling instead
(:mod:`moesim.model.kernels.tensorwise`).
"""

from __future__ import annotations

from moesim.compute.base import Kernel
from moesim.model.kernels import tensorwise
from moesim.model.kernels.make import ACT_BYTES, FP8_ACT, FP8_WEIGHT, gemm_pass, mem

CAST_TOKEN = "per_token_cast_to_fp8"
CAST_CHANNEL = "per_channel_cast_and_transpose"
WEIGHT_T = "batched_transpose"


def cast_bytes(rows: int, cols: int) -> float:
    """Read a rows × cols BF16 tensor, write it in FP8 with its 1×128 scales."""
    return float(rows) * cols * (ACT_BYTES + FP8_ACT)


def linear(name: str, m: int, n: int, k: int, phase: str, fp8: bool = False, *,
           kind: str = "gemm", dtype: str = "", cast_input: bool = True,
           kclass: str = "gemm", recipe: str = "blockwise",
           norm_amax: bool = False) -> list[Kernel]:
    """Kernels of Y(m, n) = X(m, k)·W(k, n) in ``phase`` "fwd", or "bwd" (the dgrad
    kernels, then the wgrad kernels); ``recipe``: the FP8 recipe's quantisation
    (``norm_amax``: under ``tensorwise``, X's amax comes from a fused norm)."""
    if phase not in ("fwd", "bwd"):
        raise ValueError(f"phase must be one of ('fwd', 'bwd'), got {phase!r}")
    if m <= 0 or n <= 0 or k <= 0:
        return []

    def g(p: str) -> Kernel:
        return gemm_pass(name, m, n, k, p, fp8=fp8, kind=kind, dtype=dtype, kclass=kclass)

    if fp8 and recipe == tensorwise.TENSORWISE:
        return tensorwise.linear(g, m, n, k, phase, cast_input, norm_amax)
    if phase == "fwd":
        pre = [mem(CAST_TOKEN, cast_bytes(m, k), "fwd", "cast")] if fp8 and cast_input else []
        return [*pre, g("fwd")]
    if not fp8:
        return [g("dgrad"), g("wgrad")]
    return [mem(CAST_TOKEN, cast_bytes(m, n), "dgrad", "cast"),
            mem(WEIGHT_T, 2 * FP8_WEIGHT * n * k, "dgrad", "cast"),
            g("dgrad"),
            mem(CAST_CHANNEL, cast_bytes(m, n), "dgrad", "cast"),
            mem(CAST_CHANNEL, cast_bytes(m, k), "wgrad", "cast"),
            g("wgrad")]
