"""Every live tensor of one matmul Y = X·W, whole and per GPU under TP and PP (pure).

X is (m, k), W (k, n), Y (m, n), each ``dtype`` bytes per element (bf16: 2 bytes, so
m = k = n = 65536 gives 2·65536² bytes = 8 GiB = 8.59 GB per tensor, 25.77 GB in
forward; ``moesim memory --matmul`` prints GB, 10^9 bytes, as ``moesim memory`` does).

Training adds the gradients dY (m, n) and dX (m, k) flowing back, dW (k, n), and
Adam's states: with a 16-bit dtype an fp32 master copy, m and v (12 bytes per
parameter; with W and dW that is the 16 bytes per parameter of mixed-precision Adam,
ZeRO arXiv:1910.02054 §3.1); with fp32 weights only m and v (8 bytes).

Tensor parallelism (Megatron-LM arXiv:1909.08053 §3, column-parallel linear) splits W
by columns: each of ``tp`` GPUs holds W[:, n/tp] and computes Y[:, n/tp] from the
whole X, so W, Y, dW, dY and the optimizer states are divided by tp and X, dX are not
(dX is summed over the TP group by an all-reduce). Pipeline parallelism assigns whole
layers to stages, so it cannot split one matmul: one stage holds all of it and the
other ``pp - 1`` hold none of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.errors import InputError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, int]          # whole tensor (elements)
    gpu_shape: tuple[int, int]      # on one GPU of the TP group (the stage holding it)
    bytes_per_elem: float
    phase: str                      # "forward" or "training"

    @property
    def nbytes(self) -> float:
        return self.shape[0] * self.shape[1] * self.bytes_per_elem

    @property
    def gpu_bytes(self) -> float:
        return self.gpu_shape[0] * self.gpu_shape[1] * self.bytes_per_elem


def matmul_tensors(m: int, k: int, n: int, dtype: str = "bf16", tp: int = 1,
                   pp: int = 1, source: str = "command line") -> list[Tensor]:
    """The tensors of Y = X·W in forward and in one training step."""
    for name, v in (("m", m), ("k", k), ("n", n), ("tp", tp), ("pp", pp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(source, f"--{'matmul' if name in 'mkn' else name}",
                             f"a positive integer for {name}", v)
    if dtype not in DTYPE_BYTES:
        raise InputError(source, "--dtype", f"one of {', '.join(DTYPE_BYTES)}", dtype)
    if n % tp:
        raise InputError(source, "--tp", f"a divisor of n = {n} (W is split by columns)", tp)
    b = DTYPE_BYTES[dtype]
    opt = 8 if b >= 4 else 12      # (fp32 master +) Adam m and v, fp32
    nt = n // tp
    return [
        Tensor("X (input)", (m, k), (m, k), b, "forward"),
        Tensor("W (weight)", (k, n), (k, nt), b, "forward"),
        Tensor("Y (output)", (m, n), (m, nt), b, "forward"),
        Tensor("dY (output gradient)", (m, n), (m, nt), b, "training"),
        Tensor("dX (input gradient)", (m, k), (m, k), b, "training"),
        Tensor("dW (weight gradient)", (k, n), (k, nt), b, "training"),
        Tensor("Adam states", (k, n), (k, nt), opt, "training"),
    ]


def matmul_report(m: int, k: int, n: int, dtype: str = "bf16", tp: int = 1,
                  pp: int = 1, source: str = "command line") -> dict:
    """Totals (bytes): whole and per GPU, forward and training, and the per-GPU bytes
    of each pipeline stage (the matmul sits on one stage)."""
    ts = matmul_tensors(m, k, n, dtype, tp, pp, source)
    fwd = [t for t in ts if t.phase == "forward"]
    out = {
        "m": m, "k": k, "n": n, "dtype": dtype, "tp": tp, "pp": pp,
        "tensors": [{"name": t.name, "shape": list(t.shape), "gpu_shape": list(t.gpu_shape),
                     "bytes_per_elem": t.bytes_per_elem, "phase": t.phase,
                     "bytes": t.nbytes, "gpu_bytes": t.gpu_bytes} for t in ts],
        "forward_bytes": sum(t.nbytes for t in fwd),
        "training_bytes": sum(t.nbytes for t in ts),
        "forward_gpu_bytes": sum(t.gpu_bytes for t in fwd),
        "training_gpu_bytes": sum(t.gpu_bytes for t in ts),
    }
    # PP: whole layers per stage; the one stage holding the matmul, the others nothing
    out["stage_gpu_bytes"] = [out["training_gpu_bytes"]] + [0.0] * (pp - 1)
    return out
