"""Megatron-Core's 1F1B with all-to-all overlap (``overlap.kind: a2a-1f1b``), pure.

Sources (NVIDIA/Megatron-LM): ``megatron/core/pipeline_parallel/schedules.py``
(``get_pp_rank_microbatches``: with ``overlap_moe_expert_parallel_comm`` the
interleaved schedule runs one extra warm-up forward "to ensure the forward and
backward computations are independent in all 1f1b steps"; the steady state calls
``forward_backward_helper_wrapper(f_virtual_microbatch_id=k + warmup,
b_virtual_microbatch_id=k)``), ``pipeline_parallel/combined_1f1b.py`` (without
pipelining: F0, then B(i) with F(i+1), then the last B alone),
``transformer/transformer_config.py`` (PP > 1 needs a virtual pipeline size, EP > 1)
and ``models/common/model_chunk_schedule_plan.py`` (``TransformerLayerSchedulePlan.run``:
the per-layer interleaving of one micro-batch's forward with another's backward).

Two parts: :func:`a2a_1f1b_order` says which forward and backward run together on
each stage; :data:`LAYER_PLAN` and :func:`pair_timeline` say how one forward layer
and one backward layer interleave on the compute and communication streams::

    comm stream:    combine_bwd      | dispatch_fwd, dispatch_bwd    | combine_fwd
    compute stream: attn_fwd         | mlp_bwd, mlp_dw, mlp_fwd      | attn_bwd, attn_dw

(``attn`` is Megatron's ``pre_dispatch_computation``: attention, layernorm, router.)
Inside a chunk pair, forward layer ``i`` pairs with backward layer ``L-1-i``.
The existing static pairing (``overlap.ep_comm_overlap``; ``moesim.program.overlap``)
stays available as ``overlap.kind: static``.
"""

from __future__ import annotations

from dataclasses import dataclass

from moesim.schedule.pipeline import PipeOp, check_interleaved, interleaved_op

#: one stage's items: a single PipeOp, or (forward, backward) run overlapped
Step = tuple[PipeOp, ...]

#: what resolving a scenario with ``overlap.kind: a2a-1f1b`` warns (``moesim run`` and
#: ``moesim memory`` print a scenario's warnings), so the reader of a step sees it where
#: the step is printed. The comparisons are docs/schedules.md's: the
#: three published runs measured with and without Megatron's EP overlap (Megatron-Bridge
#: PR 5094's card, Megatron-Bridge docs/training, Megatron-MoE-ModelZoo's Qwen3-235B-A22B
#: rows) each gained less from it than moesim gives.
TRUST_WARNING = ("overlap.kind a2a-1f1b: the gain from Megatron's EP overlap came out "
                 "larger than measured on all three published runs compared (docs/"
                 "schedules.md, \"How far to trust a2a-1f1b\"): read this step as optimistic")


def a2a_1f1b_order(p: int, m: int, v: int = 1) -> list[list[Step]]:
    """Per stage, the items of Megatron-Core's (interleaved) 1F1B with EP all-to-all
    overlap: warm-up ``2(p-s-1) + (v-1)p + 1`` forwards (capped at ``m v``; the ``+1``
    is the overlap's), then ``(F(k + warm-up), B(k))`` pairs, then the remaining
    backwards. With ``p == 1`` this is ``combined_1f1b_schedule_for_no_pipelining``.
    Micro-batch and chunk of the k-th forward/backward follow the interleaved
    schedule table (needs ``m % p == 0`` when ``v > 1``)."""
    for name, x in (("stages", p), ("microbatches", m), ("virtual chunks", v)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a positive integer, got {x!r}")
    if v > 1:
        check_interleaved(p, m)
    total = m * v

    def op(kind: str, k: int) -> PipeOp:
        return interleaved_op(p, v, kind, k)

    out = []
    for s in range(p):
        warm = min(2 * (p - s - 1) + (v - 1) * p + 1, total)
        steps: list[Step] = [(op("F", k),) for k in range(warm)]
        steps += [(op("F", warm + k), op("B", k)) for k in range(total - warm)]
        steps += [(op("B", k),) for k in range(total - warm, total)]
        out.append(steps)
    return out


def flatten(order: list[list[Step]]) -> list[list[PipeOp]]:
    """The plain per-stage op order (forward before backward inside a pair), e.g. for
    :func:`moesim.schedule.pipeline.inflight_microbatches`."""
    return [[o for st in steps for o in st] for steps in order]


# ---------------------------------------------------------------- one layer pair

@dataclass(frozen=True, slots=True)
class SubStep:
    stream: str      # compute | comm
    role: str        # f (the forward micro-batch) | b (the backward one)
    part: str        # attn | dispatch | mlp | combine | mlp_dw | attn_dw


#: issue order of TransformerLayerSchedulePlan.run with both layers present
#: (ep_overlap_early_attn_memory_release off; the attention weight gradient of the
#: chunk's last backward layer is deferred past the pipeline send, not shown here)
LAYER_PLAN: tuple[SubStep, ...] = (
    SubStep("comm", "b", "combine"),
    SubStep("compute", "f", "attn"),
    SubStep("compute", "b", "mlp"),
    SubStep("comm", "f", "dispatch"),
    SubStep("compute", "b", "mlp_dw"),
    SubStep("comm", "b", "dispatch"),
    SubStep("compute", "f", "mlp"),
    SubStep("comm", "f", "combine"),
    SubStep("compute", "b", "attn"),
    SubStep("compute", "b", "attn_dw"),
)

#: what each part waits for within its own micro-batch (the first part of a layer waits
#: for the last data-carrying part of the previous layer: combine forward, attention
#: input-gradient backward)
_AFTER = {("f", "attn"): None, ("f", "dispatch"): "attn", ("f", "mlp"): "dispatch",
          ("f", "combine"): "mlp", ("b", "combine"): None, ("b", "mlp"): "combine",
          ("b", "mlp_dw"): "mlp", ("b", "dispatch"): "mlp", ("b", "attn"): "dispatch",
          ("b", "attn_dw"): "attn"}
_OUT = {"f": "combine", "b": "attn"}


def pair_timeline(layers: list[dict[tuple[str, str], float]],
                  plan: tuple[SubStep, ...] = LAYER_PLAN) -> tuple[float, list[dict]]:
    """Time (s) of a chunk pair run layer pair by layer pair (``layers[i]``: the
    durations of forward layer i and of the backward layer paired with it,
    ``{(role, part): seconds}``, missing parts take 0, e.g. a dense layer's dispatch)
    and, per layer pair, each sub-step's (start, end). Each stream runs its sub-steps
    in issue order; each sub-step also waits for the part of its own micro-batch it
    reads (:data:`_AFTER`)."""
    free = {"compute": 0.0, "comm": 0.0}
    prev_out = {"f": 0.0, "b": 0.0}
    spans = []
    for t in layers:
        done: dict[tuple[str, str], float] = {}
        when: dict[tuple[str, str], tuple[float, float]] = {}
        for st in plan:
            dep = _AFTER[(st.role, st.part)]
            ready = prev_out[st.role] if dep is None else done[(st.role, dep)]
            start = max(free[st.stream], ready)
            end = start + float(t.get((st.role, st.part), 0.0))
            free[st.stream] = end
            done[(st.role, st.part)] = end
            when[(st.role, st.part)] = (start, end)
        prev_out = {r: done[(r, _OUT[r])] for r in prev_out}
        spans.append(when)
    return max(free.values()), spans


def serial_time(layers: list[dict[tuple[str, str], float]]) -> float:
    """The same layers without overlap: every sub-step one after the other."""
    return float(sum(sum(t.values()) for t in layers))
