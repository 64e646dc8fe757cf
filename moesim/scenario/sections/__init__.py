"""The scenario's free-standing sections as typed, checked dataclasses: ``serve``
(:mod:`.serve`), ``rl`` (:mod:`.rl`), ``load`` (:mod:`.load`) and the length
distributions both of the latter take (:mod:`.lengths`). Each is parsed when the
scenario is read (:mod:`moesim.scenario.read`); the packages above that run a section
(``moesim.serve``, ``moesim.rl``, ``moesim.traffic``) check the names their registries
hold (RL algorithms, schedulers, balancers, length distributions) when they wire it.

A section read from a file keeps the mapping it was read from (:func:`written`), which
:meth:`moesim.scenario.schema.Scenario.to_dict` echoes; engines and commands read the
typed fields. It is an attribute beside the dataclass's fields, so it is no key of the
section and ``dataclasses.asdict`` (the summaries' echo of a checked section) leaves it
out.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def as_written(section: T, d: Any) -> T:
    """``section`` remembering the mapping ``d`` it was read from (a private copy)."""
    object.__setattr__(section, "_written", copy.deepcopy(dict(d)))
    return section


def written(section: Any) -> dict:
    """The mapping a section was read from (a copy); for one built in code, its fields."""
    if hasattr(section, "as_dict"):          # the lower packages' sections keep their own
        return section.as_dict()
    d = getattr(section, "_written", None)
    if d is None:
        return dataclasses.asdict(section) if dataclasses.is_dataclass(section) else {}
    return copy.deepcopy(d)
