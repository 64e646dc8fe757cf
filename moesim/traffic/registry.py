"""A registry of named kinds at one extension point: serving schedulers
(:mod:`moesim.traffic.schedulers`), request balancers (:mod:`moesim.traffic.balancer`),
length distributions (:mod:`moesim.traffic.lengths`), RL algorithms
(:mod:`moesim.rl.algorithms`).

Each kind is registered once, with its name, the config fields it takes (and their
defaults) and its factory; a section's check asks the registry which names exist and which
fields a name takes, so adding a kind is one :meth:`Registry.register` call (as Vidur's
``SchedulerRegistry`` and ``ExecutionTimePredictorRegistry`` register theirs). The
registry itself is pure: no kind is imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from moesim.errors import InputError


@dataclass(frozen=True)
class Kind:
    """One registered kind: ``name``, its ``factory`` (what it is or how one is built
    depends on the extension point), the config ``fields`` it takes beside the section's common
    keys (field -> default), a one-line ``doc`` and an optional ``check`` of a built
    config against its surroundings (its arguments depend on the extension point)."""

    name: str
    factory: Any
    fields: Mapping[str, Any] = field(default_factory=dict)
    doc: str = ""
    check: Callable[..., None] | None = None


class Registry:
    """Named kinds of one extension point, in the order they were registered.
    ``key`` is the config field that names a kind (``load.scheduler``), used in the one
    line an unknown name is refused with."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._kinds: dict[str, Kind] = {}

    def register(self, name: str, factory: Any,
                 fields: Mapping[str, Any] | None = None, doc: str = "",
                 check: Callable[..., None] | None = None) -> Kind:
        if name in self._kinds:
            raise ValueError(f"{self.key}: {name!r} is registered already")
        kind = Kind(name, factory, MappingProxyType(dict(fields or {})), doc, check)
        self._kinds[name] = kind
        return kind

    def unregister(self, name: str) -> None:
        del self._kinds[name]

    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._kinds

    def get(self, name: Any, source: str = "<registry>", key: str | None = None) -> Kind:
        """The kind called ``name``; else one :class:`InputError` naming the field
        (``key``, default the registry's) and the registered names."""
        if name not in self:
            raise InputError(source, key or self.key, f"one of {list(self.names())}", name)
        return self._kinds[name]

    def all_fields(self) -> tuple[str, ...]:
        """Every field some kind takes (in registration order, once each)."""
        return tuple(dict.fromkeys(f for k in self._kinds.values() for f in k.fields))

    def refuse_foreign(self, d: Mapping[str, Any], kind: Kind, source: str,
                       section: str, noun: str) -> None:
        """Refuse a key of section ``d`` that only other kinds take, naming the kind
        chosen, the fields it takes and the kinds that take the key (one line)."""
        for k in d:
            if k in self.all_fields() and k not in kind.fields:
                takers = [n for n in self.names() if k in self._kinds[n].fields]
                raise InputError(source, f"{section}.{k}", f"no {k} for {noun} {kind.name} "
                                 f"(it takes {list(kind.fields)}; {k} is for {takers})", d[k])
