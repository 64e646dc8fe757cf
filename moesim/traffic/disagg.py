"""Disaggregated prefill and decode pools (DistServe, Zhong et al., OSDI 2024; Splitwise,
Patel et al., ISCA 2024; DeepSeek-V3 report §3.4: prefill and decode deployments apart).

The first ``prefill_groups`` lockstep groups only prefill (continuous batching of prompts,
each prefill sampling the first token); the others only decode. When a prompt's prefill
ends its KV cache moves from the prefill rank's GPUs to a decode rank's (the router's
choice among decode ranks) as flows on the max-min flow network over the topology
(:class:`moesim.network.FlowNetwork`, the one the exact engine runs): one flow per TP
rank, TP rank i of the prefill rank to TP rank i of the decode rank, each of
``kv_tokens · kv_per_token_bytes`` (the KV model's bytes on one GPU,
:mod:`moesim.serve.memory`; a sliding-window layer's share covers its last
``min(kv_tokens, window)`` tokens, the blocks vLLM still holds). Transfers that are in
flight together share the links they cross max-min (two on one link each get half of it);
a transfer starts as its prefill ends. The network carries the KV transfers only: the
steps' own all-to-alls are inside the step costs. The decode rank admits the request when
its transfer has arrived and its blocks are free.
"""

from __future__ import annotations

from moesim.traffic.request import Request
from moesim.traffic.scheduler import Batch, Scheduler
from moesim.traffic.vllm import ContinuousBatching


class PrefillOnly(ContinuousBatching):
    """Prefill steps only; a request leaves (to the KV transfer) once its first token is
    sampled (or finishes there when it wanted one token)."""

    name = "prefill"

    def plan(self, now: float) -> Batch:
        batch = super().plan(now)
        batch.decode.clear()            # (none are ever running past their prefill)
        return batch

    def finish(self, batch: Batch, now: float, tbt=None) -> list[Request]:
        done = super().finish(batch, now, tbt)
        for r, _ in batch.prefill:
            if not r.done and r.prefill_left == 0:
                self.running.remove(r)
                self.kv.release(r.id)
                done.append(r)          # handed off (not finished)
        return done


class DecodeOnly(Scheduler):
    """Admits requests whose KV arrived, first come first served while the blocks of
    their whole context (prompt + output) are free, reserved at admission (a decode rank
    cannot recompute a prefill, so it never preempts); every step decodes all of them."""

    name = "decode"

    def plan(self, now: float) -> Batch:
        while self.waiting and len(self.running) < self.max_seqs:
            r = self.waiting[0]
            if not self._fits_ever(r, now):
                continue
            if not self.kv.can_grow(r.id, r.prompt + r.output):
                break
            self.waiting.popleft()
            self.kv.grow(r.id, r.prompt + r.output)
            self.running.append(r)
        batch = Batch()
        self._decodes(batch)
        return batch

class KVTransfer:
    """Moves a prefilled request's KV cache to a decode rank as flows over ``links``
    (a topology; None: the hand-over is instant). ``gpus_of[m]``: member m's GPU names,
    in TP order. ``log``: (request id, prefill member, decode member, start s, end s)
    per transfer; ``bytes``: bytes moved (all flows); ``busy_s``: transfer durations
    summed."""

    def __init__(self, sim, kv_bytes_per_token: float, links=None,
                 gpus_of: list[tuple[str, ...]] | None = None,
                 layer_windows: list[int] | None = None) -> None:
        self.sim = sim
        self.bpt = kv_bytes_per_token
        self.windows = layer_windows
        self.gpus_of = gpus_of
        self.net = None
        if links is not None:
            from moesim.network import FlowNetwork
            self.net = FlowNetwork(sim.env, links)
        self.decode_members: list[int] = []
        self.bytes = 0.0
        self.busy_s = 0.0
        self.log: list[tuple[int, int, int, float, float]] = []

    def tokens(self, k: int) -> float:
        """Full-layer tokens of the bytes of a ``k``-token cache (windowed layers keep
        ``min(k, window)``)."""
        w = self.windows
        if not w:
            return k
        return sum(min(k, x) if x else k for x in w) / len(w)

    def __call__(self, r: Request, src: int) -> None:
        self.sim.env.process(self._move(r, src))

    def _move(self, r: Request, src: int):
        env = self.sim.env
        dst = self.sim.router.pick(self.decode_members)
        nbytes = self.bpt * self.tokens(r.kv_tokens)
        t0 = env.now
        if self.net is not None and nbytes > 0:
            flows = [(a, b, nbytes) for a, b in zip(self.gpus_of[src], self.gpus_of[dst],
                                                    strict=True)
                     if a != b]
            if flows:
                self.bytes += nbytes * len(flows)
                yield self.net.transfer_many(flows)
        self.busy_s += env.now - t0
        self.log.append((r.id, src, dst, t0, env.now))
        r.member = dst
        r.prefill_left = 0
        self.sim.members[dst].add(r)
        self.sim.wake(self.sim.group_of[dst])
