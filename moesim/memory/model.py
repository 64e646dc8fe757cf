"""Per-rank memory accounting: weights, gradients, optimizer states, activations and
routed-token buffers, against the device's capacity. Pure arithmetic, bytes throughout.

Static state (ZeRO, arXiv:1910.02054 §3.1, mixed-precision Adam): 2 bytes bf16 weight
(``spec.weight_bytes``) + 2 bytes bf16 gradient + 12 bytes fp32 master/m/v = 16 bytes
per parameter. ZeRO-1 shards the 12 over the data-parallel group, ZeRO-2 also the
gradients, ZeRO-3 also the weights.
Non-expert parameters shard over DP·CP (Megatron-Core's DATA_PARALLEL_GROUP_WITH_CP);
expert parameters, split ETP ways (expert tensor parallelism, column then row parallel),
over the expert-data-parallel group of size EDP = TP·CP·DP/(ETP·EP) (Megatron-Core MoE
parallel folding, megatron/core/parallel_state.py).

Activations per layer per micro-batch (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Eq. 2 with sequence parallelism): for T = s·b
tokens, h hidden, a heads, t = tp,

    dense layer = (34·T·h + 5·a·s·T) / t  bytes
                = attention 11·T·h + 5·a·s·T, two layer norms 4·T·h, MLP 19·T·h.

Adapted here: the MLP's 19·T·h (for a 2-matrix FFN of width 4h) generalises to
ffn_bytes(f) = 2h + 2f·(3 if gated else 2) + h per token (input, up/gate outputs, the
activation output, Korthikanti's 1-byte dropout mask), which is 19h at f = 4h. In an MoE
layer the MLP term becomes: router fp32 probabilities 4·E per token, shared experts
ffn_bytes(n_shared·shared_ffn)/t per token, the routed experts ffn_bytes(expert_ffn) per
*received* token (a hot expert's rank receives more), and the expert outputs kept for the
combine's backward, 2·h per routed assignment sent.

Without sequence parallelism (Korthikanti Eq. 1) the 10·T·h of the layer norms' inputs,
the attention and MLP inputs and the two dropout masks is not split over t. With
context parallelism each rank holds T/cp tokens of the sequence (attention scores of its
queries against all s keys: 5·a·s·T/cp). With ETP the routed experts' activations are
those of etp·received tokens (all-gathered over the ETP group) at width expert_ffn/etp.

Attention kernels: Korthikanti's 5·a·s·T bytes are the score matrix (softmax output 2,
dropout mask 1, dropout output 2 bytes per score) of an attention that materialises it.
Production kernels do not: FlashAttention (Dao et al. 2022, arXiv:2205.14135 §3.1;
FlashAttention-2 arXiv:2307.08691 Algorithm 2) and cuDNN/Transformer Engine fused
attention keep Q, K, V, the output and one fp32 log-sum-exp per head and query (4·a·T
bytes, the "softmax_lse"/"Stats" tensor) and recompute the scores in the backward. So
``attention_kernel="fused"`` (default) keeps 4·a·T instead of 5·a·s·T;
``"materialized"`` (an unfused ``DotProductAttention``) keeps the score matrix.
Recomputation: "selective" (Megatron's recompute_modules ["core_attn"]) recomputes the
core attention, keeping neither (Korthikanti §4.2); "full" keeps only each layer's
input, 2·T·h/t, plus a workspace of one layer's activations while it is recomputed
(Korthikanti §5).

The caller says how many micro-batches' activations a stage holds
(``inflight_microbatches``): GPipe keeps m, 1F1B at most p on the first stage
(GPipe arXiv:1811.06965; Megatron-LM SC'21 §2.2.1). Routed-token buffers
(dispatch/combine send and receive) live for one layer at a time and are counted once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from moesim.compute.devices import DeviceSpec
from moesim.errors import InputError
from moesim.model.params import (
    attention_params,
    embedding_params,
    ffn_params,
    layer_norm_params,
    lm_head_params,
    router_params,
)
from moesim.model.spec import ModelSpec

GRAD_BYTES = 2        # bf16 gradient (ZeRO §3.1: 2 + 2 + 12 = 16 bytes per parameter)
OPTIMIZER_BYTES = 12  # fp32 master weight, Adam m and v
ACT_BYTES = 2         # bf16 activations
RECOMPUTE_MODES = ("none", "selective", "full")
ATTENTION_KERNELS = ("fused", "materialized")
LSE_BYTES = 4         # fp32 log-sum-exp per head and query (FlashAttention-2 Algorithm 2)
#: bytes per element of a stored parameter or gradient: bf16 2, fp32 4, fp8 1
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on one rank by category; ``peak_bytes`` is their sum."""

    weights: float
    gradients: float
    optimizer: float
    activations: float          # all in-flight micro-batches, all layers of the stage
    token_buffers: float        # dispatch/combine send and receive buffers of one layer
    recompute_workspace: float  # one layer's activations during full recomputation
    capacity_bytes: float
    dense_params: float         # parameters held before ZeRO-3 sharding (not bytes)
    expert_params: float

    @property
    def peak_bytes(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.token_buffers + self.recompute_workspace)

    @property
    def oom(self) -> bool:
        return self.peak_bytes > self.capacity_bytes

    def as_dict(self) -> dict[str, float | bool]:
        return {**asdict(self), "peak_bytes": self.peak_bytes, "oom": self.oom}


def split_layers(n_layers: int, pp: int) -> list[range]:
    """Contiguous layers per pipeline stage; a remainder goes one each to stages 1, 2, ...
    (stage 0 already holds the embedding)."""
    base, extra = divmod(n_layers, pp)
    out, start = [], 0
    for stage in range(pp):
        size = base + (1 if 1 <= stage <= extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def rank_params(spec: ModelSpec, layers: Sequence[int], *, tp: int, ep: int,
                first: bool, last: bool, etp: int = 1) -> tuple[float, float]:
    """(non-expert, expert) parameters one rank of this stage holds before ZeRO-3;
    each expert's matrices split ``etp`` ways (expert tensor parallelism)."""
    attn = attention_params(spec)
    dense = 0.0
    expert = 0.0
    for i in layers:
        dense += attn.tp_split / tp + attn.replicated + layer_norm_params(spec)
        if spec.is_moe_layer(i):
            dense += router_params(spec)
            dense += spec.n_shared_experts * ffn_params(spec, spec.shared_ffn) / tp
            expert += spec.n_experts // ep * ffn_params(spec, spec.expert_ffn) / etp
        else:
            dense += ffn_params(spec, spec.dense_ffn) / tp
    if first:
        dense += embedding_params(spec) / tp
    if last:
        dense += spec.hidden  # final norm
        # a tied LM head needs its own copy of the embedding when it sits on another stage
        dense += (embedding_params(spec) if spec.tied_embeddings and not first
                  else lm_head_params(spec)) / tp
    return dense, expert


def ffn_act_bytes_per_token(spec: ModelSpec, width: int) -> float:
    """Korthikanti's MLP term generalised: 2h + 2f·(3 if gated else 2) + h bytes/token."""
    if width <= 0:
        return 0.0
    return 2 * spec.hidden + ACT_BYTES * width * (3 if spec.gated else 2) + spec.hidden


def attention_core_bytes(spec: ModelSpec, tokens: int, seq_len: int, recompute: str,
                         attention_kernel: str = "fused") -> float:
    """Bytes the core attention keeps beyond Korthikanti's 11·T·h (before the TP split):
    none with a fused kernel 4·a·T (log-sum-exp), with a materialising one 5·a·s·T (the
    score matrix); recomputed (selective, full) nothing."""
    if recompute != "none":
        return 0.0
    if attention_kernel == "materialized":
        return 5 * spec.heads * seq_len * tokens
    return LSE_BYTES * spec.heads * tokens


def layer_activation_bytes(spec: ModelSpec, layer: int, tokens: int, seq_len: int, tp: int,
                           recompute: str, received_tokens: float,
                           sequence_parallel: bool = True, etp: int = 1,
                           attention_kernel: str = "fused") -> float:
    """Bytes one micro-batch of ``tokens`` tokens (this rank's, after CP) leaves alive in
    layer ``layer``."""
    t_h = tokens * spec.hidden
    if recompute == "full":
        return ACT_BYTES * t_h / (tp if sequence_parallel else 1)
    # Korthikanti Eq. 1: without SP, 10·T·h of the 34·T·h stay whole on every TP rank
    whole = 0.0 if sequence_parallel else 10 * t_h * (1 - 1 / tp)
    attn = 11 * t_h + attention_core_bytes(spec, tokens, seq_len, recompute, attention_kernel)
    total = attn + 4 * t_h
    if spec.is_moe_layer(layer):
        total += 4 * spec.n_experts * tokens                          # fp32 router probs
        total += tokens * ffn_act_bytes_per_token(spec, spec.n_shared_experts * spec.shared_ffn)
        total += ACT_BYTES * spec.top_k * t_h                        # outputs for combine bwd
        return (whole + total / tp + received_tokens * etp
                * ffn_act_bytes_per_token(spec, spec.expert_ffn // etp))
    return whole + (total + tokens * ffn_act_bytes_per_token(spec, spec.dense_ffn)) / tp


def _check(cond: bool, source: str, field: str, expected: str, got: object) -> None:
    if not cond:
        raise InputError(source, field, expected, got)


def memory_per_rank(
    spec: ModelSpec, *, micro_batch_tokens: int, seq_len: int, tp: int = 1, pp: int = 1,
    ep: int = 1, dp: int = 1, zero: int = 0, stage: int = 0,
    layers: Sequence[int] | None = None, inflight_microbatches: int = 1,
    recompute: str = "none", received_tokens: float | Sequence[float] | None = None,
    dispatch_bytes_per_elem: float = 2.0, device: DeviceSpec | None = None,
    capacity_bytes: float | None = None, source: str = "<memory>", cp: int = 1, etp: int = 1,
    sequence_parallel: bool = True, attention_kernel: str = "fused",
    grad_dtype: str = "bf16", param_dtype: str | None = None,
) -> MemoryBreakdown:
    """Bytes on one rank of pipeline stage ``stage``.

    ``micro_batch_tokens`` = sequences × seq_len of one micro-batch on this DP rank
    (split over ``cp`` context-parallel ranks). ``etp``: expert tensor parallelism;
    ``sequence_parallel``: Korthikanti Eq. 2 (True) or Eq. 1 (False) when tp > 1.
    ``layers``: layer indices of the stage (default: :func:`split_layers`).
    ``received_tokens``: routed token-assignments this rank's experts receive per MoE
    layer (one number for all, or one per MoE layer of the stage); default balanced,
    micro_batch_tokens/tp · top_k. ``dispatch_bytes_per_elem``: 2 for bf16, 1 + 4/128 for
    fp8 with one fp32 scale per 128 values (DeepSeek-V3 report §3.3). Capacity comes
    from ``capacity_bytes``, else ``device.hbm_bytes``, else unlimited.
    ``attention_kernel``: fused (keeps no score matrix) or materialized.
    ``grad_dtype``: the stored gradient (bf16; fp32 as Megatron's main_grad with bf16
    training); ``param_dtype``: the stored weight (None: ``spec.weight_bytes``; fp8 for
    Transformer Engine's fp8 primary weights, Megatron ``--fp8-param-gather``).
    """
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep), ("dp", dp), ("cp", cp),
                        ("etp", etp),
                        ("inflight_microbatches", inflight_microbatches)):
        _check(isinstance(value, int) and value >= 1, source, f"parallel.{name}",
               "an integer >= 1", value)
    _check(zero in (0, 1, 2, 3), source, "parallel.zero", "0, 1, 2 or 3", zero)
    _check(recompute in RECOMPUTE_MODES, source, "parallel.recompute",
           f"one of {', '.join(RECOMPUTE_MODES)}", recompute)
    _check(attention_kernel in ATTENTION_KERNELS, source, "memory.attention",
           f"one of {', '.join(ATTENTION_KERNELS)}", attention_kernel)
    for name, dt in (("grad_dtype", grad_dtype), ("param_dtype", param_dtype)):
        _check(dt is None or dt in DTYPE_BYTES, source, f"memory.{name}",
               f"one of {', '.join(DTYPE_BYTES)}", dt)
    _check(spec.heads % tp == 0, source, "parallel.tp",
           f"a divisor of the model's heads ({spec.heads})", tp)
    _check(pp <= spec.layers, source, "parallel.pp", f"at most layers ({spec.layers})", pp)
    if spec.moe:
        _check(spec.n_experts % ep == 0, source, "parallel.ep",
               f"a divisor of n_experts ({spec.n_experts})", ep)
        _check((tp * cp * dp) % (ep * etp) == 0, source, "parallel.ep",
               f"etp·ep (etp={etp}) to divide tp·cp·dp ({tp * cp * dp}) (expert data "
               "parallel = tp·cp·dp/(etp·ep))", ep)
        _check(spec.expert_ffn % etp == 0, source, "parallel.etp",
               f"a divisor of the expert FFN width ({spec.expert_ffn})", etp)
    _check(0 <= stage < pp, source, "parallel.stage", f"0 <= stage < pp ({pp})", stage)
    _check(micro_batch_tokens >= 1 and seq_len >= 1, source, "micro_batch_tokens",
           "micro_batch_tokens >= 1 and seq_len >= 1", (micro_batch_tokens, seq_len))
    edp = max(tp * cp * dp // (ep * etp), 1)
    dpc = dp * cp                                       # dense gradients reduce over DP x CP
    stage_layers = list(split_layers(spec.layers, pp)[stage] if layers is None else layers)
    first, last = stage == 0, stage == pp - 1

    dense, expert = rank_params(spec, stage_layers, tp=tp, ep=ep, first=first, last=last,
                                etp=etp)
    w_bytes = spec.weight_bytes if param_dtype is None else DTYPE_BYTES[param_dtype]
    weights = w_bytes * (dense / dpc + expert / edp if zero >= 3 else dense + expert)
    grads = DTYPE_BYTES[grad_dtype] * (dense / dpc + expert / edp if zero >= 2 else dense + expert)
    optim = OPTIMIZER_BYTES * (dense / dpc + expert / edp if zero >= 1 else dense + expert)

    moe_layers = [i for i in stage_layers if spec.is_moe_layer(i)]
    micro_batch_tokens = -(-micro_batch_tokens // cp)  # this rank's share of the sequence
    sent = -(-micro_batch_tokens // tp) * spec.top_k  # assignments this rank dispatches
    if received_tokens is None:
        received = [float(sent)] * len(moe_layers)
    elif isinstance(received_tokens, int | float):
        received = [float(received_tokens)] * len(moe_layers)
    else:
        received = [float(r) for r in received_tokens]
        _check(len(received) == len(moe_layers), source, "received_tokens",
               f"one count per MoE layer of the stage ({len(moe_layers)})", len(received))
    recv_of = dict(zip(moe_layers, received, strict=True))

    def act(i: int, mode: str) -> float:
        return layer_activation_bytes(spec, i, micro_batch_tokens, seq_len, tp, mode,
                                      recv_of.get(i, 0.0), sequence_parallel, etp,
                                      attention_kernel)

    per_mb = sum(act(i, recompute) for i in stage_layers)
    t_h = micro_batch_tokens * spec.hidden / tp
    if first:
        per_mb += ACT_BYTES * t_h                      # embedding output
    if last:
        # final norm input (2·T·h/t) and fp32 logits for the loss (4·T·V/t)
        per_mb += ACT_BYTES * t_h + 4 * micro_batch_tokens * spec.vocab / tp
    workspace = 0.0
    if recompute == "full" and stage_layers:
        workspace = max(act(i, "none") for i in stage_layers)
    buffers = 0.0
    if moe_layers:
        h = spec.hidden
        buffers = max(
            (sent + r) * h * dispatch_bytes_per_elem + (sent + r) * h * ACT_BYTES
            for r in received
        )
    if capacity_bytes is None:
        capacity_bytes = device.hbm_bytes if device is not None else float("inf")
    return MemoryBreakdown(
        weights=weights, gradients=grads, optimizer=optim,
        activations=per_mb * inflight_microbatches, token_buffers=buffers,
        recompute_workspace=workspace, capacity_bytes=float(capacity_bytes),
        dense_params=dense, expert_params=expert,
    )
