"""What a run over time needs from the step engines: the time of one serving step.

A request-level event loop (continuous batching, RL rollouts) never simulates a step
itself; it asks a :class:`StepCosts`. The engine-backed implementation (a surface over
grid points, interpolated and cached) and :class:`LinearStepCosts`, whose times tests work
out by hand, both implement it. Units: seconds, tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class StepCosts(Protocol):
    def prefill_s(self, tokens: int, prompts: int) -> float:
        """One prefill step over ``tokens`` prompt tokens from ``prompts`` requests."""

    def decode_s(self, batch: int, context: int) -> float:
        """One decode step of ``batch`` running requests whose mean context (prompt +
        generated tokens so far) is ``context`` tokens."""


@dataclass(frozen=True)
class LinearStepCosts:
    """prefill = prefill_base_s + prefill_per_token_s·tokens;
    decode = decode_base_s + decode_per_seq_s·batch + decode_per_ctx_token_s·batch·context.
    For tests and back-of-the-envelope studies (every time is hand-computable)."""

    prefill_base_s: float = 0.0
    prefill_per_token_s: float = 0.0
    decode_base_s: float = 0.0
    decode_per_seq_s: float = 0.0
    decode_per_ctx_token_s: float = 0.0

    def prefill_s(self, tokens: int, prompts: int) -> float:
        return self.prefill_base_s + self.prefill_per_token_s * tokens

    def decode_s(self, batch: int, context: int) -> float:
        return (self.decode_base_s + self.decode_per_seq_s * batch
                + self.decode_per_ctx_token_s * batch * context)

    def decode_s_many(self, batch: int, contexts):
        """``decode_s(batch, c)`` for every ``c`` of ``contexts`` (the same floats)."""
        return (self.decode_base_s + self.decode_per_seq_s * batch
                + self.decode_per_ctx_token_s * batch * np.asarray(contexts, dtype=float))
