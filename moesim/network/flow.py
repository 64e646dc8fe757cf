"""Flow-level network model: max-min fair sharing, rates re-solved at every change.

Each transfer is a flow over ``links.route(src, dst, key)``. Whenever flows start
or finish, the rates of all running flows are recomputed by max-min fairness
(:mod:`moesim.network.maxmin`) and hold constant until the next change. A flow's
delivery event fires when its last byte has left (its bytes integrated over its
piecewise-constant rate) plus the sum of its path's link latencies.

Mechanics (one simpy callback chain, no process per flow):

* State is kept in numpy arrays indexed by flow slot: remaining bytes as of the
  last change, current rate, size, path latency, and the id of the transfer group
  whose event the flow belongs to. Paths are stored as (flow, link) pairs.
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
  others leave. ``incremental=False`` re-solves all running flows every time.
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

from moesim.network.base import LinkSet
from moesim.network.maxmin import maxmin_pairs

#: absolute and relative tolerance (seconds, fraction of ``env.now``) within which
#: flows predicted to finish are completed together in one step.
FINISH_ATOL_S = 1e-12
FINISH_RTOL = 1e-9

#: route arrays kept before the cache is cleared (memory bound)
ROUTE_CACHE_MAX = 1 << 20

#: flows within this relative margin of the change threshold are re-solved too
_THRESHOLD_MARGIN = 1e-6

SolveHook = Callable[[float, np.ndarray, np.ndarray, np.ndarray], None]


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
        # per flow slot
        self._rem = _Grow(float)       # bytes left to send as of self._t_last
        self._rate = _Grow(float)      # bytes/s since self._t_last
        self._size = _Grow(float)      # bytes of the flow
        self._plat = _Grow(float)      # sum of path latencies, s
        self._start = _Grow(float)     # start time, s
        self._group = _Grow(np.int64)  # transfer group id
        self._alive = _Grow(bool)
        # (flow slot, link) pairs of every flow in a slot
        self._pf = _Grow(np.int64)
        self._pl = _Grow(np.int64)
        self._t_last = float(env.now)
        self._pending: list[tuple[np.ndarray, float, int]] = []  # (path, bytes, group)
        self._groups: dict[int, list[Any]] = {}   # id -> [event, flows left, tag]
        self._next_group = 0
        self._version = 0
        self._kick_scheduled = False
        self._done_bytes = np.zeros(self._n_links)
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
            src, dst, nbytes = f[0], f[1], float(f[2])
            fkey = f[3] if len(f) > 3 else key
            if not nbytes >= 0 or nbytes == np.inf:
                raise ValueError(f"flow {src}->{dst}: bytes must be finite and >= 0, got {nbytes}")
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
            dt = float(self.env.now) - self._t_last
            sent = self._size.v - (self._rem.v - self._rate.v * dt)
            sent[~self._alive.v] = 0.0
            out += np.bincount(self._pl.v, weights=sent[self._pf.v], minlength=self._n_links)
        return out

    def series(self) -> dict[int, list[tuple[float, float]]]:
        """Per link id: (t_s, load_Bps) change points (only with ``record_series=True``)."""
        return {k: list(v) for k, v in self._series.items()}

    def active_flows(self) -> int:
        """Number of flows currently sending."""
        return int(self._alive.v.sum())

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

    def _flush_pending(self) -> int:
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
        self._start.extend(np.full(n_new, self._t_last))
        self._group.extend(np.asarray(gids, dtype=np.int64))
        self._alive.extend(np.ones(n_new, dtype=bool))
        lens = np.fromiter((len(p) for p in paths), dtype=np.int64, count=n_new)
        local = np.repeat(np.arange(n_new, dtype=np.int64), lens)
        links = np.concatenate(paths)
        self._plat.extend(np.bincount(local, weights=self._lat[links], minlength=n_new))
        self._pf.extend(local + first)
        self._pl.extend(links)
        return first

    def _step(self) -> None:
        self._version += 1   # any wake-up timer set before this step is now stale
        now = float(self.env.now)
        dt = now - self._t_last
        if dt > 0:
            self._rem.v[:] -= self._rate.v * dt
        self._t_last = now
        first_new = self._flush_pending()
        alive, rem, rate = self._alive.v, self._rem.v, self._rate.v
        tol = FINISH_ATOL_S + FINISH_RTOL * abs(now)
        if self._coalesce_rtol > 0:
            tol = tol + self._coalesce_rtol * (now - self._start.v)
        done = alive & (rem <= rate * tol)
        new = np.zeros(len(alive), dtype=bool)
        new[first_new:] = True
        changed = np.zeros(self._n_links, dtype=bool)
        r_done = np.inf
        old_done = done & ~new
        if old_done.any():  # running flows that finish: free their links
            r_done = float(rate[old_done].min())
            changed[self._pl.v[old_done[self._pf.v]]] = True
        if done.any():
            self._complete(np.flatnonzero(done))
        new &= self._alive.v
        if new.any() or old_done.any():
            self._solve(now, changed, r_done, new)
        self._maybe_compact()
        self._schedule_wake(now)

    def _complete(self, idx: np.ndarray) -> None:
        pair_done = self._mask_pairs(idx)
        self._done_bytes += np.bincount(self._pl.v[pair_done],
                                        weights=self._size.v[self._pf.v[pair_done]],
                                        minlength=self._n_links)
        self._alive.v[idx] = False
        self._rate.v[idx] = 0.0
        self._rem.v[idx] = 0.0
        lat = self._plat.v[idx]
        gid = self._group.v[idx]
        for value in np.unique(lat):
            groups = gid[lat == value]
            if value == 0:
                self._deliver(groups, None)
            else:
                self.env.timeout(float(value)).callbacks.append(partial(self._deliver, groups))

    def _mask_pairs(self, idx: np.ndarray) -> np.ndarray:
        mark = np.zeros(self._alive.n, dtype=bool)
        mark[idx] = True
        return mark[self._pf.v]

    def _deliver(self, gids: np.ndarray, _ev: simpy.Event | None) -> None:
        uniq, counts = np.unique(gids, return_counts=True)
        for g, c in zip(uniq.tolist(), counts.tolist(), strict=True):
            entry = self._groups[g]
            entry[1] -= c
            if entry[1] == 0:
                del self._groups[g]
                entry[0].succeed(entry[2])

    def _maybe_compact(self) -> None:
        alive = self._alive.v
        n = len(alive)
        n_alive = int(alive.sum())
        if n < 1024 or n_alive * 2 > n:
            return
        new_id = np.cumsum(alive) - 1
        keep_pair = alive[self._pf.v]
        pf = new_id[self._pf.v[keep_pair]]
        self._pl.compact(keep_pair)
        self._pf.compact(keep_pair)
        self._pf.v[:] = pf
        for arr in (self._rem, self._rate, self._size, self._plat, self._start, self._group):
            arr.compact(alive)
        self._alive.compact(alive)

    def _affected(self, pf: np.ndarray, pl: np.ndarray, changed: np.ndarray, r_done: float,
                  new: np.ndarray) -> np.ndarray:
        """Flows whose rate may change (bool per slot); all others keep their rate.

        Max-min freezes flows in increasing order of rate, and a change at rate r
        (a flow of rate r leaving, or a flow joining that will get at least r) leaves
        the rounds below r untouched: flows slower than r keep their rates. The
        affected flows are the new ones plus those at >= r reachable from the
        changed links through links shared with other such flows.
        """
        threshold = r_done
        if new.any():
            # a new flow gets at least min over its links of capacity / flows there
            on_new = new[pf]
            cnt = np.bincount(pl, minlength=self._n_links)
            lb = float(np.min(self._cap[pl[on_new]] / cnt[pl[on_new]]))
            threshold = min(threshold, lb)
            changed[pl[on_new]] = True
        rate = self._rate.v
        cand_p = ((self._alive.v & (rate >= threshold * (1.0 - _THRESHOLD_MARGIN))) | new)[pf]
        f, ln = pf[cand_p], pl[cand_p]
        affected = new.copy()
        while f.size:
            on = changed[ln]
            if not on.any():
                break
            affected[f[on]] = True
            take = affected[f]
            changed[ln[take]] = True     # every link of an affected flow is changed
            keep = ~take
            f, ln = f[keep], ln[keep]
        return affected

    def _solve(self, now: float, changed: np.ndarray, r_done: float, new: np.ndarray) -> None:
        alive = self._alive.v
        keep = alive[self._pf.v]
        pf = self._pf.v[keep]
        pl = self._pl.v[keep]
        rate = self._rate.v
        if self._incremental:
            aff = self._affected(pf, pl, changed, r_done, new)
            aff_p = aff[pf]
            other = ~aff_p
            load = np.bincount(pl[other], weights=rate[pf[other]], minlength=self._n_links)
            residual = np.maximum(self._cap - load, self._cap * 1e-12)
            idx = np.flatnonzero(aff)
            rate[idx] = maxmin_pairs(pf[aff_p], pl[aff_p], len(alive), residual)[idx]
            self.n_resolved += len(idx)
        else:
            rates = maxmin_pairs(pf, pl, len(alive), self._cap)
            rates[~alive] = 0.0
            rate[:] = rates
            self.n_resolved += int(alive.sum())
        self.n_solves += 1
        if self._record:
            load = np.bincount(pl, weights=rate[pf], minlength=self._n_links)
            for link in np.flatnonzero(load != self._last_load).tolist():
                self._series.setdefault(link, []).append((now, float(load[link])))
            self._last_load = load
        if self._on_solve is not None:
            self._on_solve(now, pf, pl, rate.copy())

    def _schedule_wake(self, now: float) -> None:
        alive = self._alive.v
        if not alive.any():
            return
        rate = self._rate.v[alive]
        delay = float(np.min(self._rem.v[alive] / rate))
        self.env.timeout(max(delay, 0.0)).callbacks.append(partial(self._on_wake, self._version))
