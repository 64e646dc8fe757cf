"""The status line of serving under load (moesim.traffic.status): rewritten in place on a
terminal, cleared before the summary; in a log a line at most every ``every_s`` seconds
and never the same line twice."""

from __future__ import annotations

import io

from moesim.traffic.status import Status


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_line_is_rewritten_in_place_then_cleared():
    s = Tty()
    st = Status("moesim serve", stream=s)
    st.show("a")
    st.show("b")
    st.show("b")              # the same text: nothing written
    st.close()
    assert s.getvalue() == ("\r\x1b[Kmoesim serve: a" "\r\x1b[Kmoesim serve: b" "\r\x1b[K")
    assert "\n" not in s.getvalue()


def test_in_a_log_a_line_at_most_every_interval_never_twice():
    s = io.StringIO()
    now = [0.0]
    st = Status("moesim serve", stream=s, every_s=30.0, clock=lambda: now[0])
    for t, text in [(0, "point 1"), (10, "point 2"), (31, "point 3"), (31, "point 3"),
                    (62, "point 3"), (70, "point 4")]:
        now[0] = t
        st.show(text)
    st.close()
    # 10 s: within 30 s of the first, skipped; 31 s: printed; 31 and 62 s: the same text
    # again, skipped; 70 s: 39 s after the last line
    assert s.getvalue().splitlines() == ["moesim serve: point 1", "moesim serve: point 3",
                                         "moesim serve: point 4"]
    assert st.lines == 3


def test_quiet_prints_nothing():
    s = Tty()
    st = Status("x", quiet=True, stream=s)
    st.show("a")
    st.close()
    assert s.getvalue() == ""
