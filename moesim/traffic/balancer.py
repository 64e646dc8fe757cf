"""The request balancer: which attention data-parallel rank (member) a request joins.

A balancer is registered in :data:`BALANCERS` by name with a factory
``factory(members) -> Balancer`` (``members``: the schedulers, each with its
``outstanding`` requests); ``load.router`` names one. Built in: ``round_robin`` cycles
over the members; ``least_outstanding`` picks the member with the fewest requests waiting
or running (ties: the lowest index), as a load balancer that counts in-flight requests
does (Vidur's global schedulers: round_robin, lor).
"""

from __future__ import annotations

from typing import Protocol

from moesim.traffic.registry import Registry


class Balancer(Protocol):
    def pick(self, eligible: list[int] | None = None) -> int:
        """The member a request joins, among ``eligible`` member indices (None: all)."""


#: request balancers by name: ``load.router`` (no fields of their own)
BALANCERS = Registry("load.router")


class RoundRobin:
    def __init__(self, members: list) -> None:
        self.members = members
        self._next = 0

    def pick(self, eligible: list[int] | None = None) -> int:
        idx = list(eligible if eligible is not None else range(len(self.members)))
        m = idx[self._next % len(idx)]
        self._next += 1
        return m


class LeastOutstanding:
    def __init__(self, members: list) -> None:
        self.members = members

    def pick(self, eligible: list[int] | None = None) -> int:
        idx = eligible if eligible is not None else range(len(self.members))
        return min(idx, key=lambda i: (self.members[i].outstanding, i))


BALANCERS.register("round_robin", RoundRobin, doc="cycles over the members")
BALANCERS.register("least_outstanding", LeastOutstanding,
                   doc="the member with the fewest requests waiting or running")


def make_balancer(name: str, members: list) -> Balancer:
    """The registered balancer ``name`` over ``members`` (ValueError if unknown)."""
    if name not in BALANCERS:
        raise ValueError(f"router must be one of {BALANCERS.names()}")
    return BALANCERS.get(name).factory(members)
