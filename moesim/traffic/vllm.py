"""Continuous batching as vLLM schedules it without chunked prefill (its V0 default
scheduler, vllm/core/scheduler.py ``_schedule_default``).

Each step is either a prefill step or a decode step. Waiting requests are admitted first
come, first served while their prompt's KV blocks are free, the running batch stays under
``max_seqs`` and the step's prompt tokens under ``token_budget`` (a prompt longer than the
budget runs alone); if any was admitted the step prefills them (each samples its first
token). Otherwise every running request decodes one token; one that needs a new block
when none is free preempts by recompute the last running request not yet served in the
step (the most recently admitted), or itself.
"""

from __future__ import annotations

from moesim.traffic.scheduler import Batch, Scheduler


class ContinuousBatching(Scheduler):
    name = "vllm"

    def plan(self, now: float) -> Batch:
        batch = Batch()
        tokens = 0
        while self.waiting and len(self.running) < self.max_seqs:
            r = self.waiting[0]
            if not self._fits_ever(r, now):
                continue
            t = r.to_prefill
            if batch.prefill and tokens + t > self.token_budget:
                break
            if not self.kv.can_grow(r.id, r.kv_tokens + t):
                break
            self.waiting.popleft()
            self.kv.grow(r.id, r.kv_tokens + t)
            self._admit(r, now)
            batch.prefill.append((r, t))
            tokens += t
        if batch.prefill:
            return batch
        self._decodes(batch)
        return batch
