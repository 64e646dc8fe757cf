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
- :func:`reduce_fused`: the forward's ``unpermute`` is DeepSeek's ``reduce_fused_impl``
  on the experts' side, before DeepEP's combine, not after it on the tokens' side: its
  grid is the tokens the rank received (26,592-34,144 in the profile's layers, one block
  of 128 threads each), and its public successor (deepseek-ai/TileKernels
  ``tile_kernels/moe/reduce_fused_kernel.py`` at a06642db, the same arguments) reads each
  received token's rows among the rank's ``a`` expert rows with its top-k weights and
  positions and writes one BF16 row per received token. A rank receives at most ``a``
  tokens (one per expert row); the model lists that bound (the profile's grids are 0.93
  of its expert rows: several of a token's experts on one rank), so it reads and
  writes ``a`` rows, as the backward's ``permute_bwd``, the same kernel, already does.
- :func:`routing_map_launches`: the routing-map kernels run after the dispatch over the
  received tokens' top-k indices (DeepEP's ``recv_topk_idx``, ``received × top_k``
  int64, the rank's other experts marked −1; the profile runs them just before
  ``expand_to_fused_with_scales``, after ``dispatch``), not over ``a`` indices: in the
  public successor (TileKernels ``get_fused_mapping_kernel.py`` at 1001fca4) one kernel
  writes −1 over its four maps, counts each expert's indices, syncs the grid and writes
  each copy's position, its index array read once per pass; the profile's two kernels
  are that kernel cut at the grid sync (``clean_and_count_expert``: the −1 writes and
  the counts; ``get_fused_mapping``, which takes the counts as its ``int const*``: the
  positions). Bounded as above (received = ``a``). The second pass's block-wide scans
  (2,048 B of shared memory: one int per thread) are not priced.
- :func:`expand_grad`: the backward's FP8 gradient expand (``unpermute_bwd`` with FP8
  gradients, ``expand_to_fused_with_scales_impl``) runs on the experts' side after
  DeepEP has delivered the token gradients, as the forward's ``permute`` does: the
  profile's backward grids (1,776-2,168 blocks of 512) are those of its forward
  (1,936-2,304), so it reads the received rows (at most ``a``) in FP8 with their scales
  and writes ``a``, not the ``a / top_k`` rows of the tokens' side.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from moesim.compute.base import Kernel
from moesim.model.kernels.linear import CAST_TOKEN, WEIGHT_T
from moesim.model.kernels.make import ACT_BYTES, FP8_ACT, FP8_WEIGHT, FP32_BYTES, TILE, mem
from moesim.model.kernels.reference import (
    COUNT_BYTES,
    DEEPSEEK_LAUNCHES,
    FP8_ACT_CACHE,
    FP8_GRAD_DISPATCH,
    INDEX_BYTES,
    ROW_BYTES,
    on,
)

SCALE_T = "scale_transpose"
ROTARY = "rotary_kernel"
ROUTER_OPS = "router_small_ops"
WEIGHT_GRAD = "expert_act_weight_bwd"
UNPERMUTE = "unpermute"
UNPERMUTE_BWD = "unpermute_bwd"
MAP, COUNT = "get_fused_mapping", "clean_and_count_expert"
#: the profile's small launches in a layer's forward router (train.json, F, elementwise
#: class, each under 10 µs: 35 a layer, fill_tensormaps of the grouped GEMM left out)
#: less the two the inventory lists (router_score, router_aux_stats)
ROUTER_OPS_LAUNCHES = 33
RECOMPUTE = "recompute."

__all__ = ["COUNT", "MAP", "ROUTER_OPS", "ROUTER_OPS_LAUNCHES", "SCALE_T", "UNPERMUTE",
           "UNPERMUTE_BWD", "WEIGHT_GRAD", "expand_grad", "expert_weight_transposes",
           "launches", "reduce_fused",
           "router_ops", "routing_map_launches", "routing_weight_grad", "scale_transpose"]


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
        if base == ROTARY:
            k = replace(k, count=2 * max(k.count, 1))
        elif base == UNPERMUTE and (k.pass_ or "fwd") == "fwd":
            k = reduce_fused(spec, k)
        elif base in (MAP, COUNT):
            k = routing_map_launches(spec, k)
        elif base == UNPERMUTE_BWD and on(spec, FP8_GRAD_DISPATCH):
            k = expand_grad(spec, k)
        out.append(k)
        if base == CAST_TOKEN:
            out.append(scale_transpose(k))
    return out


def reduce_fused(spec, unpermute: Kernel) -> Kernel:
    """The forward ``unpermute`` (``flops`` = 2 · a · h over ``a`` expert rows) as
    DeepSeek's reduce before the combine: read the ``a`` BF16 rows, write one per
    received token (at most ``a``: the bound), read each received token's top-k FP32
    weights and int32 positions: 2 · 2 · a · h + (4 + 4) · a · top_k bytes."""
    h, k = spec.hidden, max(spec.top_k, 1)
    a = round(unpermute.flops / (2 * h))
    received = a
    return replace(unpermute, bytes=float(ACT_BYTES * h * (a + received)
                                          + (FP32_BYTES + ROW_BYTES) * received * k))


def expand_grad(spec, kernel: Kernel) -> Kernel:
    """``reference.fp8_grad_unpermute``'s expand (FP8 with scales: ``FP8_ACT`` · (⌈a /
    top_k⌉ + a) · h + 4 · a bytes) as DeepSeek runs it on the experts' side: the received
    rows (at most ``a``) read and ``a`` written, 2 · FP8_ACT · a · h + 4 · a, as the
    forward's ``permute``."""
    h, k = spec.hidden, max(spec.top_k, 1)

    def tokens_side(a: int) -> float:
        return FP8_ACT * (-(-a // k) + a) * h + ROW_BYTES * a

    guess = round(kernel.bytes / (FP8_ACT * h * (1 + 1 / k) + ROW_BYTES))
    a = min(range(max(guess - 1, 0), guess + 2),
            key=lambda n: abs(tokens_side(n) - kernel.bytes))
    return replace(kernel, bytes=float(2 * FP8_ACT * a * h + ROW_BYTES * a))


def routing_map_launches(spec, kernel: Kernel) -> Kernel:
    """``get_fused_mapping`` / ``clean_and_count_expert`` of ``reference.routing_map``
    (over ``a`` copies) over the received tokens' ``received × top_k`` int64 indices
    (received at most ``a``: the bound). ``clean_and_count_expert``: read the indices,
    write −1 over the int32 position of each (token, k) and over the three int32 maps of
    each expert row (expert, token, (token, k)), the experts' counts;
    ``get_fused_mapping``: read the indices, write each copy's four int32 entries and the
    experts' start and end."""
    _, base = _base(kernel.name)
    e, k = spec.n_experts, max(spec.top_k, 1)
    per_copy = INDEX_BYTES + ROW_BYTES if base == MAP else INDEX_BYTES
    a = round((kernel.bytes - COUNT_BYTES * e) / per_copy)
    idx = a * k                                     # received (<= a) x top_k indices
    if base == MAP:
        nbytes = INDEX_BYTES * idx + 4 * ROW_BYTES * a + 2 * COUNT_BYTES * e
    else:
        nbytes = (INDEX_BYTES + ROW_BYTES) * idx + 3 * ROW_BYTES * a + COUNT_BYTES * e
    return replace(kernel, bytes=float(nbytes))


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
