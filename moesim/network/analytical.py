"""Contention-free analytical network: latency + bytes / bottleneck capacity.

Every flow runs as if alone on its path: it is delivered after the sum of its
path's link latencies plus ``bytes / min(capacity on the path)``. Concurrent
flows do not slow each other down. Fast, and a cross-check for
:class:`moesim.network.flow.FlowNetwork` (which equals it whenever no link is
shared). Units: seconds, bytes, bytes/s.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import simpy

from moesim.network.base import LinkSet, checked_bytes, checked_flow
from moesim.network.flow import ROUTE_CACHE_MAX


class AnalyticalNetwork:
    """No-contention model over a :class:`~moesim.network.base.LinkSet`.

    Bytes are credited to the links of a flow's path when the flow is delivered.
    """

    def __init__(self, env: simpy.Environment, links: LinkSet) -> None:
        self.env = env
        self.links = links
        self._cap = np.asarray(links.capacity_Bps, dtype=float)
        self._lat = np.asarray(links.latency_s, dtype=float)
        if np.any(~(self._cap > 0)) or np.any(~(self._lat >= 0)):
            raise ValueError("links need capacity_Bps > 0 and latency_s >= 0 on every link")
        self._routes: dict[tuple[str, str, int], tuple[np.ndarray, float, float]] = {}
        self._bytes = np.zeros(len(self._cap))
        self.n_flows = 0

    def _route(self, src: str, dst: str, key: int) -> tuple[np.ndarray, float, float]:
        k = (src, dst, key)
        hit = self._routes.get(k)
        if hit is None:
            if len(self._routes) >= ROUTE_CACHE_MAX:
                self._routes.clear()
            path = np.asarray(self.links.route(src, dst, key), dtype=np.int64)
            if len(path):
                hit = (path, float(self._lat[path].sum()), float(self._cap[path].min()))
            else:
                hit = (path, 0.0, np.inf)
            self._routes[k] = hit
        return hit

    def flow_time(self, src: str, dst: str, nbytes: float, key: int = 0) -> float:
        """Seconds from start to delivery of one flow alone on its path."""
        nbytes = checked_bytes(src, dst, nbytes)
        path, lat, bottleneck = self._route(src, dst, key)
        return 0.0 if len(path) == 0 else lat + nbytes / bottleneck

    def transfer(self, src: str, dst: str, nbytes: float, key: int = 0, tag: Any = None) -> simpy.Event:
        """Start one flow now; the event (value ``tag``) succeeds at delivery."""
        return self.transfer_many([(src, dst, nbytes)], key=key, tag=tag)

    def transfer_many(self, flows: Sequence[tuple[str, str, float]], key: int = 0,
                      tag: Any = None, latency: bool = True) -> simpy.Event:
        """Start several flows now; the event (value ``tag``) succeeds when all are delivered.

        Each flow is ``(src, dst, bytes)`` or ``(src, dst, bytes, key)``: a fourth
        element picks that flow's ECMP path, overriding ``key``. ``latency=False``:
        without the path latency (as :meth:`moesim.network.FlowNetwork.transfer_many`)."""
        ev = self.env.event()
        timed = []
        for f in flows:
            src, dst, nbytes, fkey = checked_flow(f, key)   # all checked before any starts
            path, lat, bottleneck = self._route(src, dst, fkey)
            if len(path):   # src == dst crosses no link
                timed.append(((lat if latency else 0.0) + nbytes / bottleneck, path, nbytes))
        self.n_flows += len(timed)
        longest = 0.0
        for t, path, nbytes in timed:
            longest = max(longest, t)
            # each flow is credited to its links at its own delivery
            self.env.timeout(t).callbacks.append(partial(self._credit, path, nbytes))
        if longest == 0.0:
            ev.succeed(tag)
        else:
            self.env.timeout(longest).callbacks.append(lambda _e: ev.succeed(tag))
        return ev

    def _credit(self, path: np.ndarray, nbytes: float, _ev: simpy.Event) -> None:
        self._bytes[path] += nbytes

    def link_bytes(self) -> np.ndarray:
        """Bytes carried so far per link (credited at each flow's delivery)."""
        return self._bytes.copy()
