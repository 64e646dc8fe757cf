"""Plots of a simulated step. Each function takes data and a matplotlib Axes, draws,
and returns the Axes; none touches pyplot's global state (use
:func:`new_figure` for an Agg figure).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.path import Path

# the link figure lives in its own module; these names stay importable from here
from moesim.trace.link_bins import binned_utilization  # noqa: F401
from moesim.trace.link_plot import busiest_links, link_group, plot_links  # noqa: F401
from moesim.trace.result import SimResult
from moesim.trace.spans import COMM_KINDS, KINDS, SPAN_KINDS, Span
from moesim.trace.time_squeeze import mark_cuts, squeeze_map, squeeze_spans
from moesim.trace.timeline_marks import (
    TITLE_PAD_PT,
    WIDENED_ALPHA,
    WIDENED_HATCH,
    category_shares,
    layer_segments,
    mark_layers,
    min_width_ms,
    phase_handles,
    share_label,
    widened_handle,
)

KIND_COLORS = {
    "compute": "#4C72B0", "ep_dispatch": "#55A868", "ep_combine": "#8FD694", "tp": "#8172B3",
    "dp": "#937860", "pp": "#64B5CD", "zero": "#DA8BC3", "bubble": "#CCB974",
    "stall": "#C44E52", "host": "#8C8C8C", "idle": "#EEEEEE",
}
MAX_ROWS = 64  # above this many ranks the timeline aggregates rows


def new_figure(width_in: float = 12.0, height_in: float = 5.0, dpi: int = 110) -> Figure:
    """A Figure on an Agg canvas, independent of pyplot."""
    fig = Figure(figsize=(width_in, height_in), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def timeline_figsize(n_ranks: int, ranks_per_node: int = 1) -> tuple[float, float]:
    """Figure size (inches) that keeps timeline rows readable: ~0.42 in per rank row,
    ~0.22 in per aggregated row; at least 3.5 in, so that the top margin (12 % of the
    height) holds the layer strip and the title above it."""
    if n_ranks <= MAX_ROWS:
        return 14.0, max(3.5, 2.0 + 0.42 * n_ranks)
    return 14.0, 2.0 + 0.22 * len(timeline_rows(n_ranks, ranks_per_node))


def _lane(sp: Span) -> int:
    """0 compute, 1 communication, 2 waiting (stall/bubble) and the serving engine's CPU
    work (host)."""
    if sp.kind in ("stall", "bubble", "host"):
        return 2
    return 1 if sp.kind in COMM_KINDS else 0


def merged_bars(rows: np.ndarray, start_ms: np.ndarray, width_ms: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bars (row, x, width) with the overlapping or touching bars of one row merged into
    one: the same area is covered with far fewer rectangles (a 64-rank step has ~10^5
    spans, most of them narrower than a pixel)."""
    if len(rows) == 0:
        return rows, start_ms, width_ms
    order = np.lexsort((start_ms, rows))
    r, x0 = rows[order], start_ms[order]
    x1 = x0 + width_ms[order]
    # a bar starts a new merged bar where its row changes or where it starts after the
    # running max of the ends of the bars before it on its row
    new_row = np.ones(len(r), dtype=bool)
    new_row[1:] = r[1:] != r[:-1]
    run_end = np.empty_like(x1)
    first = np.flatnonzero(new_row)
    for a, b in zip(first, [*first[1:], len(r)], strict=True):
        run_end[a:b] = np.maximum.accumulate(x1[a:b])
    start_new = new_row.copy()
    start_new[1:] |= x0[1:] > run_end[:-1]
    idx = np.flatnonzero(start_new)
    ends = np.maximum.reduceat(x1, idx)
    return r[idx], x0[idx], ends - x0[idx]


def _bar_verts(rows_t: np.ndarray, min_w: float, lane_y: np.ndarray, lane_h: float
               ) -> np.ndarray:
    """(n, 4, 2) rectangle corners of the merged bars of ``rows_t`` = [(row, start_s,
    end_s), ...], in ms, each bar at least ``min_w`` wide."""
    start = rows_t[:, 1] * 1e3
    width = np.maximum((rows_t[:, 2] - rows_t[:, 1]) * 1e3, min_w)
    r, x0, w = merged_bars(rows_t[:, 0], start, width)
    y0 = r + lane_y
    y1 = y0 + lane_h
    x1 = x0 + w
    return np.stack([np.stack([x0, y0], 1), np.stack([x0, y1], 1), np.stack([x1, y1], 1),
                     np.stack([x1, y0], 1)], axis=1)


def _rects_path(verts: np.ndarray) -> Path:
    """One compound path of the (n, 4, 2) rectangles ``verts`` (closed)."""
    n = len(verts)
    xy = np.concatenate([verts, verts[:, :1]], axis=1).reshape(-1, 2)
    codes = np.tile(np.array([Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO,
                              Path.CLOSEPOLY], dtype=Path.code_type), n)
    return Path(xy, codes)


def timeline_rows(n_ranks: int, ranks_per_node: int, max_rows: int = MAX_ROWS) -> list[list[int]]:
    """Ranks per row: one rank per row up to ``max_rows`` ranks, else one node per row, else
    equal groups of nodes so that there are at most ``max_rows`` rows."""
    if n_ranks <= max_rows:
        return [[r] for r in range(n_ranks)]
    rpn = max(1, ranks_per_node)
    per = rpn * int(np.ceil(n_ranks / rpn / max_rows))
    return [list(range(s, min(s + per, n_ranks))) for s in range(0, n_ranks, per)]


def plot_timeline(result: SimResult, ax: Axes, ranks: Iterable[int] | None = None,
                  layers: Iterable[int] | None = None, max_rows: int = MAX_ROWS,
                  annotate: int = 3, per_rank: Sequence[dict[str, float]] | None = None
                  ) -> Axes:
    """Gantt chart, one row per rank: compute (top lane), communication by kind (middle),
    bubble and stall (bottom); with ``layers``, the stretches of the step without those
    layers' spans are cut out of the time axis (:mod:`moesim.trace.time_squeeze`,
    dashed separators, ticks in the step's real time); spans of the compute stream that are communication or waits
    are drawn in their kind's lane; communication at least a few pixels wide
    (:func:`moesim.trace.timeline_marks.min_width_ms`). A strip above the rows marks the
    first rank's layers, forward and backward (:func:`~moesim.trace.timeline_marks.mark_layers`).
    Hot-expert ranks are labelled in red; the ``annotate``
    longest stalls are labelled with their blocking rank and expert. With more than
    ``max_rows`` ranks, draws per node (or group of nodes) a stacked bar of the mean
    fraction of the step in each category of the ranks' breakdowns (exclusive, so each
    bar sums to 100 %) instead.

    ``per_rank``: every rank's breakdown (``per_rank[r]``: seconds per category of rank
    r, summing to the step, as :func:`moesim.engine.breakdown.breakdown` returns them);
    default: the summary's ``per_rank`` rows. It gives the legend's shares and the
    aggregated bars; a plot takes it as data and never computes it. Without it (a result
    whose summary has no per-rank breakdown), the legend has no shares and more than
    ``max_rows`` ranks cannot be drawn (ValueError).

    Each kind is one collection (gid ``timeline:<kind>``) holding one compound path of
    rectangles, the overlapping or touching bars of a row merged (:func:`merged_bars`),
    so a 64-rank step with ~10^5 spans draws in a fraction of a second."""
    rank_list = sorted(set(range(result.n_ranks) if ranks is None else ranks))
    layer_set = None if layers is None else set(layers)
    rank_set = set(rank_list)
    spans = [s for s in result.spans if s.rank in rank_set
             and (layer_set is None or s.layer in layer_set)]
    if len(rank_list) > max_rows:
        return _timeline_aggregate(result, ax, rank_list, max_rows,
                                   _breakdowns(result, per_rank))
    # zoomed on layers: the stretches of the step without them are cut out of the axis
    cut = squeeze_map(spans) if layer_set is not None else None
    if cut is not None:
        spans = squeeze_spans(spans, cut)
    row_of = {r: i for i, r in enumerate(rank_list)}
    hot = set(result.hot_ranks)
    lane_h, lane_y = 0.26, (0.08, 0.38, 0.68)
    widened = False
    t0 = min((s.start_s for s in spans), default=0.0) * 1e3
    t1 = max((s.end_s for s in spans), default=result.step_time_s) * 1e3
    by_kind: dict[str, list[tuple[int, float, float]]] = {}
    for sp in spans:
        by_kind.setdefault(sp.kind, []).append((row_of[sp.rank], sp.start_s, sp.end_s))
    kinds_seen = []
    for kind in sorted(by_kind):  # one collection per kind, drawn in the old (kind, row) order
        lane = _lane(Span(0, "", kind, "", 0, 0))
        arr = np.array(by_kind[kind], dtype=float)
        color = KIND_COLORS.get(kind, "grey")
        # spans shorter than a few pixels are widened to stay visible: the widening is
        # drawn pale and hatched under the spans' true widths, so it reads as widened
        min_w = min_width_ms(kind, t0, t1)
        narrow = arr[(arr[:, 2] - arr[:, 1]) * 1e3 < min_w]
        if len(narrow):
            halo = PathCollection(
                [_rects_path(_bar_verts(narrow, min_w, np.array(lane_y[lane]), lane_h))],
                facecolors=to_rgba(color, WIDENED_ALPHA), edgecolors=color, linewidths=0,
                hatch=WIDENED_HATCH, snap=True, zorder=0.9)
            halo.set_gid(f"timeline:{kind}:widened")
            ax.add_collection(halo, autolim=False)
            widened = True
        verts = _bar_verts(arr, 0.0, np.array(lane_y[lane]), lane_h)
        coll = PathCollection([_rects_path(verts)], facecolors=color,
                              edgecolors="none", snap=True)
        coll.set_gid(f"timeline:{kind}")
        ax.add_collection(coll, autolim=False)  # the limits are set below
        kinds_seen.append(kind)
    ax.set_yticks([i + 0.5 for i in range(len(rank_list))])
    labels = [f"rank {r}" + (" (hot)" if r in hot else "") for r in rank_list]
    ax.set_yticklabels(labels, fontsize=8 if len(rank_list) <= 16 else 6)
    for tick, r in zip(ax.get_yticklabels(), rank_list, strict=True):
        if r in hot:
            tick.set_color("#C44E52")
            tick.set_fontweight("bold")
    ax.set_ylim(len(rank_list), 0)
    ax.set_xlim(t0, t1 + 1e-9)
    # the longest stalls (ties: lower rank first); start - end == -dur_s exactly
    stalls = heapq.nsmallest(max(0, annotate), (s for s in spans if s.kind == "stall"),
                             key=lambda s: (s.start_s - s.end_s, s.rank))
    for sp in stalls:
        text = f"{sp.dur_s * 1e3:.2f} ms ← rank {sp.waited_on}" + (
            f" e{sp.expert}" if sp.expert >= 0 else "")
        wide = sp.dur_s * 1e3 > 0.12 * (t1 - t0)  # label inside the bar, else right of it
        ha = "center" if wide else "left"
        x = (sp.start_s + sp.dur_s / 2) * 1e3 if wide else sp.end_s * 1e3 + 0.004 * (t1 - t0)
        if not wide and x > t0 + 0.85 * (t1 - t0):  # near the right edge: left of the bar
            ha, x = "right", sp.start_s * 1e3 - 0.004 * (t1 - t0)
        ax.text(x, row_of[sp.rank] + lane_y[2] + lane_h / 2, text,
                ha=ha, va="center", fontsize=6.5, color="#7A1F22",
                clip_on=True,
                bbox={"boxstyle": "round,pad=0.12", "fc": "white", "ec": "none", "alpha": 0.85})
    for i, r in enumerate(rank_list):
        if r in hot:
            ax.axhspan(i, i + 1, color="#C44E52", alpha=0.07, lw=0, zorder=0)
    if len(rank_list) > 1:
        ax.hlines(range(1, len(rank_list)), *ax.get_xlim(), colors="#BBBBBB", lw=0.5)
    ax.set_xlabel("time in step (ms)")
    if cut is not None:
        mark_cuts(ax, cut)
    ax.set_ylabel("rank")
    what = ""
    if layer_set:
        lo, hi = min(layer_set), max(layer_set)
        what = f"layer {lo}, " if lo == hi else f"layers {lo}–{hi}, "
    n = len(rank_list)
    segs = layer_segments(spans, rank_list[0])
    # the strip's height is fixed in points: a title padded past it never covers it
    ax.set_title(f"Step timeline: {what}{n} rank{'s' if n != 1 else ''}, "
                 f"step {result.step_time_s * 1e3:.2f} ms"
                 + (f"; hot-expert ranks {_short_list(sorted(hot))}" if hot else ""),
                 pad=TITLE_PAD_PT if segs else 6.0)
    order = [k for k in SPAN_KINDS if k in kinds_seen]
    mark_layers(ax, spans, rank_list[0], t0, t1, segs=segs)
    # communication kernels that hold SMs (DeepEP, NCCL with overlap.nccl_sms): say how
    # many, since compute overlapping them runs on the rest
    held = {}
    for s in spans:
        if s.args and s.args.get("sms"):
            held.setdefault(s.kind, (s.args["sms"], s.args.get("sm_share", 0.0)))
    by_rank = _breakdowns(result, per_rank)
    shares = category_shares([by_rank[r] for r in rank_list if r in by_rank] if by_rank
                             else [], result.step_time_s)
    label = {k: share_label(k, shares.get(k)) for k in order}
    label.update({k: f"{label[k]} ({held[k][0]} SMs, {held[k][1]:.0%})" for k in held
                  if k in label})
    handles = [Patch(color=KIND_COLORS[k], label=label[k]) for k in order]
    if shares.get("idle", 0.0) > 0:
        handles.append(Patch(facecolor="white", edgecolor="#BBBBBB",
                             label=share_label("idle", shares["idle"])))
    if widened:
        handles.append(widened_handle(t0, t1))
    what_share = "share of step" + (f", mean over {n} ranks" if n > 1 else "")
    ax.legend(handles=handles + phase_handles(segs),
              loc="upper left",
              bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False,
              title=f"lanes per rank:\ncompute / comm / wait\n({what_share})",
              title_fontsize=7)
    ax.grid(axis="x", alpha=0.3)
    return ax


def _breakdowns(result: SimResult, per_rank: Sequence[dict[str, float]] | None
                ) -> dict[int, dict[str, float]] | None:
    """Rank -> breakdown: ``per_rank`` (index = rank), else the summary's per-rank rows if
    they cover every rank, else None."""
    if per_rank is not None:
        return dict(enumerate(per_rank))
    rows_s = (result.summary or {}).get("per_rank") or []
    if len(rows_s) == result.n_ranks and all("breakdown_s" in r for r in rows_s):
        return {r["rank"]: r["breakdown_s"] for r in rows_s}
    return None


def _short_list(xs: list[int], n: int = 8) -> str:
    return ", ".join(map(str, xs[:n])) + (f", … ({len(xs)} in all)" if len(xs) > n else "")


def _timeline_aggregate(result: SimResult, ax: Axes, rank_list: list[int], max_rows: int,
                        per_rank: dict[int, dict[str, float]] | None) -> Axes:
    step = result.step_time_s
    # the per-rank breakdown covers every rank even when spans were kept for a few ranks
    # only (the fast path)
    if per_rank is None:
        raise ValueError(f"{len(rank_list)} ranks are drawn aggregated (more than "
                         f"max_rows={max_rows}), from every rank's breakdown: pass per_rank "
                         "(moesim.engine.breakdown.breakdown(spans, n_ranks, step)[1])")
    rank_set = set(rank_list)
    rows = [[r for r in grp if r in rank_set]
            for grp in timeline_rows(result.n_ranks, result.ranks_per_node, max_rows)]
    rows = [g for g in rows if g]
    keys = [*KINDS, "idle"]
    frac = np.zeros((len(rows), len(keys)))
    for i, grp in enumerate(rows):
        for j, k in enumerate(keys):
            frac[i, j] = np.mean([per_rank[r].get(k, 0.0) for r in grp]) / step
    y = np.arange(len(rows))
    left = np.zeros(len(rows))
    shares = category_shares([per_rank[r] for r in rank_list], step)
    for j, k in enumerate(keys):
        if frac[:, j].any():   # the legend gives the share over all the ranks shown
            ax.barh(y, frac[:, j] * 100, left=left, height=0.85, color=KIND_COLORS[k],
                    label=share_label(k, shares.get(k)))
            left += frac[:, j] * 100
    hot = set(result.hot_ranks)
    rpn = max(1, result.ranks_per_node)
    labels = [f"node {g[0] // rpn}" if len(g) <= rpn else f"nodes {g[0] // rpn}–{g[-1] // rpn}"
              for g in rows]
    step_lbl = max(1, len(rows) // 32)
    ax.set_yticks(y[::step_lbl])
    ax.set_yticklabels([lb + (f" ({len(hot & set(rows[i]))} hot)" if hot & set(rows[i]) else "")
                        for i, lb in enumerate(labels)][::step_lbl], fontsize=7)
    for tick, i in zip(ax.get_yticklabels(), range(0, len(rows), step_lbl), strict=True):
        if hot & set(rows[i]):
            tick.set_color("#C44E52")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("share of step time, mean over the row's ranks (%)")
    ax.set_title(f"Step time by kind, aggregated: {len(rank_list)} ranks in {len(rows)} rows "
                 f"({len(rows[0])} ranks each), step {step * 1e3:.2f} ms")
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    return ax


def plot_experts(result: SimResult, ax: Axes) -> Axes:
    """Heat-map of tokens routed per expert (columns) per MoE layer (rows), with a colorbar;
    cells over capacity get an ×, dropped tokens are written in the cell."""
    tok = result.expert_tokens
    if tok is None or np.size(tok) == 0:
        ax.text(0.5, 0.5, "no expert routing data in this run", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return ax
    tok = np.atleast_2d(np.asarray(tok, dtype=float))
    n_layers, n_exp = tok.shape
    im = ax.imshow(tok, aspect="auto", cmap="viridis", interpolation="nearest",
                   extent=(-0.5, n_exp - 0.5, n_layers - 0.5, -0.5))
    ax.figure.colorbar(im, ax=ax, label="tokens routed")
    cap = None if result.expert_capacity is None else np.asarray(result.expert_capacity, float)
    dropped = None if result.expert_dropped is None else np.atleast_2d(
        np.asarray(result.expert_dropped, float))
    # over capacity = tokens were dropped; without drop counts, compare with the capacity
    # (the engine's capacity may be per micro-batch while tokens are per step)
    over_mask = None
    if dropped is not None and dropped.shape == tok.shape:
        over_mask = dropped > 0
    elif cap is not None and np.isfinite(cap).any():
        over_mask = tok > cap[:, None]
    if over_mask is not None:
        over = np.argwhere(over_mask)
        if len(over):
            ax.scatter(over[:, 1], over[:, 0], marker="x", color="red",
                       s=40 if n_layers * n_exp <= 256 else 10,
                       label="over capacity (tokens dropped)")
    if n_layers * n_exp <= 64:  # small grid: write the count (and drops) in each cell
        lo, hi = float(tok.min()), float(tok.max())
        for (i, j), t in np.ndenumerate(tok):
            d = 0.0 if dropped is None else float(dropped[i, j])
            txt = f"{int(t)}" + (f"\n(-{int(d)} dropped)" if d > 0 else "")
            dark = hi > lo and (t - lo) / (hi - lo) < 0.6  # viridis is dark at the low end
            ax.text(j, i + 0.25, txt, ha="center", va="center", fontsize=8 if n_exp <= 8 else 6,
                    color="white" if dark else "black")
    mean = tok.mean()
    ax.set_xlabel("expert")
    ax.set_ylabel("MoE layer")
    ax.set_xticks(range(0, n_exp, max(1, n_exp // 16)))
    ax.set_yticks(range(0, n_layers, max(1, n_layers // 16)))
    cap_txt = ""
    if cap is not None and np.isfinite(cap).any():
        cap_txt = f", capacity {int(np.nanmin(cap[np.isfinite(cap)]))} tokens"
    drop_txt = f", dropped {int(dropped.sum())}" if dropped is not None else ""
    ax.set_title(f"Tokens per expert: max/mean {tok.max() / mean if mean else 0:.2f}{cap_txt}{drop_txt}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.12), fontsize=8, frameon=False)
    return ax
