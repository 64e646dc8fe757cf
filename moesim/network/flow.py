"""Flow-level network model: max-min fair sharing, rates re-solved at every change.

Each transfer is a flow over ``links.route(src, dst, key)``. Whenever flows start
or finish, the rates of all running flows are recomputed by max-min fairness
(:mod:`moesim.network.maxmin`) and hold constant until the next change. A flow's
delivery event fires when its last byte has left (its bytes integrated over its
piecewise-constant rate) plus the sum of its path's link latencies.

Mechanics (one simpy callback chain, no process per flow):

* State is kept in numpy arrays indexed by flow slot (:mod:`moesim.network.slots`):
  bytes left as of the flow's last rate change (``tref``), current rate, predicted
  finish time, size, path latency, and the id of the transfer group whose event the
  flow belongs to. A flow's bytes and finish time are only recomputed when its own
  rate changes. Paths are stored as (flow, link) pairs with a pair range per slot,
  running flows are counted per link, and a link -> running flows index lets an
  event walk only the links and flows it reaches; finished flows' slots are
  compacted away once they are half of all slots. One event is one compiled call
  (:mod:`moesim.network.jit_loops`, numba) or the numpy path, with the same rates up to
  rounding (:mod:`moesim.network.jit` chooses).
* ``transfer``/``transfer_many`` only queue flows and schedule one zero-delay
  "kick" at the current time, so any number of flows started at the same
  simulated time (an all-to-all) cause one re-solve. ``send`` is ``transfer``
  with a callback instead of an event: the delivery timeout calls it (one simpy
  event per flow fewer; the communicator's direct all-to-alls use it).
* After a solve, one timer is set at the earliest predicted finish. A timer made
  obsolete by a later start is recognized by a version counter and ignored.
* Flows whose predicted finish lies within ``FINISH_ATOL_S + FINISH_RTOL * now``
  of the current time complete together (their last bytes are at most that early).
  Delivery events of flows completing together with equal path latency share one
  simpy timeout.
* Incremental re-solve (exact): max-min freezes flows in increasing order of
  rate, so a change at rate r (a flow of rate r leaving, or a new flow, which is
  guaranteed at least min over its links of capacity / flows there) leaves every
  slower flow's rate as it was. Only the new flows and the flows at >= r reachable
  from the changed links through shared links are re-solved, on the capacity the
  others leave. Small problems (at most ``maxmin.SMALL_PAIRS`` running (flow, link)
  pairs) and changes where >= 90% of the running flows are candidates re-solve every
  running flow instead (cheaper, and exact as well). ``incremental=False`` always
  re-solves all running flows.
* Links that can never be a bottleneck (:mod:`moesim.network.shadow`: a link that
  always carries the same flows as a slower one, such as a GPU's PCIe link in front
  of its NIC) are left out of the pairs the rates are solved over: the same rates bit
  for bit, about a third fewer pairs on a rail-optimized DGX fabric. Their bytes and
  loads are reported as those of the link they shadow; a route that breaks the
  premise (it starts or ends at a relay node) puts them back.
* ``coalesce_rtol`` (default 0, exact) trades accuracy for speed: each step also
  completes every flow whose remaining time is within ``coalesce_rtol`` of its age,
  so it finishes at most that fraction of its duration early.

Units: seconds, bytes, bytes/s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import simpy

from moesim.network.base import LinkSet, checked_bytes, checked_flow
from moesim.network.maxmin import SMALL_PAIRS
from moesim.network.shadow import link_ends, partial_classes, shadow_classes
from moesim.network.slots import COUNTERS, PLAT, RATE, Slots

#: absolute and relative tolerance (seconds, fraction of ``env.now``) within which
#: flows predicted to finish are completed together in one step.
FINISH_ATOL_S = 1e-12
FINISH_RTOL = 1e-9

#: route arrays kept before the cache is cleared (memory bound)
ROUTE_CACHE_MAX = 1 << 20

SolveHook = Callable[[float, np.ndarray, np.ndarray, np.ndarray], None]

#: the tag of a transfer group started by :meth:`FlowNetwork.send` (its entry holds the
#: callback instead of an event)
_CALLBACK = object()


def _nonzero(mask: np.ndarray) -> np.ndarray:
    """Indices of the true entries of a 1-D bool array (np.flatnonzero, less overhead)."""
    return mask.nonzero()[0]


class FlowNetwork:
    """Max-min fair flow-level network over a :class:`~moesim.network.base.LinkSet`.

    ``record_series=True`` keeps, per link, the (t_s, rate_Bps) change points of its
    total load for plots (:meth:`series`). ``on_solve(now_s, pair_flow, pair_link,
    rates_Bps)`` is called after each re-solve with the running flows' (flow slot,
    link) pairs and the per-slot rates (0 for finished slots), for checks in tests.
    ``incremental`` (default True) re-solves only the flows a change can affect;
    ``coalesce_rtol`` (default 0.0, exact) lets a flow complete up to that fraction of
    its duration early so that nearby finishes share one re-solve (see module doc);
    ``shadow_links=False`` keeps the links that can never be a bottleneck in the
    problem (the same rates; for tests and benchmarks).
    """

    def __init__(self, env: simpy.Environment, links: LinkSet, *, record_series: bool = False,
                 on_solve: SolveHook | None = None, incremental: bool = True,
                 coalesce_rtol: float = 0.0, shadow_links: bool = True) -> None:
        self.env = env
        self.links = links
        self._cap = np.asarray(links.capacity_Bps, dtype=float)
        self._lat = np.asarray(links.latency_s, dtype=float)
        if np.any(~(self._cap > 0)) or np.any(~(self._lat >= 0)):
            raise ValueError("links need capacity_Bps > 0 and latency_s >= 0 on every link")
        self._n_links = len(self._cap)
        # (src, dst, key) -> (links solved over, route latency, route links)
        self._routes: dict[tuple[str, str, int], tuple[np.ndarray, float, int]] = {}
        # shadow links (never a bottleneck) left out of the pairs: moesim.network.shadow
        try:
            self._cls, self._master = shadow_classes(link_ends(links.link_names), self._cap,
                                                     getattr(links, "gpus", ()))
        except ValueError:   # names not "u->v": no graph to find them in, none left out
            self._cls = self._master = np.full(self._n_links, -1, dtype=np.int64)
        self._cls_size = np.bincount(self._cls[self._cls >= 0], minlength=1)
        self._drop = (self._master >= 0) & shadow_links
        self.n_restores = 0   # classes of shadow links put back (FlowNetwork._restore)
        self._slots = Slots(self._cap)   # per-flow state, pairs, link counts
        # flows queued since the last step: links solved over, bytes, transfer groups,
        # route latencies and route lengths
        self._pending: tuple[list[np.ndarray], list[float], list[int], list[float],
                             list[int]] = ([], [], [], [], [])
        self._groups: dict[int, list[Any]] = {}   # id -> [event, flows left, tag]
        self._next_group = 0
        self._version = 0
        self._kick_scheduled = False
        self._record = record_series
        self._series: dict[int, list[tuple[float, float]]] = {}
        self._last_load = np.zeros(self._n_links)
        self._on_solve = on_solve
        self._incremental = incremental
        if not 0.0 <= coalesce_rtol < 1.0:
            raise ValueError(f"coalesce_rtol must be in [0, 1), got {coalesce_rtol}")
        self._coalesce_rtol = float(coalesce_rtol)
        self.n_solves = 0   # number of max-min solves run (for benchmarks)
        self.n_resolved = 0  # flow rates recomputed, summed over solves
        self.n_flows = 0    # number of flows started with a non-empty path

    # ---- interface -------------------------------------------------------------
    def transfer(self, src: str, dst: str, nbytes: float, key: int = 0, tag: Any = None) -> simpy.Event:
        """Start one flow now; the event (value ``tag``) succeeds at delivery.
        (``transfer_many`` of one flow, without its loop.)"""
        ev = simpy.Event(self.env)
        if not self._queue_one(src, dst, nbytes, key, [ev, 1, tag]):
            ev.succeed(tag)   # src == dst crosses no link: delivered at once
        return ev

    def send(self, src: str, dst: str, nbytes: float, callback: Callable[[Any], None],
             key: int = 0) -> None:
        """Start one flow now; ``callback(event)`` is called from the simpy loop at delivery.
        (``transfer`` without its per-flow event: for callers that start hundreds of
        thousands of flows, such as the communicator's direct all-to-alls.)"""
        if not self._queue_one(src, dst, nbytes, key, [callback, 1, _CALLBACK]):
            self.env.timeout(0).callbacks.append(callback)   # src == dst: at once

    def _queue_one(self, src: str, dst: str, nbytes: float, key: int, entry: list[Any]) -> bool:
        """Queue one flow as its own transfer group ``entry`` (event or callback, flows
        left, tag) and schedule the kick; False (nothing queued) when src == dst."""
        gid = self._next_group
        self._next_group = gid + 1
        nbytes = checked_bytes(src, dst, nbytes)
        route = self._routes.get((src, dst, key))
        if route is None:
            route = self._route(src, dst, key)
        if not route[2]:
            return False
        paths, sizes, gids, plats, nroute = self._pending
        paths.append(route[0])
        sizes.append(nbytes)
        gids.append(gid)
        plats.append(route[1])
        nroute.append(route[2])
        self._groups[gid] = entry
        self.n_flows += 1
        if not self._kick_scheduled:
            self._kick_scheduled = True
            self.env.timeout(0).callbacks.append(self._on_kick)
        return True

    def transfer_many(self, flows: Sequence[tuple[str, str, float]], key: int = 0,
                      tag: Any = None, latency: bool = True) -> simpy.Event:
        """Start several flows now; the event (value ``tag``) succeeds when all are delivered.

        Each flow is ``(src, dst, bytes)`` or ``(src, dst, bytes, key)``: a fourth
        element picks that flow's ECMP path, overriding ``key``. ``latency=False``:
        delivered at their last byte, without the path latency (a caller that prices
        the latency itself, as NCCL's model: moesim.collectives.nccl.choice)."""
        ev = self.env.event()
        gid = self._next_group
        self._next_group += 1
        q_routes, q_sizes, q_keys = [], [], []
        restores = self.n_restores
        for f in flows:
            src, dst, nbytes, fkey = checked_flow(f, key)
            route = self._route(src, dst, fkey)
            if route[2]:   # src == dst crosses no link: delivered at once
                q_routes.append(route)
                q_sizes.append(nbytes)
                q_keys.append((src, dst, fkey))
        if self.n_restores != restores:   # shadow links put back: the routes made anew
            q_routes = [self._route(*k) for k in q_keys]
        count = len(q_routes)
        paths, sizes, gids, plats, nroute = self._pending
        for r in q_routes:
            paths.append(r[0])
            plats.append(r[1] if latency else 0.0)
            nroute.append(r[2])
        sizes.extend(q_sizes)
        gids.extend([gid] * count)
        if count == 0:
            ev.succeed(tag)
            return ev
        self._groups[gid] = [ev, count, tag]
        self.n_flows += count
        if not self._kick_scheduled:
            self._kick_scheduled = True
            self.env.timeout(0).callbacks.append(self._on_kick)
        return ev

    def link_bytes(self) -> np.ndarray:
        """Bytes carried so far per link (completed flows plus progress of running ones)."""
        out = self._slots.link_bytes(float(self.env.now))
        shadow = self._drop.nonzero()[0]
        out[shadow] = out[self._master[shadow]]   # the same flows
        return out

    def series(self) -> dict[int, list[tuple[float, float]]]:
        """Per link id: (t_s, load_Bps) change points (only with ``record_series=True``)."""
        return {k: list(v) for k, v in self._series.items()}

    def active_flows(self) -> int:
        """Number of flows currently sending."""
        return self._slots.n_alive

    def counters(self) -> dict[str, int]:
        """What the re-solves did so far, summed over events (``moesim.network.slots.COUNTERS``):
        solves, flows and pairs re-solved, max-min rounds and the pairs they passed over,
        links reached and index entries walked by the incremental closure, rates changed,
        whole re-solves. The same on the compiled and the numpy path."""
        return dict(zip(COUNTERS, self._slots.stats.tolist(), strict=True))

    # ---- mechanics -------------------------------------------------------------
    def _route(self, src: str, dst: str, key: int) -> tuple[np.ndarray, float, int]:
        """(links the flow is solved over, route latency summed link by link, route
        links) of the route src -> dst (cached)."""
        k = (src, dst, key)
        hit = self._routes.get(k)
        if hit is None:
            if len(self._routes) >= ROUTE_CACHE_MAX:
                self._routes.clear()
            path = np.asarray(self.links.route(src, dst, key), dtype=np.int64)
            lat = 0.0
            for x in self._lat[path].tolist():
                lat += x
            if self._drop.any():
                for c in partial_classes(path, self._cls, self._cls_size):
                    if self._drop[self._cls == c].any():
                        self._restore(c)
                solved = path[~self._drop[path]]
            else:
                solved = path
            hit = self._routes[k] = (solved, lat, len(path))
        return hit

    def _restore(self, k: int) -> None:
        """A route crosses class ``k`` of shadow links only in part: they may carry
        other flows than their master from now on, so they are solved over again (in
        running and queued flows; cached routes are made anew)."""
        shadow = ((self._cls == k) & self._drop).nonzero()[0]
        master = self._master[shadow]
        self._drop[shadow] = False
        self.n_restores += 1
        self._slots.restore(shadow, master)
        paths = self._pending[0]
        for i, p in enumerate(paths):
            for a, m in zip(shadow.tolist(), master.tolist(), strict=True):
                at = (p == m).nonzero()[0]
                if len(at):
                    p = np.insert(p, at + 1, a)
            paths[i] = p
        self._routes.clear()

    def _on_kick(self, _ev: simpy.Event) -> None:
        self._kick_scheduled = False
        self._step()

    def _on_wake(self, version: int, _ev: simpy.Event) -> None:
        if version == self._version:
            self._step()

    def _flush_pending(self, now: float) -> int:
        """Move queued flows into slots; returns the first new slot."""
        paths, sizes, gids, plats, nroute = self._pending
        if not paths:
            return self._slots.n
        self._pending = ([], [], [], [], [])
        return self._slots.add(paths, sizes, gids, now, plats, nroute)

    def _step(self) -> None:
        self._version += 1   # any wake-up timer set before this step is now stale
        now = float(self.env.now)
        slots = self._slots
        first_new = self._flush_pending(now) if self._pending[0] else slots.n
        done, n_old, n_res, wake = slots.step(now, first_new, FINISH_ATOL_S + FINISH_RTOL * abs(now),
                                              self._coalesce_rtol, self._incremental, SMALL_PAIRS)
        if n_old:   # running flows that finished: delivered after their path latency
            self._complete(done[:n_old])
        if n_old < len(done):   # zero bytes: delivered after the path latency alone
            self._complete(done[n_old:])
        if n_res >= 0:
            self.n_resolved += n_res
            self.n_solves += 1
            if self._record or self._on_solve is not None:
                self._report(now)
        slots.compact()
        if wake < np.inf:
            self.env.timeout(max(wake - now, 0.0)).callbacks.append(
                partial(self._on_wake, self._version))

    def _complete(self, idx: np.ndarray) -> None:
        slots = self._slots
        if len(idx) == 1:   # the common case: one flow, one delivery
            s = idx[0]
            lat, g = slots.f[PLAT, s].item(), slots.group[s].item()
            entry = self._groups[g]
            if entry[2] is _CALLBACK:   # one flow of send(): its callback at delivery
                del self._groups[g]
                self.env.timeout(lat).callbacks.append(entry[0])
            elif lat == 0:
                self._deliver([g], None)
            else:
                self.env.timeout(lat).callbacks.append(partial(self._deliver, [g]))
            return
        by_lat: dict[float, list[int]] = {}
        plat, group = slots.f[PLAT, idx].tolist(), slots.group[idx].tolist()
        for lat, g in zip(plat, group, strict=True):
            by_lat.setdefault(lat, []).append(g)
        for lat in sorted(by_lat):
            if lat == 0:
                self._deliver(by_lat[lat], None)
            else:
                self.env.timeout(lat).callbacks.append(partial(self._deliver, by_lat[lat]))

    def _deliver(self, gids: list[int], ev: simpy.Event | None) -> None:
        if len(gids) == 1:   # the common case: one flow's group
            entry = self._groups[gids[0]]
            entry[1] -= 1
            if entry[1] == 0:
                del self._groups[gids[0]]
                self._succeed(entry, ev)
            return
        finished = []
        for g in gids:
            entry = self._groups[g]
            entry[1] -= 1
            if entry[1] == 0:
                finished.append(g)
        for g in sorted(finished):
            self._succeed(self._groups.pop(g), ev)

    def _succeed(self, entry: list[Any], ev: simpy.Event | None) -> None:
        """A transfer group is delivered: its event succeeds, or a send()'s callback runs
        (from the delivery timeout ``ev``; at latency 0, from a zero-delay timeout)."""
        if entry[2] is not _CALLBACK:
            entry[0].succeed(entry[2])
        elif ev is not None:
            entry[0](ev)
        else:
            self.env.timeout(0).callbacks.append(entry[0])

    def _report(self, now: float) -> None:
        """Per-link load change points and the ``on_solve`` hook, after a solve."""
        slots = self._slots
        rate = slots.f[RATE, :slots.n]
        pf, pl = slots.pf[:slots.np], slots.pl[:slots.np]
        keep = slots.alive[:slots.n][pf]
        pf, pl = pf[keep], pl[keep]
        shadow = self._drop.nonzero()[0]
        if len(shadow):   # a shadow link's pairs: its master's (the same flows)
            by = shadow[np.argsort(self._master[shadow], kind="stable")]
            per = np.bincount(self._master[shadow], minlength=self._n_links)
            first = np.cumsum(per) - per
            reps = per[pl]
            n_rep = int(reps.sum())
            within = np.arange(n_rep) - np.repeat(np.cumsum(reps) - reps, reps)
            pf = np.concatenate((pf, np.repeat(pf, reps)))
            pl = np.concatenate((pl, by[np.repeat(first[pl], reps) + within]))
        if self._record:
            load = np.bincount(pl, weights=rate[pf], minlength=self._n_links)
            for link in _nonzero(load != self._last_load).tolist():
                self._series.setdefault(link, []).append((now, float(load[link])))
            self._last_load = load
        if self._on_solve is not None:
            self._on_solve(now, pf, pl, rate.copy())
