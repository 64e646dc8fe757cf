"""Progress: silent for short runs and when quiet; on a terminal one line updated in
place; in a log a few whole lines (quarters of the total), never the same line twice."""

from __future__ import annotations

import io

from moesim.trace.progress import Progress


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(p: Progress, clock: FakeClock, n: int, dt: float) -> None:
    for _ in range(n):
        clock.t += dt
        p.update()


def test_short_run_is_silent():
    for out in (io.StringIO(), Terminal()):
        clock = FakeClock()
        with Progress(100, "step", stream=out, clock=clock) as p:
            _run(p, clock, 100, 0.005)   # 0.5 s in all
        assert out.getvalue() == ""


def test_quiet_is_silent():
    for out in (io.StringIO(), Terminal()):
        clock = FakeClock()
        with Progress(10, "step", quiet=True, stream=out, clock=clock) as p:
            _run(p, clock, 10, 1.0)
        assert out.getvalue() == ""


def test_a_log_gets_a_line_per_quarter_and_none_twice():
    """400 items at 0.25 s each (100 s): a line at 25, 50, 75 and 100 % only, each
    different; close() after the last update prints nothing more."""
    clock, out = FakeClock(), io.StringIO()
    p = Progress(400, "sim", stream=out, clock=clock)
    _run(p, clock, 400, 0.25)
    p.close()
    lines = out.getvalue().splitlines()
    assert lines == ["sim:  25.0% (100/400), 4.0/s, 25 s elapsed, ETA 75 s",
                     "sim:  50.0% (200/400), 4.0/s, 50 s elapsed, ETA 50 s",
                     "sim:  75.0% (300/400), 4.0/s, 75 s elapsed, ETA 25 s",
                     "sim: 100.0% (400/400), 4.0/s, 100 s elapsed, ETA 0 s"]
    assert "\r" not in out.getvalue()


def test_a_log_run_stopped_early_ends_with_where_it_stopped():
    clock, out = FakeClock(), io.StringIO()
    with Progress(400, "sim", stream=out, clock=clock) as p:
        _run(p, clock, 250, 0.1)       # passes 25 % at 10 s and 50 % at 20 s, stops at 62.5 %
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[1].split("(")[0].strip() for ln in lines] == ["25.0%", "50.0%",
                                                                         "62.5%"]


def test_a_milestone_passed_before_the_delay_is_not_shown_late():
    clock, out = FakeClock(), io.StringIO()
    with Progress(4, "sim", stream=out, clock=clock, delay_s=1.0) as p:
        _run(p, clock, 1, 0.5)         # 25 % at 0.5 s: silent
        _run(p, clock, 1, 1.0)         # 50 % at 1.5 s: a line
    lines = out.getvalue().splitlines()
    assert lines == ["sim:  50.0% (2/4), 1.3/s, 2 s elapsed, ETA 2 s"]   # and not again


def test_a_log_without_total_doubles_its_interval():
    clock, out = FakeClock(), io.StringIO()
    with Progress(0, "steps", stream=out, clock=clock) as p:
        _run(p, clock, 1000, 0.01)     # 10 s: lines at 1, 2, 4, 8 s and the end
    lines = out.getvalue().splitlines()
    assert [ln.split("/s, ")[1] for ln in lines] == [f"{t} s elapsed" for t in (1, 2, 4, 8, 10)]


def test_a_terminal_gets_one_line_updated_in_place():
    """200 items over 2 s, at most one update a second: the line is written at 1 s and
    2 s, each time from the start of the line (\\r) erasing what was there; close()
    writes the final state only if it changed, then the one newline."""
    clock, out = FakeClock(), Terminal()
    p = Progress(400, "sim", stream=out, clock=clock)
    _run(p, clock, 200, 0.01)
    text = out.getvalue()
    assert "\n" not in text and text.count("\r") == 2
    assert text.endswith("\rsim:  50.0% (200/400), 100.0/s, 2 s elapsed, ETA 2 s\x1b[K")
    p.close()
    assert out.getvalue() == text + "\n"
    assert p.lines == 2


def test_a_line_left_open_is_ended_before_an_error_message():
    """A run stopped mid-way on a terminal (an error, Ctrl-C): end_lines() writes the
    newline, so the message that follows starts on its own line; only once."""
    from moesim.trace.progress import end_lines

    clock, out = FakeClock(), Terminal()
    p = Progress(400, "sim", stream=out, clock=clock)
    _run(p, clock, 160, 0.01)   # shown at 1 s (100 items), not at 1.6 s
    assert not out.getvalue().endswith("\n")
    end_lines()
    assert out.getvalue().endswith("\x1b[K\n") and out.getvalue().count("\n") == 1
    end_lines()
    p.close()      # the final state (not shown yet) on a line of its own, ended
    lines = out.getvalue().split("\n")
    assert lines[1] == "\rsim:  40.0% (160/400), 100.0/s, 2 s elapsed, ETA 2 s\x1b[K"
    assert out.getvalue().count("\n") == 2
