"""KV-cache bytes per token, for the whole model and for one rank.

- MHA/GQA: every layer caches a key and a value vector per KV head:
  ``2 · layers · kv_heads · head_dim · bytes`` per token. With tensor parallelism the KV
  heads are split over the TP group (Megatron-LM, Shoeybi et al. 2019 §3: attention
  heads split over TP); fewer KV heads than TP ranks: each rank keeps one.
- MLA (DeepSeek-V2, arXiv:2405.04434 §2.1.2-§2.1.3; DeepSeek-V3 report §2.1.1): only the
  compressed latent ``c_KV`` (``kv_lora_rank`` values) and the decoupled RoPE key
  (``qk_rope_dim`` values) are cached: ``layers · (kv_lora_rank + qk_rope_dim) · bytes``
  per token. The latent is shared by all heads, so TP does not split it: every rank of a
  TP group caches all of it.
"""

from __future__ import annotations

from moesim.model.spec import ModelSpec


def kv_values_per_token_layer(spec: ModelSpec, tp: int = 1) -> int:
    """Cached values per token per layer on one rank of a TP group of ``tp``."""
    if spec.attention == "mla":
        return spec.kv_lora_rank + spec.qk_rope_dim
    return 2 * max(spec.kv_heads // tp, 1) * spec.head_dim


def kv_bytes_per_token(spec: ModelSpec, elem_bytes: int = 2, tp: int = 1) -> int:
    """KV-cache bytes per token over all layers on one rank (``tp`` = 1: the model)."""
    return spec.layers * kv_values_per_token_layer(spec, tp) * elem_bytes
