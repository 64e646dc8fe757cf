"""Values of the ``routing:`` section, checked one at a time: numbers, integers, choices,
the hot set, replica specs and counts files. Every problem raises
``InputError(source, "routing.<field>", expected, got)``.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import InputError
from moesim.gating.config import ReplicaSpec


def number(d: dict, key: str, source: str, lo: float, hi: float = math.inf,
         lo_open: bool = False, default: float = 0.0) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise InputError(source, f"routing.{key}", "a finite number", v)
    if v < lo or (lo_open and v == lo) or v > hi:
        rng = f"{'>' if lo_open else '>='} {lo}" + (f" and <= {hi}" if hi < math.inf else "")
        raise InputError(source, f"routing.{key}", f"a number {rng}", v)
    return float(v)


def integer(v: Any, field: str, source: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise InputError(source, f"routing.{field}", f"an integer >= {lo}", v)
    return int(v)


def choice(d: dict, key: str, choices: tuple[str, ...], source: str, default: str) -> str:
    v = d.get(key, default)
    if v not in choices:
        raise InputError(source, f"routing.{key}", "one of " + ", ".join(choices), v)
    return str(v)


def hot_experts(v: Any, source: str) -> tuple[int, ...] | int:
    if isinstance(v, list | tuple):
        if not v:
            raise InputError(source, "routing.hot_experts", "a non-empty list of expert ids", v)
        ids = tuple(integer(x, "hot_experts", source, 0) for x in v)
        if len(set(ids)) != len(ids):
            raise InputError(source, "routing.hot_experts", "distinct expert ids", v)
        return ids
    return integer(v, "hot_experts", source, 1)


def replicate(v: Any, source: str) -> tuple[ReplicaSpec, ...]:
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
        e = integer(item["expert"], "replicate.expert", source, 0)
        ranks = item["ranks"]
        if isinstance(ranks, int) and not isinstance(ranks, bool):
            ranks = [ranks]
        if not isinstance(ranks, list | tuple) or not ranks:
            raise InputError(source, "routing.replicate.ranks", "a non-empty list of EP ranks",
                             ranks)
        rs = tuple(integer(r, "replicate.ranks", source, 0) for r in ranks)
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
