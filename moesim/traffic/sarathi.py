"""Chunked prefill under a token budget per step (Sarathi-Serve, Agrawal et al., OSDI
2024, §4: stall-free batching; vLLM's chunked-prefill scheduler does the same).

Each step first decodes one token of every running request whose prefill is done, then
spends what is left of ``token_budget`` on prompt chunks: the partly prefilled requests
first, then waiting requests admitted first come, first served while their chunk's KV
blocks are free. Decodes never wait behind a long prompt; a prompt longer than the
budget takes several steps.
"""

from __future__ import annotations

from moesim.traffic.scheduler import Batch, Scheduler


class ChunkedPrefill(Scheduler):
    name = "sarathi"

    def plan(self, now: float) -> Batch:
        batch = Batch()
        self._decodes(batch)
        budget = self.token_budget - len(batch.decode)
        for r in self.running:
            if budget <= 0:
                break
            if r.to_prefill and r not in batch.decode:
                t = min(r.to_prefill, budget)
                if not self.kv.can_grow(r.id, r.kv_tokens + t):
                    break
                self.kv.grow(r.id, r.kv_tokens + t)
                batch.prefill.append((r, t))
                budget -= t
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            r = self.waiting[0]
            if not self._fits_ever(r, now):
                continue
            t = min(r.to_prefill, budget)
            if not self.kv.can_grow(r.id, r.kv_tokens + t):
                break
            self.waiting.popleft()
            self.kv.grow(r.id, r.kv_tokens + t)
            self._admit(r, now)
            batch.prefill.append((r, t))
            budget -= t
        return batch
