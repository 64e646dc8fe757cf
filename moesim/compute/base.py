"""The compute-model interface: how long a kernel takes on a device.

The engine asks a :class:`ComputeModel` for the duration of each :class:`Kernel`.
The roofline model (``moesim.compute.roofline``) and a calibration fitted to
recorded traces (``moesim.compute.calibrated``) both implement it, so a
scenario can name either.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel (or a fused group of ``count`` launches) on one rank.

    ``flops`` and ``bytes`` (HBM traffic, read + written) are totals for the group.
    For a GEMM, ``m`` is the token (row) dimension, ``n``/``k`` the weight dims;
    the efficiency of small GEMMs (a cold expert with few tokens) depends on them.
    """

    name: str          # "expert_gemm", "attention", "router", "permute", "dense_gemm", "optimizer", ...
    flops: float       # FLOP
    bytes: float       # bytes moved to/from HBM
    m: int = 0         # GEMM rows (tokens); 0 when not a GEMM
    n: int = 0
    k: int = 0
    count: int = 1     # kernel launches this stands for (launch overhead is paid per launch)
    # What a kernel catalog needs to price it by its published measurements (issue 21).
    # Defaults leave a kernel to the roofline, as before. ``kind`` is the catalog's kernel
    # family: "gemm" (dense, m x n x k), "grouped_gemm" (``groups`` expert GEMMs laid out
    # contiguously, m rows in all), "kgrouped_gemm" (experts' weight gradient, grouped on
    # k), "attn_fwd" / "attn_bwd" (flash attention over ``seq`` with ``heads`` x
    # ``head_dim``, ``causal``), "mla_decode", "memory" (bandwidth-bound, priced by
    # ``bytes``); "" = unknown. Each kind is registered with its pricing in
    # moesim.compute.kinds (a kind not registered is priced by the roofline). ``dtype``:
    # "bf16" | "fp8" | "fp32" ("" = the scenario's precision). ``pass_``: "fwd" | "dgrad"
    # | "wgrad" ("" = not split). ``kclass``: the class validate compares by: gemm,
    # attention, cast, norm, elementwise, permute, router, optimizer, other.
    kind: str = ""
    dtype: str = ""
    pass_: str = ""
    kclass: str = ""
    groups: int = 1
    seq: int = 0
    heads: int = 0
    head_dim: int = 0
    causal: bool = True
    # replayed from a CUDA graph (moesim.program.cuda_graphs): each of its ``count``
    # launches costs the device's graph floor (``DeviceSpec.graph_kernel_s``) instead of a
    # host launch (``launch_overhead_s``); its work is the same
    graphed: bool = False
    # its launches are another kernel's: one grouped launch runs every expert of a rank
    # (vLLM's fused MoE, DeepGEMM's grouped GEMMs; ``compute.expert_launches: grouped``),
    # so only the rank's first expert pays the fixed cost per launch; its work is the same
    fused: bool = False


def per_launch_s(kernel: Kernel, launch_s: float, graph_s: float) -> float:
    """Fixed seconds per launch of ``kernel``: a host launch (``launch_s``), the graph
    floor when replayed from a CUDA graph (``graph_s``), none when its launches are
    another kernel's (``Kernel.fused``)."""
    if kernel.fused:
        return 0.0
    return graph_s if kernel.graphed else launch_s


def fused_launches(kernels: list[Kernel], on: bool = True) -> list[Kernel]:
    """``kernels`` whose launches are another kernel's (``Kernel.fused``) when ``on``."""
    return [replace(k, fused=True) for k in kernels] if on else kernels


class ComputeModel(Protocol):
    name: str

    def time_s(self, kernel: Kernel) -> float:
        """Seconds the kernel occupies the rank's compute stream."""
