"""Identical data-parallel replicas: which ranks a representative stands for (pure).

With ``replicas="identical"`` every expert-data-parallel replica of an EP group
(same stage, same tp and ep coordinates, different ``edp`` index) sees the same
token sampling, so all replicas run the same program, only renamed. The engine
then builds and simulates one *representative* per class (the rank with edp index
0) and lets it stand for its *mirrors* (the same rank in the other replicas):

- collectives whose group holds mirrors (data-parallel gradient buckets, ZeRO
  gathers, expert-data-parallel groups) are run in full: each mirror joins with
  its representative, at the same simulated time, so the DP traffic of the whole
  group is on the network, exactly as the group structure says;
- the EP all-to-alls, pipeline sends and compute of the mirrors are not simulated;
  their flows would cross other links than the representative's (other nodes) and
  only meet it where fabric links are shared, which the fidelity test measures
  (``tests/test_scale_fidelity.py``);
- a mirror's timeline and breakdown are its representative's.

``replicas="independent"`` (the default) samples every EP group separately and
simulates every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moesim.errors import InputError

REPLICA_MODES = ("independent", "identical", "sampled")


@dataclass(frozen=True)
class ReplicaMap:
    """``rep[r]``: the representative of rank r (r itself for a representative);
    ``mirrors[q]``: the ranks representative q stands for (edp index 1, 2, ...)."""

    rep: np.ndarray
    mirrors: dict[int, tuple[int, ...]]

    @property
    def representatives(self) -> list[int]:
        return [int(r) for r in np.flatnonzero(self.rep == np.arange(len(self.rep)))]

    def is_rep(self, rank: int) -> bool:
        return int(self.rep[rank]) == rank


def replica_map(layout) -> ReplicaMap:
    """Representatives of a :class:`moesim.layout.mesh.Layout`: per expert-data-parallel
    group (ranks differing only in their edp index), the member with edp index 0."""
    world = layout.world
    rep = np.arange(world, dtype=np.int64)
    mirrors: dict[int, tuple[int, ...]] = {}
    edp = layout.coords["edp"]
    for g in layout.edp_groups:
        members = sorted(g, key=lambda r: int(edp[r]))
        head = members[0]
        rep[list(members)] = head
        if len(members) > 1:
            mirrors[int(head)] = tuple(int(m) for m in members[1:])
    return ReplicaMap(rep=rep, mirrors=mirrors)


def replicas_mode(scenario, override: str | None = None) -> str:
    """The replica mode: ``override`` if given, else the scenario's ``engine.replicas``
    (default ``independent``). InputError names the field on a bad value."""
    value = override if override is not None else scenario.engine.replicas
    if value not in REPLICA_MODES:
        raise InputError(scenario.source, "engine.replicas", "one of " + ", ".join(REPLICA_MODES),
                         value)
    return str(value)
