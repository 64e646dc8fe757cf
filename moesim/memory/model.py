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

Activations per layer per micro-batch: :mod:`moesim.memory.activations`, tensor by
tensor (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", Eq. 1-2, generalised to GQA/MLA widths and the MoE block), for this rank's
T tokens (T/cp with context parallelism) split over t = tp with sequence parallelism;
without it (Korthikanti Eq. 1) 10·T·h (layer-norm inputs, attention and MLP inputs, two
dropout masks) stays whole on every TP rank. Routed experts keep their tensors per
*received* assignment (a hot expert's rank holds more); with ETP those of etp·received
assignments (all-gathered over the ETP group) at width expert_ffn/etp.
``attention_kernel``: "fused" (FlashAttention, cuDNN/TE fused attention: an fp32
log-sum-exp per head and query, never the score matrix; the default) or "materialized"
(the 5·a·s·T score matrix). Recomputation: "selective" drops the tensors of the
``modules`` recomputed (Megatron's recompute_modules, default core_attn); "full" keeps
only each layer's input, 2·T·h/t, plus a workspace of one layer's activations while it is
recomputed (Korthikanti §5).

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
from moesim.memory.activations import (
    ACTIVATION_DTYPES,
    layer_bytes_per_token,
    modules_of,
    routed_expert_bytes,
)
from moesim.model.mtp import extra_params as mtp_extra_params
from moesim.model.params import (
    attention_params,
    embedding_params,
    ffn_params,
    layer_norm_params,
    lm_head_params,
    router_params,
)
from moesim.model.spec import ModelSpec
from moesim.scenario.schema import ATTENTION_KERNELS, RECOMPUTE_MODULES
from moesim.schedule.layout_string import split_layers  # noqa: F401  (re-exported)

GRAD_BYTES = 2        # bf16 gradient (ZeRO §3.1: 2 + 2 + 12 = 16 bytes per parameter)
OPTIMIZER_BYTES = 12  # fp32 master weight, Adam m and v
ACT_BYTES = 2         # bf16 activations (moesim.memory.activations)
RECOMPUTE_MODES = ("none", "selective", "full")
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


def rank_params(spec: ModelSpec, layers: Sequence[int], *, tp: int, ep: int,
                first: bool, last: bool, etp: int = 1,
                experts_per_rank: int | None = None) -> tuple[float, float]:
    """(non-expert, expert) parameters one rank of this stage holds before ZeRO-3;
    each expert's matrices split ``etp`` ways (expert tensor parallelism).
    ``experts_per_rank``: routed experts one rank holds per MoE layer, replicas included
    (:func:`moesim.gating.eplb_placement.experts_held`; None: E / ep)."""
    held = spec.n_experts // ep if experts_per_rank is None else experts_per_rank
    attn = attention_params(spec)
    dense = 0.0
    expert = 0.0
    for i in layers:
        dense += attn.tp_split / tp + attn.replicated + layer_norm_params(spec)
        if spec.is_moe_layer(i):
            dense += router_params(spec)
            dense += spec.n_shared_experts * ffn_params(spec, spec.shared_ffn) / tp
            expert += held * ffn_params(spec, spec.expert_ffn) / etp
        else:
            dense += ffn_params(spec, spec.dense_ffn) / tp
    depths = sum(1 for i in layers if i >= spec.layers)
    if depths:   # MTP: projection and norms per depth; the stage builds the embedding
        dense += depths * mtp_extra_params(spec) / tp
        if not first and not (last and spec.tied_embeddings):  # (a tied head is a copy)
            dense += embedding_params(spec) / tp
        if not last:            # its own output head, away from the loss stage
            dense += lm_head_params(spec) / tp
    if first:
        dense += embedding_params(spec) / tp
    if last:
        dense += spec.hidden  # final norm
        # a tied LM head needs its own copy of the embedding when it sits on another stage
        dense += (embedding_params(spec) if spec.tied_embeddings and not first
                  else lm_head_params(spec)) / tp
    return dense, expert


def layer_activation_bytes(spec: ModelSpec, layer: int, tokens: int, seq_len: int, tp: int,
                           recompute: str, received_tokens: float,
                           sequence_parallel: bool = True, etp: int = 1,
                           attention_kernel: str = "fused",
                           modules: Sequence[str] | None = None,
                           act_dtype: str = "bf16") -> float:
    """Bytes one micro-batch of ``tokens`` tokens (this rank's, after CP) leaves alive in
    layer ``layer`` (:mod:`moesim.memory.activations`); ``modules``: the selective
    recompute modules (None: Megatron's default, core_attn)."""
    t_h = tokens * spec.hidden
    if recompute == "full":
        return ACT_BYTES * t_h / (tp if sequence_parallel else 1)
    # Korthikanti Eq. 1: without SP, 10·T·h of the 34·T·h stay whole on every TP rank
    whole = 0.0 if sequence_parallel else 10 * t_h * (1 - 1 / tp)
    mods = modules_of(recompute, modules)
    tok, per_assignment = layer_bytes_per_token(spec, layer, seq_len, modules=mods,
                                                attention_kernel=attention_kernel,
                                                act_dtype=act_dtype)
    total = whole + tokens * tok / tp
    if per_assignment:
        total += received_tokens * etp * (
            per_assignment + routed_expert_bytes(spec, spec.expert_ffn / etp, mods, act_dtype))
    return total


def full_recompute_chunks(n_layers: int, recompute: str, method: str, num_layers: int,
                          ) -> list[range]:
    """Positions (within a stage's layer list) re-run together by full recompute:
    uniform N: every chunk of N consecutive layers; block N: the first N layers, one by
    one (Megatron-Core transformer_block.py ``_checkpointed_forward``)."""
    if recompute != "full" or n_layers == 0:
        return []
    n = max(1, num_layers)
    if method == "block":
        return [range(j, j + 1) for j in range(min(n, n_layers))]
    return [range(j, min(j + n, n_layers)) for j in range(0, n_layers, n)]


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
    recompute_modules: Sequence[str] | None = None, recompute_method: str = "uniform",
    recompute_num_layers: int = 1, activation_dtype: str = "bf16",
    chunk_ends: tuple[bool, bool] | None = None, experts_per_rank: int | None = None,
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
    ``recompute_modules``: selective recompute's modules (None: core_attn);
    ``recompute_method``/``recompute_num_layers`` (full recompute, Megatron-Core
    transformer_block.py ``_checkpointed_forward``): uniform N keeps one input per chunk of
    N layers and re-runs a chunk at a time; block N recomputes the first N layers of the
    stage (of each virtual chunk), the rest keep everything.
    ``grad_dtype``: the stored gradient (bf16; fp32 as Megatron's main_grad with bf16
    training); ``param_dtype``: the stored weight (None: ``spec.weight_bytes``; fp8 for
    Transformer Engine's fp8 primary weights, Megatron ``--fp8-param-gather``);
    ``activation_dtype``: fp8 caches the Linear inputs saved for backward in FP8
    (DeepSeek-V3 §3.3.2; :mod:`moesim.memory.activations`).
    ``chunk_ends``: whether ``layers`` (one virtual chunk of an interleaved stage) hold the
    embedding and the loss, for the activations (None: the first and the last stage, as
    without interleaving); weights follow the stage.
    ``experts_per_rank``: routed experts one rank holds per MoE layer, redundant replicas
    included (EPLB: (E + redundant) / ep); each with its weights, gradients and optimizer
    states like any expert (None: E / ep).
    """
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep), ("dp", dp), ("cp", cp),
                        ("etp", etp),
                        ("inflight_microbatches", inflight_microbatches)):
        _check(isinstance(value, int) and value >= 1, source, f"parallel.{name}",
               "an integer >= 1", value)
    _check(zero in (0, 1, 2, 3), source, "parallel.zero", "0, 1, 2 or 3", zero)
    _check(recompute in RECOMPUTE_MODES, source, "parallel.recompute",
           f"one of {', '.join(RECOMPUTE_MODES)}", recompute)
    _check(recompute_method in ("uniform", "block"), source, "memory.recompute_method",
           "uniform or block", recompute_method)
    _check(isinstance(recompute_num_layers, int) and recompute_num_layers >= 1, source,
           "memory.recompute_num_layers", "an integer >= 1", recompute_num_layers)
    for mod in recompute_modules or ():
        _check(mod in RECOMPUTE_MODULES, source, "memory.recompute_modules",
               f"a list of {', '.join(RECOMPUTE_MODULES)}", mod)
    _check(activation_dtype in ACTIVATION_DTYPES, source, "memory.activation_dtype",
           f"one of {', '.join(ACTIVATION_DTYPES)}", activation_dtype)
    _check(attention_kernel in ATTENTION_KERNELS, source, "memory.attention",
           f"one of {', '.join(ATTENTION_KERNELS)}", attention_kernel)
    for name, dt in (("grad_dtype", grad_dtype), ("param_dtype", param_dtype)):
        _check(dt is None or dt in DTYPE_BYTES, source, f"memory.{name}",
               f"one of {', '.join(DTYPE_BYTES)}", dt)
    _check(spec.heads % tp == 0, source, "parallel.tp",
           f"a divisor of the model's heads ({spec.heads})", tp)
    _check(pp <= spec.layers, source, "parallel.pp", f"at most layers ({spec.layers})", pp)
    if spec.moe:
        # EPLB's slots (experts_per_rank = (E + redundant) / ep) may split where E does not
        _check(spec.n_experts % ep == 0 or experts_per_rank is not None, source,
               "parallel.ep", f"a divisor of n_experts ({spec.n_experts}), or with "
               "routing.placement EPLB of n_experts + its redundant copies", ep)
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
                                etp=etp, experts_per_rank=experts_per_rank)
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
                                      attention_kernel, recompute_modules, activation_dtype)

    chunks = full_recompute_chunks(len(stage_layers), recompute, recompute_method,
                                   recompute_num_layers)
    recomputed = {stage_layers[j] for c in chunks for j in c}
    per_mb = sum(act(i, "none") for i in stage_layers if i not in recomputed) \
        + sum(act(stage_layers[c[0]], "full") for c in chunks) if recompute == "full" \
        else sum(act(i, recompute) for i in stage_layers)
    t_h = micro_batch_tokens * spec.hidden / tp
    emb, loss = (first, last) if chunk_ends is None else chunk_ends
    if emb:
        per_mb += ACT_BYTES * t_h                      # embedding output
    if loss:
        # final norm input (2·T·h/t) and fp32 logits for the loss (4·T·V/t)
        per_mb += ACT_BYTES * t_h + 4 * micro_batch_tokens * spec.vocab / tp
    # MTP depth: enorm and hnorm inputs (2h each), eh_proj input (4h), final norm input
    # (2h), fp32 logits of its own loss (4V) per token
    depths = sum(1 for i in stage_layers if i >= spec.layers)
    per_mb += depths * (10 * t_h + 4 * micro_batch_tokens * spec.vocab / tp)
    workspace = 0.0
    if chunks:
        workspace = max(sum(act(stage_layers[j], "none") for j in c) for c in chunks)
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
