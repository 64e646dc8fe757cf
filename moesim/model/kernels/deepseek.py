"""DeepSeek's kernels as its training code launches them (``compute.memory_kernels:
deepseek`` only; ``reference.DEEPSEEK_LAUNCHES``): where DeepSeek's public profile of a
DualPipe F&B pair (github.com/deepseek-ai/profile-data ``train.json``) runs a kernel the
inventory lists differently, by its launch records (grid, block, the kernel's name and
the op it runs in), never by its durations.

- ``scale_transpose``: after each per-token FP8 cast, its FP32 1×128 scales are written
  again transposed (the profile's ``dpsk::grouped_gemm::cuda::utils::transpose<512, 128,
  4, 4>``, grid 32 × 512 threads, 7 launches in a layer's forward, as many as its
  per-token casts; deepseek-ai/DeepGEMM ``README.md`` at 0274ad7b, "Interfaces", of the
  public successor of these GEMMs: "the LHS scaling factor is required to have a
  TMA-aligned and transposed layout", FP32 on SM90). Reads and writes rows × cols / 128
  FP32 scales.
- ``rotary_kernel``: two launches where the inventory has one (the profile's
  ``rotary_kernel``, grid 1024 × 1 × heads for the query's rope part and 1024 × 1 × 1 for
  the key's shared one): the same bytes over two launches.
- :func:`router_ops`: the router's PyTorch eager kernels (sigmoid's bias add, the group
  scores, masks, fills, scatters, gathers, index arithmetic): 35 launches under 10 µs
  each in a layer's forward of the profile (3.0 µs mean: launch-bound), of which the
  inventory lists two (``router_score``, ``router_aux_stats``); the other 33 are one
  kernel of 33 launches moving nothing the rest of the router does not: the device's
  per-launch cost each.
- :func:`expert_weight_transposes`: the routed experts' FP8 weights transposed for the
  backward's dgrad (``batched_transpose``) run in the forward: the profile's forward
  launches ``cuda::batched_transpose<512, 128, 1, 1>`` twice in a layer, 7,168 blocks
  each, one 128 × 128 FP8 tile a block (16,896 B of shared memory = 128 × 132): 7,168 =
  4 local experts × (4,096 / 128) × (7,168 / 128), the experts' fused gate/up weights,
  and its backward only 7 small ones (the attention's five projections and the shared
  expert's two). Moved, not added: the backward loses the experts' transposes.
- :func:`routing_weight_grad`: DeepSeek applies the routing weights inside the experts'
  SwiGLU (``swiglu_forward_with_weight``), so the weights' gradient is a kernel of its
  own in the backward (the profile's ``swiglu_weight_backward_with_weight_impl``, one
  launch a layer, 64,240 blocks, 75 % occupancy): per row, the SwiGLU recomputed from
  its FP8 cache times the output's gradient, summed. Reads the FP8 input with its scales
  and the BF16 gradient, writes one FP32 per row. (Reading the BF16 input instead would
  take 3.8 TB/s in the profiled 105 µs, above HBM's rate.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from moesim.compute.base import Kernel
from moesim.model.kernels.linear import CAST_TOKEN, WEIGHT_T
from moesim.model.kernels.make import ACT_BYTES, FP8_ACT, FP8_WEIGHT, FP32_BYTES, TILE, mem
from moesim.model.kernels.reference import DEEPSEEK_LAUNCHES, FP8_ACT_CACHE, on

SCALE_T = "scale_transpose"
ROTARY = "rotary_kernel"
ROUTER_OPS = "router_small_ops"
WEIGHT_GRAD = "expert_act_weight_bwd"
#: the profile's small launches in a layer's forward router (train.json, F, elementwise
#: class, each under 10 µs: 35 a layer, fill_tensormaps of the grouped GEMM left out)
#: less the two the inventory lists (router_score, router_aux_stats)
ROUTER_OPS_LAUNCHES = 33
RECOMPUTE = "recompute."

__all__ = ["ROUTER_OPS", "ROUTER_OPS_LAUNCHES", "SCALE_T", "WEIGHT_GRAD",
           "expert_weight_transposes", "launches", "router_ops", "routing_weight_grad",
           "scale_transpose"]


def _base(name: str) -> tuple[str, str]:
    base = name.removeprefix(RECOMPUTE)
    return name[:len(name) - len(base)], base


def scale_transpose(cast: Kernel) -> Kernel:
    """The 1×128 scales of a per-token cast (``cast_bytes`` = elements × (2 + 1 + 4/128))
    read and written transposed: 2 × 4 B × elements / 128."""
    prefix, _ = _base(cast.name)
    elements = cast.bytes / (ACT_BYTES + FP8_ACT)
    return mem(prefix + SCALE_T, 2 * FP32_BYTES * elements / TILE, cast.pass_ or "fwd",
               "elementwise", count=max(cast.count, 1))


def launches(spec, kernels: Iterable[Kernel]) -> list[Kernel]:
    """One op's ``kernels`` as DeepSeek launches them (module docstring); as they are
    unless the scenario lists ``deepseek_launches``."""
    kernels = list(kernels)
    if not on(spec, DEEPSEEK_LAUNCHES):
        return kernels
    out: list[Kernel] = []
    for k in kernels:
        _, base = _base(k.name)
        out.append(replace(k, count=2 * max(k.count, 1)) if base == ROTARY else k)
        if base == CAST_TOKEN:
            out.append(scale_transpose(k))
    return out


def router_ops(spec) -> list[Kernel]:
    """The router's small eager kernels in the forward: :data:`ROUTER_OPS_LAUNCHES`
    launches of nothing counted elsewhere; none unless listed."""
    if not on(spec, DEEPSEEK_LAUNCHES):
        return []
    return [mem(ROUTER_OPS, 0.0, "fwd", "router", count=ROUTER_OPS_LAUNCHES)]


def expert_weight_transposes(spec, fc1: tuple[int, int], fc2: tuple[int, int],
                             phase: str, fp8: bool, kernels: list[Kernel]) -> list[Kernel]:
    """A routed expert's forward (``phase`` "fwd") with its two weights' FP8 transposes
    (``fc1``/``fc2`` = (n, k), 2 × (1 + 4/128²) B per weight element, as the dgrad's
    ``batched_transpose``) in front, or its backward without them; ``kernels`` as they
    are unless listed and FP8."""
    if not (fp8 and on(spec, DEEPSEEK_LAUNCHES)):
        return kernels
    if phase != "fwd":
        return [k for k in kernels if k.name != WEIGHT_T]
    return [*(mem(WEIGHT_T, 2 * FP8_WEIGHT * n * k, "fwd", "cast") for n, k in (fc1, fc2)),
            *kernels]


def routing_weight_grad(spec, rows: int, up_n: int, width: int, phase: str,
                        fp8: bool) -> list[Kernel]:
    """A routed expert's routing-weight gradient in the backward: read ``rows`` × ``up_n``
    FP8 (with 1×128 scales) and ``rows`` × ``width`` BF16, write ``rows`` FP32; none
    unless listed, FP8 with the SwiGLU input cached in FP8, and the backward."""
    if not (fp8 and phase != "fwd" and rows > 0 and on(spec, DEEPSEEK_LAUNCHES)
            and on(spec, FP8_ACT_CACHE)):
        return []
    return [mem(WEIGHT_GRAD, rows * (FP8_ACT * up_n + ACT_BYTES * width + FP32_BYTES),
                "dgrad", "elementwise", flops=4.0 * rows * width)]
