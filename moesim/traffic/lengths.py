"""Prompt and output length distributions (tokens), seeded.

``{dist: fixed, mean}``; ``{dist: uniform, min, max}``; ``{dist: lognormal, mean, sigma,
max}`` (mean of the distribution, sigma of the log; clipped to [1, max]);
``{dist: empirical, file}`` (a CSV/text file of token counts, one per line or the column
named by ``column``; sampled with replacement).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from moesim.traffic.limits import MAX_REQUESTS, MAX_TOKENS

DISTS = ("fixed", "uniform", "lognormal", "empirical")


def read_counts(path: Path, column: str | None, source: str, field: str) -> np.ndarray:
    from moesim.errors import InputError
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(source, field, "a readable file of token counts", f"{path}: "
                         f"{err.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(source, field, "a file of token counts (UTF-8 text)",
                         f"{path}: binary bytes") from None
    lines = [x for x in text.splitlines() if x.strip()]
    col = 0
    if lines and column is not None:
        head = [h.strip() for h in lines[0].split(",")]
        if column not in head:
            raise InputError(source, field, f"a column named {column!r}", head)
        col, lines = head.index(column), lines[1:]
    elif lines and not lines[0].split(",")[0].strip().lstrip("-").replace(".", "").isdigit():
        lines = lines[1:]
    try:
        vals = np.array([float(x.split(",")[col]) for x in lines])
    except (ValueError, IndexError):
        raise InputError(source, field, "numbers of tokens", str(path)) from None
    if vals.size > MAX_REQUESTS:
        raise InputError(source, field, f"at most {MAX_REQUESTS:,} counts",
                         f"{path}: {vals.size:,}")
    if vals.size == 0 or not np.all(np.isfinite(vals)) or np.any(vals < 1) \
            or np.any(vals > MAX_TOKENS):
        raise InputError(source, field, f"at least one count, all from 1 to {MAX_TOKENS:,}",
                         str(path))
    return vals.astype(np.int64)


def draw(d: dict, rng: np.random.Generator, n: int, counts: np.ndarray | None = None
         ) -> np.ndarray:
    """``n`` lengths from the checked distribution ``d`` (``counts``: an empirical
    distribution's values, read once)."""
    kind = d["dist"]
    if kind == "fixed":
        return np.full(n, int(d["mean"]), dtype=np.int64)
    if kind == "uniform":
        return rng.integers(int(d["min"]), int(d["max"]) + 1, size=n, dtype=np.int64)
    if kind == "lognormal":
        s = float(d.get("sigma", 1.0))
        mu = math.log(float(d["mean"])) - s * s / 2          # E[X] = exp(mu + s²/2)
        x = np.rint(rng.lognormal(mu, s, size=n))
        top = float(d.get("max", 1 << 30))      # (the section bounds it: no overflow)
        return np.clip(np.nan_to_num(x, nan=1.0, posinf=top), 1, top).astype(np.int64)
    return counts[rng.integers(0, counts.size, size=n)]
