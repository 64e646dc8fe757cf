"""Progress: silent for short runs and when quiet; at most one line per interval."""

from __future__ import annotations

import io

from moesim.trace.progress import Progress


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_short_run_is_silent():
    clock, out = FakeClock(), io.StringIO()
    with Progress(100, "step", stream=out, clock=clock) as p:
        for _ in range(100):
            clock.t += 0.005  # 0.5 s in all
            p.update()
    assert out.getvalue() == ""


def test_quiet_is_silent():
    clock, out = FakeClock(), io.StringIO()
    with Progress(10, "step", quiet=True, stream=out, clock=clock) as p:
        for _ in range(10):
            clock.t += 1.0
            p.update()
    assert out.getvalue() == ""


def test_long_run_prints_rate_and_eta_at_most_once_per_second():
    clock, out = FakeClock(), io.StringIO()
    p = Progress(400, "sim", stream=out, clock=clock)
    for _ in range(200):  # 0.01 s per item: 2 s, 200 items
        clock.t += 0.01
        p.update()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # at t = 1.0 s and t = 2.0 s
    assert lines[-1] == "sim:  50.0% (200/400), 100.0/s, 2 s elapsed, ETA 2 s"
    p.close()
    assert len(out.getvalue().splitlines()) == 3
