"""Sequence lengths drawn from an ``rl.*_tokens`` distribution (seeded, integers).

- ``fixed``: every sequence ``mean`` tokens;
- ``uniform``: integers ``min``..``max`` inclusive, equally likely;
- ``lognormal``: ``exp(N(mu, sigma))`` with ``mu = ln(mean) - sigma²/2`` (so the untruncated
  mean is ``mean``), rounded, then cut at ``max``: a response that reaches the generation
  limit stops there (vLLM's ``max_tokens``), so the mass above ``max`` piles up at ``max``;
- ``empirical``: lengths drawn with replacement from ``file`` (one integer per line, ``#``
  comments allowed), cut at ``max``.

Every length is at least ``min`` (default 1).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from moesim.errors import InputError
from moesim.rl.config import LengthDist


def read_lengths(path: str, field: str) -> np.ndarray:
    """The integers of an empirical length file; one line naming the file otherwise."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(str(path), field, "a readable text file of lengths, one per line",
                         type(err).__name__) from None
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            v = int(line)
        except ValueError:
            raise InputError(f"{path}:{i}", field, "an integer number of tokens", line) from None
        if v < 1:
            raise InputError(f"{path}:{i}", field, "a length >= 1", v)
        out.append(v)
    if not out:
        raise InputError(str(path), field, "at least one length", "an empty file")
    return np.asarray(out, dtype=np.int64)


def draw(dist: LengthDist, n: int, rng: np.random.Generator, field: str = "rl.tokens"
         ) -> np.ndarray:
    """``n`` lengths (int64) from ``dist``."""
    lo = int(dist.min)
    if dist.dist == "fixed":
        out = np.full(n, int(round(dist.mean)), dtype=np.int64)
    elif dist.dist == "uniform":
        out = rng.integers(lo, int(dist.max) + 1, size=n, dtype=np.int64)
    elif dist.dist == "lognormal":
        mu = math.log(dist.mean) - dist.sigma ** 2 / 2
        # clipped before the cast: a long tail beyond 2^53 tokens would overflow int64
        out = np.rint(np.minimum(rng.lognormal(mu, dist.sigma, size=n), 2.0 ** 53)
                      ).astype(np.int64)
    else:
        pool = read_lengths(str(dist.file), f"{field}.file")
        out = pool[rng.integers(0, len(pool), size=n)]
    if dist.max is not None:
        out = np.minimum(out, int(dist.max))
    return np.maximum(out, lo)
