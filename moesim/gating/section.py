"""The ``routing:`` section of a scenario, validated into a
:class:`~moesim.gating.config.RoutingConfig`: :func:`routing_from_dict` is the one place
that does it. ``routing.kind`` and the keys each kind reads come from the registry of
kinds (:mod:`moesim.gating.kinds`); the keys every kind shares are checked here. Every
problem raises ``InputError(source, "routing.<field>", expected, got)``.
"""

from __future__ import annotations

from typing import Any

from moesim.errors import InputError
from moesim.gating import kinds
from moesim.gating.config import (
    DRIFTS,
    DROP_POLICIES,
    PATHS,
    REPLICA_SPLITS,
    RoutingConfig,
)
from moesim.gating.eplb_placement import read_placement
from moesim.gating.fields import choice, integer, number, replicate

#: keys of the ``routing:`` section that every kind reads (after ``kind`` and the
#: kinds' own keys)
SHARED_KEYS = (
    "drift", "drift_rate", "top_k", "capacity_factor", "pad_to_capacity", "drop_policy",
    "max_nodes", "jitter", "replicate", "replica_split", "path", "placement",
)


def keys() -> tuple[str, ...]:
    """Every key the ``routing:`` section may hold: kind, the kinds' own, the shared."""
    own = tuple(dict.fromkeys(key for k in kinds.kinds() for key in k.keys))
    return ("kind", *own, *SHARED_KEYS)


def routing_from_dict(d: dict | None, source: str) -> RoutingConfig:
    """Validate the ``routing:`` mapping of ``source`` into a :class:`RoutingConfig`.

    A relative ``file`` is resolved against the directory of ``source``.
    """
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise InputError(source, "routing", "a mapping", d)
    allowed = keys()
    unknown = sorted(set(d) - set(allowed), key=str)
    if unknown:
        raise InputError(source, f"routing.{unknown[0]}", "one of the keys " + ", ".join(allowed),
                         unknown[0])
    kind = choice(d, "kind", kinds.names(), source, "uniform")
    kw: dict[str, Any] = {"kind": kind}
    for k in kinds.kinds():
        if k.read is not None:
            kw.update(k.read(d, source))
    kw["drift"] = choice(d, "drift", DRIFTS, source, "none")
    kw["drift_rate"] = number(d, "drift_rate", source, 0.0, 10.0, default=0.0)
    kw["jitter"] = number(d, "jitter", source, 0.0, 100.0, default=0.0)
    kw["drop_policy"] = choice(d, "drop_policy", DROP_POLICIES, source, "probability")
    kw["replica_split"] = choice(d, "replica_split", REPLICA_SPLITS, source, "even")
    kw["path"] = choice(d, "path", PATHS, source, "auto")
    if d.get("top_k") is not None:
        kw["top_k"] = integer(d["top_k"], "top_k", source, 1)
    if d.get("capacity_factor") is not None:
        kw["capacity_factor"] = number(d, "capacity_factor", source, 0.0, lo_open=True)
    if d.get("pad_to_capacity") is not None:
        pad = d["pad_to_capacity"]
        if not isinstance(pad, bool):
            raise InputError(source, "routing.pad_to_capacity", "true or false", pad)
        if pad and d.get("capacity_factor") is None:
            raise InputError(source, "routing.pad_to_capacity", "a capacity_factor to pad "
                             "to (Megatron-Core requires moe_expert_capacity_factor)", pad)
        kw["pad_to_capacity"] = pad
    if d.get("max_nodes") is not None:
        kw["max_nodes"] = integer(d["max_nodes"], "max_nodes", source, 1)
    if d.get("replicate") is not None:
        kw["replicate"] = replicate(d["replicate"], source)
    if d.get("placement") is not None:
        kw["placement"] = read_placement(d["placement"], source)
    for k in kinds.kinds():
        if k.load is None:
            continue
        if k.name == kind:
            kw.update(k.load(d, source))
            continue
        for key in k.keys:
            if d.get(key) is not None:
                raise InputError(source, f"routing.{key}", f"no {key} unless kind is {k.name}",
                                 d[key])
    return RoutingConfig(**kw)
