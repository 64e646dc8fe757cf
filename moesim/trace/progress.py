"""A progress line for long runs, on stderr, at most every ``interval_s``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """``Progress(total, label, quiet)``; call :meth:`update` as work is done and
    :meth:`close` at the end. Prints nothing when quiet, nor before ``delay_s`` has passed
    (short runs stay silent); then a line with %, rate and ETA at most every ``interval_s``."""

    def __init__(self, total: float, label: str = "", quiet: bool = False, *,
                 stream: TextIO | None = None, interval_s: float = 1.0, delay_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = float(total)
        self.label = label
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = interval_s
        self.delay_s = delay_s
        self.clock = clock
        self.done = 0.0
        self.t0 = clock()
        self._last = self.t0
        self.lines = 0

    def line(self) -> str:
        el = self.clock() - self.t0
        rate = self.done / el if el > 0 else 0.0
        pct = self.done / self.total * 100 if self.total > 0 else 100.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_txt = f"{eta:.0f} s" if eta != float("inf") else "?"
        return (f"{self.label}: {pct:5.1f}% ({self.done:,.0f}/{self.total:,.0f}), "
                f"{rate:,.1f}/s, {el:.0f} s elapsed, ETA {eta_txt}")

    def update(self, n: float = 1) -> None:
        self.done += n
        if self.quiet:
            return
        now = self.clock()
        if now - self.t0 >= self.delay_s and now - self._last >= self.interval_s:
            self._last = now
            print(self.line(), file=self.stream, flush=True)
            self.lines += 1

    def close(self) -> None:
        """Print a final line, only if progress lines were printed before."""
        if not self.quiet and self.lines:
            print(self.line(), file=self.stream, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
