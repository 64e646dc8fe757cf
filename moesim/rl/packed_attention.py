"""A packed row's core attention priced per sequence (``rl.train.packed_attention:
per_sequence``; pure).

moesim prices a trainer micro-batch as one packed row of ``seq_len`` tokens
(:mod:`moesim.rl.engine_costs`), so its core attention is one causal sequence of the
row's length: work ∝ ``seq_len²``. The frameworks attend within each packed sequence:

- NeMo RL's Megatron path packs the micro-batch in THD format and hands Transformer
  Engine ``PackedSeqParams(cu_seqlens_q = cu_seqlens_kv = cu_seqlens_padded,
  qkv_format="thd")`` (NVIDIA-NeMo/RL v0.3.0 b1c86a816 ``nemo_rl/models/megatron/
  common.py`` ``_pack_sequences_for_megatron``, lines 93-175): each sequence padded to the
  pad multiple, and with pipeline parallelism the last sequence of a micro-batch padded up
  to ``pad_packed_seq_to``, the rank's longest micro-batch (lines 97-98, 122-123).
- verl's remove-padding path calls ``flash_attn_varlen_func`` with the packed sequences'
  ``cu_seqlens`` (volcengine/verl ``verl/models/transformers/monkey_patch.py``).

A varlen kernel (FlashAttention's ``flash_attn_varlen_func``, Transformer Engine's fused
attention over THD) runs one launch whose tiles stay within each sequence: a row holding
``s_1 .. s_k`` costs the causal work of those ``k`` sequences (∝ ``Σ s_i²``), each at the
rate the kernel catalog gives its own length (shorter sequences run at lower rates: tile
rounding and the causal diagonal's partial tiles are in the published rates by sequence
length).

:class:`PerSequenceCompute` wraps the trainer's compute model: a core-attention kernel
(kinds ``attn_fwd`` / ``attn_bwd``) over the row's length ``S`` is priced as one launch
plus, for each packed sequence ``s``, the same kernel scaled to it: query tokens
``m s / S`` (the row's CP split and rows per kernel kept), FLOPs × ``(s / S)²``, bytes ×
``s / S`` (q, k, v, o and the log-sum-exp are linear in the tokens), at ``seq = s``;
rows are averaged (the engine runs every micro-batch alike). The recomputed core
attention (``recompute.attention``, same shape) is priced the same way. Every other
kernel, and an attention kernel of another length (a sliding-window layer's), is the
wrapped model's. Sequences below the catalog's shortest row fall to the roofline, as any
kernel outside the catalog does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moesim.compute.base import Kernel

#: the core-attention kernel kinds priced per sequence (moesim.model.kernels.attention._core)
ATTN_KINDS = ("attn_fwd", "attn_bwd")


def row_sequences(rows: Any, pp: int = 1) -> tuple[tuple[int, ...], ...] | None:
    """The packed sequences of each row ``rows`` carries (:class:`moesim.rl.packing.
    PackedRows`; None for a bare count). With ``pp > 1`` each row's last sequence is
    padded up to the longest row, as NeMo RL pads every micro-batch to the rank's longest
    bin for Megatron's pipeline (``pad_packed_seq_to``)."""
    members = getattr(rows, "members", None)
    if not members:
        return None
    if pp <= 1:
        return members
    longest = max(sum(m) for m in members)
    return tuple(m[:-1] + (m[-1] + longest - sum(m),) for m in members)


class PerSequenceCompute:
    """``inner`` (a compute model) with core attention over rows of ``seq`` tokens priced
    per packed sequence of ``rows`` (each row's sequence lengths), the mean row's."""

    def __init__(self, inner: Any, seq: int, rows: tuple[tuple[int, ...], ...]) -> None:
        self.inner, self.seq, self.rows = inner, int(seq), rows
        self.name = f"{getattr(inner, 'name', type(inner).__name__)}+per-sequence attention"
        self._memo: dict[Kernel, float] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def applies(self, k: Kernel) -> bool:
        return k.kind in ATTN_KINDS and k.seq == self.seq and k.m > 0

    def time_s(self, kernel: Kernel) -> float:
        if not self.applies(kernel):
            return self.inner.time_s(kernel)
        t = self._memo.get(kernel)
        if t is None:
            t = self._memo[kernel] = self._per_sequence_s(kernel)
        return t

    def price(self, kernel: Kernel):
        """The wrapped model's :meth:`price` with the per-sequence time where it applies."""
        p = self.inner.price(kernel)
        if not self.applies(kernel):
            return p
        return dataclasses.replace(p, time_s=self.time_s(kernel),
                                   detail=f"{p.detail}; per packed sequence")

    def _per_sequence_s(self, k: Kernel) -> float:
        launches = self.inner.time_s(dataclasses.replace(k, flops=0.0, bytes=0.0))
        work = 0.0
        for row in self.rows:
            for s in row:
                work += self.inner.time_s(sequence_kernel(k, s, self.seq))
        return launches + work / len(self.rows)


def sequence_kernel(k: Kernel, s: int, seq: int) -> Kernel:
    """Core-attention kernel ``k`` over rows of ``seq`` tokens scaled to one sequence of
    ``s`` tokens, its launch another's (``fused``: the varlen kernel's one launch)."""
    f = s / seq
    return dataclasses.replace(k, m=max(1, round(k.m * f)), seq=int(s), flops=k.flops * f * f,
                               bytes=k.bytes * f, fused=True)


def per_sequence(res: Any, seq: int, rows: tuple[tuple[int, ...], ...] | None) -> Any:
    """``res`` (a resolved scenario) with its compute model pricing core attention over
    rows of ``seq`` tokens per packed sequence of ``rows``; ``res`` itself for None."""
    if not rows:
        return res
    return dataclasses.replace(res, compute=PerSequenceCompute(res.compute, seq, rows))
