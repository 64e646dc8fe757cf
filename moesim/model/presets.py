"""Named model presets. Dims from the cited papers and configs (docs/sources.md)."""

from __future__ import annotations

from moesim.model.spec import ModelSpec

# Mixtral 8x7B (Mistral AI, "Mixtral of Experts", arXiv:2401.04088 Table 1,
# and the HF config mistralai/Mixtral-8x7B-v0.1): 32 layers, hidden 4096, 32 heads with
# 8 KV heads of dim 128, vocab 32000, 8 experts top-2, expert FFN 14336 SwiGLU, untied
# embeddings. ~46.7B total, ~12.9B active.
MIXTRAL_8X7B = ModelSpec(
    name="mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
    vocab=32000, attention="gqa", dense_ffn=0, first_dense_layers=0, n_experts=8, top_k=2,
    expert_ffn=14336, gated=True, tied_embeddings=False,
)

# DeepSeek-V3 (DeepSeek-V3 Technical Report arXiv:2412.19437 §2,
# §4.2 and the HF config deepseek-ai/DeepSeek-V3): 61 layers (the 1 MTP layer,
# num_nextn_predict_layers = 1, is excluded: 671B counts the main model), first 3 dense
# with FFN 18432, hidden 7168, 128 heads, MLA with q_lora_rank 1536, kv_lora_rank 512,
# RoPE dim 64, nope dim 128, v head dim 128; 256 routed experts of FFN 2048, top-8,
# 1 shared expert of FFN 2048; vocab 129280, untied embeddings. 671B total, 37B active.
DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3", layers=61, hidden=7168, heads=128, kv_heads=128, head_dim=192,
    vocab=129280, attention="mla", q_lora_rank=1536, kv_lora_rank=512, qk_rope_dim=64,
    qk_nope_dim=128, v_head_dim=128, dense_ffn=18432, first_dense_layers=3, n_experts=256,
    top_k=8, expert_ffn=2048, n_shared_experts=1, shared_ffn=2048, gated=True,
    tied_embeddings=False,
)

# Switch-Base with 128 experts (Fedus, Zoph, Shazeer, "Switch Transformers", JMLR 2022,
# arXiv:2101.03961, Table 9: Switch-Base, 7B parameters, 128 experts, expert every other
# layer, top-1 routing). Variant: the released checkpoint google/switch-base-128 (HF config:
# d_model 768, d_ff 3072 ReLU (2 matrices), 12 heads of d_kv 64, 12 encoder + 12 decoder
# layers, sparse step 2, vocab 32128, tied embeddings). moesim simulates a decoder-only
# stack, so encoder and decoder are flattened into 24 layers, every 2nd one MoE (6 + 6 = 12
# MoE layers, as in the checkpoint); decoder cross-attention (~28M parameters) is omitted.
SWITCH_BASE = ModelSpec(
    name="switch-base", layers=24, hidden=768, heads=12, kv_heads=12, head_dim=64,
    vocab=32128, attention="mha", dense_ffn=3072, first_dense_layers=0, moe_layer_freq=2,
    n_experts=128, top_k=1, expert_ffn=3072, gated=False, tied_embeddings=True,
)

# Qwen3-235B-A22B (Qwen team, the model card's config.json, huggingface.co/Qwen/Qwen3-235B-A22B:
# num_hidden_layers 94, hidden_size 4096, num_attention_heads 64, num_key_value_heads 4,
# head_dim 128, vocab_size 151936, num_experts 128, num_experts_per_tok 8,
# moe_intermediate_size 1536, intermediate_size 12288 (no layer uses it: decoder_sparse_step
# 1, mlp_only_layers []), tie_word_embeddings false, SwiGLU; the same dims as the
# Megatron-LM example examples/post_training/modelopt/conf/Qwen/Qwen3-235B-A22B.sh).
# The per-head QK RMSNorm weights (2 x 128 per layer) are not counted. 235B total, 22B active.
QWEN3_235B_A22B = ModelSpec(
    name="qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128,
    vocab=151936, attention="gqa", dense_ffn=12288, first_dense_layers=0, n_experts=128,
    top_k=8, expert_ffn=1536, gated=True, tied_embeddings=False,
)

# Qwen3-30B-A3B (Qwen team, the model card's config.json, huggingface.co/Qwen/Qwen3-30B-A3B:
# num_hidden_layers 48, hidden_size 2048, num_attention_heads 32, num_key_value_heads 4,
# head_dim 128, vocab_size 151936, num_experts 128, num_experts_per_tok 8,
# moe_intermediate_size 768, intermediate_size 6144 (no layer uses it: decoder_sparse_step
# 1, mlp_only_layers []), tie_word_embeddings false, SwiGLU). 30.5B total, 3.3B active.
QWEN3_30B_A3B = ModelSpec(
    name="qwen3-30b-a3b", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
    vocab=151936, attention="gqa", dense_ffn=6144, first_dense_layers=0, n_experts=128,
    top_k=8, expert_ffn=768, gated=True, tied_embeddings=False,
)

# GPT-OSS-120B (OpenAI, the model card's config.json, huggingface.co/openai/gpt-oss-120b:
# num_hidden_layers 36, hidden_size 2880, num_attention_heads 64, num_key_value_heads 8,
# head_dim 64, vocab_size 201088, num_local_experts 128, num_experts_per_tok 4,
# intermediate_size 2880, sliding_window 128 with layer_types alternating
# sliding_attention / full_attention from the first layer, learned attention sinks,
# tie_word_embeddings false, SwiGLU). Attention and expert biases are not counted.
GPT_OSS_120B = ModelSpec(
    name="gpt-oss-120b", layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64,
    vocab=201088, attention="gqa", dense_ffn=2880, first_dense_layers=0, n_experts=128,
    top_k=4, expert_ffn=2880, gated=True, tied_embeddings=False, window=128,
    window_full_every=2, attention_sinks=True,
)

# Dense models: no experts (n_experts 0, top_k 0), every layer a SwiGLU FFN of dense_ffn,
# GQA with head_dim 128, untied embeddings (tie_word_embeddings false). Dims from each model
# card's config.json (hidden_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, intermediate_size, vocab_size); the published parameter counts
# (the model cards) are checked in tests/test_model_dense.py within 0.5 %.
# Llama 3.1 8B (huggingface.co/meta-llama/Llama-3.1-8B): 32 layers, hidden 4096, 32 heads,
# 8 KV heads, FFN 14336, vocab 128256. 8.03B.
LLAMA_31_8B = ModelSpec(
    name="llama-3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
    vocab=128256, attention="gqa", dense_ffn=14336, first_dense_layers=0, n_experts=0,
    top_k=0, expert_ffn=0, gated=True, tied_embeddings=False,
)
# Llama 3.1 70B (huggingface.co/meta-llama/Llama-3.1-70B): 80 layers, hidden 8192, 64 heads,
# 8 KV heads, FFN 28672, vocab 128256. 70.6B.
LLAMA_31_70B = ModelSpec(
    name="llama-3.1-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
    vocab=128256, attention="gqa", dense_ffn=28672, first_dense_layers=0, n_experts=0,
    top_k=0, expert_ffn=0, gated=True, tied_embeddings=False,
)
# Llama 3.1 405B (huggingface.co/meta-llama/Llama-3.1-405B; Llama 3 paper arXiv:2407.21783
# Table 3): 126 layers, hidden 16384, 128 heads, 8 KV heads, FFN 53248, vocab 128256. 405.9B.
LLAMA_31_405B = ModelSpec(
    name="llama-3.1-405b", layers=126, hidden=16384, heads=128, kv_heads=8, head_dim=128,
    vocab=128256, attention="gqa", dense_ffn=53248, first_dense_layers=0, n_experts=0,
    top_k=0, expert_ffn=0, gated=True, tied_embeddings=False,
)
# Qwen3-32B (huggingface.co/Qwen/Qwen3-32B): 64 layers, hidden 5120, 64 heads, 8 KV heads of
# head_dim 128 (64 x 128 = 8192, wider than hidden), FFN 25600, vocab 151936. The per-head
# QK RMSNorm weights (2 x 128 per layer) are not counted. 32.8B.
QWEN3_32B = ModelSpec(
    name="qwen3-32b", layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128,
    vocab=151936, attention="gqa", dense_ffn=25600, first_dense_layers=0, n_experts=0,
    top_k=0, expert_ffn=0, gated=True, tied_embeddings=False,
)

# Qwen3-0.6B (huggingface.co/Qwen/Qwen3-0.6B config.json): 28 layers, hidden 1024, 16 heads,
# 8 KV heads of head_dim 128, FFN 3072, vocab 151936, tied embeddings. 0.6B.
QWEN3_06B = ModelSpec(
    name="qwen3-0.6b", layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128,
    vocab=151936, attention="gqa", dense_ffn=3072, first_dense_layers=0, n_experts=0,
    top_k=0, expert_ffn=0, gated=True, tied_embeddings=True,
)

# A toy model for fast CPU runs and tests (not a published model): 2 layers, hidden 512,
# 8 heads of 64, 8 experts top-2 with SwiGLU FFN 1024, vocab 32000.
TOY = ModelSpec(
    name="toy", layers=2, hidden=512, heads=8, kv_heads=8, head_dim=64, vocab=32000,
    attention="mha", dense_ffn=2048, n_experts=8, top_k=2, expert_ffn=1024, gated=True,
)

PRESETS: dict[str, ModelSpec] = {
    s.name: s for s in (MIXTRAL_8X7B, DEEPSEEK_V3, SWITCH_BASE, QWEN3_235B_A22B, QWEN3_30B_A3B,
                        GPT_OSS_120B, LLAMA_31_8B, LLAMA_31_70B, LLAMA_31_405B, QWEN3_32B,
                        QWEN3_06B, TOY)
}
