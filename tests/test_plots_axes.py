"""Pictures that say what they show: the link heat-map on the step's true time axis,
a squeezed axis with even ticks and a statement, the timeline's title clear of its layer
strip at any number of ranks, a legend listing only what is drawn, and every plot
function drawing on the Axes it is given and returning it."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.trace.plots import new_figure, plot_experts, plot_links, plot_timeline, timeline_figsize
from moesim.trace.result import LinkStats, SimResult
from moesim.trace.spans import Span
from moesim.trace.time_squeeze import TimeMap, mark_cuts, real_ticks
from moesim.trace.timeline_marks import STRIP_PT, mark_layers, phase_handles
from tests.test_trace_fixtures import MS, hot_expert_result

# ---------------------------------------------------------------- links.png


def _one_link_result(step_s: float, series: list[tuple[float, float]]) -> SimResult:
    """One NVLink of 100 GB/s carrying ``series`` in a step of ``step_s``."""
    t = [p[0] for p in series] + [step_s]
    nbytes = sum(r * (b - a) for (a, r), b in zip(series, t[1:], strict=True))
    links = LinkStats(names=["gpu0->nvsw0"], kinds=["nvlink"], capacity_Bps=np.array([100e9]),
                      bytes=np.array([nbytes]), series={0: series})
    return SimResult(spans=[], summary={}, scenario={}, n_ranks=1, ranks_per_node=1,
                     step_time_s=step_s, links=links)


def test_links_heatmap_on_the_true_time_axis():
    """A 10 ms step, the link at full rate 2-3 ms and at half rate 6-10 ms: the tick
    labelled "2" sits at 2 ms of the axis, the cells under 2-3 ms read 100 %, those
    under 6-10 ms 50 %, every column is as wide as the time it stands for (1 ms: 10 ms in
    at most 12 bins)."""
    res = _one_link_result(10 * MS, [(0.0, 0.0), (2 * MS, 100e9), (3 * MS, 0.0), (6 * MS, 50e9)])
    fig = new_figure(11, 4.5)
    ax = plot_links(res, fig.add_subplot(), bins=12)
    fig.canvas.draw()
    mesh = next(c for c in ax.collections if c.get_gid() == "links:heatmap")
    x = mesh.get_coordinates()[0, :, 0]
    np.testing.assert_allclose(x, np.arange(11.0))          # ms, one column per 1 ms
    util = np.asarray(mesh.get_array()).reshape(1, -1)[0]
    np.testing.assert_allclose(util, [0, 0, 100, 0, 0, 0, 50, 50, 50, 50], atol=1e-9)
    assert ax.get_xlim() == pytest.approx((0.0, 10.0))
    # the ticks are where their labels say: a linear axis in ms
    for loc, lab in zip(ax.get_xticks(), ax.get_xticklabels(), strict=True):
        if 0.0 <= loc <= 10.0:
            assert float(lab.get_text().replace("\u2212", "-")) == pytest.approx(loc)
    # the pixel of 2.5 ms is in the column of 2-3 ms, halfway between those of 2 and 3 ms
    px = ax.transData.transform([(2.0, 0), (2.5, 0), (3.0, 0)])[:, 0]
    assert px[1] - px[0] == pytest.approx(px[2] - px[1])
    assert "time in step (ms)" in ax.get_xlabel() and "1 ms bin" in ax.get_xlabel()
    assert "NOT to scale" not in ax.get_xlabel()
    label = ax.get_yticklabels()[0].get_text()
    # bytes: 100 GB/s × 1 ms + 50 GB/s × 4 ms = 0.30 GB; mean 0.3 GB / 100 GB/s / 10 ms
    assert "0.30 GB @ 100 GB/s, mean 30.0 %, peak 100 %" in label


def test_links_bin_width_is_round_and_the_last_bin_ends_with_the_step():
    """389.387 ms in at most 300 bins: 2 ms bins (1.298 ms is not round), the last one
    1.387 ms; a rate held over the whole step reads the same in every bin."""
    res = _one_link_result(0.389387, [(0.0, 25e9)])
    ax = plot_links(res, new_figure().add_subplot(), bins=300)
    mesh = next(c for c in ax.collections if c.get_gid() == "links:heatmap")
    x = mesh.get_coordinates()[0, :, 0]
    assert len(x) == 196 and x[-1] == pytest.approx(389.387)
    np.testing.assert_allclose(np.diff(x)[:-1], 2.0)
    np.testing.assert_allclose(np.asarray(mesh.get_array()), 25.0)
    assert "2 ms bin" in ax.get_xlabel()


def test_squeezed_axis_has_even_ticks_and_says_so():
    """Kept stretches 0-10 and 90-100 ms (20 ms kept): ticks at multiples of 2.5 ms in
    real time, the one at 90 ms (0.3 ms right of the 10 ms tick on the axis) left out;
    labels are the real times; the x label says the axis is cut."""
    m = TimeMap(np.array([0.0, 10 * MS, 90 * MS, 100 * MS]),
                np.array([0.0, 10 * MS, 10.3 * MS, 20.3 * MS]))
    np.testing.assert_allclose(real_ticks(m) * 1e3, [0, 2.5, 5, 7.5, 10, 92.5, 95, 97.5, 100])
    ax = new_figure().add_subplot()
    ax.set_xlim(0, 20.3)
    assert mark_cuts(ax, m) is ax
    ax.figure.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["0", "2.5", "5", "7.5", "10", "92.5", "95", "97.5", "100"]
    np.testing.assert_allclose(ax.get_xticks(), [0, 2.5, 5, 7.5, 10, 12.8, 15.3, 17.8, 20.3])
    assert "cut out at the dashed lines (80 ms in all)" in ax.get_xlabel()


# ---------------------------------------------------------------- timeline.png


def _layered_step(n_ranks: int, backward: bool) -> SimResult:
    """Each rank: layers 0-3 forward, 1 ms each (compute 0.8 + dispatch 0.2 ms), then,
    with ``backward``, layers 3-0 backward, 2 ms each."""
    spans = []
    for r in range(n_ranks):
        t = 0.0
        for layer in range(4):
            spans.append(Span(r, "compute", "compute", "fwd.attn", t, t + 0.8 * MS,
                              layer=layer, microbatch=0, phase="fwd"))
            spans.append(Span(r, "compute", "ep_dispatch", "dispatch", t + 0.8 * MS, t + MS,
                              layer=layer, microbatch=0, phase="fwd"))
            t += MS
        if backward:
            for layer in reversed(range(4)):
                spans.append(Span(r, "compute", "compute", "bwd.attn", t, t + 2 * MS,
                                  layer=layer, microbatch=0, phase="bwd"))
                t += 2 * MS
    step = 12 * MS if backward else 4 * MS
    return SimResult(spans=spans, summary={}, scenario={}, n_ranks=n_ranks, ranks_per_node=8,
                     step_time_s=step)


def _legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_forward_only_step_has_no_backward_legend_entry():
    ax = plot_timeline(_layered_step(2, backward=False), new_figure().add_subplot())
    texts = _legend_texts(ax)
    assert "forward (strip: layer)" in texts
    assert not [t for t in texts if "backward" in t]
    ax = plot_timeline(_layered_step(2, backward=True), new_figure().add_subplot())
    assert {"forward (strip: layer)", "backward (strip: layer)"} <= set(_legend_texts(ax))
    # no strip (spans without a layer): no strip entries at all
    res = _layered_step(2, backward=False)
    res.spans = [Span(s.rank, s.stream, s.kind, s.name, s.start_s, s.end_s) for s in res.spans]
    texts = _legend_texts(plot_timeline(res, new_figure().add_subplot()))
    assert not [t for t in texts if "strip" in t]
    assert phase_handles([]) == []


def test_legend_lists_only_the_kinds_drawn():
    res = _layered_step(2, backward=False)
    # the breakdown is data the caller gives: per rank 3.2 ms compute, 0.8 ms dispatch
    rows = [{"compute": 3.2 * MS, "ep_dispatch": 0.8 * MS, "idle": 0.0}] * 2
    ax = plot_timeline(res, new_figure().add_subplot(), per_rank=rows)
    # compute 0.8 and dispatch 0.2 ms per 1 ms layer, nothing else (no idle, nothing
    # widened: 0.2 ms is over 4 ms / 400)
    assert _legend_texts(ax) == ["compute 80.0 %", "ep_dispatch 20.0 %", "forward (strip: layer)"]
    drawn = {c.get_gid().split(":")[1] for c in ax.collections
             if (c.get_gid() or "").startswith("timeline:")}
    assert drawn == {"compute", "ep_dispatch"}


def test_timeline_takes_the_breakdown_as_data():
    """The plot never computes a breakdown: without one (no ``per_rank``, a summary
    without per-rank rows) the legend has no shares and an aggregated timeline is
    refused; the summary's per-rank rows are used when they cover every rank."""
    res = _layered_step(2, backward=False)
    assert _legend_texts(plot_timeline(res, new_figure().add_subplot()))[:2] == [
        "compute", "ep_dispatch"]
    res.summary = {"per_rank": [{"rank": r, "breakdown_s": {"compute": 2 * MS,
                                                           "ep_dispatch": 2 * MS}}
                                for r in range(2)]}
    assert _legend_texts(plot_timeline(res, new_figure().add_subplot()))[:2] == [
        "compute 50.0 %", "ep_dispatch 50.0 %"]
    with pytest.raises(ValueError, match="per_rank"):
        plot_timeline(_layered_step(3, backward=False), new_figure().add_subplot(), max_rows=2)
    ax = plot_timeline(_layered_step(3, backward=False), new_figure().add_subplot(),
                       max_rows=2, per_rank=[{"compute": 4 * MS}] * 3)
    assert ax.get_title().startswith("Step time by kind, aggregated: 3 ranks")


def _strip_extent_px(ax, renderer) -> tuple[float, float]:
    """Bottom and top (display pixels) of the layer strip's boxes."""
    strip = next(c for c in ax.collections if c.get_gid() == "layers:strip")
    tr = strip.get_transform()
    ys = np.concatenate([tr.transform(p.vertices)[:, 1] for p in strip.get_paths()])
    return float(ys.min()), float(ys.max())


@pytest.mark.parametrize("n_ranks", [2, 8, 32, 64])
def test_title_clear_of_the_layer_strip(n_ranks):
    """Issue 36 item 7: at 64 ranks the strip (then 4 % of a 29-inch axes) ran into the
    title. The strip is a fixed 10 points tall, 3 points above the rows, whatever the
    figure's height, and the title's box lies wholly above it and inside the figure."""
    fig = new_figure(*timeline_figsize(n_ranks))
    ax = plot_timeline(_layered_step(n_ranks, backward=True), fig.add_subplot())
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = ax.title.get_window_extent(renderer)
    axes_box = ax.get_window_extent(renderer)
    lo, hi = _strip_extent_px(ax, renderer)
    pt = fig.dpi / 72
    assert lo - axes_box.y1 == pytest.approx(STRIP_PT[0] * pt, abs=0.5)
    assert hi - lo == pytest.approx((STRIP_PT[1] - STRIP_PT[0]) * pt, abs=0.5)
    assert title.y0 > hi                      # the title is above the strip
    assert title.y1 <= fig.bbox.y1            # and inside the figure
    for t in ax.texts:                        # the strip's labels too
        if t.get_gid() == "layers:label":
            assert t.get_window_extent(renderer).y1 < title.y0


def test_strip_marks_the_first_ranks_layers():
    res = _layered_step(1, backward=True)
    ax = new_figure().add_subplot()
    ax.set_xlim(0, 12)
    assert mark_layers(ax, res.spans, 0, 0.0, 12.0) is ax
    strip = next(c for c in ax.collections if c.get_gid() == "layers:strip")
    x = sorted((p.vertices[:, 0].min(), p.vertices[:, 0].max()) for p in strip.get_paths())
    assert x == [pytest.approx(v) for v in [(0, 1), (1, 2), (2, 3), (3, 4), (4, 6), (6, 8),
                                            (8, 10), (10, 12)]]


# ---------------------------------------------------------------- every plot


def test_plots_draw_on_the_axes_given_and_return_it():
    res = hot_expert_result()
    res.links.series = {0: [(0.0, 450e9)], 1: [(0.0, 0.0)], 3: [(0.0, 0.0)]}
    for draw in (plot_timeline, plot_experts, plot_links):
        fig = new_figure()
        ax = fig.add_subplot()
        assert draw(res, ax) is ax
        # nothing drawn outside the figure given (a colorbar is an Axes of the same figure)
        assert all(a.figure is fig for a in fig.axes)
        assert ax.get_title()
