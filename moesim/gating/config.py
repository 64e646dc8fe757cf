"""Routing configuration: the ``routing:`` section of a scenario.

:class:`RoutingConfig` is frozen plain data; :func:`routing_from_dict` is the one
place that validates it. Every problem raises
``InputError(source, "routing.<field>", expected, got)``.

Quantities and units:

* shares and fractions are dimensionless (0..1); ``zipf_s`` and ``alpha`` are
  dimensionless shape parameters; ``drift_rate`` is the standard deviation of
  the natural log of an expert's popularity added per training step;
* token counts are integers; ``capacity_factor`` is dimensionless
  (Megatron-Core: capacity = ceil(tokens * top_k / experts * factor),
  megatron/core/transformer/moe/moe_utils.py get_capacity).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import InputError

KINDS = ("uniform", "zipf", "hot", "dirichlet", "file")
DRIFTS = ("none", "layer", "step", "walk")
DROP_POLICIES = ("probability", "position")
REPLICA_SPLITS = ("even", "nearest")
PATHS = ("auto", "token", "counts")


@dataclass(frozen=True)
class ReplicaSpec:
    """Extra copies of one expert: ``ranks`` are EP ranks holding a replica in
    addition to the expert's home rank."""

    expert: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class RoutingConfig:
    """How tokens pick experts.

    kind            uniform | zipf | hot | dirichlet | file (see docs/routing.md)
    zipf_s          zipf exponent: share of the r-th most popular expert ∝ 1/r**s
    hot_experts     hot set: tuple of expert ids, or an int n meaning experts 0..n-1
    hot_fraction    share of routed (token, expert) assignments going to the hot set
                    (with top-k, a token makes k assignments: 0.4 at top-2 means 80 %
                    of the tokens pick the hot expert)
    hot_token_fraction  share of TOKENS that pick a hot expert among their top-k (summed
                    over the hot set); None = use hot_fraction. With k distinct picks
                    per token, hot_fraction = hot_token_fraction / k. Exclusive with
                    hot_fraction.
    alpha           dirichlet concentration per expert (small = skewed)
    file            path of a counts file (layers × experts) the shares come from
    counts          the loaded counts (filled by routing_from_dict from ``file``)
    drift           none | layer (fixed random relabelling of experts per layer) |
                    step (new relabelling every step and layer) |
                    walk (per-layer relabelling + a random walk of log-popularity)
    drift_rate      walk: std of ln(popularity) added per step
    top_k           experts per token; None = the model's
    capacity_factor None = no dropping; else capacity per (source rank, expert) =
                    ceil(tokens_on_source * top_k / experts * factor) (Megatron-Core)
    pad_to_capacity Megatron-Core moe_pad_expert_input_to_capacity: every (source rank,
                    expert) slot is padded up to its capacity, so each expert receives and
                    computes exactly sources x capacity rows (token_dispatcher.py,
                    MoEAlltoAllTokenDispatcher, drop_and_pad); needs capacity_factor
    drop_policy     probability | position: which tokens lose an over-capacity slot
                    (changes token identity only, never the counts)
    max_nodes       node-limited routing: each token's experts lie on at most this
                    many nodes (DeepSeek-V3: 4, report §2.1.2); None = unlimited
    jitter          std of Gaussian noise added to the router logits ln(share)
                    (affects the mean router probability P_i and probability drops)
    replicate       extra replicas of hot experts (see placement.py)
    replica_split   even | nearest: how tokens for a replicated expert are split
    path            auto | token | counts: per-token sampling, counts-level sampling,
                    or token when tokens × experts <= TOKEN_PATH_LIMIT
    """

    kind: str = "uniform"
    zipf_s: float = 1.0
    hot_experts: tuple[int, ...] | int = 1
    hot_fraction: float = 0.5
    hot_token_fraction: float | None = None
    alpha: float = 1.0
    file: str | None = None
    counts: tuple[tuple[float, ...], ...] | None = None
    drift: str = "none"
    drift_rate: float = 0.0
    top_k: int | None = None
    capacity_factor: float | None = None
    pad_to_capacity: bool = False
    drop_policy: str = "probability"
    max_nodes: int | None = None
    jitter: float = 0.0
    replicate: tuple[ReplicaSpec, ...] = ()
    replica_split: str = "even"
    path: str = "auto"


_FIELDS = (
    "kind", "zipf_s", "hot_experts", "hot_fraction", "hot_token_fraction", "alpha", "file", "drift",
    "drift_rate", "top_k", "capacity_factor", "pad_to_capacity", "drop_policy", "max_nodes", "jitter",
    "replicate", "replica_split", "path",
)


def _num(d: dict, key: str, source: str, lo: float, hi: float = math.inf,
         lo_open: bool = False, default: float = 0.0) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise InputError(source, f"routing.{key}", "a finite number", v)
    if v < lo or (lo_open and v == lo) or v > hi:
        rng = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if hi < math.inf else "")
        raise InputError(source, f"routing.{key}", f"a number {rng}", v)
    return float(v)


def _int(v: Any, field: str, source: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise InputError(source, f"routing.{field}", f"an integer >= {lo}", v)
    return int(v)


def _choice(d: dict, key: str, choices: tuple[str, ...], source: str, default: str) -> str:
    v = d.get(key, default)
    if v not in choices:
        raise InputError(source, f"routing.{key}", "one of " + ", ".join(choices), v)
    return str(v)


def _hot_experts(v: Any, source: str) -> tuple[int, ...] | int:
    if isinstance(v, list | tuple):
        if not v:
            raise InputError(source, "routing.hot_experts", "a non-empty list of expert ids", v)
        ids = tuple(_int(x, "hot_experts", source, 0) for x in v)
        if len(set(ids)) != len(ids):
            raise InputError(source, "routing.hot_experts", "distinct expert ids", v)
        return ids
    return _int(v, "hot_experts", source, 1)


def _replicate(v: Any, source: str) -> tuple[ReplicaSpec, ...]:
    items = [v] if isinstance(v, dict) else v
    if not isinstance(items, list | tuple):
        raise InputError(source, "routing.replicate",
                         "a mapping {expert: E, ranks: [r, ...]} or a list of them", v)
    out = []
    seen = set()
    for item in items:
        if not isinstance(item, dict) or set(item) != {"expert", "ranks"}:
            raise InputError(source, "routing.replicate",
                             "a mapping with exactly the keys expert and ranks", item)
        e = _int(item["expert"], "replicate.expert", source, 0)
        ranks = item["ranks"]
        if isinstance(ranks, int) and not isinstance(ranks, bool):
            ranks = [ranks]
        if not isinstance(ranks, list | tuple) or not ranks:
            raise InputError(source, "routing.replicate.ranks", "a non-empty list of EP ranks",
                             ranks)
        rs = tuple(_int(r, "replicate.ranks", source, 0) for r in ranks)
        if len(set(rs)) != len(rs) or e in seen:
            raise InputError(source, "routing.replicate",
                             "each expert once, each replica rank once", item)
        seen.add(e)
        out.append(ReplicaSpec(expert=e, ranks=rs))
    return tuple(out)


def load_counts(path: Path, source: str) -> tuple[tuple[float, ...], ...]:
    """Read a counts file (layers × experts) as JSON, CSV or NPY.

    JSON: a list of lists, or ``{"counts": [[...], ...]}``; CSV: one row per layer,
    no header; NPY: a 1- or 2-D numeric array. A single row means every layer.
    """
    where = str(path)
    try:
        suffix = path.suffix.lower()
        if suffix == ".json":
            raw = json.loads(path.read_text())
            if isinstance(raw, dict):
                raw = raw.get("counts")
            arr = np.asarray(raw, dtype=float)
        elif suffix == ".csv":
            with path.open(newline="") as fh:
                rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
            arr = np.asarray([[float(c) for c in r] for r in rows], dtype=float)
        elif suffix == ".npy":
            arr = np.load(path, allow_pickle=False).astype(float)
        else:
            raise InputError(source, "routing.file", "a .json, .csv or .npy counts file", str(path))
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(source, "routing.file", "an existing counts file", where) from None
    except (OSError, ValueError, TypeError) as err:
        raise InputError(where, "routing.file", "a numeric layers × experts table",
                         str(err).splitlines()[0] if str(err) else type(err).__name__) from None
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] == 0 or arr.shape[0] == 0:
        raise InputError(where, "routing.file", "a 2-D layers × experts table", list(arr.shape))
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise InputError(where, "routing.file", "finite counts >= 0", "a negative or non-finite value")
    if np.any(arr.sum(axis=1) <= 0):
        raise InputError(where, "routing.file", "every layer row with a positive total",
                         int(np.flatnonzero(arr.sum(axis=1) <= 0)[0]))
    return tuple(tuple(float(x) for x in row) for row in arr)


def with_top_k(cfg: RoutingConfig, top_k: int) -> RoutingConfig:
    """``cfg`` with ``hot_fraction`` (a share of assignments) worked out from
    ``hot_token_fraction`` (a share of tokens) for ``top_k`` distinct picks per token:
    each token makes k assignments, so hot_fraction = hot_token_fraction / k."""
    if cfg.hot_token_fraction is None:
        return cfg
    return replace(cfg, hot_fraction=cfg.hot_token_fraction / top_k)


def routing_from_dict(d: dict | None, source: str) -> RoutingConfig:
    """Validate the ``routing:`` mapping of ``source`` into a :class:`RoutingConfig`.

    A relative ``file`` is resolved against the directory of ``source``.
    """
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise InputError(source, "routing", "a mapping", d)
    unknown = sorted(set(d) - set(_FIELDS), key=str)
    if unknown:
        raise InputError(source, f"routing.{unknown[0]}", "one of the keys " + ", ".join(_FIELDS),
                         unknown[0])
    kind = _choice(d, "kind", KINDS, source, "uniform")
    kw: dict[str, Any] = {"kind": kind}
    kw["zipf_s"] = _num(d, "zipf_s", source, 0.0, 20.0, default=1.0)
    kw["hot_experts"] = _hot_experts(d.get("hot_experts", 1), source)
    if d.get("hot_fraction") is not None:   # null: the default (e.g. --set ...=null)
        kw["hot_fraction"] = _num(d, "hot_fraction", source, 0.0, 1.0)
    if d.get("hot_token_fraction") is not None:
        if d.get("hot_fraction") is not None:
            raise InputError(source, "routing.hot_token_fraction",
                             "either hot_fraction (share of assignments) or hot_token_fraction "
                             "(share of tokens), not both", d["hot_token_fraction"])
        kw["hot_token_fraction"] = _num(d, "hot_token_fraction", source, 0.0, math.inf)
    kw["alpha"] = _num(d, "alpha", source, 0.0, lo_open=True, default=1.0)
    kw["drift"] = _choice(d, "drift", DRIFTS, source, "none")
    kw["drift_rate"] = _num(d, "drift_rate", source, 0.0, 10.0, default=0.0)
    kw["jitter"] = _num(d, "jitter", source, 0.0, 100.0, default=0.0)
    kw["drop_policy"] = _choice(d, "drop_policy", DROP_POLICIES, source, "probability")
    kw["replica_split"] = _choice(d, "replica_split", REPLICA_SPLITS, source, "even")
    kw["path"] = _choice(d, "path", PATHS, source, "auto")
    if d.get("top_k") is not None:
        kw["top_k"] = _int(d["top_k"], "top_k", source, 1)
    if d.get("capacity_factor") is not None:
        kw["capacity_factor"] = _num(d, "capacity_factor", source, 0.0, lo_open=True)
    if d.get("pad_to_capacity") is not None:
        pad = d["pad_to_capacity"]
        if not isinstance(pad, bool):
            raise InputError(source, "routing.pad_to_capacity", "true or false", pad)
        if pad and d.get("capacity_factor") is None:
            raise InputError(source, "routing.pad_to_capacity", "a capacity_factor to pad "
                             "to (Megatron-Core requires moe_expert_capacity_factor)", pad)
        kw["pad_to_capacity"] = pad
    if d.get("max_nodes") is not None:
        kw["max_nodes"] = _int(d["max_nodes"], "max_nodes", source, 1)
    if d.get("replicate") is not None:
        kw["replicate"] = _replicate(d["replicate"], source)
    if kind == "file":
        f = d.get("file")
        if not isinstance(f, str) or not f:
            raise InputError(source, "routing.file", "a counts file path (kind: file)", f)
        p = Path(f)
        if not p.is_absolute():
            p = Path(source).parent / p
        kw["file"] = f
        kw["counts"] = load_counts(p, source)
    elif d.get("file") is not None:
        raise InputError(source, "routing.file", "no file unless kind is file", d["file"])
    return RoutingConfig(**kw)
