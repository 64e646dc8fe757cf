"""Links that can never be a bottleneck, found from the graph alone (pure, no simpy).

A node with exactly two neighbours, u and w, that no flow starts or ends at (a NIC
between its GPU's PCIe link and its leaf switch, a PCIe switch in a chain) relays
every flow that enters it from u to w and every flow from w to u: a simple path that
enters it must leave it by the other side. So the links u->v and v->w carry the same
flows, at every instant, and so do w->v and v->u. Such links, chained through
several relays, form a *class* of links with one flow set.

Within a class the link of smallest capacity (the *master*) saturates first. A link
of the class whose capacity is above the master's by more than :data:`MARGIN`
(relative) can never be a bottleneck: with the same flows and the same frozen load,
its fair share ``max(c - load, c x floor) / n`` is at least ``c / c_master`` times
the master's (1.3x for a 63 GB/s PCIe link in front of a 47.5 GB/s NIC), so
progressive filling never freezes a flow on it, and a round of local bottlenecks
always finds it above the share of a flow crossing it (``SAT_RTOL`` 1e-9 is far
below :data:`MARGIN`). Leaving such *shadow* links out of the max-min problem gives
the same rates bit for bit: every other link sees the same loads, added in the same
order, and the links keep their order of first use.

:func:`shadow_classes` finds the classes; the flow network
(:class:`moesim.network.flow.FlowNetwork`) leaves the shadow links out of the pairs
it solves over, checks each new route (a route that crosses part of a class, such
as one that starts at a NIC, breaks the premise: the class's links are put back for
every flow, :meth:`moesim.network.slots.Slots.restore`), and reports the shadow
links' bytes and loads as their master's (the same flows).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

#: a link of a class is left out only when its capacity exceeds the master's by more
#: than this fraction (far above rounding and ``maxmin.SAT_RTOL``): links within it
#: of the master stay in the problem (they would tie with it)
MARGIN = 1e-6


def link_ends(names: Sequence[str]) -> list[tuple[str, str]]:
    """(u, v) of each link named ``"u->v"`` (the :class:`moesim.network.base.LinkSet`
    convention)."""
    out = []
    for name in names:
        u, sep, v = str(name).partition("->")
        if not sep or not u or not v:
            raise ValueError(f"link name {name!r}: expected 'u->v'")
        out.append((u, v))
    return out


def shadow_classes(ends: Sequence[tuple[str, str]], cap: np.ndarray,
                   endpoints: Collection[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """(cls, master) for links ``ends[l] = (u, v)`` of capacity ``cap[l]``; nodes in
    ``endpoints`` (where flows start and end: the GPUs) are never relays.

    ``cls[l]``: the class of link l (-1 if it shares its flow set with no other link
    through a relay); ``master[l]``: the link whose flows link l always carries, if l
    is a shadow link (capacity above the class's smallest by more than
    :data:`MARGIN`), else -1. Deterministic: classes numbered by
    their smallest link id, the master the first link of smallest capacity."""
    n = len(ends)
    nbr: dict[str, set[str]] = {}
    out_link: dict[tuple[str, str], int] = {}
    for lk, (u, v) in enumerate(ends):
        nbr.setdefault(u, set()).add(v)
        nbr.setdefault(v, set()).add(u)
        out_link[(u, v)] = lk
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    related: set[int] = set()
    ends_at = set(endpoints)
    for v in sorted(nbr):
        if len(nbr[v]) != 2 or v in ends_at:
            continue
        u, w = sorted(nbr[v])
        for a, b in ((u, w), (w, u)):   # a -> v -> b: one flow set
            x, y = out_link.get((a, v)), out_link.get((v, b))
            if x is not None and y is not None:
                rx, ry = find(x), find(y)
                if rx != ry:
                    parent[max(rx, ry)] = min(rx, ry)
                related.update((x, y))
    cls = np.full(n, -1, dtype=np.int64)
    master = np.full(n, -1, dtype=np.int64)
    members: dict[int, list[int]] = {}
    for lk in sorted(related):
        members.setdefault(find(lk), []).append(lk)
    for k, root in enumerate(sorted(members)):
        links = members[root]
        cls[links] = k
        m = min(links, key=lambda lk: (cap[lk], lk))
        for lk in links:
            if cap[lk] > cap[m] * (1.0 + MARGIN):
                master[lk] = m
    return cls, master


def partial_classes(path: Sequence[int], cls: np.ndarray, size: np.ndarray) -> list[int]:
    """The classes ``path`` crosses only in part (in order of first crossing; empty when
    it crosses every link of each class it touches, the premise of
    :func:`shadow_classes`). ``size``: links per class."""
    seen: dict[int, int] = {}
    for lk in path:
        k = int(cls[lk])
        if k >= 0:
            seen[k] = seen.get(k, 0) + 1
    return [k for k, cnt in seen.items() if cnt != size[k]]
