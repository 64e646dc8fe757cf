"""Skipping between events: a run of decode steps that nothing changes, priced and
applied in one move with the same results as stepping them one by one.

After a lockstep group has planned a step in which every member only decodes (no
prompt tokens, no preemption), the next steps decode the same requests again as long as
no request finishes, no request arrives, no block boundary finds the cache full and no
weight update interrupts: a policy's :meth:`~moesim.traffic.scheduler.Scheduler.plan` then
returns the same batch (admission stays blocked: free blocks only shrink; the decode set
and its order do not change). :func:`plan_run` finds how many such steps lie ahead
(``K``: up to the first finish, included, and the last step whose blocks still fit) and
prices them: step ``i``'s mean context per member is ``(S + (i - 1)·b) / b`` (``S`` the
summed context at the first step, ``b`` the batch), exactly the float the stepwise loop
computes, and step ends ``T_i = T_(i-1) + d_i`` are accumulated in the same order.
:class:`DecodeRun` applies steps ``a+1..j`` at once: tokens, KV blocks (grown to what the
plans up to the step in flight would hold), times between tokens, the per-step series
rows and the KV peak, each equal to the stepwise loop's (tests/test_load_skip.py).

Something arriving at a member of the group in the middle (an admission, a KV hand-over)
*cuts* the run at the step in flight (:meth:`DecodeRun.cut`); a weight update, or a
``run(until)`` that stops inside it, brings it to the clock (``LoadSim._settle``: the
steps ended so far applied, the step in flight planned).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moesim.traffic.request import Request


def decode_costs(costs, batch: int, ctx: np.ndarray) -> np.ndarray:
    """``costs.decode_s(batch, c)`` for every ``c`` in ``ctx`` (vectorised when the costs
    offer ``decode_s_many``, which must return the same floats)."""
    many = getattr(costs, "decode_s_many", None)
    if many is not None:
        return np.asarray(many(batch, ctx), dtype=float)
    f = costs.decode_s
    return np.array([f(batch, c) for c in ctx.tolist()], dtype=float)


def delay_to(now: float, t: float) -> float:
    """A delay ``d`` with ``now + d == t`` in floating point (simpy adds the delay to
    the clock), so a skipped run ends on the stepwise loop's clock reading."""
    d = t - now
    for _ in range(64):
        s = now + d
        if s == t:
            break
        d = math.nextafter(d, math.inf if s < t else -math.inf)
    return max(d, 0.0)


@dataclass
class _Member:
    sched: object                      # the member's Scheduler
    reqs: list[Request]                # its decode batch, in order
    k0: np.ndarray                     # each one's KV tokens at the first step's plan
    h0: np.ndarray                     # blocks it held after that plan
    gen0: np.ndarray                   # tokens generated before the first step
    base_used: int                     # the member's used blocks after that plan
    ctx: int = 0                       # summed context (prompt + generated) at step 1
    held: np.ndarray = None            # blocks each holds now

    def __post_init__(self) -> None:
        if self.held is None:
            self.held = self.h0.copy()


@dataclass
class DecodeRun:
    batches: list                      # the group's (member, Batch) of the first step
    members: list[_Member]
    T: np.ndarray                      # T[0] the start, T[i] the end of step i (i = 1..K)
    others_kv: float                   # KV fraction of the group's members not decoding
    running0: int
    waiting0: int
    applied: int = 0                   # steps whose tokens are applied
    planned: int = 1                   # steps whose blocks are allocated
    last: int = 0                      # the step the run ends with (K unless cut)
    resume: float = 0.0                # after a weight update: end of the step in flight

    @property
    def K(self) -> int:
        return len(self.T) - 1

    def __post_init__(self) -> None:
        self.last = self.K

    # ------------------------------------------------------------ events in the middle
    def cut(self, t: float, since: float | None) -> int:
        """Something reached the group at time ``t``: the plans made before it stand;
        the run ends with the step in flight. A plan at exactly ``t`` (a step boundary)
        came first when the stepwise loop's event for that boundary was created before
        the waker's (``since``: when the waker's event was created; None: the waker
        came first)."""
        j = int(np.searchsorted(self.T, t, side="left"))   # boundaries before t
        if (1 <= j <= self.K and self.T[j] == t and since is not None
                and since > self.T[j - 1]):
            j += 1
        self.last = min(max(j, 1, self.applied + 1), self.K)
        return self.last

    def in_flight(self, t: float) -> int:
        """The step in flight at ``t`` (steps ending before ``t`` are done)."""
        done = int(np.searchsorted(self.T[1:], t, side="left"))
        return min(done + 1, self.last)

    # ------------------------------------------------------------ applying steps
    def grow(self, planned: int) -> None:
        """Blocks for the plans of steps up to ``planned`` (what ``kv.grow`` of each
        request to its tokens then would add; only the requests that crossed a block
        boundary are touched)."""
        if planned <= self.planned:
            return
        for mb in self.members:
            kv = mb.sched.kv
            bs = kv.block_size
            need = (mb.k0 + (planned + bs - 1)) // bs
            more = np.flatnonzero(need > mb.held)
            if more.size:
                if int((need[more] - mb.held[more]).sum()) > kv.free:
                    raise RuntimeError("KV cache over capacity")
                held = kv.held
                for i in more.tolist():
                    rid = mb.reqs[i].id
                    n = int(need[i])
                    kv.used += n - held.get(rid, 0)
                    held[rid] = n
                mb.held = np.maximum(mb.held, need)
        self.planned = planned

    def kv_fraction(self) -> float:
        """The group's fullest member's used share (after the plans so far)."""
        out = self.others_kv
        for mb in self.members:
            kv = mb.sched.kv
            out = max(out, kv.used / kv.blocks)
        return out

    def used_at(self, mb: _Member, steps: np.ndarray) -> np.ndarray:
        """Used blocks of member ``mb`` once step ``i`` (each of ``steps``) is planned."""
        bs = mb.sched.kv.block_size
        need = (mb.k0[:, None] + steps[None, :] + bs - 1) // bs - mb.h0[:, None]
        return mb.base_used + np.maximum(need, 0).sum(axis=0)


def plan_run(costs, batches, group_scheds, now: float, first_s: float) -> DecodeRun | None:
    """The run of identical decode steps starting with the planned ``batches`` (each
    (member, Batch); ``first_s`` the first step's time), or None when only that step
    can be taken before something changes."""
    if any(group_scheds[m].kv.windowed for m, _ in batches):
        return None                   # windowed KV groups free blocks mid-run: step
    rem = math.inf
    for _, b in batches:              # the next finish first: the cheap bound
        if b.prefill:
            return None
        if b.decode:
            rem = min(rem, min(r.output - r.generated for r in b.decode))
            if rem < 2:
                return None
    members = []
    for m, b in batches:
        if not b.decode:
            continue
        s = group_scheds[m]
        reqs = b.decode
        held = s.kv.held
        a = np.array([(r.kv_tokens, held.get(r.id, 0), r.generated, r.prompt) for r in reqs],
                     dtype=np.int64)
        members.append(_Member(s, reqs, a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy(),
                               s.kv.used, ctx=int((a[:, 3] + a[:, 2]).sum())))
    if not members:
        return None
    K = int(rem)
    for mb in members:
        K = min(K, _kv_steps(mb, K))
        if K < 2:
            return None
    d = None
    for mb in members:
        b = len(mb.reqs)
        S = mb.ctx
        ctx = (np.arange(K, dtype=np.int64) * b + S) / b
        x = decode_costs(costs, b, ctx)
        d = x if d is None else np.maximum(d, x)
    d[0] = first_s
    if not np.all(np.isfinite(d)) or np.any(d[1:] <= 0.0):
        return None
    T = np.cumsum(np.concatenate(([now], d)))      # sequential: T_i = T_(i-1) + d_i
    dec = {id(mb.sched) for mb in members}
    others = [s.kv.used / s.kv.blocks for s in (group_scheds[m] for m, _ in batches)
              if id(s) not in dec]
    return DecodeRun(batches, members, T, max(others, default=0.0),
                     sum(len(group_scheds[m].running) for m, _ in batches),
                     sum(len(group_scheds[m].waiting) for m, _ in batches))


def _kv_steps(mb: _Member, hi: int) -> int:
    """The most steps (<= ``hi``) whose new blocks fit the member's free blocks: request
    r needs its first new block at step ``i_r = h0·bs - k0 + 1`` and one more every
    ``bs`` steps after."""
    kv = mb.sched.kv
    bs = kv.block_size
    first = mb.h0 * bs - mb.k0 + 1
    free = kv.free

    def extra(k: int) -> int:
        x = k - first
        return int(np.where(x >= 0, x // bs + 1, 0).sum())

    if extra(hi) <= free:
        return hi
    lo, up = 1, hi                     # extra(lo) <= free < extra(up)
    while up - lo > 1:
        mid = (lo + up) // 2
        if extra(mid) <= free:
            lo = mid
        else:
            up = mid
    return lo
