"""What an Nsight Systems NVTX range around each step of a Megatron-Core MoE layer's
forward would read, on the host's clock and projected onto the GPU (pure; no simpy).

Megatron-Core's ``MoELayer.forward`` runs four steps (NVIDIA/Megatron-LM
megatron/core/transformer/moe/moe_layer.py, the 2025 releases): ``router_and_preprocess``
(the router, then ``token_dispatcher.dispatch_preprocess``: the token counts, their copy
to the host, the permute), ``dispatch`` (``token_dispatch``: the all-to-all, after the
host waits on the token counts' copy at ``cuda_sync_point`` "before_ep_alltoall"),
``experts_compute`` (``dispatch_postprocess``: the sort by local expert; the experts;
``combine_preprocess``: the unsort) and ``combine`` (``token_combine`` and
``combine_postprocess``: the all-to-all back and the unpermute). :data:`RANGES` groups
:data:`moesim.program.host_dispatch.FORWARD_OPS`' parts so.

A push/pop NVTX range is timed on the thread that pushes it: nsys's NVTX range summary
(``nvtx_sum``) reports how long the host took from push to pop, waits included; its GPU
projection (``nvtx_gpu_proj_sum``) reports the span from the first GPU operation the range
launched to the last one's end. :func:`layer_ranges` reads both off the two clocks of
:func:`moesim.program.host_dispatch.timeline_pass_s` (same host prices, same sync), so a
host-side range grows by the time the host waits at the sync, and a range whose kernels
queue behind earlier work projects onto the GPU from when they start.

``cpp_launch_s`` re-prices each GEMM that Transformer Engine's GroupedLinear issues per
local expert from C++ (host_dispatch's :data:`~moesim.program.host_dispatch.CPP_LAUNCH_S`,
a bare kernel launch). Each such GEMM is one ``nvte_cublas_gemm`` call
(``nvte_multi_stream_cublas_gemm`` loops over them), and that call builds the cuBLASLt
descriptors, asks ``cublasLtMatmulAlgoGetHeuristic`` for an algorithm and launches, all
on the host inside one ``NVTE_API_CALL`` NVTX range (NVIDIA/TransformerEngine
transformer_engine/common/gemm/cublaslt_gemm.cu at 5c62f728; common/nvtx.h
``NVTXWrapper``: nvtxRangePush / nvtxRangePop). :data:`TE_GEMM_CALL_S` is that range's
published median.
"""

from __future__ import annotations

from statistics import median

from moesim.program import host_dispatch as hd

#: host seconds of one ``nvte_cublas_gemm`` call: the median of its NVTX range over
#: 645,099 calls, Qwen3-30B-A3B on 8 B200 under nsys (yanring/Megatron-MoE-ModelZoo issue 7,
#: 2025-08-18; min 10.3 us; the profiler's own tracing is inside the figure)
TE_GEMM_CALL_S = 13.709e-6

#: Megatron-Core MoELayer.forward's steps, as groups of host_dispatch parts
RANGES: dict[str, tuple[str, ...]] = {
    "router_and_preprocess": ("router", "dispatcher preprocess",
                              "token counts to host and the sync", "permute"),
    "dispatch": ("dispatch all-to-alls", "TP gathers"),
    "experts_compute": ("sort by local expert", "experts", "unsort and TP reduce-scatter"),
    "combine": ("combine all-to-all and unpermute",),
}
#: the whole MoE layer (router to combine) and the attention block before it
MLP = tuple(p for parts in RANGES.values() for p in parts)
ATTENTION = ("attention block",)


def trace(gpu_s: dict[str, float], local_experts: int, tp: int, layers: int,
          te: bool = True, cpp_launch_s: float | None = None
          ) -> tuple[list[dict[str, tuple]], float]:
    """:func:`moesim.program.host_dispatch.two_clocks`: per layer and part the two clocks'
    ``(host start, host end, GPU start, GPU end)``, and the pass's end (``cpp_launch_s``:
    each per-expert GEMM call's host price, e.g. :data:`TE_GEMM_CALL_S`)."""
    return hd.two_clocks(gpu_s, local_experts, tp, layers, te, cpp_launch_s)


def _span(rec: dict[str, tuple], parts: tuple[str, ...]) -> tuple[float, float | None]:
    """(host seconds, GPU-projected seconds or None) of one range in one layer's record."""
    got = [rec[p] for p in parts if p in rec]
    host = got[-1][1] - got[0][0]
    gs = [(g0, g1) for _, _, g0, g1 in got if g0 is not None]
    return host, (max(g1 for _, g1 in gs) - min(g0 for g0, _ in gs)) if gs else None


def layer_ranges(gpu_s: dict[str, float], local_experts: int, tp: int, layers: int,
                 te: bool = True, cpp_launch_s: float | None = None
                 ) -> dict[str, tuple[float, float | None]]:
    """Median over a pass's ``layers`` MoE layers (as nsys reports a range's median over
    its instances) of each range's host seconds and GPU-projected seconds: the four
    steps of :data:`RANGES`, ``"MLP"`` (router to combine) and ``"attention"``
    (``cpp_launch_s``: as :func:`trace`)."""
    recs, _ = trace(gpu_s, local_experts, tp, layers, te, cpp_launch_s)
    groups = {**RANGES, "MLP": MLP, "attention": ATTENTION}
    out: dict[str, tuple[float, float | None]] = {}
    for name, parts in groups.items():
        spans = [_span(r, parts) for r in recs]
        gs = [g for _, g in spans if g is not None]
        out[name] = (median(h for h, _ in spans), median(gs) if gs else None)
    return out
