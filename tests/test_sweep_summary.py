"""A sweep's summary.json and summary.md from its results, worked by hand: counts, the
points that do not fit in device memory, means per combination in the right unit."""

from __future__ import annotations

from moesim.sweep.results import aggregate, records_frame
from moesim.sweep.spec import load_sweep
from moesim.sweep.summary import oom_mask, summary_markdown, sweep_summary

SWEEP = """\
name: hand
scenario: hot-expert
axes:
  routing.hot_fraction: [0.25, 0.5]
seeds: [1, 2]
"""


def _rec(pid, hf, seed, status="ok", **metrics):
    rec = {"point_id": pid, "index": 0, "values": {"routing.hot_fraction": hf}, "seed": seed,
           "status": status}
    if status == "ok":
        rec["metrics"] = metrics
    else:
        rec["reason"] = "too big"
    return rec


def test_summary_by_hand(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(SWEEP)
    spec = load_sweep(f)
    df = records_frame([_rec("a", 0.25, 1, step_time_s=2.0, tokens_per_s=100.0, oom=True),
                        _rec("b", 0.25, 2, step_time_s=4.0, tokens_per_s=50.0, oom=False),
                        _rec("c", 0.5, 1, step_time_s=1.0, tokens_per_s=200.0, oom=None),
                        _rec("d", 0.5, 2, status="skipped")])
    df.attrs["axes"] = ["routing.hot_fraction"]
    assert list(oom_mask(df)) == [True, False, False, False]
    s = sweep_summary(spec, df, aggregate(df), ran=3, reused=1, files=["summary.json"])
    assert s["counts"] == {"ok": 3, "skipped": 1}
    assert (s["oom"], s["oom_points"], s["memory_checked"]) == (True, 1, 2)   # c: no verdict
    assert s["oom_at"] == [{"routing.hot_fraction": 0.25, "seed": 1}]
    assert s["not_run"] == {"skipped: too big": 1}
    assert s["means"] == [
        {"routing.hot_fraction": 0.25, "n_seeds": 2, "step_time_s_mean": 3.0,
         "tokens_per_s_mean": 75.0},
        {"routing.hot_fraction": 0.5, "n_seeds": 1, "step_time_s_mean": 1.0,
         "tokens_per_s_mean": 200.0}]
    md = summary_markdown(s)
    assert "4 points (ok 3, skipped 1); this run ran 3, 1 were already done." in md
    assert "**1 of 4 points do not fit in device memory**" in md
    assert "- routing.hot_fraction=0.25, seed=1" in md
    assert "- 1 skipped: too big" in md
    # steps of a second or more are shown in seconds, shorter ones in ms
    assert "| routing.hot_fraction | n_seeds | step (s) | tokens/s |" in md
    assert "| 0.25 | 2 | 3.000 | 75 |" in md and "| 0.5 | 1 | 1.000 | 200 |" in md
    short = {**s, "means": [{**m, "step_time_s_mean": m["step_time_s_mean"] / 1e3}
                            for m in s["means"]]}
    assert "| 0.25 | 2 | 3.000 | 75 |" in summary_markdown(short)
    assert "step (ms)" in summary_markdown(short)
