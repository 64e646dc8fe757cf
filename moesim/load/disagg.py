"""Disaggregated prefill and decode pools (DistServe, Zhong et al., OSDI 2024; Splitwise,
Patel et al., ISCA 2024; DeepSeek-V3 report §3.4: prefill and decode deployments apart).

The first ``prefill_groups`` lockstep groups only prefill (continuous batching of prompts,
each prefill sampling the first token); the others only decode. When a prompt's prefill
ends its KV cache moves from the prefill rank's GPUs to a decode rank's (the router's
choice among decode ranks): ``kv_tokens · kv_per_token_bytes`` over the topology route
between the two GPUs, at its bottleneck link's bandwidth, one transfer at a time per
prefill rank (a flow per TP rank in parallel: the bytes are per GPU). The decode rank
admits it when its blocks are free.
"""

from __future__ import annotations

import simpy

from moesim.load.request import Request
from moesim.load.scheduler import Batch, Scheduler
from moesim.load.vllm import ContinuousBatching


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
    """Moves a prefilled request's KV cache to a decode rank over the topology."""

    def __init__(self, sim, kv_bytes_per_token: float, seconds_per_byte) -> None:
        self.sim = sim
        self.bpt = kv_bytes_per_token
        self.spb = seconds_per_byte          # (prefill member, decode member) -> s/byte
        self.links: dict[int, simpy.Resource] = {}
        self.decode_members: list[int] = []
        self.bytes = 0.0
        self.busy_s = 0.0

    def __call__(self, r: Request, src: int) -> None:
        self.sim.env.process(self._move(r, src))

    def _move(self, r: Request, src: int):
        env = self.sim.env
        dst = self.sim.router.pick(self.decode_members)
        res = self.links.setdefault(src, simpy.Resource(env, capacity=1))
        with res.request() as slot:
            yield slot
            nbytes = self.bpt * r.kv_tokens
            dt = nbytes * self.spb(src, dst)
            self.bytes += nbytes
            self.busy_s += dt
            yield env.timeout(dt)
        r.member = dst
        r.prefill_left = 0
        self.sim.members[dst].add(r)
        self.sim.wake(self.sim.group_of[dst])
