"""The global router: which attention data-parallel rank (member) a request joins.

``round_robin`` cycles over the members; ``least_outstanding`` picks the member with the
fewest requests waiting or running (ties: the lowest index), as a load balancer that
counts in-flight requests does (Vidur's global schedulers: round_robin, lor).
"""

from __future__ import annotations

ROUTERS = ("round_robin", "least_outstanding")


class Router:
    def __init__(self, kind: str, members: list) -> None:
        if kind not in ROUTERS:
            raise ValueError(f"router must be one of {ROUTERS}")
        self.kind = kind
        self.members = members
        self._next = 0

    def pick(self, eligible: list[int] | None = None) -> int:
        idx = eligible if eligible is not None else range(len(self.members))
        if self.kind == "round_robin":
            idx = list(idx)
            m = idx[self._next % len(idx)]
            self._next += 1
            return m
        return min(idx, key=lambda i: (self.members[i].outstanding, i))
