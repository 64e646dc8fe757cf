"""The host's per-op dispatch in an eager Megatron-Core MoE forward, and the bound it puts
on each MoE layer (pure; ``rl.train.host_dispatch: eager``).

PyTorch eager issues every op from the CPU: Python, the dispatcher and the launch, one op
after the other. The GPU may run behind the host, but Megatron-Core's
``MoEAlltoAllTokenDispatcher`` synchronises the host once per MoE layer's forward: the
token counts go to the host on ``cuda_dtoh_stream`` at ``cuda_dtoh_point``
("before_permutation_1") and the host waits on ``cuda_dtoh_stream.synchronize()`` at
``cuda_sync_point`` "before_ep_alltoall" (``_maybe_dtoh_and_synchronize``, set in
``preprocess``; NVIDIA/Megatron-LM 2ff0f099, megatron/core/transformer/moe/
token_dispatcher.py). So the host cannot run ahead of the GPU past one MoE layer, and a
layer's forward takes ``max(G, H)``: ``G`` its GPU time, ``H`` the host time of the ops
issued between two syncs (one layer: the dispatch, experts and combine of one MoE layer,
then the next layer's attention and router up to its sync).

:data:`FORWARD_OPS` counts the host calls of one layer's forward as that commit issues
them with Transformer Engine modules (sequence parallel, the alltoall dispatcher,
``moe_permute_fusion``, ``moe_grouped_gemm`` with TE's GroupedLinear, the router without
load balancing, as NeMo RL's Megatron worker configures Qwen3-30B-A3B). Three prices,
each a published measurement:

- a Python-level op that launches work: 16.1 us, PyTorch's operator benchmark
  ``addmm_M1_N1_K1_cuda`` in eager mode (pytorch/pytorch PR 38421's table; the benchmark
  calls the op back to back and synchronises once at the end,
  ``benchmarks/operator_benchmark/benchmark_pytorch.py`` ``run_forward``, so a 1 x 1 x 1
  GEMM's time is the host's per call);
- a view or metadata op (reshape, transpose, ravel, indexing): 3.3 us, the same
  benchmark's ``split_M8_N8_parts2_cuda`` (pytorch/pytorch PR 32194);
- a kernel launched from C++ inside one such call (GroupedLinear's
  ``general_grouped_gemm`` loops over the local experts' GEMMs in C++): 2.43 us,
  te42kyfo/gpu-benches ``gpu-small-kernels`` back-to-back stream launches on an H200
  (commit 1c36d50), moesim's ``GPU_LAUNCH_OVERHEAD_S`` context.

Transformer Engine's modules run Python beyond their one call (argument checks, FP8
meta, autograd context); ``eager`` counts each as one op, so its ``H`` is a lower bound.
``timeline`` (below) prices the four linear-module calls at :data:`TE_MODULE_S`, the one
published per-module figure; the attention and norm modules stay at one op each. The
backward has no host sync (the all-to-all splits are known), so its host work runs ahead
of the GPU and is not priced here.
"""

from __future__ import annotations

from dataclasses import dataclass

US = 1e-6
#: host seconds per Python-level eager op that launches work (PyTorch operator benchmark,
#: addmm_M1_N1_K1_cuda, pytorch/pytorch PR 38421)
EAGER_OP_S = 16.1 * US
#: host seconds per view / metadata op (split_M8_N8_parts2_cuda, pytorch/pytorch PR 32194)
VIEW_OP_S = 3.3 * US
#: host seconds per kernel launched from C++ inside one call (te42kyfo/gpu-benches
#: gpu-small-kernels h200.txt, fit a = 2433 ns, commit 1c36d50)
CPP_LAUNCH_S = 2.43 * US

#: host seconds per forward call of a Transformer Engine linear module as Megatron-Core
#: wraps it (``TEColumnParallelLinear``, BF16, TP1): 115 us after NVIDIA/TransformerEngine
#: PR 1191's CPU-overhead cuts (140 us before; Megatron's own ColumnParallelLinear 74 us).
#: NeMo RL v0.3 pins TE 2.3, which holds that PR; TE's later cuts (PR 2146) came after.
TE_MODULE_S = 115.0 * US

MODES = ("none", "eager", "timeline")


@dataclass(frozen=True)
class Part:
    """One part of a layer's forward: ``ops`` Python-level calls that launch work,
    ``views`` view / metadata calls, ``per_expert`` C++ launches per local expert,
    ``tp_only`` parts issued only at TP > 1; ``source``: where the calls are."""

    name: str
    ops: int
    views: int = 0
    per_expert: int = 0
    tp_only: bool = False
    source: str = ""
    #: of ``ops``, the calls of Transformer Engine linear modules (:data:`TE_MODULE_S`
    #: each under ``timeline``)
    te_calls: int = 0


_TD = "megatron/core/transformer/moe/token_dispatcher.py"
#: one MoE layer's forward on one rank, Megatron-LM 2ff0f099 with Transformer Engine
FORWARD_OPS: tuple[Part, ...] = (
    Part("attention block", 10, 4, te_calls=2, source=(
        "transformer_layer.py / attention.py: linear_qkv (TELayerNormColumnParallelLinear, "
        "its SP all-gather inside), q_layernorm, k_layernorm, rotary x2 (fused), "
        "core_attention (TE DotProductAttention), linear_proj (TERowParallelLinear, its "
        "reduce-scatter inside), bias-dropout-add x2, pre_mlp_layernorm; the QKV split "
        "and the output reshape as views")),
    Part("router", 13, 1, source=(
        "router.py gating 76-81 (input.to, weight.to fp64, linear); routing 395 (view); "
        "moe_utils.py topk_softmax_with_capacity 555-575 (topk, softmax, type_as, "
        "zeros_like, scatter, zeros_like, int, scatter, bool, sum)")),
    Part("dispatcher preprocess", 9, 6, source=(
        f"{_TD} preprocess 377-441: routing_map.sum, long, the input splits' sum, the "
        "token-count all-gather over TP x EP (empty, all_gather), the local experts' "
        "slice (contiguous), three sums; reshape, transpose, slice, index, view as views")),
    Part("token counts to host and the sync", 6, source=(
        f"{_TD} _maybe_dtoh_and_synchronize 673-710: wait_stream, tokens_per_expert, "
        "input_splits, output_splits, output_splits_tp to the host, "
        "cuda_dtoh_stream.synchronize()")),
    Part("permute", 1, 1, source=f"{_TD} token_permutation 490-504 (fused permute)"),
    Part("dispatch all-to-alls", 4, source=(
        f"{_TD} 510-515: all_to_all of the tokens and of the probs (empty, "
        "all_to_all_single each)")),
    Part("TP gathers", 5, tp_only=True, source=(
        f"{_TD} 519-529: output_splits_tp.tolist, gather_from_sequence_parallel_region of "
        "the tokens and the probs")),
    Part("sort by local expert", 1, 1, source=f"{_TD} 534-571 sort_chunks_by_idxs (fused)"),
    Part("experts", 4, 1, per_expert=2, te_calls=2, source=(
        "experts.py TEGroupedMLP.forward 748-800: tokens_per_expert.tolist, unsqueeze, "
        "linear_fc1 and linear_fc2 (TE GroupedLinear: one GEMM per local expert each, "
        "launched from C++), weighted_bias_swiglu")),
    Part("unsort and TP reduce-scatter", 5, 2, source=(
        f"{_TD} token_unpermutation 596-624: sort_chunks_by_idxs (fused), .T.ravel; "
        "tolist, .to(probs dtype), reduce_scatter (empty, reduce_scatter), .to")),
    Part("combine all-to-all and unpermute", 3, 1, source=(
        f"{_TD} 628-641: all_to_all (empty, all_to_all_single), unpermute (fused), view")),
)


def layer_parts(local_experts: int, tp: int, te: bool = False) -> list[tuple[str, float, str]]:
    """(part, host seconds, source) of one MoE layer's forward on one rank (``te``: the
    Transformer Engine module calls at :data:`TE_MODULE_S`)."""
    return [(p.name, part_host_s(p, local_experts, te), p.source) for p in FORWARD_OPS
            if not (p.tp_only and tp <= 1)]


def layer_host_s(local_experts: int, tp: int, te: bool = False) -> float:
    """Host seconds to issue one MoE layer's forward (the ops between two syncs)."""
    return sum(s for _, s, _ in layer_parts(local_experts, tp, te))


def layer_counts(local_experts: int, tp: int) -> tuple[int, int, int]:
    """(Python-level ops, views, C++ launches) of one MoE layer's forward."""
    ps = [p for p in FORWARD_OPS if not (p.tp_only and tp <= 1)]
    return (sum(p.ops for p in ps), sum(p.views for p in ps),
            sum(p.per_expert for p in ps) * local_experts)


def segment_s(gpu_s: float, host_s: float) -> float:
    """One segment between two host syncs: the host issues ``host_s`` of ops while the GPU
    runs ``gpu_s`` behind it, so the segment takes the longer of the two."""
    return max(gpu_s, host_s)


def pass_extra_s(moe_layers: int, gpu_layer_s: float, host_layer_s: float) -> float:
    """Seconds a forward pass over ``moe_layers`` MoE layers (each ``gpu_layer_s`` on the
    GPU) gains when each layer is a segment bounded by its host time ``host_layer_s``."""
    return moe_layers * (segment_s(gpu_layer_s, host_layer_s) - gpu_layer_s)


# --- ``timeline``: the host and the GPU as two clocks, op by op -------------------------
#
# ``max(G, H)`` lets the GPU run any of a layer's kernels while the host is anywhere in
# the layer. The sync forbids more: when ``cuda_dtoh_stream.synchronize()`` returns, the
# GPU has run everything up to the token counts' copy and holds at most the permute the
# host issued since; every later kernel can start only once the host has issued it. So
# the host's time to reach a kernel and the GPU's work from it on add up: the layer takes
# ``max_j(h_j + g_j..)`` over its kernels j rather than ``max(G, H)``. ``timeline_pass_s``
# runs the two clocks over a pass's layers, each part's Python-level ops and C++ launches
# issued one by one (the part's host seconds spread evenly over them, its GPU seconds
# likewise: how a part's kernels split among its launches is not modelled), the sync
# after the permute (``cuda_sync_point`` "before_ep_alltoall", 2ff0f099).

#: the part after which the token counts' copy is enqueued (``cuda_dtoh_point``
#: "before_permutation_1") and the part after which the host waits on it
#: (``cuda_sync_point`` "before_ep_alltoall")
DTOH_AFTER = "token counts to host and the sync"
SYNC_AFTER = "permute"


def part_of(op: str, kernel: str) -> str:
    """The :data:`FORWARD_OPS` part that launches an inventory kernel of the forward
    (``op``, ``kernel``: :func:`moesim.program.inventory.layer_ops`' op and kernel
    names)."""
    if op.endswith(".attn"):
        return "attention block"
    if kernel == "sort_chunks_by_idxs":
        return "sort by local expert" if op.endswith(".router") else \
            "unsort and TP reduce-scatter"
    if kernel.startswith("router"):
        return "router"
    if op.endswith(".unpermute"):
        return "combine all-to-all and unpermute"
    if op.endswith(".router"):
        return "permute"                 # the routing map, the fused permute
    return "experts"


def comm_shares(tokens: int, top_k: int, ep: int, tp: int) -> dict[str, float]:
    """Each communicating part's share of a layer's forward communication, by the bytes
    each GPU sends: the dispatch and the combine all-to-all ``tokens x top_k x (ep-1)/ep``
    rows each, and at TP > 1 the attention block's sequence-parallel all-gather and
    reduce-scatter ``tokens x (tp-1)`` rows each (``tokens``: the GPU's rows)."""
    a2a = tokens * top_k * (ep - 1) / ep if ep > 1 else 0.0
    sp = 2 * tokens * (tp - 1)
    total = 2 * a2a + sp
    if total <= 0:
        return {}
    out = {"dispatch all-to-alls": a2a / total, "combine all-to-all and unpermute": a2a / total}
    if sp:
        out["attention block"] = sp / total
    return out


def part_host_s(p: Part, local_experts: int, te: bool = False,
                cpp_launch_s: float | None = None) -> float:
    """Host seconds of one part; with ``te`` its Transformer Engine module calls at
    :data:`TE_MODULE_S` rather than :data:`EAGER_OP_S`; with ``cpp_launch_s`` its
    per-expert C++ GEMM calls at that price rather than :data:`CPP_LAUNCH_S`."""
    op_s = p.ops * EAGER_OP_S + (p.te_calls * (TE_MODULE_S - EAGER_OP_S) if te else 0.0)
    s = op_s + p.views * VIEW_OP_S + p.per_expert * local_experts * CPP_LAUNCH_S
    if cpp_launch_s is None:
        return s
    return s + p.per_expert * local_experts * (cpp_launch_s - CPP_LAUNCH_S)


def two_clocks(gpu_s: dict[str, float], local_experts: int, tp: int, layers: int,
               te: bool = True, cpp_launch_s: float | None = None
               ) -> tuple[list[dict[str, tuple]], float]:
    """A forward pass over ``layers`` MoE layers on two clocks: the host issues each
    part's launches in :data:`FORWARD_OPS` order, a kernel starts once issued and once the
    GPU is free, and after :data:`SYNC_AFTER` the host waits until the GPU has run
    everything issued up to :data:`DTOH_AFTER` (the wait is the first thing the next part
    does: ``token_dispatch`` calls ``_maybe_dtoh_and_synchronize`` before its all-to-all).
    ``gpu_s``: each part's GPU seconds per layer (missing parts: none); ``cpp_launch_s``:
    as :func:`part_host_s`. Returns, per layer and part, ``(host start, host end, GPU
    start, GPU end)`` (GPU ``None`` where the part launches no GPU work), and the pass's
    end, when both clocks are done."""
    host = gpu = dtoh = 0.0
    wait = False
    out: list[dict[str, tuple]] = []
    for _ in range(layers):
        rec: dict[str, tuple] = {}
        for p in FORWARD_OPS:
            if p.tp_only and tp <= 1:
                continue
            h0 = host
            if wait:
                host, wait = max(host, dtoh), False
            n = max(p.ops + p.per_expert * local_experts, 1)
            h = part_host_s(p, local_experts, te, cpp_launch_s)
            g = gpu_s.get(p.name, 0.0)
            g0 = None
            for _ in range(n):
                host += h / n
                if g:
                    start = max(gpu, host)
                    g0 = start if g0 is None else g0
                    gpu = start + g / n
            rec[p.name] = (h0, host, g0, gpu if g else None)
            if p.name == DTOH_AFTER:
                dtoh = gpu
            if p.name == SYNC_AFTER:
                wait = True
        out.append(rec)
    return out, max(host, gpu)


def timeline_pass_s(gpu_s: dict[str, float], local_experts: int, tp: int,
                    layers: int, te: bool = True, cpp_launch_s: float | None = None) -> float:
    """Seconds of a forward pass over ``layers`` MoE layers on two clocks
    (:func:`two_clocks`)."""
    return two_clocks(gpu_s, local_experts, tp, layers, te, cpp_launch_s)[1]


def timeline_extra_s(gpu_s: dict[str, float], local_experts: int, tp: int,
                     layers: int, te: bool = True, cpp_launch_s: float | None = None) -> float:
    """Seconds the two clocks add to a forward pass over the GPU's own time."""
    return (timeline_pass_s(gpu_s, local_experts, tp, layers, te, cpp_launch_s)
            - layers * sum(gpu_s.values()))
