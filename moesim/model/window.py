"""Sliding-window attention and attention sinks (pure; docs/model.md, "Attention variants").

Megatron-Core (transformer_config.py ``window_size``, ``window_attn_skip_freq``;
transformer/utils.py ``is_layer_window_attention``, NVIDIA/Megatron-LM d98e8a6): with a
window, layer number n (1-based) uses it unless ``window_attn_skip_freq`` N divides n (one
full-attention layer after N-1 windowed ones). moesim: ``model.window`` W (keys a query
sees, itself included; 0 = none) and ``model.window_full_every`` N (0: every layer
windowed). GPT-OSS alternates 128-token windows with full attention (N = 2); Mistral 7B
windows every layer (W 4096, N 0).

Core-attention work: a causal layer scores s²/2 (query, key) pairs per sequence of s
tokens (moesim.model.costs counts half the score matrix); a window of W scores
∫₀ˢ min(x, W) dx = W·s − W²/2 pairs (s ≥ W), the same s²/2 at W = s. The projections do
not change. :func:`effective_seq` is the sequence length that gives the causal formula
those pairs: 2W − W²/s.

KV cache (serving): a windowed layer keeps the last W tokens' keys and values
(:func:`kv_tokens`), a full layer the whole context.

Attention sinks (``model.attention_sinks``: GPT-OSS's learned per-head sink logit,
Megatron ``softmax_type: learnable``): one more logit per (query, head) in the softmax, one
parameter per head per layer; they keep no tokens.
"""

from __future__ import annotations

from moesim.model.spec import ModelSpec


def is_window_layer(spec: ModelSpec, layer: int) -> bool:
    """Layer ``layer`` (0-based) uses the sliding window (Megatron's 1-based rule)."""
    if spec.window <= 0:
        return False
    n = spec.window_full_every
    return n <= 0 or (layer + 1) % n != 0


def score_pairs(seq_len: int, window: int) -> float:
    """(query, key) pairs a causal sequence of ``seq_len`` scores with ``window`` (0: none)."""
    s = float(seq_len)
    if window <= 0 or window >= s:
        return s * s / 2
    return window * s - window * window / 2


def effective_seq(spec: ModelSpec, layer: int, seq_len: int) -> float:
    """The sequence length that prices layer ``layer``'s core attention: ``seq_len``, or
    2·W − W²/s for a windowed layer (same pairs under the causal formula)."""
    if not is_window_layer(spec, layer) or spec.window >= seq_len:
        return seq_len
    return 2 * score_pairs(seq_len, spec.window) / seq_len


def kv_tokens(spec: ModelSpec, layer: int, context: int) -> int:
    """Tokens whose keys and values layer ``layer`` keeps for a context of ``context``."""
    return min(context, spec.window) if is_window_layer(spec, layer) else context


def kv_bytes(spec: ModelSpec, layer: int, context: int, bytes_per_elem: float = 2.0) -> float:
    """Key and value bytes layer ``layer`` caches for one sequence of ``context`` tokens:
    2·kv_heads·head_dim per token (MLA: the kv_lora_rank + qk_rope_dim latent), over the
    window's tokens on a windowed layer."""
    per_token = (spec.kv_lora_rank + spec.qk_rope_dim if spec.attention == "mla"
                 else 2 * spec.kv_heads * spec.head_dim)
    return per_token * bytes_per_elem * kv_tokens(spec, layer, context)
