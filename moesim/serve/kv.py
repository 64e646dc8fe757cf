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
- Sliding-window layers (``model.window``, ``window_full_every``; :mod:`moesim.model.window`)
  keep the last ``min(context, window)`` tokens, full layers the whole context
  (:func:`kv_bytes_per_request`). vLLM's sliding-window KV manager frees the blocks that
  left the window (vllm-project/vllm 002f349, vllm/v1/core/single_type_kv_cache_manager.py
  ``SlidingWindowManager.remove_skipped_blocks``: the tokens before ``computed - window +
  1``). Attention sinks (GPT-OSS, ``model.attention_sinks``) are a learned logit per head
  (openai/gpt-oss, gpt_oss/torch/model.py ``sdpa``: ``S`` joins the scores before the
  softmax), not cached tokens: they add no KV bytes.
"""

from __future__ import annotations

from moesim.model import window
from moesim.model.spec import ModelSpec


def kv_values_per_token_layer(spec: ModelSpec, tp: int = 1) -> int:
    """Cached values per token per layer on one rank of a TP group of ``tp``."""
    if spec.attention == "mla":
        return spec.kv_lora_rank + spec.qk_rope_dim
    return 2 * max(spec.kv_heads // tp, 1) * spec.head_dim


def kv_bytes_per_token(spec: ModelSpec, elem_bytes: int = 2, tp: int = 1) -> int:
    """KV-cache bytes per token over all layers on one rank (``tp`` = 1: the model)."""
    return spec.layers * kv_values_per_token_layer(spec, tp) * elem_bytes


def kv_bytes_per_request(spec: ModelSpec, context: int, elem_bytes: int = 2,
                         tp: int = 1) -> int:
    """KV-cache bytes of one request with ``context`` tokens on one rank: each layer's
    values per token × the tokens it keeps (a windowed layer ``min(context, window)``)."""
    per = kv_values_per_token_layer(spec, tp) * elem_bytes
    return per * sum(window.kv_tokens(spec, layer, context) for layer in range(spec.layers))
