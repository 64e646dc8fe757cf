"""The step breakdown: per rank, categories partition [0, step] exactly."""

import pytest

from moesim.engine.breakdown import breakdown, rank_breakdown
from moesim.trace.spans import Span


def sp(kind, start, end, stream="compute", rank=0):
    return Span(rank=rank, stream=stream, kind=kind, name=kind, start_s=start, end_s=end)


def test_compute_stream_wins_and_hidden_comm_is_not_exposed():
    spans = [
        sp("compute", 0.0, 4.0),
        sp("ep_dispatch", 4.0, 5.0),           # blocking, on the compute stream
        sp("dp", 3.0, 7.0, stream="comm"),     # 3-5 hidden under compute/dispatch, 5-7 exposed
        sp("stall", 7.0, 8.0),
    ]
    b = rank_breakdown(spans, 10.0)
    assert b["compute"] == pytest.approx(4.0)
    assert b["ep_dispatch"] == pytest.approx(1.0)
    assert b["dp"] == pytest.approx(2.0)
    assert b["stall"] == pytest.approx(1.0)
    assert b["idle"] == pytest.approx(2.0)
    assert sum(b.values()) == pytest.approx(10.0)


def test_overlapping_secondary_kinds_counted_once():
    spans = [sp("dp", 0.0, 2.0, stream="comm"), sp("zero", 1.0, 3.0, stream="comm"),
             sp("pp", 2.5, 4.0, stream="pp")]
    b = rank_breakdown(spans, 4.0)
    # dp precedes zero and pp in COMM_KINDS order
    assert b["dp"] == pytest.approx(2.0)
    assert b["pp"] == pytest.approx(1.5)
    assert b["zero"] == pytest.approx(0.5)
    assert b["idle"] == pytest.approx(0.0)


def test_mean_over_ranks_sums_to_step():
    spans = [sp("compute", 0, 3, rank=0), sp("compute", 0, 1, rank=1), sp("stall", 1, 3, rank=1)]
    mean, rows = breakdown(spans, 2, 3.0)
    assert rows[1]["stall"] == pytest.approx(2.0)
    assert mean["compute"] == pytest.approx(2.0)
    assert mean["stall"] == pytest.approx(1.0)
    assert sum(mean.values()) == pytest.approx(3.0)
