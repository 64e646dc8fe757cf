"""Run per-rank op programs on simpy: the only place (with the network model and the
communicator) where simulated time advances.

One simpy process per (rank, stream) walks that stream's ops in order. Compute ops
hold the stream for their duration; collective ops join the run's
:class:`~moesim.collectives.Communicator`; pipeline sends are eager (the flow starts
when the send is issued) and a receive waits for the message's delivery.
Every wait on a late peer becomes a ``stall`` span (collectives) or a ``bubble``
span (pipeline receives) naming the rank waited on and, where it was computing
experts, the expert that made it late.

SM sharing: a communication op holds ``op.sms`` of its GPU's ``sm_total`` SMs from its
issue to its end (an NCCL or DeepEP kernel occupies its blocks while it waits for peers
too); meanwhile a compute op on that GPU progresses at (S - held)/S of its rate, re-rated
whenever a kernel starts or ends. With no op holding SMs, compute ops take exactly their
``duration_s``. The part ``pinned_s`` of a compute op's time (GEMMs priced on the SMs the
communication kernels leave, for the whole step: :mod:`moesim.compute.pinned_sms`) is not
slowed: the op is taken as an even mix of its pinned and other kernels, so one second of
its full-rate work takes ``p + (1 - p)·S/(S - held)`` seconds (``p = pinned_s /
duration_s``) while SMs are held.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import simpy

from moesim.program.ops import Op
from moesim.trace.spans import Span, wait_reason

_EP_KINDS = ("ep_dispatch", "ep_combine")


class Executor:
    """Runs ``programs[rank] -> list[Op]`` once; collects spans."""

    def __init__(self, env: simpy.Environment, network, communicator, gpus: Sequence[str],
                 programs: Sequence[Sequence[Op]], progress=None,
                 mirrors: dict[int, tuple[int, ...]] | None = None, sm_total: int = 0
                 ) -> None:
        self.env = env
        self.net = network
        self.comm = communicator
        self.gpus = list(gpus)
        self.programs = programs
        self.spans: list[Span] = []
        self._messages: dict[tuple, simpy.Event] = {}
        # (rank, layer, microbatch, phase) -> (expert, tokens) of the rank's most loaded expert
        self._hot: dict[tuple[int, int, int, str], tuple[int, int]] = {}
        # per rank: 1 when op i has finished; events only for ops someone waits on
        self.finished: list[bytearray] = []
        self._waiters: list[dict[int, simpy.Event]] = []
        self._progress = progress  # callable(stage, n_ops) or None
        # representative rank -> the ranks it stands for (moesim.program.replicas); a
        # mirror in a collective's group joins it together with its representative
        self.mirrors = mirrors or {}
        self._mirror_cache: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = {}
        self._pending_progress = 0
        # SM sharing: SMs held per rank by communication kernels, and an event per rank
        # that fires when that changes (compute in progress re-rates itself)
        self.sm_total = int(sm_total)
        self._sharing = self.sm_total > 0 and any(op.sms > 0 for prog in programs
                                                  for op in prog)
        self._held = [0] * len(programs)
        self._sm_changed: list[simpy.Event | None] = [None] * len(programs)

    # -- public -----------------------------------------------------------------
    def start(self) -> None:
        env = self.env
        for rank, prog in enumerate(self.programs):
            self.finished.append(bytearray(len(prog)))
            self._waiters.append({})
            streams: dict[str, list[int]] = defaultdict(list)
            for i, op in enumerate(prog):
                streams[op.stream].append(i)
            for idxs in streams.values():
                env.process(self._stream(rank, idxs))

    def run(self) -> float:
        self.start()
        self.env.run()
        if self._progress is not None and self._pending_progress:
            self._progress("ops", self._pending_progress)
            self._pending_progress = 0
        unfinished = [(r, i) for r, fin in enumerate(self.finished) for i, f in enumerate(fin)
                      if not f]
        if unfinished:
            r, i = unfinished[0]
            op = self.programs[r][i]
            raise RuntimeError(
                f"deadlock: {len(unfinished)} ops never ran; first: rank {r} op {i} "
                f"{op.name} (layer {op.layer}, mb {op.microbatch}, key {op.key})")
        return max((s.end_s for s in self.spans), default=0.0)

    # -- internals --------------------------------------------------------------
    def _message(self, key: tuple) -> simpy.Event:
        ev = self._messages.get(key)
        if ev is None:
            ev = self._messages[key] = self.env.event()
        return ev

    def _stream(self, rank: int, idxs: list[int]):
        env = self.env
        prog = self.programs[rank]
        fin = self.finished[rank]
        waiters = self._waiters[rank]
        for i in idxs:
            op = prog[i]
            if op.deps:
                pending = [d for d in op.deps if not fin[d]]
                if pending:
                    evs = []
                    for d in pending:
                        ev = waiters.get(d)
                        if ev is None:
                            ev = waiters[d] = env.event()
                        evs.append(ev)
                    yield evs[0] if len(evs) == 1 else env.all_of(evs)
            t0 = env.now
            if op.sms and self._sharing:
                self._hold(rank, op.sms)
            if op.coll is not None:
                ev = self.comm.join(op.key, rank, op.coll)
                if self.mirrors:
                    mirrored = self._mirrors_in(rank, op.coll.group)
                    if mirrored:   # a group with mirrors runs in full: no extra copies
                        full = getattr(self.net, "full_keys", None)
                        if full is not None:
                            full.add(op.key)
                    for m in mirrored:
                        self.comm.join(op.key, m, op.coll)
                rec = yield ev
                if op.sms and self._sharing:
                    self._hold(rank, -op.sms)
                self._collective_spans(rank, op, t0, rec)
            elif op.send_to >= 0:
                msg = self._message(op.key)
                ev = self.net.transfer(self.gpus[rank], self.gpus[op.send_to], op.nbytes,
                                       key=op.microbatch)
                ev.callbacks.append(lambda _e, m=msg: m.succeed() if not m.triggered else None)
                yield ev
                if op.sms and self._sharing:
                    self._hold(rank, -op.sms)
                self._span(rank, op, "pp", t0, env.now, bytes=op.nbytes, peers=(op.send_to,))
            elif op.recv_from >= 0:
                msg = self._message(op.key)
                if not msg.triggered:
                    yield msg
                if env.now > t0:
                    self._span(rank, op, "bubble", t0, env.now, waited_on=op.recv_from,
                               reason=f"waiting for stage of rank {op.recv_from} ({op.name})")
            else:
                if op.duration_s > 0:
                    if self._sharing:
                        yield from self._shared_compute(rank, op.duration_s, op.pinned_s)
                    else:
                        yield env.timeout(op.duration_s)
                if op.hot_expert >= 0:
                    self._hot[(rank, op.layer, op.microbatch, op.phase)] = (op.hot_expert,
                                                                           op.hot_tokens)
                extra = ({"expert_tokens": dict(zip(op.experts, op.expert_tokens, strict=True))}
                         if op.expert_tokens else {})
                self._span(rank, op, op.kind, t0, env.now, tokens=op.tokens,
                           experts=op.experts, flops=op.flops, args=extra)
            fin[i] = 1
            ev = waiters.pop(i, None)
            if ev is not None:
                ev.succeed()
            if self._progress is not None:
                self._pending_progress += 1
                if self._pending_progress >= 256:   # one call per 256 ops
                    self._progress("ops", self._pending_progress)
                    self._pending_progress = 0

    def _hold(self, rank: int, sms: int) -> None:
        """Communication kernels on ``rank`` take (``sms`` > 0) or give back SMs."""
        self._held[rank] += sms
        ev = self._sm_changed[rank]
        if ev is not None:
            self._sm_changed[rank] = None
            ev.succeed()

    def _shared_compute(self, rank: int, work_s: float, pinned_s: float = 0.0):
        """Run ``work_s`` seconds of full-rate compute at (S - held)/S of the rate, its
        pinned part ``pinned_s`` at its own rate (see the module docstring)."""
        env, S = self.env, self.sm_total
        left = work_s
        p = min(max(pinned_s / work_s, 0.0), 1.0) if pinned_s > 0 else 0.0
        while True:
            held = self._held[rank]
            if held <= 0:      # the whole GPU: the same timeout as without sharing
                rate = 1.0
            elif p > 0:        # one second of work: p pinned + (1 - p) slowed
                rate = (1.0 / (p + (1.0 - p) * S / (S - held)) if held < S
                        else (1.0 if p >= 1.0 else 0.0))
            else:
                rate = max(S - held, 0) / S
            changed = self._sm_changed[rank]
            if changed is None:
                changed = self._sm_changed[rank] = env.event()
            t0 = env.now
            if rate <= 0:
                yield changed
                continue
            done = env.timeout(left / rate)
            yield done | changed
            if done.processed:     # (a Timeout counts as triggered from its creation)
                return
            left -= (env.now - t0) * rate
            if left <= 0:
                return

    def _mirrors_in(self, rank: int, group: tuple[int, ...]) -> tuple[int, ...]:
        key = (rank, group)
        hit = self._mirror_cache.get(key)
        if hit is None:
            members = set(group)
            hit = self._mirror_cache[key] = tuple(m for m in self.mirrors.get(rank, ())
                                                  if m in members)
        return hit

    def _collective_spans(self, rank: int, op: Op, t0: float, rec) -> None:
        group = tuple(op.coll.group)
        wait = max(0.0, float(rec.wait_s))
        t_start = t0 + wait
        if wait > 0:
            b = int(rec.blocking_rank)
            expert, tokens = self._hot.get((b, op.layer, op.microbatch, op.phase), (-1, 0))
            reason = wait_reason(b, op.name, expert, tokens)
            self._span(rank, op, "stall", t0, t_start, waited_on=b, expert=expert,
                       tokens=tokens, reason=reason, peers=group)
        self._span(rank, op, op.kind, t_start, max(t_start, float(rec.end_s)), bytes=op.nbytes,
                   peers=group, tokens=op.tokens,
                   args={"sms": op.sms, "sm_share": op.sms / self.sm_total}
                   if op.sms and self.sm_total else {})

    def _span(self, rank: int, op: Op, kind: str, start: float, end: float, **kw) -> None:
        if end <= start and kind in ("stall", "bubble"):
            return
        self.spans.append(Span(rank=rank, stream=op.stream, kind=kind, name=op.name,
                               start_s=start, end_s=end, layer=op.layer,
                               microbatch=op.microbatch, phase=op.phase, **kw))
