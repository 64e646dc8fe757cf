"""The progress line of a long run, on stderr.

On a terminal it is one line that updates in place (a carriage return, then the line,
then "erase to the end of the line"), at most every ``interval_s``, ended by a newline
when the run ends. Elsewhere (a log file, a pipe, CI) a line per update would flood the
log, so only a few whole lines are printed: when the work passes a quarter, a half and
three quarters of the total (or, with no total known, at 2, 4, 8, ... times the delay),
and a last one at the end, never the same line twice. Short runs (under ``delay_s``)
and quiet ones print nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

#: fractions of the total at which a log (not a terminal) gets a line
MILESTONES = (0.25, 0.5, 0.75)
#: the terminal control sequence "erase from the cursor to the end of the line"
_ERASE = "\x1b[K"


_OPEN: list[Progress] = []     # progress lines on a terminal awaiting their newline


def end_lines() -> None:
    """End every progress line left open on a terminal (a run stopped by an error or
    Ctrl-C), so that the message printed next starts on a line of its own."""
    while _OPEN:
        _OPEN.pop().end()


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """``Progress(total, label, quiet)``; call :meth:`update` as work is done and
    :meth:`close` at the end (or use it as a context manager). ``tty`` forces the
    terminal (True) or log (False) behaviour; by default it is the stream's own."""

    def __init__(self, total: float, label: str = "", quiet: bool = False, *,
                 stream: TextIO | None = None, interval_s: float = 1.0, delay_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None) -> None:
        self.total = float(total)
        self.label = label
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _is_tty(self.stream) if tty is None else tty
        self.interval_s = interval_s
        self.delay_s = delay_s
        self.clock = clock
        self.done = 0.0
        self.t0 = clock()
        self._last = self.t0
        self._next = 0                      # the next milestone (log) ...
        self._next_t = max(delay_s, 1e-9)   # ... or time, with no total (log)
        self._shown: float | None = None    # ``done`` of the last line shown
        self._open = False                  # a terminal line awaits its newline
        self.lines = 0                      # lines shown (updates in place count once each)

    def line(self) -> str:
        el = self.clock() - self.t0
        rate = self.done / el if el > 0 else 0.0
        if self.total > 0:
            pct = self.done / self.total * 100
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            eta_txt = f"{eta:.0f} s" if eta != float("inf") else "?"
            return (f"{self.label}: {pct:5.1f}% ({self.done:,.0f}/{self.total:,.0f}), "
                    f"{rate:,.1f}/s, {el:.0f} s elapsed, ETA {eta_txt}")
        return f"{self.label}: {self.done:,.0f} done, {rate:,.1f}/s, {el:.0f} s elapsed"

    def _show(self) -> None:
        if self.tty:
            self.stream.write("\r" + self.line() + _ERASE)
            if not self._open:
                _OPEN.append(self)
            self._open = True
        else:
            self.stream.write(self.line() + "\n")
        self.stream.flush()
        self._shown = self.done
        self.lines += 1

    def _due_in_log(self, now: float) -> bool:
        if self.total > 0:
            frac = self.done / self.total
            due = False
            while self._next < len(MILESTONES) and frac >= MILESTONES[self._next]:
                self._next += 1
                due = True
            return due
        if now - self.t0 >= self._next_t:
            while now - self.t0 >= self._next_t:
                self._next_t *= 2
            return True
        return False

    def update(self, n: float = 1) -> None:
        self.done += n
        if self.quiet:
            return
        now = self.clock()
        if now - self.t0 < self.delay_s:
            if not self.tty:          # milestones passed while silent are not shown late
                self._due_in_log(now)
            return
        if self.tty:
            if now - self._last >= self.interval_s:
                self._last = now
                self._show()
        elif self._due_in_log(now):
            self._show()

    def close(self) -> None:
        """The last line, only if a line was shown before and this one is new; on a
        terminal, the newline that ends the line updated in place."""
        if self.quiet or not self.lines:
            return
        if self._shown != self.done:
            self._show()
        self.end()

    def end(self) -> None:
        """The newline that ends a line updated in place, if one is open."""
        if self._open:
            self._open = False
            if self in _OPEN:
                _OPEN.remove(self)
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
