"""The RL trainer's eager forward on two clocks (``rl.train.host_dispatch: timeline``).

:mod:`moesim.program.host_dispatch` runs the host and the GPU as two clocks over a
forward pass's MoE layers (:func:`~moesim.program.host_dispatch.timeline_pass_s`). This
module gives it the GPU seconds of each part of one layer for a row of the trainer's
pass:

- the first MoE layer's forward kernels as ``moesim kernels`` lists them
  (:func:`moesim.program.inventory.layer_ops`, priced on the scenario's compute model, each
  routed expert launched on its own as Transformer Engine's GroupedLinear does), each
  under the part that launches it (:func:`~moesim.program.host_dispatch.part_of`);
- the layer's communication: the simulated pass's time per layer less those kernels,
  shared among the dispatch and combine all-to-alls and, under sequence parallelism, the
  attention block's all-gather and reduce-scatter, by the bytes each sends
  (:func:`~moesim.program.host_dispatch.comm_shares`).

The pass gains what the two clocks add over the GPU's own time. Pure (no simpy).
"""

from __future__ import annotations

import dataclasses

from moesim.program import host_dispatch as hd
from moesim.program.inventory import layer_ops
from moesim.program.nvtx_ranges import TE_GEMM_CALL_S
from moesim.rl.trainer_kernels import with_sort_chunks
from moesim.wiring import resolve


def forward_part_kernels_s(res) -> dict[str, float]:
    """{host_dispatch part: GPU seconds} of the first MoE layer's forward kernels of a
    resolved scenario (``moesim kernels``'s list, each kernel under the part that
    launches it)."""
    spec = res.model
    layer = next(i for i in range(spec.layers) if spec.is_moe_layer(i))
    gpu: dict[str, float] = {}
    for o in layer_ops(res, layer, "fwd"):
        for k in o.kernels:
            p = hd.part_of(o.op, k.name)
            gpu[p] = gpu.get(p, 0.0) + float(res.compute.time_s(k))
    return gpu


def part_gpu_s(scn, row: int, gpu_layer_s: float, ep: int) -> tuple[dict[str, float], int, int]:
    """({part: GPU seconds per layer}, local experts, tp) of a forward over one row of
    ``row`` tokens on the trainer's layout (``scn``), the layer taking ``gpu_layer_s`` in
    the simulated pass."""
    sch = dataclasses.replace(scn.schedule, seq_len=row, microbatches=1, micro_batch_size=1)
    one = dataclasses.replace(scn, schedule=sch, compute=scn.compute.with_default(
        "expert_launches", "per_expert", scn.source))
    res = with_sort_chunks(resolve(one))
    spec = res.model
    gpu = forward_part_kernels_s(res)
    tp = scn.parallel.tp
    sp = bool(scn.parallel.sequence_parallel) and tp > 1
    comm = max(0.0, gpu_layer_s - sum(gpu.values()))
    for p, share in hd.comm_shares(row // tp if sp else row, spec.top_k, ep, tp if sp else 1).items():
        gpu[p] = gpu.get(p, 0.0) + share * comm
    return gpu, max(1, spec.n_experts // ep), tp


def timeline_row_s(scn, row: int, moe_layers: int, gpu_layer_s: float, ep: int,
                   te_gemm_call: str = "launch") -> float:
    """Seconds a forward pass over one row of ``row`` tokens gains over the GPU's own time
    on two clocks, over its ``moe_layers`` MoE layers; with ``te_gemm_call`` ``nvte``
    each per-expert GEMM that Transformer Engine's GroupedLinear issues costs the host
    :data:`moesim.program.nvtx_ranges.TE_GEMM_CALL_S` (``rl.train.te_gemm_call``)."""
    gpu, local, tp = part_gpu_s(scn, row, gpu_layer_s, ep)
    cpp = TE_GEMM_CALL_S if te_gemm_call == "nvte" else None
    return max(0.0, hd.timeline_extra_s(gpu, local, tp, moe_layers, te=True, cpp_launch_s=cpp))
