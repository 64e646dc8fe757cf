"""Result frames, seed aggregation, best layout and plots, on hand-made records."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from moesim.errors import InputError  # noqa: E402
from moesim.sweep.plots import (  # noqa: E402
    choose,
    plot_bars,
    plot_best_layout,
    plot_heatmap,
    plot_vs_skew,
    write_sweep_plots,
)
from moesim.sweep.results import (  # noqa: E402
    POINTS_FILE,
    aggregate,
    best_layout,
    read_records,
    records_frame,
    repair_points_file,
    write_results,
)
from moesim.sweep.runner import flatten  # noqa: E402
from moesim.sweep.spec import expand, parse_sweep  # noqa: E402

SPEC = parse_sweep({"scenario": "hot-expert", "seeds": [1, 2],
                    "axes": {"routing.hot_fraction": [0.1, 0.5], "parallel.ep": [4, 8]}},
                   "s.yaml", check_scenario=False)


def step_of(hf: float, ep: int, seed: int) -> float:
    # made-up model, chosen so that the best ep flips with skew: ep 8 wins at 0.1,
    # ep 4 at 0.5; seed 2 is 1 ms slower than seed 1
    return {(0.1, 4): 0.020, (0.1, 8): 0.010, (0.5, 4): 0.030, (0.5, 8): 0.040}[(hf, ep)] \
        + (seed - 1) * 0.001


def records(skip_ep: int | None = None) -> list[dict]:
    out = []
    for p in expand(SPEC):
        v = dict(p.values)
        rec = {"point_id": p.point_id, "index": p.index, "values": v, "seed": p.seed,
               "sim_wall_s": 0.1}
        if v["parallel.ep"] == skip_ep:
            rec.update(status="skipped", reason="layout")
        else:
            st = step_of(v["routing.hot_fraction"], v["parallel.ep"], p.seed)
            rec.update(status="ok", metrics={"step_time_s": st, "stall_fraction": 0.25,
                                             "tokens_per_s": 1000 / st})
        out.append(rec)
    return out


def frame(recs):
    df = records_frame(recs, SPEC)
    df.attrs["axes"] = list(SPEC.axis_keys)
    return df


def test_flatten_keeps_scalars_with_dotted_keys():
    assert flatten({"a": 1, "b": {"c": 2.5, "d": [1, 2], "e": {"f": "x"}}, "g": None}) == \
        {"a": 1, "b.c": 2.5, "b.e.f": "x", "g": None}


def test_frame_orders_by_expansion_and_aggregate_over_seeds():
    recs = records()
    df = frame(list(reversed(recs)))
    assert list(df["index"]) == list(range(8))
    assert list(df.columns[:9]) == ["point_id", "index", "seed", "status", "reason", "error",
                                    "sim_wall_s", "routing.hot_fraction", "parallel.ep"]
    agg = aggregate(df, ["step_time_s"])
    assert list(agg["n_seeds"]) == [2, 2, 2, 2]
    row = agg[(agg["routing.hot_fraction"] == 0.5) & (agg["parallel.ep"] == 4)].iloc[0]
    assert row["step_time_s_mean"] == pytest.approx(0.0305)
    assert row["step_time_s_min"] == pytest.approx(0.030)
    assert row["step_time_s_max"] == pytest.approx(0.031)
    assert row["step_time_s_std"] == pytest.approx(0.001 / np.sqrt(2))


def test_best_layout_per_skew_level():
    agg = aggregate(frame(records()), ["step_time_s"])
    best = best_layout(agg, ["parallel.ep"])
    assert list(best["routing.hot_fraction"]) == [0.1, 0.5]
    assert list(best["parallel.ep"]) == [8, 4]
    assert list(best["step_time_s_mean"]) == pytest.approx([0.0105, 0.0305])
    assert list(best["n_layouts"]) == [2, 2]
    with pytest.raises(InputError):
        best_layout(agg, ["cluster.topology"])


def test_skipped_points_have_no_metrics_and_are_left_out_of_means():
    df = frame(records(skip_ep=8))
    assert (df.loc[df["parallel.ep"] == 8, "status"] == "skipped").all()
    assert df.loc[df["parallel.ep"] == 8, "step_time_s"].isna().all()
    agg = aggregate(df, ["step_time_s"])
    assert list(agg["parallel.ep"]) == [4, 4]


def test_points_file_last_record_wins_partial_tail_ignored_and_repaired(tmp_path: Path):
    recs = records()
    failed = {**recs[0], "status": "failed", "error": "x"}
    failed.pop("metrics")
    lines = [json.dumps(failed)] + [json.dumps(r) for r in recs]
    p = tmp_path / POINTS_FILE
    p.write_text("\n".join(lines) + "\n" + '{"point_id": "abc", "ind')
    got = read_records(tmp_path)
    assert len(got) == 8 and [r["status"] for r in got].count("failed") == 0
    assert repair_points_file(tmp_path) == len('{"point_id": "abc", "ind')
    assert p.read_text().endswith("}\n")
    res = write_results(tmp_path, SPEC)
    assert res.counts == {"ok": 8} and len(res.frame) == 8
    p.write_text("garbage\n" + p.read_text())
    with pytest.raises(InputError) as e:
        read_records(tmp_path)
    assert e.value.field == "line 1"


def test_plots_return_axes_and_draw_the_data(tmp_path: Path):
    df = frame(records())
    agg = aggregate(df, ["step_time_s", "stall_fraction"])
    ax = Figure().add_subplot()
    assert plot_vs_skew(ax, agg, "routing.hot_fraction", "step_time_s", "parallel.ep") is ax
    assert len(ax.lines) >= 2
    ys = sorted(tuple(np.round(line.get_ydata(), 6)) for line in ax.lines
                if len(line.get_xdata()) == 2)
    assert (10.5, 40.5) in ys and (20.5, 30.5) in ys    # ms, mean of the two seeds
    ax2 = Figure().add_subplot()
    assert plot_heatmap(ax2, agg, "routing.hot_fraction", "parallel.ep") is ax2
    img = ax2.images[0].get_array()
    assert img[0, 0] == pytest.approx(20.5) and img[1, 1] == pytest.approx(40.5)
    ax3 = Figure().add_subplot()
    best = best_layout(agg, ["parallel.ep"])
    assert plot_best_layout(ax3, best, "routing.hot_fraction", ["parallel.ep"]) is ax3
    assert [t.get_text() for t in ax3.texts] == ["ep=8", "ep=4"]
    assert choose(df, SPEC) == {"skew": "routing.hot_fraction", "by": "parallel.ep",
                                "layout": ["parallel.ep"],
                                "heatmap": ["routing.hot_fraction", "parallel.ep"],
                                "metric": "step_time_s"}
    names = [p.name for p in write_sweep_plots(tmp_path, df, SPEC)]
    assert names == ["step_time.png", "stall_fraction.png", "heatmap.png", "best_layout.png"]
    assert all((tmp_path / n).stat().st_size > 1000 for n in names)


def test_bars_for_a_categorical_axis(tmp_path: Path):
    spec = parse_sweep({"scenario": "hot-expert", "seeds": [1, 2],
                        "axes": {"cluster.topology": ["dgx-h100", "pcie-8gpu"]}}, "s.yaml",
                       check_scenario=False)
    recs = [{"point_id": p.point_id, "index": p.index, "values": dict(p.values), "seed": p.seed,
             "status": "ok", "metrics": {"step_time_s": 0.010 * (p.index // 2 + 1) + 0.002 * p.seed,
                                         "stall_fraction": 0.1}} for p in expand(spec)]
    df = records_frame(recs, spec)
    df.attrs["axes"] = ["cluster.topology"]
    agg = aggregate(df, ["step_time_s"])
    ax = Figure().add_subplot()
    assert plot_bars(ax, agg, "cluster.topology") is ax
    # dgx-h100: 12 and 14 ms -> 13; pcie-8gpu: 22 and 24 ms -> 23
    assert [round(b.get_height(), 9) for b in ax.patches] == [13.0, 23.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dgx-h100", "pcie-8gpu"]
    names = [p.name for p in write_sweep_plots(tmp_path, df, spec)]
    assert names == ["step_time.png", "stall_fraction.png"]
