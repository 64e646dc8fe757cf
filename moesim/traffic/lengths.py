"""Sequence length distributions (tokens per prompt, output or response), seeded: one
module for serving traffic (``load.prompt_tokens``, ``load.output_tokens``) and RL
(``rl.prompt_tokens``, ``rl.response_tokens``).

Each distribution is registered once in :data:`DISTRIBUTIONS` with the fields it takes
(:data:`REQUIRED` or a default) and its sampler ``sample(dist, rng, n, values)``; every
section is checked by :func:`check` and drawn by :func:`draw`. Built in:

- ``{dist: fixed, mean}``: every sequence ``mean`` tokens (rounded);
- ``{dist: uniform, min, max}``: integers ``min``..``max`` inclusive, equally likely;
- ``{dist: lognormal, mean, sigma, max}``: ``exp(N(mu, sigma))`` with
  ``mu = ln(mean) - sigma²/2`` (so the untruncated mean is ``mean``), rounded;
- ``{dist: empirical, file, column}``: lengths drawn with replacement from a file of
  token counts: one per line (``#`` comments allowed) or a CSV's ``column`` (a header
  line is skipped).

Every draw is then cut to ``[min, max]`` (``min`` default 1; ``max`` default none): a
response that reaches the generation limit stops there (vLLM's ``max_tokens``), so the
mass above ``max`` piles up at ``max``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from moesim.errors import InputError
from moesim.scenario.sections.lengths import LengthDist, check_values
from moesim.scenario.sections.load_limits import MAX_REQUESTS, MAX_TOKENS
from moesim.traffic.registry import Registry

#: a field a distribution cannot do without
REQUIRED = object()
#: the longest draw before the cut (a lognormal's tail beyond it would overflow int64)
CAP = 2 ** 53


#: the fields every distribution takes
COMMON = ("dist", "min", "max")
#: length distributions by name: ``*_tokens.dist``; fields: LengthDist's
DISTRIBUTIONS = Registry("dist")


def register(name: str, sample: Callable[..., np.ndarray], fields_: Mapping[str, Any],
             doc: str = "") -> None:
    """Add a distribution: ``sample(dist, rng, n, values) -> int64 array`` (before the
    cut to ``[min, max]``; ``values``: an empirical file's counts), taking ``fields_``
    (LengthDist fields but ``dist``, each :data:`REQUIRED` or its default; ``min`` and
    ``max`` are every distribution's, listed only to require one)."""
    known = {f.name for f in fields(LengthDist)}
    bad = [f for f in fields_ if f not in known or f == "dist"]
    if bad:
        raise ValueError(f"distribution fields must be LengthDist's but dist: {bad}")
    DISTRIBUTIONS.register(name, sample, fields_, doc)


def _fixed(d: LengthDist, rng, n: int, values) -> np.ndarray:
    return np.full(n, int(round(d.mean)), dtype=np.int64)


def _uniform(d: LengthDist, rng, n: int, values) -> np.ndarray:
    return rng.integers(int(d.min), int(d.max) + 1, size=n, dtype=np.int64)


def _lognormal(d: LengthDist, rng, n: int, values) -> np.ndarray:
    s = float(d.sigma)
    mu = math.log(float(d.mean)) - s * s / 2          # E[X] = exp(mu + s²/2)
    # clipped before the cast: a long tail beyond 2^53 tokens would overflow int64
    return np.rint(np.minimum(rng.lognormal(mu, s, size=n), float(CAP))).astype(np.int64)


def _empirical(d: LengthDist, rng, n: int, values) -> np.ndarray:
    return values[rng.integers(0, values.size, size=n)]


register("fixed", _fixed, {"mean": REQUIRED}, "every sequence mean tokens")
register("uniform", _uniform, {"max": REQUIRED}, "min..max, equally likely")
register("lognormal", _lognormal, {"mean": REQUIRED, "sigma": 0.5},
         "mean mean, log-space sigma")
register("empirical", _empirical, {"file": REQUIRED, "column": None},
         "drawn from a file of token counts")


def read_counts(path: Path, column: str | None, source: str, field: str) -> np.ndarray:
    """The token counts of an empirical file (one per line, ``#`` comments allowed, or a
    CSV's ``column``); one :class:`InputError` naming ``field`` otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise InputError(source, field, "a readable file of token counts", f"{path}: "
                         f"{err.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(source, field, "a file of token counts (UTF-8 text)",
                         f"{path}: binary bytes") from None
    lines = [x for x in (y.split("#", 1)[0] for y in text.splitlines()) if x.strip()]
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
            or np.any(vals > MAX_TOKENS) or np.any(vals != np.floor(vals)):
        raise InputError(source, field, f"at least one count, all whole numbers from 1 to "
                         f"{MAX_TOKENS:,}", str(path))
    return vals.astype(np.int64)


def draw(d: LengthDist, rng: np.random.Generator, n: int, values: np.ndarray | None = None,
         *, source: str = "<lengths>", field: str = "tokens") -> np.ndarray:
    """``n`` lengths (int64) from the checked distribution ``d``, cut to ``[min, max]``
    (``values``: an empirical distribution's counts, read once; None: read from
    ``d.file`` as given, errors naming ``source`` and ``field.file``)."""
    if d.dist == "empirical" and values is None:
        values = read_counts(Path(str(d.file)), d.column, source, f"{field}.file")
    out = DISTRIBUTIONS.get(d.dist).factory(d, rng, n, values)
    return np.maximum(np.minimum(out, int(d.max if d.max is not None else CAP)), int(d.min))


def check(d: Any, source: str, field: str, defaults: Mapping[str, Any] | None = None
          ) -> LengthDist:
    """Check a distribution mapping (``field``: its section key, e.g. ``load.prompt_tokens``;
    ``defaults``: the section's values for fields not given); every problem is one
    :class:`InputError` naming ``field.KEY``."""
    if isinstance(d, LengthDist):
        return d
    if not isinstance(d, dict):
        raise InputError(source, field, "a mapping {dist: ..., mean: ...}", d)
    d = {**(defaults or {}), **d}
    kind = DISTRIBUTIONS.get(d.get("dist"), source, f"{field}.dist")
    allowed = list(COMMON) + [f for f in DISTRIBUTIONS.all_fields() if f not in COMMON]
    for k in d:
        if k not in allowed:
            raise InputError(source, f"{field}.{k}", f"one of the {field} keys {allowed}", k)
    check_values(d, source, field)
    for k, default in kind.fields.items():
        if d.get(k) is None and default is REQUIRED:
            raise InputError(source, f"{field}.{k}", f"a value for dist: {kind.name}",
                             "missing")
        d.setdefault(k, default)
    out = LengthDist(**d)
    if out.max is not None and out.max < out.min:
        raise InputError(source, f"{field}.max", f"at least {field}.min = {out.min}", out.max)
    if out.max is not None and "mean" in kind.fields and out.mean > out.max:
        raise InputError(source, f"{field}.mean", f"at most {field}.max = {out.max}", out.mean)
    return out
