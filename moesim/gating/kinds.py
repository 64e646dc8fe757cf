"""Kinds of token routing: the one registry of ``routing.kind``.

A kind says how popular each expert is: its ``shares(cfg, n_experts, seed, layer,
source)`` returns one layer's target share of (token, expert) assignments per expert
before drift (q >= 0, sum q = 1; :func:`moesim.gating.skew.expert_shares` adds the
drift, the router samples k distinct experts per token from it). Each kind is
registered once with:

- ``keys``: the keys of the ``routing:`` section only this kind reads (a key another
  kind does not read is warned about, not dropped silently:
  :func:`moesim.scenario.checks.routing_ignored_warnings`, from :func:`keys_by_kind`);
- ``read(d, source)``: checks those keys into :class:`~moesim.gating.config.RoutingConfig`
  fields, whatever the kind chosen (a bad value is refused even where unused);
- ``load(d, source)``: for a kind that reads more when chosen (``file``: the counts); its
  keys are then refused under any other kind ("no file unless kind is file");
- ``exact``: the shares are what the user asked for, so a share above what k distinct
  picks allow (1/top_k) is refused rather than capped (``hot``).

:func:`moesim.gating.section.routing_from_dict` validates ``routing.kind`` and the keys
from this registry. Built in: ``uniform``, ``zipf``, ``hot``, ``dirichlet``, ``file``
(docs/routing.md).

Adding a kind: write its shares function and register it here (one
:func:`register_kind` call); a parameter no kind has yet is also a field of
:class:`~moesim.gating.config.RoutingConfig` (moesim/gating/config.py). In a test::

    with registered_kind(RoutingKind("first_two", first_two_shares)):
        cfg = routing_from_dict({"kind": "first_two"}, "test")
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import InputError
from moesim.gating.config import RoutingConfig
from moesim.gating.fields import hot_experts, load_counts, number

#: the stream of per-layer random draws: (seed, STREAM_LAYER, layer, i), i = 0 for a
#: kind's shares (dirichlet), 1 for the drift's relabelling (moesim.gating.skew)
STREAM_LAYER = 1

Shares = Callable[[RoutingConfig, int, int, int, str], np.ndarray]
Read = Callable[[Mapping, str], dict]


@dataclass(frozen=True)
class RoutingKind:
    """A kind of token routing (see the module docstring)."""

    name: str
    shares: Shares
    keys: tuple[str, ...] = ()
    read: Read | None = None
    load: Read | None = None
    exact: bool = False
    doc: str = ""


_KINDS: dict[str, RoutingKind] = {}


def register_kind(kind: RoutingKind) -> RoutingKind:
    """Register ``kind``; a name registered twice is a ValueError."""
    if not isinstance(kind.name, str) or not kind.name:
        raise ValueError("a routing kind's name is a non-empty string")
    if kind.name in _KINDS:
        raise ValueError(f"routing kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Forget the kind ``name``."""
    if _KINDS.pop(name, None) is None:
        raise KeyError(f"routing kind {name!r} is not registered (registered: "
                       f"{', '.join(_KINDS)})")


@contextmanager
def registered_kind(kind: RoutingKind) -> Iterator[RoutingKind]:
    """:func:`register_kind` for the duration of a ``with`` block."""
    register_kind(kind)
    try:
        yield kind
    finally:
        unregister_kind(kind.name)


def names(files: bool = True) -> tuple[str, ...]:
    """Registered kind names, in registration order; ``files=False`` leaves out the kinds
    that read more when chosen (``file``: a counts file)."""
    return tuple(n for n, k in _KINDS.items() if files or k.load is None)


def kinds() -> tuple[RoutingKind, ...]:
    """The registered kinds, in registration order."""
    return tuple(_KINDS.values())


def get_kind(name: str, source: str = "routing", field: str = "routing.kind") -> RoutingKind:
    """The registered kind ``name``; else an InputError naming ``field`` and the kinds."""
    kind = _KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise InputError(source, field, "one of " + ", ".join(_KINDS), name)
    return kind


def keys_by_kind() -> dict[str, tuple[str, ...]]:
    """Each kind-specific key of the ``routing:`` section → the kinds that read it."""
    out: dict[str, tuple[str, ...]] = {}
    for k in _KINDS.values():
        for key in k.keys:
            out[key] = (*out.get(key, ()), k.name)
    return out


# ------------------------------------------------------------------- built in
def _uniform(cfg: RoutingConfig, e: int, seed: int, layer: int, source: str) -> np.ndarray:
    return np.full(e, 1.0 / e)


def _zipf(cfg: RoutingConfig, e: int, seed: int, layer: int, source: str) -> np.ndarray:
    w = 1.0 / np.arange(1, e + 1, dtype=float) ** cfg.zipf_s
    return w / w.sum()


def _read_zipf(d: Mapping, source: str) -> dict:
    return {"zipf_s": number(d, "zipf_s", source, 0.0, 20.0, default=1.0)}


def hot_ids(cfg: RoutingConfig, n_experts: int, source: str = "routing") -> np.ndarray:
    """The hot set as expert ids (before any drift relabelling)."""
    if isinstance(cfg.hot_experts, int):
        if cfg.hot_experts >= n_experts:
            raise InputError(source, "routing.hot_experts",
                             f"fewer hot experts than the {n_experts} experts", cfg.hot_experts)
        return np.arange(cfg.hot_experts)
    ids = np.asarray(cfg.hot_experts, dtype=np.int64)
    if ids.max() >= n_experts:
        raise InputError(source, "routing.hot_experts", f"expert ids < {n_experts}",
                         list(cfg.hot_experts))
    if len(ids) >= n_experts:
        raise InputError(source, "routing.hot_experts",
                         f"fewer hot experts than the {n_experts} experts", list(cfg.hot_experts))
    return ids


def _hot(cfg: RoutingConfig, e: int, seed: int, layer: int, source: str) -> np.ndarray:
    ids = hot_ids(cfg, e, source)
    q = np.full(e, (1.0 - cfg.hot_fraction) / (e - len(ids)))
    q[ids] = cfg.hot_fraction / len(ids)
    return q


def _read_hot(d: Mapping, source: str) -> dict:
    kw: dict[str, Any] = {"hot_experts": hot_experts(d.get("hot_experts", 1), source)}
    if d.get("hot_fraction") is not None:   # null: the default (e.g. --set ...=null)
        kw["hot_fraction"] = number(d, "hot_fraction", source, 0.0, 1.0)
    if d.get("hot_token_fraction") is not None:
        if d.get("hot_fraction") is not None:
            raise InputError(source, "routing.hot_token_fraction",
                             "either hot_fraction (share of assignments) or hot_token_fraction "
                             "(share of tokens), not both", d["hot_token_fraction"])
        kw["hot_token_fraction"] = number(d, "hot_token_fraction", source, 0.0, math.inf)
    return kw


def _dirichlet(cfg: RoutingConfig, e: int, seed: int, layer: int, source: str) -> np.ndarray:
    rng = np.random.default_rng([seed, STREAM_LAYER, layer, 0])
    return rng.dirichlet(np.full(e, cfg.alpha))


def _read_dirichlet(d: Mapping, source: str) -> dict:
    return {"alpha": number(d, "alpha", source, 0.0, lo_open=True, default=1.0)}


def _file(cfg: RoutingConfig, e: int, seed: int, layer: int, source: str) -> np.ndarray:
    counts = cfg.counts or ()
    where = cfg.file or source
    if len(counts) != 1 and layer >= len(counts):
        raise InputError(where, "routing.file",
                         f"a row of counts for MoE layer {layer} (or a single row for all)",
                         f"{len(counts)} rows")
    row = np.asarray(counts[0] if len(counts) == 1 else counts[layer], dtype=float)
    if row.size != e:
        raise InputError(where, "routing.file", f"{e} expert columns", int(row.size))
    return row / row.sum()


def _load_file(d: Mapping, source: str) -> dict:
    """The counts file, relative to the directory of ``source``."""
    f = d.get("file")
    if not isinstance(f, str) or not f:
        raise InputError(source, "routing.file", "a counts file path (kind: file)", f)
    p = Path(f)
    if not p.is_absolute():
        p = Path(source).parent / p
    return {"file": f, "counts": load_counts(p, source)}


register_kind(RoutingKind("uniform", _uniform, doc="every expert the same share"))
register_kind(RoutingKind("zipf", _zipf, ("zipf_s",), _read_zipf,
                          doc="share of the r-th most popular expert ∝ 1/r**zipf_s"))
register_kind(RoutingKind("hot", _hot, ("hot_experts", "hot_fraction", "hot_token_fraction"),
                          _read_hot, exact=True,
                          doc="hot_fraction of the assignments to the hot_experts"))
register_kind(RoutingKind("dirichlet", _dirichlet, ("alpha",), _read_dirichlet,
                          doc="shares drawn per layer from Dirichlet(alpha)"))
register_kind(RoutingKind("file", _file, ("file",), load=_load_file,
                          doc="shares from a counts file (layers × experts)"))
