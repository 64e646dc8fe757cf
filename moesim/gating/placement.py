"""Placement of experts on expert-parallel (EP) ranks, with optional replicas.

Default (Megatron-Core): expert e lives on EP rank ``e // (E / ep)``. A replicated
expert also lives on the extra ranks listed for it; tokens routed to it are split
between its holders by one of two documented rules:

* ``even``: each source rank splits its n tokens for the expert as evenly as
  integers allow: every holder gets n // R, and the n % R leftovers go to the
  holders at positions (src + j) mod R, j = 0 .. n % R - 1 (holders in the order
  home first, then the listed ranks). Rotating by source keeps the totals even.
* ``nearest``: a source that holds the expert keeps all its tokens; otherwise it
  splits them evenly (as above) among the holders on its own node; otherwise among
  all holders. Nodes are ``ep_rank // ranks_per_node``; without ranks_per_node
  this is the same as ``even`` except for holders' own tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from moesim.errors import InputError
from moesim.gating.config import REPLICA_SPLITS, ReplicaSpec


@dataclass(frozen=True)
class Placement:
    """``holders[e]``: EP ranks holding expert e, home rank first."""

    n_experts: int
    ep: int
    holders: tuple[tuple[int, ...], ...]
    split: str = "even"

    @cached_property
    def home(self) -> np.ndarray:
        """EP rank of each expert's home (read-only; computed once)."""
        out = np.array([h[0] for h in self.holders], dtype=np.int64)
        out.setflags(write=False)
        return out

    @cached_property
    def replicated(self) -> tuple[int, ...]:
        return tuple(e for e, h in enumerate(self.holders) if len(h) > 1)

    @cached_property
    def _by_home(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(experts sorted by home rank, stably; the ranks; first position of each)."""
        by_home = np.argsort(self.home, kind="stable")
        ranks, first = np.unique(self.home[by_home], return_index=True)
        return by_home, ranks, first

    @cached_property
    def _blocks(self) -> int:
        """Experts per rank when expert e's only holder is rank e // that (the default
        placement without replicas), else 0."""
        per = self.n_experts // self.ep
        ok = (not self.replicated and per * self.ep == self.n_experts
              and np.array_equal(self.home, np.arange(self.n_experts) // per))
        return per if ok else 0

    def layer(self, j: int) -> Placement:
        """The placement of MoE layer ``j``: the same for every layer (an EPLB placement,
        :class:`moesim.gating.eplb_placement.LayerPlacements`, has one per layer)."""
        return self

    def experts_on(self, rank: int) -> tuple[int, ...]:
        """Experts whose weights live on EP rank ``rank`` (home or replica)."""
        return tuple(e for e, h in enumerate(self.holders) if rank in h)

    def node_of_expert(self, ranks_per_node: int) -> np.ndarray:
        """Node of each expert's home rank (used by node-limited routing)."""
        return self.home // ranks_per_node

    def split_counts(self, kept: np.ndarray, ranks_per_node: int | None,
                     sums: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Send ``kept`` (src EP rank × expert) tokens to the holders.

        Returns ``dispatch`` (src × dst EP rank) and ``rank_expert`` (dst EP rank ×
        expert): the tokens each rank computes for each expert. Every kept token
        lands exactly once: dispatch.sum(1) == kept.sum(1) and
        rank_expert.sum(0) == kept.sum(0). ``sums``: ``kept.sum(axis=0)`` when the
        caller has it.
        """
        s_, e_ = kept.shape
        home = self.home
        rep = self.replicated
        per = self._blocks
        if per and e_ == self.n_experts and kept.dtype == np.int64:   # whole numbers: sums
            if per == 1:
                dispatch = kept.copy()
            elif per <= 8:        # each rank's columns added slice by slice
                dispatch = kept[:, 0::per] + kept[:, 1::per]
                for j in range(2, per):
                    dispatch += kept[:, j::per]
            else:
                dispatch = np.add.reduceat(kept, np.arange(0, e_, per), axis=1)
            rank_expert = np.zeros((self.ep, e_), dtype=np.int64)
            rank_expert[home, np.arange(e_)] = kept.sum(axis=0) if sums is None else sums
            return dispatch, rank_expert
        plain = kept.copy()
        plain[:, list(rep)] = 0
        # sum the columns of each destination rank (experts grouped by home rank)
        by_home, ranks, first = self._by_home
        dispatch = np.zeros((s_, self.ep), dtype=np.int64)
        dispatch[:, ranks] = np.add.reduceat(plain[:, by_home], first, axis=1)
        rank_expert = np.zeros((self.ep, e_), dtype=np.int64)
        rank_expert[home, np.arange(e_)] = plain.sum(axis=0)
        for e in rep:
            share = self._split_one(kept[:, e], self.holders[e], ranks_per_node)  # (S, R)
            for j, r in enumerate(self.holders[e]):
                dispatch[:, r] += share[:, j]
                rank_expert[r, e] += int(share[:, j].sum())
        return dispatch, rank_expert

    def _split_one(self, n: np.ndarray, holders: tuple[int, ...],
                   ranks_per_node: int | None) -> np.ndarray:
        s_ = n.shape[0]
        if self.split != "nearest":     # holder p gets one more iff (p - src) mod R < n % R
            r = len(holders)
            base, extra = np.divmod(np.asarray(n, dtype=np.int64), r)
            off = (np.arange(r)[None, :] - np.arange(s_)[:, None]) % r
            return base[:, None] + (off < extra[:, None])
        out = np.zeros((s_, len(holders)), dtype=np.int64)
        hold = np.asarray(holders)
        for src in range(s_):
            if self.split == "nearest":
                if src in holders:
                    out[src, holders.index(src)] = n[src]
                    continue
                cand = np.arange(len(holders))
                if ranks_per_node:
                    near = np.flatnonzero(hold // ranks_per_node == src // ranks_per_node)
                    if near.size:
                        cand = near
            else:
                cand = np.arange(len(holders))
            r = cand.size
            base, extra = divmod(int(n[src]), r)
            out[src, cand] = base
            for j in range(extra):
                out[src, cand[(src + j) % r]] += 1
        return out


def make_placement(n_experts: int, ep: int, replicate: Sequence[ReplicaSpec] = (),
                   split: str = "even", source: str = "routing") -> Placement:
    """Contiguous placement (expert e on EP rank e // (E/ep)) plus replicas."""
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise InputError(source, "parallel.ep", "an integer >= 1", ep)
    if n_experts < 1 or n_experts % ep != 0:
        raise InputError(source, "parallel.ep",
                         f"a divisor of the number of experts ({n_experts}), or with "
                         "routing.placement EPLB of the experts + its redundant copies", ep)
    if split not in REPLICA_SPLITS:
        raise InputError(source, "routing.replica_split", "one of " + ", ".join(REPLICA_SPLITS),
                         split)
    per = n_experts // ep
    holders = [[e // per] for e in range(n_experts)]
    for spec in replicate:
        if spec.expert >= n_experts:
            raise InputError(source, "routing.replicate.expert", f"an expert id < {n_experts}",
                             spec.expert)
        for r in spec.ranks:
            if r >= ep:
                raise InputError(source, "routing.replicate.ranks", f"EP ranks < ep = {ep}", r)
            if r in holders[spec.expert]:
                raise InputError(source, "routing.replicate.ranks",
                                 f"ranks other than expert {spec.expert}'s home rank", r)
            holders[spec.expert].append(r)
    return Placement(n_experts=n_experts, ep=ep, holders=tuple(tuple(h) for h in holders),
                     split=split)
