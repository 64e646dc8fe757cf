"""A sequence length distribution of a section (``load.prompt_tokens``,
``rl.response_tokens``, ...): :class:`LengthDist`, checked as far as it goes without the
registry of distributions when the scenario is read (:func:`parse`). The distributions
by name, the fields each requires and their samplers are :mod:`moesim.traffic.lengths`'s
(its ``check`` completes a section's distribution when the section is run).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moesim.errors import InputError
from moesim.scenario.sections import as_written
from moesim.scenario.sections.load_limits import MAX_SIGMA, MAX_TOKENS

#: the fields every distribution takes, then the others a built-in one takes: the order
#: a section's keys are listed in when one is unknown
KEYS = ("dist", "min", "max", "mean", "sigma", "file", "column")


@dataclass(frozen=True)
class LengthDist:
    """A checked distribution (:func:`moesim.traffic.lengths.check`). ``sigma`` 0.5 is an
    assumption of ours (set it from your data)."""

    dist: str = "fixed"
    mean: float = 256
    max: int | None = None
    min: int = 1
    sigma: float = 0.5
    file: str | None = None
    column: str | None = None


def bounded_number(v: Any, src: str, key: str, lo: float, top: float, what: str,
                   integer: bool = False) -> float | int:
    """``v`` as a finite number (``integer``: a whole one) in ``[lo, top]``; else one
    InputError naming ``key`` (``what``: what the limit ``top`` counts)."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
        and (not integer or float(v).is_integer())
    kind = "an integer" if integer else "a number"
    if not ok or v < lo:
        raise InputError(src, key, f"{kind} >= {lo:g}", v)
    if v > top:
        top = int(top) if float(top).is_integer() else top
        top_s = f"{top:,}" if float(top).is_integer() else f"{top:g}"
        raise InputError(src, key, f"at most {top_s} ({what}: the limit of what one "
                         "machine simulates)", v)
    return int(v) if integer else float(v)


def check_values(d: dict, source: str, field: str) -> None:
    """Check and normalise, in place, the values of a distribution mapping ``d``: token
    counts (``mean``, ``min``, ``max``), ``sigma``, ``file`` and ``column``."""
    for k in ("mean", "min", "max"):
        if d.get(k) is not None:
            d[k] = bounded_number(d[k], source, f"{field}.{k}", 1, MAX_TOKENS,
                                  "tokens per sequence", integer=(k != "mean"))
    if "sigma" in d:
        d["sigma"] = bounded_number(d["sigma"], source, f"{field}.sigma", 0, MAX_SIGMA,
                                    "a lognormal's log-space sigma")
    for k in ("file", "column"):
        if d.get(k) is not None and not (isinstance(d[k], str) and d[k]):
            raise InputError(source, f"{field}.{k}", "a file name" if k == "file" else
                             "a column name", d[k])


def parse(d: Any, source: str, field: str, defaults: Mapping[str, Any] | None = None
          ) -> LengthDist:
    """Check a distribution mapping's shape, keys and values (``field``: its section key,
    e.g. ``load.prompt_tokens``; ``defaults``: the section's values for fields not
    given); the name and the fields it requires are checked by the registry
    (:func:`moesim.traffic.lengths.check`). Every problem is one :class:`InputError`
    naming ``field.KEY``."""
    if isinstance(d, LengthDist):
        return d
    if not isinstance(d, Mapping):
        raise InputError(source, field, "a mapping {dist: ..., mean: ...}", d)
    given = dict(d)
    d = {**(defaults or {}), **d}
    for k in d:
        if k not in KEYS:
            raise InputError(source, f"{field}.{k}", f"one of the {field} keys {list(KEYS)}", k)
    check_values(d, source, field)
    out = LengthDist(**{k: v for k, v in d.items() if v is not None or k in ("max", "file",
                                                                             "column")})
    if out.max is not None and out.max < out.min:
        raise InputError(source, f"{field}.max", f"at least {field}.min = {out.min}", out.max)
    return as_written(out, given)
