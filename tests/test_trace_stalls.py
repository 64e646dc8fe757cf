"""Stall attribution and critical path on hand-built steps (arithmetic in the fixture)."""

from __future__ import annotations

import csv

import pytest

from moesim.trace.stalls import (
    critical_path,
    path_breakdown,
    stall_table,
    stall_totals,
    top_stalls,
    write_stalls_csv,
)
from tests.test_trace_fixtures import MS, hot_expert_result, many_rank_result


def test_stall_table_hot_expert():
    rows = stall_table(hot_expert_result())
    assert len(rows) == 1
    r = rows[0]
    assert (r["rank"], r["layer"], r["microbatch"], r["phase"]) == (0, 3, 1, "fwd")
    assert r["seconds"] == pytest.approx(1.2 * MS, abs=1e-15)
    assert (r["blocking_rank"], r["expert"], r["tokens"]) == (1, 3, 600)
    assert "expert 3" in r["reason"]


def test_stalls_csv_sums_to_summary_total(tmp_path):
    res = many_rank_result(16, rpn=8, hot=5)
    rows = stall_table(res)
    path = write_stalls_csv(rows, tmp_path / "stalls.csv")
    with path.open() as f:
        got = list(csv.DictReader(f))
    assert len(got) == 15  # every rank but the hot one waits once
    total_csv = sum(float(g["seconds"]) for g in got)
    total_summary = sum(p["breakdown_s"]["stall"] for p in res.summary["per_rank"])
    assert total_csv == pytest.approx(total_summary, rel=1e-12)
    assert total_csv == pytest.approx(15 * 1.5 * MS, rel=1e-12)
    assert {g["blocking_rank"] for g in got} == {"5"}


def test_totals_and_top():
    res = many_rank_result(8, rpn=8, hot=2)
    rows = stall_table(res)
    tot = stall_totals(rows)
    assert tot["count"] == 7
    assert tot["by_blocking_rank"] == {"2": pytest.approx(7 * 1.5 * MS)}
    assert tot["by_expert"] == {"2": pytest.approx(7 * 1.5 * MS)}
    top = top_stalls(rows, 5)
    assert len(top) == 1  # all 7 waits are the same (layer, phase, rank, expert)
    assert top[0]["count"] == 7 and top[0]["waiting_ranks"] == [0, 1, 3, 4, 5, 6, 7]
    assert top[0]["seconds"] == pytest.approx(7 * 1.5 * MS)


def test_critical_path_goes_through_hot_expert():
    res = hot_expert_result()
    path = critical_path(res)
    got = [(s.rank, s.name) for s in path]
    assert got == [(1, "fwd.attn"), (1, "dispatch"), (1, "fwd.experts"), (0, "combine"),
                   (0, "fwd.post")]
    assert path[2].experts == (2, 3)
    pb = path_breakdown(res, path)
    assert pb["total_s"] == pytest.approx(res.step_time_s, abs=1e-15)
    assert pb["by_kind"]["compute"] == pytest.approx(3.5 * MS)
    assert pb["by_kind"]["ep_dispatch"] == pytest.approx(0.5 * MS)
    assert pb["by_kind"]["ep_combine"] == pytest.approx(0.5 * MS)
    assert "stall" not in pb["by_kind"]  # the wait is replaced by the work that caused it
    assert pb["by_expert"] == {"2+3": pytest.approx(2.0 * MS)}
    assert pb["ranks"] == [0, 1]


def test_critical_path_counts_gaps_as_idle():
    res = many_rank_result(4, rpn=4, hot=1)
    res.step_time_s = 4 * MS  # 1 ms after the last span
    pb = path_breakdown(res)
    assert pb["total_s"] == pytest.approx(4 * MS)
    assert pb["by_kind"]["idle"] == pytest.approx(1 * MS)
    assert pb["by_expert"] == {"1": pytest.approx(1.5 * MS)}


def test_unattributed_stall_stays_on_path():
    res = hot_expert_result()
    res.spans = [s for s in res.spans if s.rank == 0]  # blocking rank's spans unknown
    pb = path_breakdown(res)
    assert pb["by_kind"]["stall"] == pytest.approx(1.2 * MS)
    assert pb["total_s"] == pytest.approx(4.5 * MS)


def test_top_stall_tokens_agree_with_its_cause_text():
    """Issue 20 item 12: a group of waits over micro-batches (26182 and 26223 tokens on
    the hot expert) shows the largest count, and its cause text says that count."""
    from moesim.trace.spans import wait_reason

    def row(rank, mb, tokens):
        return {"rank": rank, "layer": 0, "microbatch": mb, "phase": "bwd", "seconds": 0.1,
                "blocking_rank": 3, "expert": 3, "tokens": tokens,
                "reason": wait_reason(3, "bwd.dispatch", 3, tokens)}

    (g,) = top_stalls([row(0, 0, 26182), row(0, 1, 26223), row(1, 0, 26182)])
    assert g["tokens"] == 26223 and "(26223 tokens)" in g["reason"]
    assert g["count"] == 3 and g["waiting_ranks"] == [0, 1]
