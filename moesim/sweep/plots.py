"""Sweep plots. Each function takes data (a frame from :mod:`moesim.sweep.results`)
and a matplotlib Axes, draws, and returns the Axes; none touches pyplot state.

* :func:`plot_vs_skew`: a metric (step time, stall fraction, ...) against the skew
  axis, one line per value of a grouping axis (e.g. topology), error bars = spread
  (min..max) over seeds;
* :func:`plot_bars`: a metric per value of a categorical axis (e.g. topology only);
* :func:`plot_heatmap`: a metric over two axes;
* :func:`plot_best_layout`: the best layout's metric per skew level, labelled with it.

Every function takes ``rl``: an RL sweep's times are shown in seconds, a training
step's in milliseconds (:func:`label`).

:func:`write_sweep_plots` picks the plots a sweep's axes allow and writes PNGs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from moesim.outputs import save_figure
from moesim.sweep.results import aggregate, axis_columns, best_layout
from moesim.sweep.spec import SweepSpec

# metric -> (axis label, factor from SI to the unit shown)
UNITS: dict[str, tuple[str, float]] = {
    "step_time_s": ("step time (ms)", 1e3),
    "stall_fraction": ("stall (% of step, mean over ranks)", 100.0),
    "breakdown_s.stall": ("stall (ms, mean over ranks)", 1e3),
    "stall_max_rank_s": ("stall of the most-waiting rank (ms)", 1e3),
    "tokens_per_s": ("tokens/s", 1.0),
    "mfu": ("MFU (%)", 100.0),
    "experts.dropped_total": ("dropped token assignments", 1.0),
    "memory.peak_bytes_max": ("peak memory per GPU (GB)", 1e-9),
}
# axes that measure expert skew, in order of preference for the x axis
SKEW_KEYS = ("routing.hot_fraction", "routing.hot_token_fraction", "routing.zipf_s",
             "routing.alpha", "routing.capacity_factor")


# RL steps last minutes: their times in seconds (moesim.rl.summary's columns)
RL_UNITS: dict[str, tuple[str, float]] = {
    "step_time_s": ("RL step time (s)", 1.0),
    "utilization.train": ("trainer busy (% of the run)", 100.0),
    "utilization.rollout": ("rollout pool busy (% of the run)", 100.0),
    "samples_per_s": ("samples/s", 1.0),
    "tokens_per_s_per_gpu": ("tokens/s per GPU", 1.0),
}
#: the plots of an RL sweep after the step time: the pools' busy fractions (no stall or
#: hot-rank columns: those describe a training step's ranks)
RL_PLOTS = (("utilization.train", "utilization_train.png"),
            ("utilization.rollout", "utilization_rollout.png"))


def is_rl(df: pd.DataFrame) -> bool:
    """Whether a results frame holds RL points (moesim.rl.summary's columns)."""
    return "step_time_kind" in df.columns or "samples_per_s" in df.columns


def label(metric: str, rl: bool = False) -> tuple[str, float]:
    """Axis label with unit and the factor from SI, for a metric column (``rl``: of an
    RL sweep, whose times are seconds)."""
    if rl:
        if metric in RL_UNITS:
            return RL_UNITS[metric]
        if metric.endswith("_s") or "_s." in metric:     # phases_s.generate
            return f"{metric} (s)", 1.0
    if metric in UNITS:
        return UNITS[metric]
    if metric.endswith("_s"):
        return f"{metric} (ms)", 1e3
    return metric, 1.0


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "none"     # e.g. capacity_factor null = no dropping
    return f"{v:g}" if isinstance(v, float) else str(v)


def plot_vs_skew(ax: Axes, agg: pd.DataFrame, skew: str, metric: str = "step_time_s",
                 by: str | None = None, rl: bool = False) -> Axes:
    """``metric`` (mean over seeds, bars min..max) against ``skew``, a line per ``by``
    value. Other axes, if any, are averaged (their spread widens the bars)."""
    text, k = label(metric, rl)
    groups = [(None, agg)] if by is None else list(agg.groupby(by, sort=False, dropna=False))
    for name, g in groups:
        g2 = g.groupby(skew, sort=True).agg(mean=(f"{metric}_mean", "mean"),
                                            lo=(f"{metric}_min", "min"),
                                            hi=(f"{metric}_max", "max"))
        x = np.asarray(g2.index, dtype=float)
        y = g2["mean"].to_numpy(dtype=float) * k
        err = np.vstack([y - g2["lo"].to_numpy(dtype=float) * k,
                         g2["hi"].to_numpy(dtype=float) * k - y])
        ax.errorbar(x, y, yerr=np.clip(err, 0, None), marker="o", capsize=3,
                    label=None if name is None else f"{by}={_fmt(name)}")
    xs = np.unique(np.asarray(agg[skew], dtype=float))
    if len(xs) <= 12 and np.all(xs == np.round(xs)):     # integer axis values as ticks
        ax.set_xticks(xs, [f"{int(x)}" for x in xs])
    ax.set_xlabel(skew)
    ax.set_ylabel(text)
    ax.grid(alpha=0.3)
    if by is not None:
        ax.legend(fontsize=8)
    ax.set_title(f"{text.split(' (')[0]} vs {skew}")
    return ax


def plot_heatmap(ax: Axes, agg: pd.DataFrame, x: str, y: str,
                 metric: str = "step_time_s", rl: bool = False) -> Axes:
    """Mean ``metric`` over the ``x`` × ``y`` grid (other axes averaged), annotated;
    a missing cell (skipped or failed) is blank."""
    text, k = label(metric, rl)
    # axis values as labels, so that a null value (e.g. no capacity limit) keeps its row
    lab = pd.DataFrame({x: agg[x].map(_fmt), y: agg[y].map(_fmt),
                        "v": agg[f"{metric}_mean"]})
    grid = lab.pivot_table(index=y, columns=x, values="v", aggfunc="mean", sort=False)
    vals = grid.to_numpy(dtype=float) * k
    im = ax.imshow(np.ma.masked_invalid(vals), aspect="auto", cmap="viridis", origin="lower")
    ax.set_xticks(range(grid.shape[1]), list(grid.columns), rotation=30)
    ax.set_yticks(range(grid.shape[0]), list(grid.index))
    finite = vals[np.isfinite(vals)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for i in range(vals.shape[0]):
        for j in range(vals.shape[1]):
            if np.isfinite(vals[i, j]):
                ax.text(j, i, f"{vals[i, j]:.3g}", ha="center", va="center", fontsize=8,
                        color="white" if vals[i, j] < mid else "black")
    ax.figure.colorbar(im, ax=ax, label=text)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(text.split(" (")[0])
    return ax


def plot_bars(ax: Axes, agg: pd.DataFrame, key: str, metric: str = "step_time_s",
              rl: bool = False) -> Axes:
    """Mean ``metric`` per value of a (categorical) axis, bars = min..max over seeds;
    other axes averaged."""
    text, k = label(metric, rl)
    g = agg.groupby(key, sort=False, dropna=False).agg(
        mean=(f"{metric}_mean", "mean"), lo=(f"{metric}_min", "min"),
        hi=(f"{metric}_max", "max"))
    y = g["mean"].to_numpy(dtype=float) * k
    err = np.vstack([y - g["lo"].to_numpy(dtype=float) * k, g["hi"].to_numpy(dtype=float) * k - y])
    x = np.arange(len(g))
    ax.bar(x, y, yerr=np.clip(err, 0, None), capsize=3)
    ax.set_xticks(x, [_fmt(v) for v in g.index], rotation=30)
    ax.set_xlabel(key)
    ax.set_ylabel(text)
    ax.set_title(f"{text.split(' (')[0]} per {key}")
    ax.grid(alpha=0.3, axis="y")
    return ax


def plot_best_layout(ax: Axes, best: pd.DataFrame, skew: str, layout: list[str],
                     metric: str = "step_time_s", by: str | None = None,
                     rl: bool = False) -> Axes:
    """The best layout's mean ``metric`` per ``skew`` level (a line per ``by`` value),
    each point labelled with the winning layout values."""
    text, k = label(metric, rl)
    groups = [(None, best)] if by is None else list(best.groupby(by, sort=False, dropna=False))
    for name, g in groups:
        g = g.sort_values(skew)
        x = g[skew].to_numpy(dtype=float)
        y = g[f"{metric}_mean"].to_numpy(dtype=float) * k
        ax.plot(x, y, marker="s", label=None if name is None else f"{by}={_fmt(name)}")
        for xi, yi, (_, row) in zip(x, y, g.iterrows(), strict=True):
            tag = ",".join(f"{key.split('.')[-1]}={_fmt(row[key])}" for key in layout)
            ax.annotate(tag, (xi, yi), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize=7)
    ax.set_xlabel(skew)
    ax.set_ylabel(f"best {text}")
    ax.set_title(f"best {'/'.join(layout)} per {skew}")
    ax.grid(alpha=0.3)
    if by is not None:
        ax.legend(fontsize=8)
    return ax


def choose(df: pd.DataFrame, spec: SweepSpec | None = None) -> dict[str, Any]:
    """Which axes the default plots use: ``skew`` (x), ``by`` (lines), ``heatmap``
    (two axes), ``layout`` (parallel.* axes) — from the sweep's ``plots:`` or guessed."""
    keys = axis_columns(df)
    opt = dict(spec.plots) if spec is not None else {}
    skew = opt.get("skew") or next((k for k in SKEW_KEYS if k in keys), keys[0] if keys else None)
    rest = [k for k in keys if k != skew]
    by = opt.get("by") or ("cluster.topology" if "cluster.topology" in rest
                           else (rest[0] if rest else None))
    layout = opt.get("layout") or [k for k in rest if k.startswith("parallel.")]
    heat = opt.get("heatmap") or ([skew, by] if skew and by else None)
    return {"skew": skew, "by": by, "layout": list(layout), "heatmap": heat,
            "metric": opt.get("metric", "step_time_s")}


def write_sweep_plots(outdir: str | Path, df: pd.DataFrame,
                      spec: SweepSpec | None = None) -> list[Path]:
    """Write ``step_time.png``, ``stall_fraction.png``, ``heatmap.png`` and
    ``best_layout.png`` (those the axes allow) into ``outdir``; return their paths. An
    RL sweep (:func:`is_rl`) gets its times in seconds and, instead of the stall
    fraction (a training step's), the pools' busy fractions (:data:`RL_PLOTS`)."""
    from moesim.trace.plots import new_figure

    out = Path(outdir)
    rl = is_rl(df)
    c = choose(df, spec)
    skew, by, metric = c["skew"], c["by"], c["metric"]
    extra = RL_PLOTS if rl else (("stall_fraction", "stall_fraction.png"),)
    wanted = [metric, *(m for m, _ in extra)] + ([] if rl else ["tokens_per_s"])
    agg = aggregate(df, [m for m in dict.fromkeys(wanted) if m in df.columns])
    if agg.empty:
        return []
    by_line = by if by != skew else None
    written = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        written.append(save_figure(fig, out / name, force=True))  # the sweep's own plots

    for m, name in ((metric, "step_time.png"), *extra):
        if f"{m}_mean" not in agg.columns:
            continue
        fig = new_figure(7, 4.5)
        if pd.api.types.is_numeric_dtype(agg[skew]):
            plot_vs_skew(fig.add_subplot(), agg, skew, m, by_line, rl=rl)
        else:   # no numeric axis to draw against: bars per value
            plot_bars(fig.add_subplot(), agg, skew, m, rl=rl)
        save(fig, name)
    if c["heatmap"] and len(set(c["heatmap"])) == 2:
        fig = new_figure(7, 4.5)
        plot_heatmap(fig.add_subplot(), agg, c["heatmap"][0], c["heatmap"][1], metric, rl=rl)
        save(fig, "heatmap.png")
    layout = [k for k in c["layout"] if k != skew]
    if layout and pd.api.types.is_numeric_dtype(agg[skew]):
        keep = [k for k in axis_columns(agg) if k in (skew, by, *layout)]
        sub = agg.groupby(keep, sort=False).mean(numeric_only=True).reset_index()
        sub.attrs["axes"] = keep
        best = best_layout(sub, layout, metric)
        fig = new_figure(7, 4.5)
        plot_best_layout(fig.add_subplot(), best, skew, layout, metric,
                         by if by not in layout and by != skew else None, rl=rl)
        save(fig, "best_layout.png")
    return written
