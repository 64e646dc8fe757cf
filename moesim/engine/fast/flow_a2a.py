"""All-to-alls flow by flow on the flow network, and the pipeline sends that share
their NICs.

:func:`exact_finish` runs a direct all-to-all-v of a small multi-host group on the
flow-level max-min network (:class:`moesim.network.FlowNetwork`), the exact engine's
communicator semantics (``FastNetwork.exact_finish``, docs/fast-path.md).

A pipeline send between two stages over several hosts leaves through the NICs the
multi-host all-to-alls of its EP groups use. The exact engine runs both on one max-min
network, so a send that overlaps an all-to-all (1F1B with static pairs: the forward
send under the next micro-batch's combine on the ``ep`` stream; a2a-1f1b: the pair's
two sends under the next pair's first all-to-all) gets a share of the NIC and arrives
later, and the all-to-all is a little slower. Timed alone, a send took 1.24 ms where
the exact engine's took 5.6 ms (DeepSeek-V3 cut to 32 GPUs, 1F1B; docs/fast-path.md).

So every send of such groups (:func:`hold_send`, from ``Chain._send``) runs again with
the flows of the all-to-alls already run on its two groups that it overlaps (the list
schedule may have run the receiving stage ahead), and is *held*: the next all-to-all
:func:`exact_finish` runs on either group while it is in flight runs its flows too
(from their start) and moves its end to their delivery, never before its end alone
(which counts a gradient bucket's ring flow on its path; the runs do not). The receiver takes
the message once the sender's all-to-alls are past it (``Chain.ready``,
:meth:`HeldSends.settled`); when every stage waits on such messages only, they are
taken as sent (:meth:`HeldSends.settle`). The all-to-alls that ran before a send keep
the ends they had (they are used already). Sends between groups whose all-to-alls are
timed in closed form (one host, or more than 32 members) or precomputed (DeepEP's
kernels) are not held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

#: flow-network all-to-alls kept per group for the sends issued after them (the list
#: schedule runs a stage ahead of the others by a few items at most)
RUNS_KEPT = 64


@dataclass
class Run:
    """One all-to-all run flow by flow: its flows (sender, receiver, bytes), their
    starts (absolute) and its last delivery."""
    flows: list
    starts: np.ndarray
    end: float


@dataclass
class Held:
    """One stage's send to another: member e of ``src`` sends to member e of ``dst``
    from ``start[e]``; ``end`` (updated in place) is its delivery; ``past``: the
    all-to-alls run before it was issued that it overlaps."""
    src: tuple[int, ...]
    dst: tuple[int, ...]
    start: np.ndarray
    end: np.ndarray
    nbytes: float
    on_end: Callable[[np.ndarray], None] | None
    alone: np.ndarray = field(default_factory=lambda: np.empty(0))   # its end alone
    past: list[Run] = field(default_factory=list)
    passed: set = field(default_factory=set)   # groups whose all-to-alls are past it

    def flows(self) -> list:
        return [(x, y, self.nbytes) for x, y in zip(self.src, self.dst, strict=True)]


class HeldSends:
    """The sends in flight, keyed by (source group, message key): a chain run again
    (for its spans) replaces its first run's entries instead of adding to them; and
    each group's last :data:`RUNS_KEPT` all-to-alls."""

    def __init__(self) -> None:
        self._held: dict[tuple, Held] = {}
        self.runs: dict[tuple, deque[Run]] = {}
        #: the chain's gradient buckets in flight beside its all-to-alls, or None
        #: (:class:`moesim.engine.fast.grad_flows.ChainBuckets`: DualPipe's ``dp_overlap``)
        self.buckets = None

    def hold(self, key: tuple, h: Held) -> None:
        self._held[(h.src, key)] = h

    def ran(self, group: tuple[int, ...], run: Run) -> None:
        q = self.runs.get(group)
        if q is None:
            q = self.runs[group] = deque(maxlen=RUNS_KEPT)
        q.append(run)

    def overlapping(self, h: Held) -> list[Run]:
        """The kept all-to-alls of ``h``'s groups running while it is in flight."""
        lo, hi = float(h.start.min()), float(h.end.max())
        return [r for g in dict.fromkeys((h.src, h.dst)) for r in self.runs.get(g, ())
                if r.end > lo and float(r.starts.min()) < hi]

    def in_flight(self, group: tuple[int, ...], first: float) -> list[Held]:
        """The held sends of ``group`` (from or to it) still in flight at ``first``;
        one is dropped once the all-to-alls of both its groups have passed it."""
        out, gone = [], []
        for k, h in self._held.items():
            if h.src == group or h.dst == group:
                if h.end.max() > first:
                    out.append(h)
                    continue
                h.passed.add(group)
                if h.src in h.passed and h.dst in h.passed:
                    gone.append(k)
        for k in gone:
            del self._held[k]
        return out

    def settled(self, src: tuple, key: tuple) -> bool:
        """Whether the send ``key`` from ``src`` can move no more: not held, or the
        all-to-alls of its source group are past it."""
        h = self._held.get((src, key))
        return h is None or h.src in h.passed

    def __len__(self) -> int:
        return len(self._held)

    def settle(self) -> None:
        """Take every held send as settled (the schedule cannot advance otherwise)."""
        for h in self._held.values():
            h.passed.add(h.src)

    def drop(self, done: list[Held]) -> None:
        """Forget ``done`` (their delivery is decided)."""
        ids = {id(h) for h in done}
        for k in [k for k, h in self._held.items() if id(h) in ids]:
            del self._held[k]

    def clear(self) -> None:
        self._held.clear()
        self.runs.clear()
        self.buckets = None


def run_flows(fn, flows: list[tuple[int, int, float]], starts: np.ndarray,
              t0: float, rings: list | None = None):
    """Delivery times of ``flows`` (sender rank, receiver rank, bytes), started at
    ``starts`` (absolute, none before ``t0``, the run's clock origin), together on an empty flow network of ``fn`` (a
    :class:`moesim.engine.fast.network.FastNetwork`; max-min re-solved at every start
    and finish; one simpy environment per FastNetwork, each run from its current time;
    with ``coalesce_rtol`` > 0, the scenario's ``engine.coalesce_rtol``, flows finish at
    most that fraction of their duration early, as in the exact engine). ``rings``:
    ring collectives run beside them, each ``(start, steps, flows, after)``: ``steps``
    phases of ``flows``, a phase started when the previous one is delivered (as the
    exact engine runs a collective's phases), the first once the rings listed in
    ``after`` (earlier ones) have ended; then the result is ``(deliveries, each ring's
    end)``."""
    if fn._env is None:   # simpy only here: the rest of the fast path is closed form
        import simpy

        from moesim.network import FlowNetwork

        fn._env = simpy.Environment()
        fn._flow = FlowNetwork(fn._env, fn.topo, coalesce_rtol=fn.coalesce_rtol)
    env, net, gpus = fn._env, fn._flow, fn.gpus
    starts = starts - t0
    base = env.now
    order = np.argsort(starts, kind="stable")
    done = np.full(len(flows), -np.inf)

    def launch():
        i = 0
        while i < len(order):
            at = float(starts[order[i]])
            if at > env.now - base:
                yield env.timeout(at - (env.now - base))
            batch = []
            while i < len(order) and starts[order[i]] <= at:
                batch.append(order[i])
                i += 1
            for f in batch:
                a, b, nbytes = flows[f]
                ev = net.transfer(gpus[a], gpus[b], nbytes)
                ev.callbacks.append(lambda _e, f=f: done.__setitem__(f, t0 + env.now - base))

    env.process(launch())
    if not rings:
        env.run()
        return done
    import simpy

    ends = np.full(len(rings), -np.inf)
    procs: list = []

    def ring(i: int, at: float, steps: int, rf: list, after: list[int]):
        if at - t0 > env.now - base:
            yield env.timeout(at - t0 - (env.now - base))
        if after:
            yield simpy.AllOf(env, [procs[j] for j in after])
        for _ in range(steps):
            yield simpy.AllOf(env, [net.transfer(gpus[a], gpus[b], nb) for a, b, nb in rf])
        ends[i] = t0 + env.now - base

    for i, (at, steps, rf, after) in enumerate(rings):
        procs.append(env.process(ring(i, at, steps, rf, after)))
    env.run()
    return done, ends


def exact_finish(fn, group: Sequence[int], matrix: np.ndarray,
                 arrivals: np.ndarray) -> np.ndarray:
    """Per member: end of a direct all-to-all-v on the flow-level network
    (:func:`run_flows`), the exact engine's semantics: flow i→j (``matrix[i, j]`` bytes
    > 0) starts at max(arrival i, arrival j) and is delivered after its last byte plus
    its path latency; member i is done at the latest delivery of the flows it sends or
    receives, or at its arrival if it has none. The held pipeline sends the all-to-all
    meets (:meth:`HeldSends.in_flight`) run beside it from their own starts and get their
    delivery; the all-to-all's flows are kept as the group's last (:func:`hold_send`)."""
    m = np.asarray(matrix, dtype=float)
    arr = np.asarray(arrivals, dtype=float)
    src, dst = np.nonzero(m)
    flows = [(group[a], group[b], float(m[a, b]))
             for a, b in zip(src.tolist(), dst.tolist(), strict=True)]
    starts = np.maximum(arr[src], arr[dst])
    key = tuple(int(r) for r in group)
    k = len(src)
    cands = fn.held.in_flight(key, float(arr.min()))
    held: list[Held] = []
    last = float(starts.max(initial=arr.max()))     # the sends it meets: started before
    done = None                                     # its last flow, then before its end
    bks = fn.held.buckets
    near: list = []                                 # gradient buckets beside it (grad_flows)
    while True:
        more = [h for h in cands if all(h is not x for x in held) and h.start.min() < last]
        now = [] if bks is None else bks.beside(key, float(arr.min()), last)
        if done is not None and not more and len(now) == len(near):
            break
        held += more
        near = now
        fl, st = _with_held(flows, starts, held)
        t0 = float(min(arr.min(), st.min(initial=np.inf)))
        if near:      # with the other groups' all-to-alls the rings meet (run before)
            seen = {id(r) for h in held for r in h.past}
            for g, q in fn.held.runs.items():
                for r in q:
                    if (g != key and id(r) not in seen and r.end > float(arr.min())
                            and float(r.starts.min()) < last):
                        fl = fl + r.flows
                        st = np.concatenate([st, r.starts])
            rings = [(*bk.ring(float(arr.min())),
                      [j for j, x in enumerate(near[:i]) if any(x is p for p in bk.prev)])
                     for i, bk in enumerate(near)]
            done, ends = run_flows(fn, fl, st, min(t0, min(r[0] for r in rings)), rings)
        else:
            done = run_flows(fn, fl, st, t0)
        last = float(done[:k].max(initial=-np.inf))
    for bk, e in zip(near, ends if near else (), strict=True):
        bk.moved(float(e))
    if near:
        bks.schedule()
    fn.held.drop(held)
    end = arr.copy()
    np.maximum.at(end, src, done[:k])
    np.maximum.at(end, dst, done[:k])
    fn.held.ran(key, Run(flows, starts, float(done[:k].max(initial=-np.inf))))
    for h in held:
        n = len(h.src)
        h.end[:] = np.maximum(done[k:k + n], h.alone)
        k += n
        if h.on_end is not None:
            h.on_end(h.end)
    return end


def _with_held(flows: list, starts: np.ndarray, held: list[Held]):
    """``flows`` and ``starts``, then each held send's flows, then the flows of the
    earlier all-to-alls they overlap (each once)."""
    fl, st = list(flows), [starts]
    for h in held:
        fl += h.flows()
        st.append(h.start)
    past = {id(r): r for h in held for r in h.past}
    for r in past.values():
        fl += r.flows
        st.append(r.starts)
    return fl, np.concatenate(st)


def hold_send(fn, key: tuple, src: tuple[int, ...], dst: tuple[int, ...], start: np.ndarray,
              end: np.ndarray, nbytes: float,
              on_end: Callable[[np.ndarray], None] | None = None) -> None:
    """A pipeline send of ``nbytes`` from member e of ``src`` to member e of ``dst``,
    timed alone from ``start`` to ``end`` (``fn``: the FastNetwork; alone on its path,
    or beside a gradient bucket's ring flow, which the flow runs here do not see: a
    delivery is never before ``end``). It runs again with the flows of the
    all-to-alls already run on either group that it overlaps (one on the ``ep`` stream
    of overlapped pairs; the other stage's, which the list schedule may have run
    first), and is held for the next all-to-all of either group that meets it
    (:func:`exact_finish`). Each moves ``end`` (in place) to the send's delivery and
    calls ``on_end(end)`` (an all-to-all run before keeps the ends it had: they are
    used already). Sends between groups with no all-to-all run flow by flow yet (timed
    in closed form, or precomputed: DeepEP) are not held."""
    if not fn.exact_ok or (tuple(src) not in fn.held.runs and tuple(dst) not in fn.held.runs):
        return
    h = Held(tuple(src), tuple(dst), np.array(start, dtype=float), end, float(nbytes), on_end,
             end.copy())
    h.passed = {g for g in (h.src, h.dst) if fn.stateless(g)}   # no all-to-all will come
    h.past = fn.held.overlapping(h)
    if h.past:
        fl, st = _with_held([], np.empty(0), [h])
        end[:] = np.maximum(run_flows(fn, fl, st, float(st.min()))[:len(h.src)], h.alone)
        if on_end is not None:
            on_end(end)
    fn.held.hold(key, h)
