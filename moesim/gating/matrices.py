"""Dispatch and combine matrices of the expert-parallel all-to-all.

Semantics (Megatron-Core alltoall token dispatcher): a token sent to k experts
travels once per (token, expert) assignment that survived capacity, even when
two of its experts live on the same destination rank; the diagonal (a rank's
tokens for its own experts) is included and carries no network traffic.
DeepEP-style deduplication per destination rank and node is counted per token by
:mod:`moesim.gating.tokens` (used by :mod:`moesim.ep`).

``dispatch_tokens[src, dst]``: token copies EP rank src sends to EP rank dst.
``combine_tokens = dispatch_tokens.T``: the expert outputs coming back.
Byte matrices multiply by the bytes of one token's hidden vector in the dtype of
each direction (:func:`bytes_per_token`).
"""

from __future__ import annotations

import math

import numpy as np

from moesim.errors import InputError

#: bytes per value; fp8 adds one fp32 scale per FP8_BLOCK values
#: (DeepSeek-V3 report: FP8 dispatch with one scale per 128 values, §3.3.2-§3.3.3)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
FP8_BLOCK = 128
FP8_SCALE_BYTES = 4  # fp32 scale


def bytes_per_token(dtype: str, hidden: int, source: str = "routing",
                    field: str = "dtype") -> float:
    """Bytes of one token's hidden vector: bf16 2·h; fp8 h + 4·ceil(h/128)
    (h = 7168: 7168 + 224 = 7392 bytes, docs/sources.md [D])."""
    if dtype not in DTYPE_BYTES:
        raise InputError(source, field, "one of " + ", ".join(DTYPE_BYTES), dtype)
    if isinstance(hidden, bool) or not isinstance(hidden, int | np.integer) or hidden < 1:
        raise InputError(source, "model.hidden", "an integer >= 1", hidden)
    b = DTYPE_BYTES[dtype] * int(hidden)
    if dtype == "fp8":
        b += FP8_SCALE_BYTES * math.ceil(int(hidden) / FP8_BLOCK)
    return float(b)


def byte_matrices(dispatch_tokens: np.ndarray, hidden: int, dispatch_dtype: str,
                  combine_dtype: str, source: str = "routing") -> tuple[np.ndarray, np.ndarray]:
    """(dispatch_bytes, combine_bytes), float64, src × dst of each all-to-all."""
    bd = bytes_per_token(dispatch_dtype, hidden, source, "dispatch_dtype")
    bc = bytes_per_token(combine_dtype, hidden, source, "combine_dtype")
    return byte_matrices_of(dispatch_tokens, bd, bc)


def byte_matrices_of(dispatch_tokens: np.ndarray, bd: float, bc: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`byte_matrices` with the bytes of one token in dispatch ``bd`` and in
    combine ``bc``."""
    d = dispatch_tokens.astype(np.float64)
    return d * bd, d.T * bc
