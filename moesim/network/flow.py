"""Flow-level network model: max-min fair sharing, rates re-solved at every change.

Each transfer is a flow over ``links.route(src, dst, key)``. Whenever flows start
or finish, the rates of all running flows are recomputed by max-min fairness
(:mod:`moesim.network.maxmin`) and hold constant until the next change. A flow's
delivery event fires when its last byte has left (its bytes integrated over its
piecewise-constant rate) plus the sum of its path's link latencies.

Mechanics (one simpy callback chain, no process per flow):

* State is kept in numpy arrays indexed by flow slot: bytes left as of the flow's
  last rate change (``tref``), current rate, predicted finish time, size, path
  latency, and the id of the transfer group whose event the flow belongs to. A
  flow's bytes and finish time are only recomputed when its own rate changes, so a
  step costs work in the flows it re-rates, not in all running flows. Paths are
  stored as (flow, link) pairs; finished flows' slots are compacted away once they
  are half of all slots.
* ``transfer``/``transfer_many`` only queue flows and schedule one zero-delay
  "kick" at the current time, so any number of flows started at the same
  simulated time (an all-to-all) cause one re-solve.
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

from moesim.network import incremental, jit
from moesim.network.base import LinkSet, checked_flow
from moesim.network.maxmin import CAP_FLOOR, SAT_RTOL, SMALL_PAIRS

#: absolute and relative tolerance (seconds, fraction of ``env.now``) within which
#: flows predicted to finish are completed together in one step.
FINISH_ATOL_S = 1e-12
FINISH_RTOL = 1e-9

#: route arrays kept before the cache is cleared (memory bound)
ROUTE_CACHE_MAX = 1 << 20

SolveHook = Callable[[float, np.ndarray, np.ndarray, np.ndarray], None]


def _nonzero(mask: np.ndarray) -> np.ndarray:
    """Indices of the true entries of a 1-D bool array (np.flatnonzero, less overhead)."""
    return mask.nonzero()[0]


class _Grow:
    """A growable 1-D numpy array (amortized O(1) append of blocks)."""

    def __init__(self, dtype: Any, fill: float = 0) -> None:
        self.a = np.zeros(64, dtype=dtype)
        self.fill = fill
        self.n = 0

    def extend(self, values: np.ndarray) -> None:
        need = self.n + len(values)
        if need > len(self.a):
            new = np.full(max(need, 2 * len(self.a)), self.fill, dtype=self.a.dtype)
            new[: self.n] = self.a[: self.n]
            self.a = new
        self.a[self.n:need] = values
        self.n = need

    @property
    def v(self) -> np.ndarray:
        return self.a[: self.n]

    def compact(self, keep: np.ndarray) -> None:
        kept = self.a[: self.n][keep]
        self.a[: len(kept)] = kept
        self.n = len(kept)


class FlowNetwork:
    """Max-min fair flow-level network over a :class:`~moesim.network.base.LinkSet`.

    ``record_series=True`` keeps, per link, the (t_s, rate_Bps) change points of its
    total load for plots (:meth:`series`). ``on_solve(now_s, pair_flow, pair_link,
    rates_Bps)`` is called after each re-solve with the running flows' (flow slot,
    link) pairs and the per-slot rates (0 for finished slots), for checks in tests.
    ``incremental`` (default True) re-solves only the flows a change can affect;
    ``coalesce_rtol`` (default 0.0, exact) lets a flow complete up to that fraction of
    its duration early so that nearby finishes share one re-solve (see module doc).
    """

    def __init__(self, env: simpy.Environment, links: LinkSet, *, record_series: bool = False,
                 on_solve: SolveHook | None = None, incremental: bool = True,
                 coalesce_rtol: float = 0.0) -> None:
        self.env = env
        self.links = links
        self._cap = np.asarray(links.capacity_Bps, dtype=float)
        self._lat = np.asarray(links.latency_s, dtype=float)
        if np.any(~(self._cap > 0)) or np.any(~(self._lat >= 0)):
            raise ValueError("links need capacity_Bps > 0 and latency_s >= 0 on every link")
        self._n_links = len(self._cap)
        self._routes: dict[tuple[str, str, int], np.ndarray] = {}
        # per flow slot (a flow's bytes left are rem - rate * (t - tref) until its next change)
        self._rem = _Grow(float)       # bytes left to send as of self._tref
        self._tref = _Grow(float)      # time of the flow's last rate change, s
        self._rate = _Grow(float)      # bytes/s since self._tref (0 once finished)
        self._tfin = _Grow(float, np.inf)  # predicted time its last byte leaves (inf: none)
        self._size = _Grow(float)      # bytes of the flow
        self._plat = _Grow(float)      # sum of path latencies, s
        self._start = _Grow(float)     # start time, s
        self._group = _Grow(np.int64)  # transfer group id
        self._alive = _Grow(bool)
        # (flow slot, link) pairs of every flow in a slot, in slot order
        self._pf = _Grow(np.int64)
        self._pl = _Grow(np.int64)
        self._pstart = _Grow(np.int64)  # slot s's pairs are pstart[s]:pstart[s+1]
        self._pstart.extend(np.zeros(1, dtype=np.int64))
        self._lcnt = np.zeros(self._n_links, dtype=np.int64)  # running flows per link
        self._n_alive = 0          # running flows
        self._n_alive_pairs = 0    # their (flow, link) pairs
        self._lindex: tuple[np.ndarray, np.ndarray] | None = None  # link -> flows, when valid
        self._ws: list[np.ndarray] | None = None   # compiled solve's scratch arrays
        self._pending: list[tuple[np.ndarray, float, int]] = []  # (path, bytes, group)
        self._groups: dict[int, list[Any]] = {}   # id -> [event, flows left, tag]
        self._next_group = 0
        self._version = 0
        self._kick_scheduled = False
        self._done_bytes = np.zeros(self._n_links)  # bytes of flows compacted away
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
        """Start one flow now; the event (value ``tag``) succeeds at delivery."""
        return self.transfer_many([(src, dst, nbytes)], key=key, tag=tag)

    def transfer_many(self, flows: Sequence[tuple[str, str, float]], key: int = 0,
                      tag: Any = None) -> simpy.Event:
        """Start several flows now; the event (value ``tag``) succeeds when all are delivered.

        Each flow is ``(src, dst, bytes)`` or ``(src, dst, bytes, key)``: a fourth
        element picks that flow's ECMP path, overriding ``key``."""
        ev = self.env.event()
        gid = self._next_group
        self._next_group += 1
        queued = []
        for f in flows:
            src, dst, nbytes, fkey = checked_flow(f, key)
            path = self._route(src, dst, fkey)
            if len(path):   # src == dst crosses no link: delivered at once
                queued.append((path, nbytes, gid))
        count = len(queued)
        self._pending.extend(queued)
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
        out = self._done_bytes.copy()
        if self._pf.n:
            now = float(self.env.now)
            left = self._rem.v - self._rate.v * (now - self._tref.v)
            sent = np.where(self._alive.v, self._size.v - left, self._size.v)
            out += np.bincount(self._pl.v, weights=sent[self._pf.v], minlength=self._n_links)
        return out

    def series(self) -> dict[int, list[tuple[float, float]]]:
        """Per link id: (t_s, load_Bps) change points (only with ``record_series=True``)."""
        return {k: list(v) for k, v in self._series.items()}

    def active_flows(self) -> int:
        """Number of flows currently sending."""
        return self._n_alive

    # ---- mechanics -------------------------------------------------------------
    def _route(self, src: str, dst: str, key: int) -> np.ndarray:
        k = (src, dst, key)
        path = self._routes.get(k)
        if path is None:
            if len(self._routes) >= ROUTE_CACHE_MAX:
                self._routes.clear()
            path = np.asarray(self.links.route(src, dst, key), dtype=np.int64)
            self._routes[k] = path
        return path

    def _on_kick(self, _ev: simpy.Event) -> None:
        self._kick_scheduled = False
        self._step()

    def _on_wake(self, version: int, _ev: simpy.Event) -> None:
        if version == self._version:
            self._step()

    def _flush_pending(self, now: float) -> int:
        """Move queued flows into slots; returns the first new slot."""
        first = self._rem.n
        if not self._pending:
            return first
        paths, sizes, gids = zip(*self._pending, strict=True)
        self._pending = []
        n_new = len(sizes)
        size = np.asarray(sizes, dtype=float)
        self._rem.extend(size)
        self._size.extend(size)
        self._rate.extend(np.zeros(n_new))
        self._tref.extend(np.full(n_new, now))
        self._tfin.extend(np.full(n_new, np.inf))
        self._start.extend(np.full(n_new, now))
        self._group.extend(np.asarray(gids, dtype=np.int64))
        self._alive.extend(np.ones(n_new, dtype=bool))
        lens = np.fromiter((len(p) for p in paths), dtype=np.int64, count=n_new)
        local = np.repeat(np.arange(n_new, dtype=np.int64), lens)
        links = np.concatenate(paths)
        self._plat.extend(np.bincount(local, weights=self._lat[links], minlength=n_new))
        self._pstart.extend(self._pf.n + np.cumsum(lens))
        self._pf.extend(local + first)
        self._pl.extend(links)
        self._lcnt += np.bincount(links, minlength=self._n_links)
        self._n_alive += n_new
        self._n_alive_pairs += len(links)
        self._lindex = None
        return first

    def _step(self) -> None:
        self._version += 1   # any wake-up timer set before this step is now stale
        now = float(self.env.now)
        first_new = self._flush_pending(now)
        kern = jit.kernels()
        tol = FINISH_ATOL_S + FINISH_RTOL * abs(now)
        rtol = self._coalesce_rtol
        if kern is not None:
            old_done = kern.due(self._tfin.v, self._start.v, first_new, now, tol, rtol)
        elif rtol > 0:   # also flows whose remaining time is <= rtol x age
            tfin = self._tfin.v
            old_done = _nonzero(tfin[:first_new] - now
                                <= tol + rtol * (now - self._start.v[:first_new]))
        else:
            old_done = _nonzero(self._tfin.v[:first_new] <= now + tol)
        r_done = np.inf
        if len(old_done):   # running flows that finish: their links are freed
            r_done = float(self._rate.v[old_done].min())
            self._complete(old_done)
        has_new = False
        if first_new < self._alive.n:
            new_zero = first_new + _nonzero(self._size.v[first_new:] == 0.0)
            if len(new_zero):   # zero bytes: delivered after the path latency alone
                self._complete(new_zero)
            has_new = self._n_alive > 0 and bool(self._alive.v[first_new:].any())
        if has_new or len(old_done):
            self._solve(now, old_done, r_done, first_new if has_new else self._alive.n, kern)
        self._maybe_compact()
        self._schedule_wake(now, kern)

    def _complete(self, idx: np.ndarray) -> None:
        self._alive.v[idx] = False
        self._rate.v[idx] = 0.0
        self._tfin.v[idx] = np.inf
        pst = self._pstart.v
        links = self._pl.v[incremental.ranges(pst[idx], pst[idx + 1])]
        self._lcnt -= np.bincount(links, minlength=self._n_links)
        self._n_alive -= len(idx)
        self._n_alive_pairs -= len(links)
        by_lat: dict[float, list[int]] = {}
        for lat, g in zip(self._plat.v[idx].tolist(), self._group.v[idx].tolist(), strict=True):
            by_lat.setdefault(lat, []).append(g)
        for lat in sorted(by_lat):
            if lat == 0:
                self._deliver(by_lat[lat], None)
            else:
                self.env.timeout(lat).callbacks.append(partial(self._deliver, by_lat[lat]))

    def _deliver(self, gids: list[int], _ev: simpy.Event | None) -> None:
        finished = []
        for g in gids:
            entry = self._groups[g]
            entry[1] -= 1
            if entry[1] == 0:
                finished.append(g)
        for g in sorted(finished):
            entry = self._groups.pop(g)
            entry[0].succeed(entry[2])

    def _maybe_compact(self) -> None:
        n = self._alive.n
        if n < 64 or self._n_alive * 2 > n:
            return
        alive = self._alive.v
        keep_pair = alive[self._pf.v]
        dead_p = ~keep_pair   # finished flows leave: credit their bytes to their links
        self._done_bytes += np.bincount(self._pl.v[dead_p], weights=self._size.v[self._pf.v[dead_p]],
                                        minlength=self._n_links)
        new_id = np.cumsum(alive) - 1
        pf = new_id[self._pf.v[keep_pair]]
        self._pl.compact(keep_pair)
        self._pf.compact(keep_pair)
        self._pf.v[:] = pf
        lens = np.diff(self._pstart.v)[alive]
        self._pstart.n = 1
        self._pstart.extend(np.cumsum(lens))
        for arr in (self._rem, self._tref, self._rate, self._tfin, self._size, self._plat,
                    self._start, self._group):
            arr.compact(alive)
        self._alive.compact(alive)
        self._lindex = None

    def _workspace(self, n_slots: int) -> tuple[np.ndarray, ...]:
        """Zeroed per-link and per-slot scratch arrays of the compiled solve (kept zeroed)."""
        ws = self._ws
        if ws is None:
            n = self._n_links
            ws = self._ws = [np.zeros(0, dtype=bool), np.zeros(n, dtype=bool), np.zeros(n),
                             np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n),
                             np.zeros(n, dtype=bool), np.zeros(n)]
        if len(ws[0]) < n_slots:
            ws[0] = np.zeros(max(n_slots, 2 * len(ws[0])), dtype=bool)
        return tuple(ws)

    def _solve(self, now: float, done: np.ndarray, r_done: float, first_new: int,
               kern: Any) -> None:
        """Re-rate after flows ``done`` (slots) finished and slots ``first_new:`` started."""
        # a small problem is re-solved whole: cheaper than finding what it affects
        whole = not (self._incremental and self._n_alive_pairs > SMALL_PAIRS)
        if not whole and (self._lindex is None or 2 * self._n_alive_pairs < len(self._lindex[1])):
            # (re)built over the running flows once half of those it lists have finished
            self._lindex = (kern or incremental).link_index(self._pf.v, self._pl.v, self._alive.v,
                                                            self._n_links)
        lptr, lidx = self._lindex if self._lindex is not None else (None, None)
        state = (self._pstart.v, self._pf.v, self._pl.v, lptr, lidx, self._cap, self._alive.v,
                 self._rate.v, self._rem.v, self._tref.v, self._tfin.v, self._lcnt,
                 np.asarray(done, dtype=np.int64), first_new, r_done, self._n_alive, whole)
        if kern is None:
            idx = incremental.solve(now, *state)
        else:
            if lptr is None:
                lptr = lidx = np.zeros(1, dtype=np.int64)
                state = state[:3] + (lptr, lidx) + state[5:]
            idx = kern.solve(now, *state, incremental.FULL_FRACTION, incremental.THRESHOLD_MARGIN,
                             CAP_FLOOR, 1.0 + SAT_RTOL, *self._workspace(self._alive.n))
        self.n_resolved += len(idx)
        self.n_solves += 1
        if self._record or self._on_solve is not None:
            rate = self._rate.v
            keep = self._alive.v[self._pf.v]
            pf, pl = self._pf.v[keep], self._pl.v[keep]
            if self._record:
                load = np.bincount(pl, weights=rate[pf], minlength=self._n_links)
                for link in _nonzero(load != self._last_load).tolist():
                    self._series.setdefault(link, []).append((now, float(load[link])))
                self._last_load = load
            if self._on_solve is not None:
                self._on_solve(now, pf, pl, rate.copy())

    def _schedule_wake(self, now: float, kern: Any) -> None:
        if not self._n_alive:
            return
        t = float(kern.earliest(self._tfin.v) if kern is not None else self._tfin.v.min())
        if t < np.inf:
            self.env.timeout(max(t - now, 0.0)).callbacks.append(
                partial(self._on_wake, self._version))
