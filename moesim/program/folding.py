"""The step's folded-parallelism transfers: TP, SP, CP and ETP collectives (pure).

Megatron-Core's layouts (megatron/core/parallel_state.py; docs/scenarios.md "Parallel
folding"): the TP all-reduce, or with sequence parallelism its reduce-scatter +
all-gather; context parallelism's ring KV exchange beside attention
(:mod:`moesim.program.cp`); expert tensor parallelism's all-gather / reduce-scatter
around the expert GEMMs (:mod:`moesim.program.etp`). Every one is charged to the
``tp`` category of the breakdown; span names tell them apart (``sp_*``, ``cp_kv``,
``etp_*``).

:class:`FoldedTransfers` takes its inputs explicitly (layout, model, tokens per rank,
the TP / SP / CP / ETP settings, the routing stage for ETP's gathered tokens) and
returns :class:`Transfer` s, the collectives the builder places in a rank's program.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moesim.collectives.communicator import CollectiveSpec
from moesim.program import cp as cpx
from moesim.program import etp as etpx

ACT_BYTES = 2  # bf16 activations on the wire (as moesim.program.build)
FP8_WIRE = 1   # an FP8 element with one per-tensor scale (moesim.model.kernels.tensorwise)


def attn_input_width(spec) -> int:
    """Features per token that sequence parallelism all-gathers in front of a layer's
    attention: the hidden state, or under MLA the latents. Megatron-LM d98e8a6
    ``megatron/core/transformer/multi_latent_attention.py`` runs MLA's down-projections
    on the ``[s/TP]`` shard (``_qkv_down_projection``) and gathers what they make: the
    q latent (``q_lora_rank``) and the kv latent (``kv_lora_rank``) inside the
    up-projections' column-parallel ``LayerNormColumnParallelLinear`` (Transformer Engine
    d0067d0 ``layernorm_linear.py``: norm, then ``gather_along_first_dim`` of its output
    under ``sequence_parallel``), the shared RoPE key (``qk_pos_emb_head_dim``) with
    ``gather_from_sequence_parallel_region`` (``get_query_key_value_tensors``); without
    a q latent ``linear_q_proj`` gathers the hidden state."""
    if spec.attention != "mla":
        return spec.hidden
    return (spec.q_lora_rank or spec.hidden) + spec.kv_lora_rank + spec.qk_rope_dim


def sp_exchange(spec, tokens: int, layer: int, phase: str, which: str,
                tp_overlap: bool) -> tuple[tuple[str, float], ...]:
    """(collective, bytes) of one sequence-parallel exchange (``which``: after the
    attention, ``"attn"``, or after the MLP, ``"mlp"``), in program order: a reduce-scatter
    of the block's output and an all-gather of the next block's input, an MoE layer only
    the reduce-scatter after attention and the all-gather before the next attention
    (:meth:`FoldedTransfers.tp_reduce`). The all-gather in front of an attention (forward;
    in the backward the reduce-scatter of its gradient, autograd's reverse) carries
    :func:`attn_input_width` features per token, every other one the hidden state."""
    ops = ("reduce_scatter", "all_gather")
    moe = spec.is_moe_layer(layer)
    if moe:
        # with TE's overlap the backward's exchanges are the gradients' own kinds
        swap = phase == "bwd" and tp_overlap    # (tp_overlap)
        ops = ops[:1] if (which == "attn") != swap else ops[1:]
    into_attn = "all_gather" if phase == "fwd" else "reduce_scatter"
    return tuple((op, wire_bytes(spec, tokens, op, which == "mlp" and (moe or op == into_attn)))
                 for op in ops)


def quantised_gathers(spec) -> bool:
    """Whether sequence parallelism's all-gathers carry FP8 (:func:`wire_bytes`)."""
    return (getattr(spec, "precision", "bf16") == "fp8"
            and getattr(spec, "fp8_recipe", "blockwise") == "tensorwise")


def wire_bytes(spec, tokens: int, op: str, latent: bool) -> float:
    """Bytes of one sequence-parallel collective for ``tokens`` tokens of the hidden
    state, or with ``latent`` of :func:`attn_input_width`. BF16, except that under
    Transformer Engine's per-tensor current scaling (``compute.fp8_recipe: tensorwise``)
    an all-gather carries the tensor already quantised, one byte per element: TE v2.8
    ``module/linear.py`` and ``layernorm_linear.py`` quantise a column-parallel input
    on the rank's shard and ``gather_along_first_dim`` it with the quantiser, and
    ``module/base.py`` ``grad_output_preprocess`` does the same for a row-parallel
    output's gradient in the backward; MLA's shared RoPE key is gathered outside TE
    (``gather_from_sequence_parallel_region``), in BF16. Reduce-scatters stay BF16."""
    width = attn_input_width(spec) if latent else spec.hidden
    if op != "all_gather" or not quantised_gathers(spec):
        return float(tokens * width * ACT_BYTES)
    rope = spec.qk_rope_dim if latent and spec.attention == "mla" else 0
    return float(tokens * ((width - rope) * FP8_WIRE + rope * ACT_BYTES))


@dataclass(frozen=True)
class Transfer:
    """One collective of a rank's program: span kind and name, the collective, its
    rendezvous key and the bytes this rank sends, on ``stream``."""

    kind: str
    name: str
    spec: CollectiveSpec
    key: tuple
    nbytes: float
    stream: str = "compute"


@dataclass
class FoldedTransfers:
    """TP / SP / CP / ETP collectives of every rank."""

    lay: object                  # moesim.layout Layout: groups tp, cp, etp, ep of a rank
    spec: object                 # moesim.model ModelSpec
    tokens: int                  # per rank per micro-batch (after CP)
    tp: int
    sp: bool                     # sequence parallelism (with tp > 1)
    cp: int
    etp: int
    tp_overlap: bool             # TE's TP overlap (moesim.program.tp_overlap) is on
    routes: object = None        # moesim.program.token_routing.TokenRouting (ETP only)
    _specs: dict = field(default_factory=dict, repr=False)

    def _cached(self, key: tuple, make):
        if key not in self._specs:
            self._specs[key] = make()
        return self._specs[key]

    def tp_reduce(self, rank: int, layer: int, mb: int, phase: str,
                  which: str) -> list[Transfer]:
        """The TP all-reduce after attention / MLP (``which``); with sequence parallelism
        (Megatron-LM arXiv:2205.05198 §4.2.2) a reduce-scatter of the block's output and
        an all-gather of the next block's input instead (same bytes on a ring; under MLA
        the all-gather in front of an attention carries the latents, :func:`sp_exchange`).
        An MoE layer takes sequence-parallel input, so it keeps only the reduce-scatter
        after attention and the all-gather before the next attention."""
        if self.tp <= 1:
            return []
        group = self.lay.group_of(rank, "tp")
        nbytes = float(self.tokens * self.spec.hidden * ACT_BYTES)
        if not self.sp:
            spec = self._cached(("tp", group),
                                lambda: CollectiveSpec("all_reduce", group, nbytes))
            return [Transfer("tp", f"{phase}.tp_{which}", spec,
                             ("tp", which, layer, mb, phase, group[0]), nbytes)]
        return [Transfer("tp", f"{phase}.sp_{which}_{op}",
                         self._cached(("sp", op, group, nb),
                                      lambda o=op, b=nb: CollectiveSpec(o, group, b)),
                         ("sp", op, which, layer, mb, phase, group[0]), nb)
                for op, nb in sp_exchange(self.spec, self.tokens, layer, phase, which,
                                          self.tp_overlap)]

    def cp_kv(self, rank: int, layer: int, mb: int, phase: str) -> Transfer | None:
        """CP's ring KV exchange of a layer's attention, on the ``cp`` stream beside it
        (moesim.program.cp); None without CP."""
        if self.cp <= 1:
            return None
        group = self.lay.group_of(rank, "cp")
        spec = self._cached(("cp", group, phase), lambda: cpx.kv_spec(
            group, self.spec, self.tokens, self.tp, phase))
        return Transfer("tp", f"{phase}.cp_kv", spec, ("cp", layer, mb, phase, group[0]),
                        cpx.kv_exchange_bytes(self.spec, self.tokens, self.tp, self.cp, phase),
                        stream="cp")

    def expert_tokens(self, rank: int, r, pos: int, layer: int, mb: int):
        """(tokens per local expert this rank computes, its ETP group): with ETP > 1 the
        tokens every ETP peer received (same EP position, other EP groups), gathered."""
        local = r.rank_expert_tokens[pos]
        if self.etp <= 1:
            return local, ()
        group = self.lay.group_of(rank, "etp")
        total = np.zeros_like(local)
        for peer in group:
            g = self.lay.group_of(peer, "ep")
            total = total + self.routes.route(g[0], g, layer, mb).rank_expert_tokens[g.index(peer)]
        return total, group

    def etp_transfer(self, group, gathered, layer: int, mb: int, phase: str,
                     which: int) -> Transfer | None:
        """ETP all-gather (which 0, before the experts) or reduce-scatter (1, after);
        None without an ETP group."""
        if len(group) <= 1:
            return None
        n = int(gathered.sum())
        specs = self._cached(("etp", group, layer, mb, phase),
                             lambda: etpx.etp_specs(group, self.spec, n))
        name = ("etp_gather", "etp_scatter")[which]
        return Transfer("tp", f"{phase}.{name}", specs[which],
                        ("etp", which, layer, mb, phase, group[0]), specs[which].nbytes)
