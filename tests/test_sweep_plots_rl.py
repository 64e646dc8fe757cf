"""An RL sweep's plots: times in seconds, the pools' busy fractions, no training-only
columns (stall fraction, hot ranks); point rows without them."""

from __future__ import annotations

import pandas as pd
import pytest

from moesim.sweep.plots import is_rl, label, plot_vs_skew, write_sweep_plots
from moesim.sweep.results import aggregate
from moesim.sweep.runner import point_metrics


def rl_frame() -> pd.DataFrame:
    rows = []
    for i, (gpus, lag, step) in enumerate([(8, 0, 200.0), (8, 1, 170.0), (16, 0, 140.0),
                                           (16, 1, 90.0)]):
        summary = {"step_time_s": step, "step_time_kind": "steady_state",
                   "steps_averaged": [lag, 3 - lag], "samples_per_s": 2048 / step,
                   "utilization": {"train": 0.25 + 0.1 * lag, "rollout": 0.9},
                   "phases_s": {"generate": step - 10}, "oom": False,
                   "fit": {"oom": False, "checks": []}, "steps": [{"step": 0}]}
        rows.append({"point_id": f"p{i}", "index": i, "status": "ok", "seed": 0,
                     "rl.rollout.gpus": gpus, "rl.max_lag": lag, **point_metrics(summary)})
    df = pd.DataFrame(rows)
    df.attrs["axes"] = ["rl.rollout.gpus", "rl.max_lag"]
    return df


def test_rl_rows_have_no_training_only_columns():
    df = rl_frame()
    for col in ("stall_fraction", "stall_max_rank_s", "n_hot_ranks"):
        assert col not in df.columns
    assert "utilization.train" in df.columns and "oom" in df.columns and is_rl(df)


def test_rl_step_time_is_drawn_in_seconds():
    assert label("step_time_s", rl=True) == ("RL step time (s)", 1.0)
    assert label("step_time_s") == ("step time (ms)", 1e3)        # a training step's
    assert label("phases_s.generate", rl=True) == ("phases_s.generate (s)", 1.0)
    from moesim.trace.plots import new_figure

    agg = aggregate(rl_frame(), ["step_time_s"])
    ax = plot_vs_skew(new_figure(6, 4).add_subplot(), agg, "rl.max_lag", "step_time_s",
                      "rl.rollout.gpus", rl=True)
    assert ax.get_ylabel() == "RL step time (s)"
    ys = sorted(float(y) for line in ax.get_lines() if line.get_marker() == "o"
                for y in line.get_ydata())        # the lines, not the error bars' caps
    assert ys == pytest.approx([90.0, 140.0, 170.0, 200.0])       # seconds, as summarised


def test_rl_sweep_writes_busy_fractions_not_stalls(tmp_path):
    names = sorted(p.name for p in write_sweep_plots(tmp_path, rl_frame()))
    assert names == ["heatmap.png", "step_time.png", "utilization_rollout.png",
                     "utilization_train.png"]
