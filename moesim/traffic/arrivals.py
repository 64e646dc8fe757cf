"""Arrival times (seconds), seeded.

- ``poisson``: exponential gaps of mean ``1/rate_rps``;
- ``gamma``: gamma gaps of mean ``1/rate_rps`` and coefficient of variation ``cv``
  (``cv > 1`` bursty; ``cv = 1`` is Poisson), as Vidur's ``gamma`` request generator;
- ``trace``: a CSV with a header. The public Azure LLM inference traces
  (github.com/Azure/AzurePublicDataset, AzureLLMInferenceTrace_{code,conv}.csv:
  ``TIMESTAMP,ContextTokens,GeneratedTokens``, timestamps as dates) or moesim's own
  ``arrival_s,prompt_tokens,output_tokens``. Times are taken relative to the first row;
  ``rate_rps`` (optional) rescales them to that mean rate.

A scaled sequence (the same seed at another rate) is the same pattern compressed in time,
so capacity searches compare like with like.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import numpy as np

from moesim.errors import InputError
from moesim.scenario.sections.load import ARRIVAL_KINDS
from moesim.scenario.sections.load_limits import MAX_DURATION_S, MAX_REQUESTS, MAX_TOKENS

KINDS = ARRIVAL_KINDS
AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
OWN = ("arrival_s", "prompt_tokens", "output_tokens")


def gaps(kind: str, rng: np.random.Generator, n: int, cv: float = 1.0) -> np.ndarray:
    """Unit-rate gaps (mean 1): multiply by 1/rate."""
    if kind == "poisson":
        return rng.exponential(1.0, size=n)
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / shape, size=n)


def _time(x: str) -> float:
    try:
        return float(x)
    except ValueError:
        return datetime.fromisoformat(x.strip().replace(" ", "T")[:26]).timestamp()


def read_trace(path: Path, source: str, field: str = "load.arrival.file"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival_s from 0, prompt tokens, output tokens) of a trace file."""
    try:
        lines = [x for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    except OSError as err:
        raise InputError(source, field, "a readable trace CSV", f"{path}: {err.strerror}"
                         ) from None
    except UnicodeDecodeError:
        raise InputError(source, field, "a trace CSV (UTF-8 text)", f"{path}: binary bytes"
                         ) from None
    if len(lines) - 1 > MAX_REQUESTS:
        raise InputError(source, field, f"at most {MAX_REQUESTS:,} request rows",
                         f"{path}: {len(lines) - 1:,} rows")
    head = [h.strip() for h in lines[0].split(",")] if lines else []
    cols = AZURE if all(c in head for c in AZURE) else OWN
    if not all(c in head for c in cols):
        raise InputError(source, field, f"a CSV with columns {list(AZURE)} (Azure LLM "
                         f"inference trace) or {list(OWN)}", f"{path}: {head}")
    idx = [head.index(c) for c in cols]
    t, p, o = [], [], []
    for i, line in enumerate(lines[1:], start=2):
        parts = line.split(",")
        try:
            t.append(_time(parts[idx[0]]))
            pt, ot = float(parts[idx[1]]), float(parts[idx[2]])
            if not (math.isfinite(t[-1]) and 0 <= pt <= MAX_TOKENS and 0 <= ot <= MAX_TOKENS):
                raise ValueError
            p.append(int(pt))
            o.append(int(ot))
        except (ValueError, IndexError, OverflowError):
            raise InputError(source, field, f"row {i} of {path}: a finite time and two token "
                             f"counts from 0 to {MAX_TOKENS:,}", line[:80]) from None
    if not t:
        raise InputError(source, field, "at least one request row", str(path))
    ta = np.asarray(t)
    if not np.all(np.isfinite(ta)) or np.any(np.diff(ta) < 0):
        raise InputError(source, field, f"times in {path} finite and non-decreasing", "")
    if ta[-1] - ta[0] > MAX_DURATION_S:
        raise InputError(source, field, f"times in {path} spanning at most "
                         f"{MAX_DURATION_S:g} s", f"{ta[-1] - ta[0]:g} s")
    pa, oa = np.asarray(p, dtype=np.int64), np.asarray(o, dtype=np.int64)
    if np.any(pa < 1) or np.any(oa < 0):
        raise InputError(source, field, f"prompt tokens >= 1 and output tokens >= 0 in "
                         f"{path}", "")
    return ta - ta[0], pa, np.maximum(oa, 1)     # a request samples at least one token
