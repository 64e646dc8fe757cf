"""Timeline readability at step scale (issue 12 item 21): communication slivers keep a
minimum width, a strip marks layers and forward/backward, a burst shorter than a bin
of the link heat-map shows in the link's peak."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.trace.link_bins import even_edges, nice_width
from moesim.trace.plots import new_figure, plot_links, plot_timeline
from moesim.trace.result import SimResult
from moesim.trace.spans import Span
from moesim.trace.timeline_marks import PHASE_COLORS, layer_segments
from tests.test_trace_fixtures import MS, hot_expert_result


def _bars(ax, gid):
    coll = next(c for c in ax.collections if c.get_gid() == gid)
    rects = coll.get_paths()[0].vertices.reshape(-1, 5, 2)
    return sorted((r[:, 0].min(), r[:, 0].max()) for r in rects)


def _long_step() -> SimResult:
    """One rank: 100 ms of compute with a 1 µs dispatch at 50 ms (layer 0, forward) and a
    2 µs combine at 60 ms (layer 0, backward)."""
    spans = [Span(0, "compute", "compute", "fwd.attn", 0.0, 50 * MS, layer=0, phase="fwd"),
             Span(0, "compute", "ep_dispatch", "fwd.dispatch", 50 * MS, 50 * MS + 1e-6,
                  layer=0, phase="fwd"),
             Span(0, "compute", "compute", "bwd.attn", 50 * MS + 1e-6, 60 * MS, layer=0,
                  phase="bwd"),
             Span(0, "compute", "ep_combine", "bwd.combine", 60 * MS, 60 * MS + 2e-6,
                  layer=0, phase="bwd"),
             Span(0, "compute", "compute", "opt", 60 * MS + 2e-6, 100 * MS, phase="opt")]
    return SimResult(spans=spans, summary={}, scenario={}, n_ranks=1, ranks_per_node=1,
                     step_time_s=0.1)


def test_short_communication_drawn_a_few_pixels_wide_and_marked_widened():
    """Issue 20 item 9: a sliver widened to be seen reads as widened: its true width is
    drawn solid, the widening pale and hatched in a collection of its own, and the
    legend says so."""
    ax = plot_timeline(_long_step(), new_figure().add_subplot())
    # 100 ms axis: communication at least 100/400 = 0.25 ms wide (4 pixels of a 14-inch
    # figure), drawn pale and hatched; the spans themselves at their own width
    (d0, d1), = _bars(ax, "timeline:ep_dispatch:widened")
    assert d0 == pytest.approx(50.0) and d1 - d0 == pytest.approx(0.25)
    (c0, c1), = _bars(ax, "timeline:ep_combine:widened")
    assert c1 - c0 == pytest.approx(0.25)
    (d0, d1), = _bars(ax, "timeline:ep_dispatch")
    assert d0 == pytest.approx(50.0) and d1 - d0 == pytest.approx(1e-3)
    (c0, c1), = _bars(ax, "timeline:ep_combine")
    assert c1 - c0 == pytest.approx(2e-3)
    halo = next(c for c in ax.collections if c.get_gid() == "timeline:ep_dispatch:widened")
    assert halo.get_facecolor()[0][3] == pytest.approx(0.3) and halo.get_hatch()
    solid = next(c for c in ax.collections if c.get_gid() == "timeline:ep_dispatch")
    assert solid.get_facecolor()[0][3] == 1.0 and not solid.get_hatch()
    # compute spans (ms long) are not widened
    assert not [c for c in ax.collections if c.get_gid() == "timeline:compute:widened"]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("pale, hatched: widened to be seen") for t in texts)


def test_legend_prints_each_categorys_share_of_the_step():
    """Hand-built 2-rank step (tests/test_trace_fixtures.py): per rank compute 2.3 / 3.5,
    dispatch 0.5 / 0.5, combine 0.5 / 0.5, stall 1.2 / 0 ms of 4.5 ms (dp hidden)."""
    ax = plot_timeline(hot_expert_result(), new_figure().add_subplot())
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts[:5] == ["compute 64.4 %", "ep_dispatch 11.1 %", "ep_combine 11.1 %",
                         "dp 0.0 %", "stall 13.3 %"]
    assert "mean over 2 ranks" in ax.get_legend().get_title().get_text()
    # one rank: its own shares
    ax = plot_timeline(hot_expert_result(), new_figure().add_subplot(), ranks=[0])
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "stall 26.7 %" in texts and "compute 51.1 %" in texts
    # nothing widened here (every span >= 1/400 of the 4.5 ms axis): no note
    assert not any(t.startswith("pale") for t in texts)


def test_layer_strip_marks_forward_and_backward():
    res = _long_step()
    assert layer_segments(res.spans, 0) == [
        ("fwd", 0, 0.0, 50 * MS + 1e-6), ("bwd", 0, 50 * MS + 1e-6, 60 * MS + 2e-6)]
    ax = plot_timeline(res, new_figure().add_subplot())
    strip = next(c for c in ax.collections if c.get_gid() == "layers:strip")
    colors = [tuple(np.round(c[:3], 3)) for c in strip.get_facecolors()]
    from matplotlib.colors import to_rgb
    assert colors == [tuple(np.round(to_rgb(PHASE_COLORS[p]), 3)) for p in ("fwd", "bwd")]
    labels = [t.get_text() for t in ax.texts if t.get_gid() == "layers:label"]
    assert labels.count("L0") == 2 and "  layers of rank 0" in labels


def test_hot_expert_strip_is_one_forward_layer():
    ax = plot_timeline(hot_expert_result(), new_figure().add_subplot())
    strip = next(c for c in ax.collections if c.get_gid() == "layers:strip")
    assert len(strip.get_paths()) == 1     # layer 3, micro-batch 1, forward on rank 0


def test_a_burst_shorter_than_a_bin_is_averaged_and_its_peak_printed():
    """A 10 µs burst at full rate at 50 ms of a 100 ms step: 300 bins at most → bins of
    0.5 ms (0.333 ms is not a round width; 200 bins); the burst's bin holds 10/500 of
    full rate = 2 %, and the link's label says its peak is 100 %."""
    res = hot_expert_result()
    res.step_time_s = 0.1
    res.links.series = {0: [(0.0, 0.0), (0.05, 450e9), (0.05 + 1e-5, 0.0)],
                        1: [(0.0, 225e9)], 3: [(0.02, 50e9), (0.03, 0.0)]}
    ax = plot_links(res, new_figure().add_subplot(), bins=300)
    mesh = next(c for c in ax.collections if c.get_gid() == "links:heatmap")
    util = np.asarray(mesh.get_array()).reshape(3, -1)
    assert util.shape == (3, 200)
    assert util[0, 100] == pytest.approx(2.0) and util[0].sum() == pytest.approx(2.0)
    np.testing.assert_allclose(util[1], 50.0)
    np.testing.assert_allclose(util[2, 40:60], 100.0)     # 20-30 ms at full rate
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "peak 100 %" in labels[0] and "peak 50 %" in labels[1] and "peak 100 %" in labels[2]
    assert "0.5 ms bin" in ax.get_xlabel()


def test_even_edges_round_widths():
    assert nice_width(389.387, 300) == 2.0      # 1.298 ms → 2 ms
    assert nice_width(4.5, 9) == 0.5
    assert nice_width(100.0, 300) == 0.5        # 0.333 → 0.5
    assert nice_width(1.0, 1) == 1.0
    assert nice_width(0.0123, 10) == pytest.approx(0.002)
    e = even_edges(0.389387, 300)   # 194 bins of 2 ms, the last 1.387 ms
    assert len(e) == 196 and e[0] == 0.0 and e[-1] == 0.389387
    np.testing.assert_allclose(np.diff(e)[:-1], 2e-3)
    assert e[-1] - e[-2] == pytest.approx(1.387e-3)
    np.testing.assert_allclose(even_edges(4.5e-3, 9), np.arange(10) * 0.5e-3)


def test_aggregated_rows_count_their_hot_ranks():
    from tests.test_trace_fixtures import many_rank_result
    res = many_rank_result(2048, rpn=8, hot=3)
    res.hot_ranks = [3, 5, 40]
    ax = plot_timeline(res, new_figure().add_subplot())
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].endswith("(2 hot)")


def test_zoom_on_layers_cuts_the_empty_stretches_out_of_the_time_axis():
    """Issue 20 item 12 (`plot --layers`): one rank, layer 0 forward 0-10 ms, layer 1
    10-90 ms, layer 0 backward 90-100 ms. Zoomed on layer 0, the 80 ms without it are
    cut out: two stretches of 10 ms side by side with a separator of 1.5 % of the kept
    20 ms (0.3 ms), ticks in the step's real time."""
    spans = [Span(0, "compute", "compute", "fwd.attn", 0.0, 10 * MS, layer=0, phase="fwd"),
             Span(0, "compute", "compute", "fwd.attn", 10 * MS, 50 * MS, layer=1, phase="fwd"),
             Span(0, "compute", "compute", "bwd.attn", 50 * MS, 90 * MS, layer=1, phase="bwd"),
             Span(0, "compute", "compute", "bwd.attn", 90 * MS, 100 * MS, layer=0, phase="bwd")]
    res = SimResult(spans=spans, summary={}, scenario={}, n_ranks=1, ranks_per_node=1,
                    step_time_s=0.1)
    ax = plot_timeline(res, new_figure().add_subplot(), layers=[0])
    assert ax.get_xlim() == pytest.approx((0.0, 20.3), abs=1e-6)
    assert _bars(ax, "timeline:compute") == [pytest.approx((0.0, 10.0)),
                                             pytest.approx((10.3, 20.3))]
    cuts = [ln.get_xdata()[0] for ln in ax.lines if ln.get_gid() == "timeline:cut"]
    assert cuts == [pytest.approx(10.15)]
    fmt = ax.xaxis.get_major_formatter()
    assert fmt(10.3, 0) == "90" and fmt(15.3, 0) == "95" and fmt(5.0, 0) == "5"
    assert "cut out" in ax.get_xlabel() and "80 ms in all" in ax.get_xlabel()
    # without a layer filter the whole step stays on the axis
    ax = plot_timeline(res, new_figure().add_subplot())
    assert ax.get_xlim() == pytest.approx((0.0, 100.0), abs=1e-6)
    assert not [ln for ln in ax.lines if ln.get_gid() == "timeline:cut"]
