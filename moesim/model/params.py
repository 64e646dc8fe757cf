"""Parameter counting: total, active per token, and by component.

Counts weights only (no biases: Mixtral, DeepSeek-V3 and T5/Switch use none in their
linear layers); norms are RMSNorm with one weight vector of the normalised width.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moesim.model.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class AttentionParams:
    """Attention weights of one layer, split into what TP shards and what it replicates."""

    tp_split: int     # Megatron column/row-parallel projections (sharded over tp)
    replicated: int   # MLA down-projections and their norms (every TP rank holds them)

    @property
    def total(self) -> int:
        return self.tp_split + self.replicated


def attention_params(spec: ModelSpec) -> AttentionParams:
    h = spec.hidden
    if spec.attention == "mla":
        qk = spec.qk_nope_dim + spec.qk_rope_dim
        if spec.q_lora_rank:
            q_down = h * spec.q_lora_rank + spec.q_lora_rank     # W_DQ + q_a norm
            q_up = spec.q_lora_rank * spec.heads * qk            # W_UQ (+ W_QR)
        else:
            q_down, q_up = 0, h * spec.heads * qk
        kv_down = h * (spec.kv_lora_rank + spec.qk_rope_dim) + spec.kv_lora_rank  # + norm
        kv_up = spec.kv_lora_rank * spec.heads * (spec.qk_nope_dim + spec.v_head_dim)
        out = spec.heads * spec.v_head_dim * h
        return AttentionParams(tp_split=q_up + kv_up + out, replicated=q_down + kv_down)
    q = h * spec.heads * spec.head_dim
    kv = 2 * h * spec.kv_heads * spec.head_dim
    out = spec.heads * spec.head_dim * h
    sinks = spec.heads if spec.attention_sinks else 0   # one learned logit per head
    return AttentionParams(tp_split=q + kv + out + sinks, replicated=0)


def ffn_params(spec: ModelSpec, width: int) -> int:
    """One FFN (an expert or a dense MLP) of the given width: 3 or 2 matrices of h x f."""
    return spec.ffn_matrices * spec.hidden * width


def router_params(spec: ModelSpec) -> int:
    return spec.hidden * spec.n_experts


def layer_norm_params(spec: ModelSpec) -> int:
    """Pre-attention and pre-FFN RMSNorm of one layer (MLA's inner norms are in attention)."""
    return 2 * spec.hidden


def embedding_params(spec: ModelSpec) -> int:
    return spec.vocab * spec.hidden


def lm_head_params(spec: ModelSpec) -> int:
    return 0 if spec.tied_embeddings else spec.vocab * spec.hidden


@dataclass(frozen=True, slots=True)
class LayerParams:
    """Parameters of one transformer layer by component."""

    attention: int
    norms: int
    router: int
    routed_experts: int   # all routed experts of the layer
    shared_experts: int
    dense_ffn: int

    @property
    def total(self) -> int:
        return (self.attention + self.norms + self.router + self.routed_experts
                + self.shared_experts + self.dense_ffn)


def layer_params(spec: ModelSpec, i: int) -> LayerParams:
    attn = attention_params(spec).total
    if spec.is_moe_layer(i):
        return LayerParams(
            attention=attn, norms=layer_norm_params(spec), router=router_params(spec),
            routed_experts=spec.n_experts * ffn_params(spec, spec.expert_ffn),
            shared_experts=spec.n_shared_experts * ffn_params(spec, spec.shared_ffn),
            dense_ffn=0,
        )
    return LayerParams(attention=attn, norms=layer_norm_params(spec), router=0,
                       routed_experts=0, shared_experts=0,
                       dense_ffn=ffn_params(spec, spec.dense_ffn))


@dataclass(frozen=True, slots=True)
class ParamCount:
    """Parameter counts (numbers of weights, not bytes)."""

    embedding: int
    attention: int
    router: int
    routed_experts: int
    shared_experts: int
    dense_ffn: int
    norms: int
    lm_head: int
    active: int   # weights one token's forward pass uses (top_k routed experts per layer)

    @property
    def total(self) -> int:
        return (self.embedding + self.attention + self.router + self.routed_experts
                + self.shared_experts + self.dense_ffn + self.norms + self.lm_head)

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def count_params(spec: ModelSpec) -> ParamCount:
    """Count parameters of ``spec``. The active count includes the embedding row lookup's
    matrix and the LM head, as DeepSeek-V3's 37B and Mixtral's 12.9B do."""
    layers = [layer_params(spec, i) for i in range(spec.layers)]
    per_expert = ffn_params(spec, spec.expert_ffn)
    routed = sum(lp.routed_experts for lp in layers)
    active_routed = sum(spec.top_k * per_expert for i in range(spec.layers) if spec.is_moe_layer(i))
    counts = ParamCount(
        embedding=embedding_params(spec),
        attention=sum(lp.attention for lp in layers),
        router=sum(lp.router for lp in layers),
        routed_experts=routed,
        shared_experts=sum(lp.shared_experts for lp in layers),
        dense_ffn=sum(lp.dense_ffn for lp in layers),
        norms=sum(lp.norms for lp in layers) + spec.hidden,   # + final norm
        lm_head=lm_head_params(spec),
        active=0,
    )
    total = counts.total
    return ParamCount(**{**asdict(counts), "active": total - routed + active_routed})
