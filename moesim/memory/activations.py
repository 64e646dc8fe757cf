"""Activations one layer keeps for its backward, tensor by tensor, and what each
recompute choice drops (pure arithmetic, bytes; docs/model.md, "Activations").

The dense transformer layer follows Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", §4.1, Eq. 1-2), written per tensor so that
attention of any width (GQA, MLA) and the MoE layer can be counted by the same rules.
Per token, bf16 (2 bytes) unless said, a = query heads, s = sequence length:

attention block
  ``ln_out``   2h              the input layer norm's output, input of the QKV GEMM
  ``latents``  2(2q_r + 2kv_r + r)  MLA only: the compressed query/key-value vectors
               before and after their norms, the RoPE key part
  ``qkv``      2(q + k + v)    Q, K and V as the core attention saves them (q, k, v: the
               query, key and value widths of all heads: h, h, h for MHA;
               kv_heads·head_dim for GQA's K and V; MLA's up-projected heads)
  ``core``     fused kernel (FlashAttention, arXiv:2205.14135 §3.1 / FlashAttention-2
               arXiv:2307.08691 Algorithm 2; cuDNN/TE fused attention): one fp32
               log-sum-exp per head, 4a; a materialising kernel: the score matrix, softmax
               output 2 + dropout mask 1 + dropout output 2 bytes per score, 5as
  ``proj_in``  2·o             the core output (o = heads·v_head_dim), input of the output GEMM
  ``mask``     h               the attention's output dropout mask (1 byte)
both layer norms' inputs (the residual stream): ``norm_in`` 4h
MLP block: ``mlp_in`` 2h (the second layer norm's output), the FFN's saved tensors, its
output dropout mask h. A dense FFN of width f saves fc1's output and the activation's
output: 2·2f + 2f = 6f gated (SwiGLU: gate and up), 2f + 2f = 4f otherwise. For MHA with
f = 4h, not gated, the layer sums to Korthikanti's 34h + 5as.

MoE block: the router's fp32 probabilities 4E, the shared experts' FFN tensors, and per
routed assignment the permuted input 2h (fc1's input), the expert FFN's tensors and its
fp32 routing probability, 4 bytes. Megatron-Core multiplies the probability inside the
experts' activation (moe/experts.py ``TEGroupedMLP.forward``: ``weighted_bias_swiglu_impl``;
fusions/fused_bias_swiglu.py ``WeightedSwiGLUFunction`` saves fc1's output and the
probabilities) and unpermutes without probabilities (moe/token_dispatcher.py, ``unpermute``
with no ``probs``), so no expert output is kept for the combine's backward
(NVIDIA/Megatron-LM d98e8a6). The dropout mask is per token, after the combine.

Megatron-Core's selective recompute modules (megatron/core/transformer/
transformer_config.py, ``recompute_modules``; NVIDIA/Megatron-LM d98e8a6) drop:
``core_attn`` the core attention's own state (``core``); ``layernorm`` both layer norms'
outputs (``ln_out``, ``mlp_in``; output-discarding checkpoints); ``mla_up_proj`` MLA's
up-projected ``qkv``; ``moe_act`` the routed experts' activation outputs (2f per
assignment); ``mlp`` a dense FFN's tensors; ``shared_experts`` the shared experts'
tensors; ``moe`` everything of the MoE block but its input. Full recompute keeps each
recomputed layer's input, 2h.

FP8 activation caching (``memory.activation_dtype: fp8``; DeepSeek-V3 report,
arXiv:2412.19437 §3.3.2 "Low-Precision Storage"): the inputs the Linear operators save
for their backward are cached in FP8 with one fp32 scale per 1x128 tile (1 + 4/128
bytes per value, §3.3.1 fine-grained quantization): ``ln_out``, MLA's normed latents,
a dense FFN's fc2 input, the expert FFNs' fc2 input and the routed experts' permuted
input. Two exceptions as the report gives them: the output projection's input
(``proj_in``) is cached in DeepSeek's E5M6 (12 bits, 1.5 + 4/128 bytes); the SwiGLU's
input in the MoE (fc1's output, shared and routed experts) is cached in FP8 too (the
output is recomputed: ``moe_act`` drops it for the routed experts). What is not a
Linear's input stays bf16: norm inputs (the residual stream), Q/K/V as the core
attention saves them, the log-sum-exp, a dense FFN's SwiGLU input, and ``mlp_in``, which
also feeds the router, kept in BF16/FP32 (§3.3.1: the gating module stays in its
original precision).
"""

from __future__ import annotations

from moesim.model.spec import ModelSpec

ACT_BYTES = 2         # bf16 activations
LSE_BYTES = 4         # fp32 log-sum-exp per head and query (FlashAttention-2 Algorithm 2)
#: the fp32 routing probability Megatron-Core's weighted SwiGLU saves per routed assignment
#: (fusions/fused_bias_swiglu.py ``WeightedSwiGLUFunction``, d98e8a6)
PROB_BYTES = 4
#: Megatron-Core's default recompute_modules (transformer_config.py __post_init__)
DEFAULT_MODULES = ("core_attn",)
ACTIVATION_DTYPES = ("bf16", "fp8")
#: bytes per cached value under fp8 caching: FP8 / DeepSeek's E5M6, with one fp32 scale
#: per 1x128 tile (DeepSeek-V3 report §3.3.1-3.3.2)
FP8_CACHE = 1 + 4 / 128
E5M6_CACHE = 1.5 + 4 / 128


def attention_widths(spec: ModelSpec) -> tuple[int, int, int, int]:
    """(q, k, v, o): widths of all heads' queries, keys, values and core outputs."""
    if spec.attention == "mla":
        qk = spec.heads * (spec.qk_nope_dim + spec.qk_rope_dim)
        v = spec.heads * spec.v_head_dim
        return qk, qk, v, v
    q = spec.heads * spec.head_dim
    kv = spec.kv_heads * spec.head_dim
    return q, kv, kv, q


def attention_tensors(spec: ModelSpec, seq_len: int, attention_kernel: str = "fused",
                      act_dtype: str = "bf16") -> dict[str, float]:
    """Bytes per token of each tensor the attention block saves (see module docstring)."""
    h = spec.hidden
    q, k, v, o = attention_widths(spec)
    lin, proj = (FP8_CACHE, E5M6_CACHE) if act_dtype == "fp8" else (ACT_BYTES, ACT_BYTES)
    latents = 0.0
    if spec.attention == "mla":     # before their norms (bf16), after (up-projection input)
        latents = (ACT_BYTES * (spec.q_lora_rank + spec.kv_lora_rank + spec.qk_rope_dim)
                   + lin * (spec.q_lora_rank + spec.kv_lora_rank))
    core = (5 * spec.heads * seq_len if attention_kernel == "materialized"
            else LSE_BYTES * spec.heads)
    return {"ln_out": lin * h, "latents": latents, "qkv": ACT_BYTES * (q + k + v),
            "core": core, "proj_in": proj * o, "mask": h}


def ffn_saved_bytes(spec: ModelSpec, width: float, act_dtype: str = "bf16",
                    moe: bool = False) -> float:
    """Bytes per token an FFN of ``width`` saves beyond its input: fc1 output(s) (the
    activation's input) and the activation output (fc2's input), 6f gated, 4f otherwise
    in bf16. FP8 caching: fc2's input in FP8, and in the MoE the activation's input too."""
    fc1_out = width * (2 if spec.gated else 1)
    if act_dtype != "fp8":
        return ACT_BYTES * (fc1_out + width)
    return (FP8_CACHE if moe else ACT_BYTES) * fc1_out + FP8_CACHE * width


def modules_of(recompute: str, modules) -> frozenset[str]:
    """The selective modules in force (Megatron's default ``core_attn`` when None)."""
    if recompute != "selective":
        return frozenset()
    return frozenset(DEFAULT_MODULES if modules is None else modules)


def layer_bytes_per_token(spec: ModelSpec, layer: int, seq_len: int, *,
                          modules: frozenset[str] = frozenset(),
                          attention_kernel: str = "fused",
                          act_dtype: str = "bf16") -> tuple[float, float]:
    """(bytes per token of the layer's TP-split tensors, bytes per routed assignment
    received beyond the expert FFN's own) for layer ``layer`` with the selective
    ``modules`` recomputed and Linear inputs cached in ``act_dtype``."""
    h = spec.hidden
    att = attention_tensors(spec, seq_len, attention_kernel, act_dtype)
    if "core_attn" in modules:
        att["core"] = 0.0
    if "layernorm" in modules:
        att["ln_out"] = 0.0
    if "mla_up_proj" in modules and spec.attention == "mla":
        att["qkv"] = 0.0
    tok = sum(att.values()) + 4 * h + h                  # + both norms' inputs, MLP mask
    mlp_in = 0.0 if "layernorm" in modules else ACT_BYTES * h
    if not spec.is_moe_layer(layer):
        return tok + mlp_in + (0.0 if "mlp" in modules
                               else ffn_saved_bytes(spec, spec.dense_ffn, act_dtype)), 0.0
    if "moe" in modules:                                 # only the MoE block's input
        return tok + ACT_BYTES * h, 0.0
    tok += mlp_in + 4 * spec.n_experts                   # fp32 router probabilities
    if "shared_experts" not in modules:
        tok += ffn_saved_bytes(spec, spec.n_shared_experts * spec.shared_ffn, act_dtype,
                               moe=True)
    lin = FP8_CACHE if act_dtype == "fp8" else ACT_BYTES
    # on the expert's rank: the permuted input and the routing probability the weighted
    # SwiGLU keeps (no expert output is kept for the combine)
    return tok, lin * h + PROB_BYTES


def routed_expert_bytes(spec: ModelSpec, width: float, modules: frozenset[str],
                        act_dtype: str = "bf16") -> float:
    """Bytes one routed assignment's expert FFN (of ``width``, after ETP) saves."""
    saved = ffn_saved_bytes(spec, width, act_dtype, moe=True)
    if "moe_act" in modules:                             # the activation's output
        saved -= (FP8_CACHE if act_dtype == "fp8" else ACT_BYTES) * width
    return saved
