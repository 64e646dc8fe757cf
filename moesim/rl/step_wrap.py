"""A rollout engine's step costs with something added: the base of the wrappers the
``rl.rollout`` knobs put around :class:`moesim.traffic.step_costs.StepCosts`
(:mod:`moesim.rl.sampler_v1`, :mod:`moesim.rl.executor`, :mod:`moesim.rl.prefix_cache`,
:mod:`moesim.rl.worker_post`).

A wrapper holds the costs it wraps as ``inner``, adds :meth:`StepCostsWrapper.
extra_prefill_s` and :meth:`StepCostsWrapper.extra_decode_s` to each step (nothing by
default), and answers everything else the generation reads from the engine's costs
(their surface's fields, a wrapper's own attributes further in) from ``inner``.
"""

from __future__ import annotations

import numpy as np


class StepCostsWrapper:
    """Step costs ``inner`` with :meth:`extra_prefill_s` and :meth:`extra_decode_s`
    added to its prefill and decode steps; a subclass sets ``self.inner``."""

    def extra_prefill_s(self, tokens: int, prompts: int) -> float:
        """Seconds added to a prefill step of ``tokens`` tokens over ``prompts``."""
        return 0.0

    def extra_decode_s(self, batch: int) -> float:
        """Seconds added to a decode step of ``batch`` sequences."""
        return 0.0

    def prefill_s(self, tokens: int, prompts: int) -> float:
        return self.inner.prefill_s(tokens, prompts) + self.extra_prefill_s(tokens, prompts)

    def decode_s(self, batch: int, context: int) -> float:
        return self.inner.decode_s(batch, context) + self.extra_decode_s(batch)

    def decode_s_many(self, batch: int, contexts):
        """``decode_s(batch, c)`` for each of ``contexts``."""
        many = getattr(self.inner, "decode_s_many", None)
        if many is None:
            return [self.decode_s(batch, c) for c in contexts]
        return np.asarray(many(batch, contexts)) + self.extra_decode_s(batch)

    def __getattr__(self, name):
        if name == "inner":                      # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)
