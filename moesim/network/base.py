"""The interface every network model implements (ASTRA-sim style: small).

A network model runs inside a simpy ``Environment``. It is built over a
*link set* (anything with ``capacity_Bps``, ``latency_s``, ``link_names``,
``link_kinds`` and ``route(src, dst, key) -> tuple[int, ...]``; a
:class:`moesim.topology.Topology` is one). A model may also offer ``send(src, dst,
nbytes, callback, key=0)``: ``transfer`` calling ``callback(event)`` at delivery instead
of returning an event (:class:`moesim.network.flow.FlowNetwork` does; the communicator
uses it where present, else ``transfer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import simpy


def checked_bytes(src: str, dst: str, nbytes: Any) -> float:
    """``nbytes`` as a float; ValueError naming the flow unless finite and >= 0."""
    nbytes = float(nbytes)
    if not nbytes >= 0 or nbytes == np.inf:
        raise ValueError(f"flow {src}->{dst}: bytes must be finite and >= 0, got {nbytes}")
    return nbytes


def checked_flow(flow: Sequence[Any], key: int) -> tuple[str, str, float, int]:
    """(src, dst, bytes, key) of one ``transfer_many`` entry, ``(src, dst, bytes)`` or
    ``(src, dst, bytes, key)`` (a fourth element overrides ``key``); bytes checked."""
    src, dst = flow[0], flow[1]
    return src, dst, checked_bytes(src, dst, flow[2]), (flow[3] if len(flow) > 3 else key)


class LinkSet(Protocol):
    capacity_Bps: np.ndarray   # per directed link, bytes/s after efficiency
    latency_s: np.ndarray      # per directed link, seconds
    link_names: list[str]      # "u->v"
    link_kinds: list[str]

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        """Link ids from src to dst (empty when src == dst). ``key`` picks among
        equal-cost paths deterministically (ECMP)."""


class NetworkModel(Protocol):
    env: simpy.Environment

    def transfer(self, src: str, dst: str, nbytes: float, key: int = 0, tag: Any = None) -> simpy.Event:
        """Start a flow now; the event succeeds when its last byte is delivered
        (bandwidth share over time, plus the sum of its path's link latencies)."""

    def transfer_many(self, flows: Sequence[tuple[str, str, float]], key: int = 0,
                      tag: Any = None, latency: bool = True) -> simpy.Event:
        """Start several flows now; the event succeeds when all are delivered
        (``latency=False``: without the path latencies)."""

    def link_bytes(self) -> np.ndarray:
        """Bytes carried so far per link."""
