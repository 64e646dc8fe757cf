"""The trace readers on real engine output (scenarios/hot-expert.yaml, toy-cpu)."""

from __future__ import annotations

import csv
import json

import pytest

from moesim.engine.breakdown import CATEGORIES, breakdown
from moesim.trace.chrome import load_chrome_trace
from moesim.trace.report import write_run_outputs
from moesim.trace.stalls import critical_path, path_breakdown
from moesim.wiring import simulate
from tests.test_trace_chrome import check_schema


@pytest.fixture(scope="module")
def hot(tmp_path_factory):
    result = simulate("hot-expert")
    out = tmp_path_factory.mktemp("hot") / "run"
    write_run_outputs(result, out, quiet=True)
    return result, out


@pytest.mark.slow
def test_hot_expert_run_directory(hot):
    result, out = hot
    trace = json.loads((out / "trace.json").read_text())
    check_schema(trace)
    assert any(e["ph"] == "s" for e in trace["traceEvents"])  # stalls get flow arrows
    # round trip: the per-rank breakdown of the loaded spans is the summary's
    spans = load_chrome_trace(out / "trace.json")
    assert len(spans) == len(result.spans)
    back = breakdown(spans, result.n_ranks, result.step_time_s)[1]
    for row, pr in zip(back, result.summary["per_rank"], strict=True):
        for k in CATEGORIES:
            assert row[k] == pytest.approx(pr["breakdown_s"][k], abs=1e-9)
    # stalls.csv: sums to the stall spans' time, blames rank 3 / expert 3
    with (out / "stalls.csv").open() as f:
        rows = list(csv.DictReader(f))
    total_csv = sum(float(r["seconds"]) for r in rows)
    assert total_csv == pytest.approx(sum(s.dur_s for s in result.spans if s.kind == "stall"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stalls"]["total_s"] == pytest.approx(total_csv)
    assert summary["hot_ranks"] == [3]
    top = summary["stalls"]["top"][0]
    assert (top["blocking_rank"], top["expert"]) == (3, 3)
    by_rank = summary["stalls"]["by_blocking_rank"]
    assert by_rank["3"] > 0.99 * total_csv  # nearly all waiting is on the hot rank
    assert "sim_wall_s" not in summary and summary["scenario"]["name"] == "hot-expert"


@pytest.mark.slow
def test_hot_expert_critical_path(hot):
    result, _ = hot
    path = critical_path(result)
    pb = path_breakdown(result, path)
    assert pb["total_s"] == pytest.approx(result.step_time_s, rel=1e-9)
    hot_expert = [s for s in path if s.rank == 3 and s.kind == "compute" and 3 in s.experts]
    assert hot_expert, "the path goes through rank 3's expert-3 compute"
    assert pb["by_expert"]["3"] > 0.5 * result.step_time_s
    # spans on the path follow each other without overlap
    for a, b in zip(path, path[1:], strict=False):
        assert a.end_s <= b.start_s + 1e-9


@pytest.mark.slow
def test_same_seed_same_bytes(tmp_path):
    names = ("summary.json", "summary.md", "trace.json", "stalls.csv")
    got = []
    for d in ("a", "b"):
        write_run_outputs(simulate("toy-cpu"), tmp_path / d, quiet=True)
        got.append({n: (tmp_path / d / n).read_bytes() for n in names})
    assert got[0] == got[1]
