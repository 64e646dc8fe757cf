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
- verl's remove-padding path (``use_remove_padding``) patches transformers'
  ``_flash_attention_forward`` and calls it with the packed row's ``position_ids``
  (volcengine/verl 018ee1404c ``verl/models/transformers/monkey_patch.py``
  ``_ulysses_flash_attention_forward``), from which transformers derives each sequence's
  ``cu_seqlens`` and calls ``flash_attn_varlen_func``.

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
rows are averaged (the engine runs every micro-batch alike). A sequence shorter than the
catalog's shortest row ``s0`` (whose rates the catalog does not hold below it) takes the
price at ``s0`` times the ratio of the causal tiles the kernel visits at ``s`` and at
``s0`` (:func:`causal_tiles`, FlashAttention-3's tiles): a tile costs at least what it
costs at ``s0``, and a short sequence pays for its partial tiles. The recomputed core
attention (``recompute.attention``, same shape) is priced the same way. Every other
kernel, and an attention kernel of another length (a sliding-window layer's), is the
wrapped model's; so is every sequence under a compute model without a catalog.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from moesim.compute.base import Kernel
from moesim.compute.catalog import price as provenance

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
        self._short: dict[tuple, int] = {}

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
        """The wrapped model's price (its provenance where it is a catalog, else its time
        under its name) with the per-sequence time where it applies."""
        p = provenance(self.inner, kernel)
        if not self.applies(kernel):
            return p
        return dataclasses.replace(p, time_s=self.time_s(kernel),
                                   detail=f"{p.detail}; per packed sequence")

    def _per_sequence_s(self, k: Kernel) -> float:
        launches = self.inner.time_s(dataclasses.replace(k, flops=0.0, bytes=0.0))
        work, memo = 0.0, {}
        for row in self.rows:
            for s in row:
                if s not in memo:
                    memo[s] = self._sequence_s(k, s)
                work += memo[s]
        return launches + work / len(self.rows)

    def _sequence_s(self, k: Kernel, s: int) -> float:
        """One sequence's work: the catalog's price at its length, or below the catalog's
        shortest row its price there scaled by the causal tiles (:func:`causal_tiles`)."""
        one = sequence_kernel(k, s, self.seq)
        s0 = self._shortest(k)
        if not s0 or s >= s0 or provenance(self.inner, one).source == "catalog":
            return self.inner.time_s(one)
        bm, bn = TILES[k.kind]
        return (self.inner.time_s(sequence_kernel(k, s0, self.seq))
                * causal_tiles(s, bm, bn, k.causal) / causal_tiles(s0, bm, bn, k.causal))

    def _shortest(self, k: Kernel) -> int:
        """The shortest sequence the wrapped catalog prices ``k`` at (0: no catalog)."""
        key = (k.kind, k.head_dim, k.causal, k.dtype)
        if key not in self._short:
            tables = getattr(self.inner, "tables_for", None)
            axes = sorted({int(r.axis) for t in (tables(k) if tables else ())
                           if t.kind in TABLE_KINDS for r in t.rows})
            self._short[key] = next((a for a in axes if provenance(
                self.inner, sequence_kernel(k, a, self.seq)).source == "catalog"), 0)
        return self._short[key]


#: (query block, key block) of the kernels' tiles: FlashAttention-3 on Hopper, BF16, head
#: dim 128, causal: forward 128 x 128 (Dao-AILab/flash-attention 0251105a
#: hopper/tile_size.h ``tile_size_fwd_sm90``), backward 64 x 128
#: (hopper/flash_bwd_launch_template.h ``run_mha_bwd_hdim128``)
TILES = {"attn_fwd": (128, 128), "attn_bwd": (64, 128)}
#: the catalog's attention table kinds (moesim.compute.catalog_data.ATTN_KINDS)
TABLE_KINDS = ("attn_fwd", "attn_bwd", "attn_fwdbwd")


def causal_tiles(s: int, bm: int, bn: int, causal: bool = True) -> int:
    """Tiles a FlashAttention kernel visits over one sequence of ``s`` tokens: each query
    block ``i`` of ``bm`` rows scores the key blocks of ``bn`` up to its last query
    (``ceil(min(s, (i + 1) bm) / bn)``, FlashAttention's ``n_block_max`` under a causal
    mask), every key block without one."""
    q = -(-s // bm)
    if not causal:
        return q * -(-s // bn)
    return sum(-(-min(s, (i + 1) * bm) // bn) for i in range(q))


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
