"""The routed experts' pinned seconds on the fast path (``overlap.gemm_sms: left_by_ep``).

With the FP8 GEMMs of a DualPipe step launched on the SMs the EP kernels leave
(:func:`moesim.compute.pinned_sms.step_gemms`), the exact engine does not slow the part
of a compute op those GEMMs take (``Op.pinned_s``) while the EP kernels hold SMs
(:mod:`moesim.engine.exact.execute`). The fast path's records carry the same part of each
rank's expert op, per phase (``RouteRec.exp_p``): the sum over the rank's experts of
each expert's pinned seconds, its kernels as :meth:`moesim.engine.fast.engine.Context.
expert_cost` prices them (the backward's ``B`` and ``W`` parts and the activation
recompute cut from the same list; a rank's later experts under grouped launches with
``Kernel.fused``), memoized per token count.
"""

from __future__ import annotations

import numpy as np

from moesim.program import recipe, recompute


class PinnedExperts:
    """Pinned seconds of one expert's kernels per (token count, phase, fused) for the
    step's context ``ctx`` and its :class:`moesim.compute.pinned_sms.PinnedGemms`
    ``pin``."""

    def __init__(self, ctx, pin) -> None:
        self.ctx, self.pin = ctx, pin
        self._memo: dict[tuple[int, str, bool], float] = {}

    def one(self, x: int, phase: str, fused: bool = False) -> float:
        """Pinned seconds of one expert with ``x`` tokens in ``phase`` (``fwd``, ``bwd``,
        ``bwd.B``, ``bwd.W``, ``act``)."""
        key = (x, phase, fused)
        hit = self._memo.get(key)
        if hit is None:
            ph, _, part = phase.partition(".")
            if phase == "act":
                ph, part = "fwd", "act"
            ks, _ = self.ctx._expert_kernels(x, ph, fused)
            if part == "act":
                ks = recompute.act_kernels(ks)
            elif part:
                ks = recipe.backward_part(ks, part)
            hit = self._memo[key] = self.pin.pinned_s(tuple(ks), memo=False)
        return hit

    def per_rank(self, rows: np.ndarray, vals: np.ndarray, later: np.ndarray | None,
                 phase: str, n: int) -> np.ndarray:
        """(n,) pinned seconds of each rank's expert op: experts at ``rows`` (rank) with
        ``vals`` tokens, ``later`` marking a rank's experts after its first (grouped)."""
        fused = later.tolist() if later is not None else [False] * len(rows)
        p = np.fromiter((self.one(int(x), phase, f) for x, f in
                         zip(vals.tolist(), fused, strict=True)), dtype=float, count=len(rows))
        return np.bincount(rows, weights=p, minlength=n)
