"""One request of a run over time, and what happened to it.

A request arrives at ``arrival_s`` with ``prompt`` tokens and leaves when it has generated
``output`` tokens. The prefill step that completes its prompt samples its first token (as
vLLM does); every decode step it takes part in adds one. Preemption by recompute (vLLM's
default) frees its KV cache and queues it again: it then prefills ``prompt + generated``
tokens. ``tag`` is the caller's (e.g. an RL sample's id). Times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class Request:
    id: int
    arrival_s: float
    prompt: int
    output: int
    tag: Any = None
    generated: int = 0                  # output tokens sampled
    prefill_left: int = -1              # tokens to prefill before it decodes (-1: prompt)
    kv_tokens: int = 0                  # tokens in its KV cache
    admitted_s: float | None = None     # first scheduled (queueing ends)
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0
    member: int = -1                    # the attention-DP rank serving it (-1: none yet)
    rejected: bool = False              # could never fit the KV cache (vLLM: ignored)

    @property
    def context(self) -> int:
        """Tokens in its KV cache once the step in flight ends (prompt + generated)."""
        return self.prompt + self.generated

    def __post_init__(self) -> None:
        if self.prefill_left < 0:
            self.prefill_left = self.prompt

    @property
    def to_prefill(self) -> int:
        """Tokens still to prefill before it can decode (the prompt, or after a
        preemption by recompute the prompt and the tokens generated so far)."""
        return self.prefill_left

    @property
    def done(self) -> bool:
        return self.finish_s is not None

    def latency(self) -> dict[str, float | None]:
        """TTFT, TPOT (mean time per output token after the first), e2e, queueing."""
        if self.finish_s is None:
            return {"ttft_s": None, "tpot_s": None, "e2e_s": None, "queue_s": None}
        ttft = self.first_token_s - self.arrival_s
        tpot = ((self.finish_s - self.first_token_s) / (self.generated - 1)
                if self.generated > 1 else 0.0)
        return {"ttft_s": ttft, "tpot_s": tpot, "e2e_s": self.finish_s - self.arrival_s,
                "queue_s": self.admitted_s - self.arrival_s}
