"""Context parallelism: ring attention's KV exchange and per-rank attention (pure).

Megatron-Core splits each sequence over the ``cp`` ranks of a CP group in 2·cp chunks,
rank i holding chunks i and 2·cp-1-i, so every rank does the same share of a causal
mask (``megatron/core/utils.py`` ``get_batch_on_this_cp_rank``); attention runs as a
ring (NVIDIA/TransformerEngine
``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``,
``AttnFuncWithCPAndKVP2P`` and ``flash_attn_p2p_communicate``, "point-to-point
communications of KV and dKV"): in cp-1 steps each rank passes the K and V block it
holds to the next rank of the ring, overlapping the attention of that block. The
backward passes the K and V blocks again plus their gradients dK, dV: twice the
forward's bytes.

Per rank, with T_r = T / cp tokens: the attention scores of its queries against the
keys its causal chunks see are T_r · s / 2 (exactly the causal share,
:func:`moesim.model.costs.attention_kernels` with ``tokens = T_r``: its 1/2 causal
fraction times T_r · s), and every weight GEMM runs on T_r tokens. The exchange is
charged as a ring all-gather of the group's blocks (each rank sends cp-1 blocks to its
ring neighbour, the same flows), on its own stream next to the attention kernel.
"""

from __future__ import annotations

from moesim.collectives.communicator import CollectiveSpec
from moesim.model.spec import ModelSpec

ACT_BYTES = 2  # bf16 K and V on the wire


def kv_block_bytes(spec: ModelSpec, tokens: int, tp: int) -> float:
    """Bytes of K and V of ``tokens`` tokens on one TP rank (one ring step's block)."""
    if spec.attention == "mla":   # K, V after the up-projection, per local head
        per_token = (spec.heads // tp) * (spec.qk_nope_dim + spec.qk_rope_dim
                                          + spec.v_head_dim)
    else:
        per_token = 2 * max(spec.kv_heads // tp, 1) * spec.head_dim
    return float(ACT_BYTES * tokens * per_token)


def kv_exchange_bytes(spec: ModelSpec, tokens: int, tp: int, cp: int, phase: str) -> float:
    """Bytes one rank sends in one layer's ring: cp-1 blocks forward, twice that backward
    (K, V and dK, dV)."""
    if cp <= 1:
        return 0.0
    return (cp - 1) * kv_block_bytes(spec, tokens, tp) * (1 if phase == "fwd" else 2)


def kv_spec(group: tuple[int, ...], spec: ModelSpec, tokens: int, tp: int,
            phase: str) -> CollectiveSpec:
    """The exchange as a ring all-gather: nbytes (nccl-tests sense) = cp blocks."""
    cp = len(group)
    return CollectiveSpec("all_gather", group,
                          cp * kv_exchange_bytes(spec, tokens, tp, cp, phase) / (cp - 1))
