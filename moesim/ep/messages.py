"""Bytes per token message as DeepEP's kernels lay them out (pure).

Sources, all in deepseek-ai/DeepEP (V1 "legacy" kernels, the ones DeepSeek-V3 used):

* normal internode kernels, ``csrc/kernels/legacy/internode.cu``:
  ``get_num_bytes_per_token(hidden_int4, num_scales, num_topk_idx, num_topk_weights)
  = align_up(hidden_bytes + sizeof(SourceMeta) + 4·scales + 4·topk_idx + 4·topk_weights,
  sizeof(int4))``; ``SourceMeta`` is two ints (source node, 8-bit target-GPU mask),
  8 bytes. Dispatch sends scales, top-k indices and top-k weights
  (``get_num_bytes_per_token(hidden_int4, num_scales, num_topk, num_topk)``); combine
  sends only the weights (``get_num_bytes_per_token(hidden_int4, 0, 0, num_topk)``).
  The same packed message crosses RDMA and is forwarded over NVLink.
* normal intranode kernels, ``csrc/kernels/legacy/intranode.cu``: separate channel
  buffers for x, the source index (int), top-k indices (``topk_idx_t``, int64 unless
  ``EP_NUM_TOPK_IDX_BITS`` says otherwise, ``deep_ep/include/deep_ep/common/compiled.cuh``),
  top-k weights (float) and fp8 scales (float per 128 values); combine sends x, the
  source index and the weights.
* low-latency kernels, ``csrc/kernels/legacy/internode_ll.cu``: dispatch
  ``num_bytes_per_msg = sizeof(int4) + (fp8 ? hidden + 4·hidden/128 : 2·hidden)``
  (a 16-byte header holding the source token index); combine sends ``hidden · 2`` bytes
  of bf16 (``num_send_bytes = hidden * sizeof(nv_bfloat16)``).

FP8 dispatch uses one fp32 scale per 128 values (DeepSeek-V3 technical report §3.3;
``x_scales`` of ``hidden / 128`` floats in the kernels).

DeepEP's *tests* count a different, payload-only size when they report bandwidth
(``tests/legacy/test_internode.py``: bf16 ``hidden·2`` times ``fp8_factor =
(1 + 4/128)/2`` for fp8; ``tests/legacy/test_low_latency.py``: ``hidden + hidden/128·4
+ 16`` for fp8, ``hidden·2`` for bf16): :func:`logical_bytes_per_token`.
"""

from __future__ import annotations

import math

from moesim.errors import InputError

DTYPES = ("fp8", "bf16")
#: values per fp32 scale in FP8 dispatch (DeepSeek-V3 report §3.3; internode.cu x_scales)
FP8_BLOCK = 128
SCALE_BYTES = 4            # float scale
INT4_BYTES = 16            # sizeof(int4): message alignment and vector width (CUDA int4)
SOURCE_META_BYTES = 8      # internode.cu: struct SourceMeta { int src_rdma_rank, bits; }
TOPK_IDX_BYTES_NET = 4     # internode.cu packs top-k indices as int in the message
TOPK_IDX_BYTES_INTRA = 8   # intranode.cu buffers of topk_idx_t = int64 (compiled.cuh default)
TOPK_WEIGHT_BYTES = 4      # float
SRC_IDX_BYTES = 4          # intranode.cu channel_src_idx_buffers: int
LL_HEADER_BYTES = 16       # internode_ll.cu: sizeof(int4) header before the payload


def deepep_carries(hidden: int) -> bool:
    """Whether DeepEP's kernels carry tokens of ``hidden`` values (their static asserts:
    ``kHidden % 128 == 0`` in internode_ll.cu)."""
    return hidden >= 1 and hidden % FP8_BLOCK == 0


def deepep_hidden_expected(hidden: int) -> str:
    """What a scenario asking DeepEP for a hidden size it cannot carry should ask for."""
    return (f"for a hidden size that is not a multiple of {FP8_BLOCK} (DeepEP's kernels "
            f"static_assert kHidden % {FP8_BLOCK} == 0; this model's hidden is {hidden})")


def check_message(dtype: str, hidden: int, top_k: int, source: str = "command line",
                  prefix: str = "--") -> None:
    """InputError unless dtype is fp8/bf16, hidden a positive multiple of 128 (the
    kernels' static asserts: ``kHidden % 128 == 0`` in internode_ll.cu) and top_k >= 1."""
    if dtype not in DTYPES:
        raise InputError(source, prefix + "dtype", "one of " + ", ".join(DTYPES), dtype)
    if isinstance(hidden, bool) or not isinstance(hidden, int) or not deepep_carries(hidden):
        raise InputError(source, prefix + "hidden", f"a positive multiple of {FP8_BLOCK}", hidden)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise InputError(source, prefix + "top-k", "an integer >= 1", top_k)


def _check(dtype: str, hidden: int, top_k: int, source: str) -> None:
    check_message(dtype, hidden, top_k, source)


def hidden_bytes(dtype: str, hidden: int) -> int:
    """Payload of one token: fp8 1 B/value + one fp32 scale per 128; bf16 2 B/value."""
    if dtype == "fp8":
        return hidden + SCALE_BYTES * math.ceil(hidden / FP8_BLOCK)
    return 2 * hidden


def _align(n: int, to: int = INT4_BYTES) -> int:
    return -(-n // to) * to


def internode_bytes_per_token(dtype: str, hidden: int, top_k: int, *, combine: bool,
                              source: str = "command line") -> int:
    """Packed message of the normal internode kernels (RDMA and NVLink forwarding).

    H = 7168, top-8: fp8 dispatch align16(7168 + 8 + 224 + 32 + 32) = 7472 B;
    bf16 combine align16(14336 + 8 + 32) = 14384 B."""
    _check(dtype, hidden, top_k, source)
    body = (2 * hidden if dtype == "bf16" else hidden) + SOURCE_META_BYTES
    if combine:
        body += TOPK_WEIGHT_BYTES * top_k
    else:
        if dtype == "fp8":
            body += SCALE_BYTES * math.ceil(hidden / FP8_BLOCK)
        body += (TOPK_IDX_BYTES_NET + TOPK_WEIGHT_BYTES) * top_k
    return _align(body)


def intranode_bytes_per_token(dtype: str, hidden: int, top_k: int, *, combine: bool,
                              source: str = "command line") -> int:
    """Bytes per token of the normal intranode kernels (one node, NVLink only).

    H = 7168, top-8: fp8 dispatch 7392 + 4 + 8·8 + 8·4 = 7492 B; bf16 combine
    14336 + 4 + 32 = 14372 B."""
    _check(dtype, hidden, top_k, source)
    b = hidden_bytes(dtype, hidden) + SRC_IDX_BYTES + TOPK_WEIGHT_BYTES * top_k
    if not combine:
        b += TOPK_IDX_BYTES_INTRA * top_k
    return b


def ll_bytes_per_message(dtype: str, hidden: int, *, combine: bool,
                         source: str = "command line") -> int:
    """One (token, expert) message of the low-latency kernels.

    H = 7168: fp8 dispatch 16 + 7168 + 224 = 7408 B; bf16 combine 14336 B."""
    _check(dtype, hidden, 1, source)
    if combine:
        return 2 * hidden if dtype == "bf16" else hidden_bytes(dtype, hidden)
    return LL_HEADER_BYTES + hidden_bytes(dtype, hidden)


def logical_bytes_per_token(kernel: str, dtype: str, hidden: int) -> float:
    """Bytes per token DeepEP's tests divide by the kernel time (see module docstring).

    normal kernels: bf16 2·H; fp8 2·H·(1 + 4/128)/2 = H·(1 + 1/32) (7392 at H = 7168);
    low-latency: fp8 H + H/128·4 + 16 (7408), bf16 2·H."""
    if dtype == "bf16":
        return 2.0 * hidden
    if kernel == "deepep-ll":
        return hidden + hidden / FP8_BLOCK * SCALE_BYTES + LL_HEADER_BYTES
    return 2.0 * hidden * (1 + SCALE_BYTES / FP8_BLOCK) / 2
