"""All-to-alls flow by flow on the flow network, and the pipeline sends that share
their NICs.

:func:`exact_finish` runs a direct all-to-all-v of a small multi-host group on the
flow-level max-min network (:class:`moesim.network.FlowNetwork`), the exact engine's
communicator semantics (``FastNetwork.exact_finish``, docs/fast-path.md).


A pipeline send between two stages over several hosts leaves through the same NICs
as the multi-host all-to-alls of its EP group. The exact engine runs both on one
max-min network, so a send issued just before its stage's next all-to-all (1F1B's
forward send, then the next item's dispatch; a2a-1f1b's two sends, then the next
pair's first all-to-all) gets a share of the NIC and arrives later, and the
all-to-all is a little slower. The fast path timed the send alone on its path
(measured on DeepSeek-V3 cut to 32 GPUs, 1F1B: 1.24 ms alone, 5.6 ms in the exact
engine; docs/fast-path.md).

Here a send timed alone is *held*: the next all-to-all that
:meth:`moesim.engine.fast.network.FastNetwork.exact_finish` runs flow by flow on a
group the send leaves from or arrives at, while the send is still in flight, runs the
send's flows too (from their start, with the bytes that give the alone time: a
gradient bucket's share of the path stays in), and moves the send's end to their
delivery. A send is held for one such all-to-all at most (the one it meets first);
sends of groups whose all-to-alls are not run flow by flow are not held (per-link
sharing and the link bound time an all-to-all alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class Held:
    """One stage's send to another: member e of ``src`` sends to member e of ``dst``
    from ``start[e]``; ``end`` (updated in place) is its delivery."""
    src: tuple[int, ...]
    dst: tuple[int, ...]
    start: np.ndarray
    end: np.ndarray
    nbytes: np.ndarray          # per member: the bytes that take end - start alone
    on_end: Callable[[np.ndarray], None] | None


class HeldSends:
    """The sends in flight, keyed by (source group, message key): a chain run again
    (for its spans) replaces its first run's entries instead of adding to them."""

    def __init__(self) -> None:
        self._held: dict[tuple, Held] = {}
        #: per group: its last flow-network all-to-all (flows, starts, last delivery)
        self.last: dict[tuple, tuple[list, np.ndarray, float]] = {}

    def hold(self, key: tuple, h: Held) -> None:
        self._held[(h.src, key)] = h

    def take(self, group: tuple[int, ...], first: float, last: float) -> list[Held]:
        """The held sends of ``group`` (from or to it) that an all-to-all whose members
        arrive from ``first`` to ``last`` meets: those started before ``last`` and
        delivered after ``first``; those delivered before ``first`` are dropped."""
        out, gone = [], []
        for k, h in self._held.items():
            if h.src != group and h.dst != group:
                continue
            if h.end.max() <= first:
                gone.append(k)
            elif h.start.min() < last:
                out.append(h)
                gone.append(k)
        for k in gone:
            del self._held[k]
        return out

    def clear(self) -> None:
        self._held.clear()
        self.last.clear()


def run_flows(fn, flows: list[tuple[int, int, float]], starts: np.ndarray,
              t0: float) -> np.ndarray:
    """Delivery times of ``flows`` (sender rank, receiver rank, bytes), started at
    ``starts`` (absolute, none before ``t0``, the run's clock origin), together on an empty flow network of ``fn`` (a
    :class:`moesim.engine.fast.network.FastNetwork`; max-min re-solved at every start
    and finish; one simpy environment per FastNetwork, each run from its current time;
    with ``coalesce_rtol`` > 0, the scenario's ``engine.coalesce_rtol``, flows finish at
    most that fraction of their duration early, as in the exact engine)."""
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
    env.run()
    return done


def exact_finish(fn, group: Sequence[int], matrix: np.ndarray,
                 arrivals: np.ndarray) -> np.ndarray:
    """Per member: end of a direct all-to-all-v on the flow-level network
    (:func:`run_flows`), the exact engine's semantics: flow i→j (``matrix[i, j]`` bytes
    > 0) starts at max(arrival i, arrival j) and is delivered after its last byte plus
    its path latency; member i is done at the latest delivery of the flows it sends or
    receives, or at its arrival if it has none. The held pipeline sends the all-to-all
    meets (:meth:`HeldSends.take`) run beside it from their own starts and get their
    delivery; the all-to-all's flows are kept as the group's last (:func:`hold_send`)."""
    m = np.asarray(matrix, dtype=float)
    arr = np.asarray(arrivals, dtype=float)
    src, dst = np.nonzero(m)
    flows = [(group[a], group[b], float(m[a, b]))
             for a, b in zip(src.tolist(), dst.tolist(), strict=True)]
    starts = np.maximum(arr[src], arr[dst])
    key = tuple(int(r) for r in group)
    held = fn.held.take(key, float(arr.min()), float(starts.max(initial=arr.max())))
    k = len(src)
    own = (list(flows), starts)
    for h in held:
        flows += [(x, y, b) for x, y, b in zip(h.src, h.dst, h.nbytes.tolist(), strict=True)]
        starts = np.concatenate([starts, h.start])
    done = run_flows(fn, flows, starts, float(min(arr.min(), starts.min(initial=np.inf))))
    end = arr.copy()
    np.maximum.at(end, src, done[:k])
    np.maximum.at(end, dst, done[:k])
    fn.held.last[key] = (*own, float(done[:k].max(initial=-np.inf)))
    for h in held:
        n = len(h.src)
        h.end[:] = done[k:k + n]
        k += n
        if h.on_end is not None:
            h.on_end(h.end)
    return end


def hold_send(fn, key: tuple, src: tuple[int, ...], dst: tuple[int, ...], start: np.ndarray,
              end: np.ndarray, on_end: Callable[[np.ndarray], None] | None = None) -> None:
    """A pipeline send from member e of ``src`` to member e of ``dst``, timed alone from
    ``start`` to ``end`` (``fn``: the FastNetwork). If the last all-to-all
    :func:`exact_finish` ran on either group is still in flight at the send's start (an
    all-to-all on the ``ep`` stream of overlapped pairs), the send runs again with its
    flows; else it is held for the next all-to-all of either group that meets it.
    Either moves ``end`` (in place) to the send's delivery and calls ``on_end(end)``
    (the earlier all-to-all keeps the ends it had: they are used already). Sends
    between groups whose all-to-alls are timed in closed form are not held."""
    if not fn.exact_ok or (fn.stateless(src) and fn.stateless(dst)):
        return
    nbytes = np.empty(len(src))
    for e, (x, y) in enumerate(zip(src, dst, strict=True)):
        fn.p2p_time(x, y, 0.0)        # caches the path's (latency, bottleneck)
        lat, cap = fn._p2p[(x, y)]
        nbytes[e] = max(float(end[e] - start[e]) - lat, 0.0) * cap
    h = Held(tuple(src), tuple(dst), np.array(start, dtype=float), end, nbytes, on_end)
    for g in (h.src, h.dst):
        last = fn.held.last.get(g)
        if last is not None and last[2] > h.start.min() and last[1].min() < h.start.max():
            flows = [*last[0], *zip(h.src, h.dst, nbytes.tolist(), strict=True)]
            starts = np.concatenate([last[1], h.start])
            end[:] = run_flows(fn, flows, starts, float(starts.min()))[len(last[0]):]
            if on_end is not None:
                on_end(end)
            return
    fn.held.hold(key, h)
