"""compare: deltas of two runs' summaries, as a table and as JSON."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.trace.compare import compare_summaries, format_table
from moesim.trace.report import full_summary
from tests.test_trace_fixtures import MS, hot_expert_result


def _row(rows, metric):
    return next(r for r in rows if r["metric"] == metric)


def _two_runs(tmp_path):
    a = full_summary(hot_expert_result())
    b = json.loads(json.dumps(a))
    b["step_time_s"] = 3.6 * MS  # 20% faster
    b["breakdown_s"]["stall"] = 0.0
    b["tokens_per_s"] = 500 / (3.6 * MS)
    b["experts"]["dropped"] = 0
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "summary.json").write_text(json.dumps(a))
    (tmp_path / "b" / "summary.json").write_text(json.dumps(b))
    return a, b


def test_deltas(tmp_path):
    a, b = _two_runs(tmp_path)
    rows = compare_summaries(a, b)
    st = _row(rows, "step time (ms)")
    assert (st["a"], st["b"]) == (pytest.approx(4.5), pytest.approx(3.6))
    assert st["delta"] == pytest.approx(-0.9) and st["delta_pct"] == pytest.approx(-20.0)
    stall = _row(rows, "breakdown stall (ms)")
    assert stall["delta"] == pytest.approx(-0.6) and stall["delta_pct"] == pytest.approx(-100)
    tp = _row(rows, "throughput (tokens/s)")
    assert tp["delta_pct"] == pytest.approx(25.0)
    assert _row(rows, "dropped assignments")["delta"] == -100
    same = _row(rows, "breakdown compute (ms)")
    assert same["delta"] == 0 and same["delta_pct"] == 0
    zero = _row(rows, "breakdown tp (ms)")
    assert zero["delta"] == 0 and zero["delta_pct"] is None  # Δ% undefined when A is 0
    assert _row(rows, "stall L3 fwd ← rank 1 e3 (ms)")["a"] == pytest.approx(1.2)


def test_metric_only_in_one_run():
    rows = compare_summaries({"step_time_s": 1.0}, {"step_time_s": 2.0, "mfu": 0.5})
    assert _row(rows, "MFU (%)") == {"metric": "MFU (%)", "a": None, "b": 50.0, "delta": None,
                                     "delta_pct": None}
    text = format_table(rows)
    assert text.splitlines()[0].split() == ["metric", "A", "B", "Δ", "Δ%"]
    assert "+100.0%" in text


def test_cli_table_and_json(tmp_path, capsys):
    _two_runs(tmp_path)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("step time (ms)"))
    assert line.split()[-4:] == ["4.5", "3.6", "-0.9", "-20.0%"]
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert _row(rows, "step time (ms)")["delta_pct"] == pytest.approx(-20.0)


@pytest.mark.parametrize("content", [None, "{oops", "[1, 2]", '{"mfu": 1}'])
def test_cli_bad_run_dir(tmp_path, capsys, content):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text(json.dumps({"step_time_s": 1.0}))
    (tmp_path / "a").mkdir()
    if content is not None:
        (tmp_path / "a" / "summary.json").write_text(content)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "summary.json" in err[0]


def test_b_only_stall_rows_sit_with_a_stall_rows():
    def summ(*stalls):
        return {"step_time_s": 1.0, "stalls": {"total_s": 1.0, "top": [
            {"layer": lay, "phase": "fwd", "blocking_rank": r, "expert": r, "seconds": sec}
            for lay, r, sec in stalls]}, "mfu": 0.5}
    rows = compare_summaries(summ((0, 3, 0.5)), summ((1, 5, 0.25)))
    assert [r["metric"] for r in rows] == [
        "step time (ms)", "throughput (tokens/s)", "MFU (%)", "stall total, all ranks (ms)",
        "stall L0 fwd ← rank 3 e3 (ms)", "stall L1 fwd ← rank 5 e5 (ms)"]
    assert rows[-1]["b"] == pytest.approx(250.0) and rows[-1]["a"] is None
