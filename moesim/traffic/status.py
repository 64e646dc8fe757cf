"""One status line on stderr for a run over time (surface points, the run, the capacity
search): rewritten in place on a terminal; elsewhere (a log, a pipe) a line at most every
``every_s`` seconds, so a long search leaves a few lines, never the same line twice."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Status:
    def __init__(self, prefix: str, quiet: bool = False, *, stream: TextIO | None = None,
                 every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.prefix = prefix
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s = every_s
        self.clock = clock
        self._last_t: float | None = None
        self._last_text = ""
        self._open = False          # a line in place on the terminal, not yet ended
        self.lines = 0              # lines printed (not on a terminal)

    def show(self, text: str) -> None:
        if self.quiet or text == self._last_text:
            return
        line = f"{self.prefix}: {text}"
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
            self._open = True
        else:
            now = self.clock()
            if self._last_t is not None and now - self._last_t < self.every_s:
                return
            self._last_t = now
            print(line, file=self.stream, flush=True)
            self.lines += 1
        self._last_text = text

    def close(self) -> None:
        """Clear the line in place (the summary follows); nothing elsewhere."""
        if self._open:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._open = False
