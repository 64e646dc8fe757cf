"""What every per-replica scheduler shares: its queue, its running requests, its paged KV
cache, preemption by recompute, and applying a step's progress.

A scheduler serves one attention data-parallel rank (a *member*: one TP group; with
``tp 1`` one GPU). Each step it :meth:`plan`\\ s a :class:`Batch` (prompt tokens to
prefill, requests to decode), growing KV blocks as it goes; the event loop prices the
batch with a :class:`moesim.traffic.step_costs.StepCosts`, waits that long and calls
:meth:`finish`. Policies (one per module) differ only in :meth:`plan`:
:mod:`moesim.traffic.vllm` (continuous batching, prefill first), :mod:`moesim.traffic.sarathi`
(chunked prefill under a token budget), :mod:`moesim.traffic.disagg` (prefill-only and
decode-only pools); each is registered by name, with its fields, in
:mod:`moesim.traffic.schedulers`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

from moesim.scenario.sections.load import MAX_SEQS, TOKEN_BUDGET  # vLLM's defaults
from moesim.traffic.kvcache import BlockManager
from moesim.traffic.request import Request


@dataclass
class Batch:
    prefill: list[tuple[Request, int]] = field(default_factory=list)   # (request, tokens)
    decode: list[Request] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def prefill_tokens(self) -> int:
        return sum(t for _, t in self.prefill)

    def seconds(self, costs) -> float:
        """The step's time: a decode step at the running batch and mean context, a
        prefill step over the prompt tokens, or both in one forward pass (chunked
        prefill): the decode step plus the prefill's tokens beyond an empty step
        (``prefill_s(t, p) - prefill_s(0, 0)``; the weights are read once)."""
        t, p = self.prefill_tokens, len(self.prefill)
        b = len(self.decode)
        if not b:
            return costs.prefill_s(t, p) if t else 0.0
        ctx = sum(r.context for r in self.decode) / b
        d = costs.decode_s(b, ctx)
        if not t:
            return d
        return d + max(0.0, costs.prefill_s(t, p) - costs.prefill_s(0, 0))


class Scheduler(ABC):
    """Shared state and mechanics; subclasses implement :meth:`plan`."""

    def __init__(self, kv: BlockManager, *, max_seqs: int = MAX_SEQS,
                 token_budget: int = TOKEN_BUDGET) -> None:
        self.kv = kv
        self.max_seqs = max_seqs
        self.token_budget = token_budget
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []       # admitted, in order of admission
        self.preempted = 0
        self.rejected: list[Request] = []

    # ------------------------------------------------------------ state
    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    @abstractmethod
    def plan(self, now: float) -> Batch:
        """The next step's batch: each policy module (vllm, sarathi, disagg) says how.
        The event loop skips ahead (:mod:`moesim.traffic.skip`) after a plan that only
        decodes: a policy must then plan the same decodes again as long as nothing
        arrives, finishes or is preempted and the free blocks only shrink (admission
        stays blocked); every policy here does."""

    # ------------------------------------------------------------ mechanics
    def _admit(self, req: Request, now: float) -> None:
        if req.admitted_s is None:
            req.admitted_s = now
        self.running.append(req)

    def _fits_ever(self, r: Request, now: float) -> bool:
        """A request whose prompt alone exceeds the whole cache is refused (vLLM marks it
        FINISHED_IGNORED): it leaves the queue with ``rejected`` set."""
        if self.kv.need(r.prompt + r.output) <= self.kv.blocks:
            return True
        self.waiting.remove(r)
        r.rejected = True
        r.finish_s = now
        self.rejected.append(r)
        return False

    def _requeue(self, r: Request) -> None:
        self.kv.release(r.id)
        r.kv_tokens = 0
        r.prefill_left = r.prompt + r.generated
        r.preemptions += 1
        self.preempted += 1
        self.waiting.appendleft(r)

    def _decodes(self, batch: Batch) -> None:
        """Every running request whose prefill is done decodes one token and needs a
        slot for it. As vLLM's scheduler (``_schedule_running``): requests are served in
        admission order; one that finds no free block preempts, by recompute, the last
        request not yet served this step (or itself when none is left), which goes back
        to the front of the queue with its blocks freed."""
        kv = self.kv
        ready = [r for r in self.running if not r.prefill_left]
        # fast path, the same outcome: every request's next token fits, none preempts
        bs, held = kv.block_size, kv.held
        cross = [r for r in ready if r.kv_tokens >= held.get(r.id, 0) * bs]
        if not kv.windowed and sum(kv.need(r.kv_tokens + 1) - held.get(r.id, 0)
                                   for r in cross) <= kv.free:
            for r in cross:
                kv.grow(r.id, r.kv_tokens + 1)
            batch.decode += ready
            return
        queue = deque(ready)
        while queue:
            r = queue.popleft()
            while not self.kv.can_grow(r.id, r.kv_tokens + 1):
                victim = queue.pop() if queue else r
                self.running.remove(victim)
                self._requeue(victim)
                if victim is r:
                    break
            else:
                self.kv.grow(r.id, r.kv_tokens + 1)
                batch.decode.append(r)

    def finish(self, batch: Batch, now: float, tbt=None) -> list[Request]:
        """Apply a finished step: prefilled tokens; a request whose prefill completed
        samples its first (or, after a recompute, its next) token; every decode adds
        one. ``tbt(gap)`` is called with each time between tokens. Returns the requests
        that finished (their blocks freed)."""
        done = []
        for r, t in batch.prefill:
            r.prefill_left -= t
            r.kv_tokens += t
            if r.prefill_left == 0:
                self._token(r, now, tbt, done)
        for r in batch.decode:
            r.kv_tokens += 1
            self._token(r, now, tbt, done)
        return done

    def _token(self, r: Request, now: float, tbt, done: list) -> None:
        if r.first_token_s is None:
            r.first_token_s = now
        elif tbt is not None:
            tbt(now - r.last_token_s)
        r.last_token_s = now
        r.generated += 1            # its KV is written by the next decode step
        if r.generated >= r.output:
            r.finish_s = now
            self.running.remove(r)
            self.kv.release(r.id)
            done.append(r)

    def remove_all(self) -> list[Request]:
        """Take every request out (an RL weight update interrupts generation): KV freed."""
        out = list(self.running) + list(self.waiting)
        for r in self.running:
            self.kv.release(r.id)
            r.kv_tokens = 0
            r.prefill_left = r.prompt + r.generated
        self.running.clear()
        self.waiting.clear()
        return out
