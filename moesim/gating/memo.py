"""A small bounded memo for the routing sampler's draw-independent arrays: every
micro-batch of a layer (and every layer of one law) asks for the same ones, so they are
computed once and kept read-only; the memo is emptied when it reaches its size, so a long
run's memory stays flat. No moesim imports."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np


class Memo:
    """Values per key, made on a miss by the caller's function and frozen: every numpy
    array in the value (itself, or nested in tuples) made read-only, since callers share
    it. Emptied when it holds ``size`` entries. A function that raises stores nothing."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: dict[Hashable, Any] = {}

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        d = self._d
        if key in d:
            return d[key]
        value = make()
        if len(d) >= self.size:
            d.clear()
        _freeze(value)
        d[key] = value
        return value

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        self._d.clear()


def _freeze(value: Any) -> None:
    if isinstance(value, np.ndarray):
        if value.flags.writeable:
            value.setflags(write=False)
    elif isinstance(value, tuple):
        for x in value:
            _freeze(x)
