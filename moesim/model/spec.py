"""The model description: a frozen dataclass of dimensions, and its YAML loader.

Sizes are counts (layers, heads, features); ``weight_bytes`` is bytes per weight
element. Presets live in :mod:`moesim.model.presets`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from moesim.errors import InputError

ATTENTION_KINDS = ("mha", "gqa", "mla")
PRECISIONS = ("bf16", "fp8")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Dimensions of a decoder-only (MoE) transformer.

    Layer ``i`` (0-based) is an MoE layer when ``n_experts > 0``,
    ``i >= first_dense_layers`` and ``(i - first_dense_layers) % moe_layer_freq ==
    moe_layer_freq - 1``; every other layer has a dense FFN of width ``dense_ffn``.
    """

    name: str = "custom"
    layers: int = 2                 # transformer blocks (MTP/auxiliary heads excluded)
    hidden: int = 512               # model width h (features)
    heads: int = 8                  # query heads a
    kv_heads: int = 8               # key/value heads (== heads for MHA; ignored for MLA)
    head_dim: int = 64              # features per head (MHA/GQA)
    vocab: int = 32000              # vocabulary size V (tokens)
    attention: str = "mha"          # "mha", "gqa" or "mla"
    # Multi-head latent attention (DeepSeek-V2/V3) dims, used only when attention == "mla".
    q_lora_rank: int = 0            # query compression width (0: no query compression)
    kv_lora_rank: int = 0           # key/value compression width
    qk_rope_dim: int = 0            # decoupled RoPE features per head
    qk_nope_dim: int = 0            # non-RoPE query/key features per head
    v_head_dim: int = 0             # value features per head
    dense_ffn: int = 2048           # FFN width of dense layers (features)
    first_dense_layers: int = 0     # leading layers with a dense FFN instead of MoE
    moe_layer_freq: int = 1         # every k-th layer (after the dense ones) is MoE
    n_experts: int = 8              # routed experts per MoE layer (0: dense model)
    top_k: int = 2                  # routed experts per token
    expert_ffn: int = 1024          # FFN width of one routed expert (features)
    n_shared_experts: int = 0       # always-on shared experts per MoE layer
    shared_ffn: int = 0             # FFN width of one shared expert (features)
    gated: bool = True              # SwiGLU (3 matrices) if True, else 2-matrix FFN
    tied_embeddings: bool = False   # LM head shares the embedding matrix
    weight_bytes: int = 2           # bytes per weight element (2 = bf16)
    # GEMM precision of the training recipe, "bf16" or "fp8": set from compute.precision
    # when the scenario is resolved (moesim.model.costs adds the FP8 quantisation kernels)
    precision: str = "bf16"
    # Multi-token prediction depths (DeepSeek-V3 §2.2; Megatron-Core mtp_num_layers): each
    # one more transformer layer (MoE when the last layer is), its embedding projection and
    # norms, and a second output head and loss (moesim.model.mtp)
    mtp_layers: int = 0
    # Sliding-window attention (moesim.model.window): keys a query sees (0: full), and every
    # how many layers one uses full attention (Megatron window_attn_skip_freq; 0: none)
    window: int = 0
    window_full_every: int = 0
    attention_sinks: bool = False   # a learned sink logit per head (GPT-OSS)
    qk_norm: bool = False           # RMSNorm on each query and key head (Qwen3; Megatron qk_layernorm)
    # fused kernel pairs, set from compute.fusion when the scenario is resolved, as
    # precision is (moesim.model.kernels.fusion; not a model field: () = none)
    fusion: tuple[str, ...] = ()
    # kernels of the reference code the base inventory leaves out, set when the scenario
    # is resolved (moesim.model.kernels.reference; not a model field: () = none)
    reference_kernels: tuple[str, ...] = ()
    # the FP8 recipe's quantisation kernels, set from compute.fp8_recipe when the scenario
    # is resolved (moesim.model.kernels.tensorwise; not a model field)
    fp8_recipe: str = "blockwise"

    @property
    def moe(self) -> bool:
        return self.n_experts > 0

    def is_moe_layer(self, i: int) -> bool:
        if i >= self.layers:        # an MTP layer is MoE when the last decoder layer is
            return self.layers > 0 and self.is_moe_layer(self.layers - 1)
        if not self.moe or i < self.first_dense_layers:
            return False
        return (i - self.first_dense_layers) % self.moe_layer_freq == self.moe_layer_freq - 1

    @property
    def blocks(self) -> int:
        """Decoder layers plus MTP layers (indices ``layers`` .. ``blocks - 1``)."""
        return self.layers + self.mtp_layers

    @property
    def n_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices per FFN: 3 for SwiGLU (gate, up, down), 2 otherwise."""
        return 3 if self.gated else 2

    @property
    def q_dim(self) -> int:
        """Query features (all heads) entering attention scores."""
        if self.attention == "mla":
            return self.heads * (self.qk_nope_dim + self.qk_rope_dim)
        return self.heads * self.head_dim


FIELDS = {f.name: f for f in dataclasses.fields(ModelSpec)
          if f.name not in ("fusion", "reference_kernels", "fp8_recipe")}
_TYPES = {"str": str, "int": int, "bool": bool}
#: Largest value of an integer model field (widths, heads, vocabulary: 2^24, far above
#: any published model's) and of ``layers`` (per-layer programs are built and looped
#: over; 1024 is ~17x DeepSeek-V3's 61); docs/scenarios.md, "Size limits".
MAX_DIM = 2**24
MAX_LAYERS = 1024


def check_type(name: str, value: Any, source: str) -> Any:
    kind = _TYPES[str(FIELDS[name].type)]
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(source, f"model.{name}", "an integer", value)
        if value < 0:
            raise InputError(source, f"model.{name}", "an integer >= 0", value)
        top = MAX_LAYERS if name in ("layers", "first_dense_layers", "mtp_layers") else MAX_DIM
        if value > top:
            raise InputError(source, f"model.{name}", f"at most {top:,} (the most this "
                             "simulator runs; docs/scenarios.md, Size limits)", value)
    elif not isinstance(value, kind):
        raise InputError(source, f"model.{name}", f"a {kind.__name__}", value)
    return value


def validate(spec: ModelSpec, source: str) -> ModelSpec:
    """Check cross-field consistency; raise InputError naming the field."""
    def bad(field: str, expected: str, got: Any) -> InputError:
        return InputError(source, f"model.{field}", expected, got)

    for name in ("layers", "hidden", "heads", "vocab", "moe_layer_freq", "weight_bytes"):
        if getattr(spec, name) < 1:
            raise bad(name, "an integer >= 1", getattr(spec, name))
    if spec.precision not in PRECISIONS:
        raise bad("precision", f"one of {', '.join(PRECISIONS)}", spec.precision)
    if spec.attention not in ATTENTION_KINDS:
        raise bad("attention", f"one of {', '.join(ATTENTION_KINDS)}", spec.attention)
    if spec.attention == "mla":
        for name in ("kv_lora_rank", "qk_nope_dim", "v_head_dim"):
            if getattr(spec, name) < 1:
                raise bad(name, "an integer >= 1 for mla attention", getattr(spec, name))
    else:
        if spec.head_dim < 1:
            raise bad("head_dim", "an integer >= 1", spec.head_dim)
        if spec.kv_heads < 1 or spec.heads % spec.kv_heads:
            raise bad("kv_heads", f"a divisor of heads ({spec.heads})", spec.kv_heads)
        if spec.attention == "mha" and spec.kv_heads != spec.heads:
            raise bad("kv_heads", f"equal to heads ({spec.heads}) for mha", spec.kv_heads)
    if spec.first_dense_layers > spec.layers:
        raise bad("first_dense_layers", f"at most layers ({spec.layers})", spec.first_dense_layers)
    if spec.moe:
        if not 1 <= spec.top_k <= spec.n_experts:
            raise bad("top_k", f"between 1 and n_experts ({spec.n_experts})", spec.top_k)
        if spec.expert_ffn < 1:
            raise bad("expert_ffn", "an integer >= 1", spec.expert_ffn)
        if spec.n_shared_experts and spec.shared_ffn < 1:
            raise bad("shared_ffn", "an integer >= 1 when n_shared_experts > 0", spec.shared_ffn)
    if spec.n_moe_layers < spec.layers and spec.dense_ffn < 1:
        raise bad("dense_ffn", "an integer >= 1 (the model has dense layers)", spec.dense_ffn)
    return spec
