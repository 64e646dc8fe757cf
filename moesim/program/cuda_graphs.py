"""CUDA graphs: kernels captured in a graph pay one graph launch instead of one launch
each (pure; docs/model.md, "CUDA graphs").

Megatron-Core (transformer_config.py ``cuda_graph_impl`` "transformer_engine" / "local"
and ``cuda_graph_modules``, NVIDIA/Megatron-LM d98e8a6) captures per layer: ``attn`` the
attention block (input norm, QKV, core attention, output projection), ``mlp`` a dense
layer's MLP, ``moe_router`` the MoE block up to the router (router GEMM, softmax/top-k;
the shared experts too when they are not overlapped with the dispatch),
``moe_preprocess`` the token permutation before the dispatch (with ``moe_router``). A
replayed graph launches its kernels from the GPU: moesim keeps each kernel's work and
its launches, each paying the device's graph floor (``Kernel.graphed``;
``DeviceSpec.graph_kernel_s``, 1.26 µs on Hopper, measured) instead of a host launch,
and adds one host launch for the graph (``cuda_graph_launch``). Transformer Engine's
make_graphed_callables graphs the backward too, so both passes are captured. Dispatch
and combine (communication) stay outside.
"""

from __future__ import annotations

from dataclasses import replace

from moesim.compute.base import Kernel


def graphed(kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` replayed from one CUDA graph: no host launch per kernel (each pays the
    graph floor instead), one host launch for the graph."""
    if not kernels:
        return kernels
    return [*(replace(k, graphed=True) for k in kernels), Kernel("cuda_graph_launch", 0.0, 0.0)]


def maybe(kernels: list[Kernel], on: bool) -> list[Kernel]:
    return graphed(kernels) if on else kernels

