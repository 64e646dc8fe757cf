"""Plot functions: they draw the expected rows/bars on a given Axes and return it."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.container import BarContainer

from moesim.trace.plots import (
    binned_utilization,
    merged_bars,
    new_figure,
    plot_experts,
    plot_links,
    plot_timeline,
    timeline_rows,
)
from moesim.trace.spans import Span
from moesim.trace.timeline_marks import LABEL_GID
from tests.test_trace_fixtures import MS, hot_expert_result, many_rank_result


def _bar_collections(ax):
    return [c for c in ax.collections if (c.get_gid() or "").startswith("timeline:")]


def _bars(coll) -> list[tuple[float, float]]:
    """(x0, x1) of each rectangle of a timeline collection (one compound path of closed
    5-vertex rectangles)."""
    (path,) = coll.get_paths()
    rects = path.vertices.reshape(-1, 5, 2)
    return sorted((r[:, 0].min(), r[:, 0].max()) for r in rects)


def _stall_texts(ax):
    """Texts other than the layer strip's labels."""
    return [t for t in ax.texts if t.get_gid() != LABEL_GID]


def _n_bars(ax) -> int:
    return sum(len(_bars(c)) for c in _bar_collections(ax))


def test_timeline_two_ranks():
    res = hot_expert_result()
    ax = new_figure().add_subplot()
    assert plot_timeline(res, ax) is ax
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["rank 0", "rank 1 (hot)"]
    # one bar collection per kind: compute, ep_dispatch, ep_combine, stall, dp
    assert sorted(c.get_gid() for c in _bar_collections(ax)) == [
        "timeline:compute", "timeline:dp", "timeline:ep_combine", "timeline:ep_dispatch",
        "timeline:stall"]
    assert _n_bars(ax) == len(res.spans)  # no two spans of one kind touch on a row here
    texts = [t.get_text() for t in _stall_texts(ax)]
    assert texts == ["1.20 ms ← rank 1 e3"]
    assert ax.get_xlabel() == "time in step (ms)"
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {
        "compute 64.4 %", "ep_dispatch 11.1 %", "ep_combine 11.1 %", "dp 0.0 %", "stall 13.3 %",
        "forward (strip: layer)"}   # a forward-only step: no "backward" entry


def test_timeline_zoom_ranks_and_layers():
    res = hot_expert_result()
    ax = plot_timeline(res, new_figure().add_subplot(), ranks=[1], layers=[3])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 1 (hot)"]
    assert _n_bars(ax) == 5  # rank 1's layer-3 spans


def test_merged_bars_cover_the_same_area():
    rows = np.array([1, 0, 0, 0, 1, 0])
    x = np.array([0.0, 5.0, 0.0, 2.0, 3.0, 1.0])
    w = np.array([1.0, 1.0, 1.0, 0.5, 2.0, 0.5])
    r, x0, wm = merged_bars(rows, x, w)
    # row 0: [0,1] ∪ [1,1.5] touch, [2,2.5] apart, [5,6]; row 1: [0,1], [3,5]
    assert r.tolist() == [0, 0, 0, 1, 1]
    assert x0.tolist() == [0.0, 2.0, 5.0, 0.0, 3.0]
    assert wm.tolist() == [1.5, 0.5, 1.0, 1.0, 2.0]
    # a bar inside a wider one disappears into it
    r, x0, wm = merged_bars(np.array([0, 0]), np.array([0.0, 1.0]), np.array([4.0, 1.0]))
    assert (r.tolist(), x0.tolist(), wm.tolist()) == ([0], [0.0], [4.0])


def test_timeline_touching_spans_become_one_bar():
    res = hot_expert_result()
    # rank 0 computes 0-1 (attn), 1.5-2.3 (experts) and 4-4.5 ms (post); a compute span
    # 1-1.5 ms on the comm stream fills the gap, so 0-2.3 ms is one bar
    res.spans.append(Span(0, "comm", "compute", "extra", 1.0 * MS, 1.5 * MS))
    ax = plot_timeline(res, new_figure().add_subplot(), ranks=[0])
    comp = next(c for c in _bar_collections(ax) if c.get_gid() == "timeline:compute")
    assert _bars(comp) == [pytest.approx((0.0, 2.3)), pytest.approx((4.0, 4.5))]


def test_timeline_8_ranks_one_row_each():
    ax = plot_timeline(many_rank_result(8), new_figure().add_subplot())
    assert len(ax.get_yticklabels()) == 8
    assert len(_stall_texts(ax)) == 3  # the three worst stalls are annotated


def test_timeline_rows_grouping():
    assert timeline_rows(8, 8) == [[r] for r in range(8)]
    assert timeline_rows(128, 8) == [list(range(8 * i, 8 * i + 8)) for i in range(16)]
    rows = timeline_rows(2048, 8)  # 256 nodes → groups of 4 nodes
    assert len(rows) == 64 and rows[1] == list(range(32, 64))


def test_timeline_2048_ranks_aggregates():
    res = many_rank_result(2048, rpn=8, hot=3)
    ax = plot_timeline(res, new_figure().add_subplot())
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    # no idle; each with its share of the step over all 2048 ranks (issue 20 item 9):
    # compute (2047 x 1 + 2.5 ms) / 2048 / 3 ms = 33.4 %, dispatch 0.5 / 3, stall
    # 2047 x 1.5 / 2048 / 3 = 50.0 %
    assert [b.get_label() for b in bars] == ["compute 33.4 %", "ep_dispatch 16.7 %",
                                             "stall 50.0 %"]
    assert all(len(b) == 64 for b in bars)
    # row 0 holds the hot rank 3: its mean stall share is 31 of 32 ranks × 50% of the step
    stall = next(b for b in bars if b.get_label().startswith("stall"))
    assert stall[0].get_width() == pytest.approx(31 / 32 * 50)
    assert stall[1].get_width() == pytest.approx(50)
    assert "(1 hot)" in ax.get_yticklabels()[0].get_text()


def test_experts_heatmap():
    res = hot_expert_result()
    fig = new_figure()
    ax = fig.add_subplot()
    assert plot_experts(res, ax) is ax
    img = ax.get_images()[0]
    np.testing.assert_array_equal(img.get_array(), res.expert_tokens)
    assert len(fig.axes) == 2  # the heat-map and its colorbar
    over = [c for c in ax.collections if isinstance(c, PathCollection)][0]
    np.testing.assert_array_equal(over.get_offsets(), [[3, 0]])  # expert 3, layer 0 > capacity
    assert [t.get_text() for t in ax.texts] == ["100", "100", "200", "600\n(-100 dropped)"]
    assert "max/mean 2.40" in ax.get_title() and "capacity 500" in ax.get_title()


def test_links_bars_without_series():
    res = hot_expert_result()
    ax = plot_links(res, new_figure().add_subplot(), top=8)
    bars = ax.containers[0]
    assert len(bars) == 3  # the PCIe link carried nothing
    # grouped: NVLink first, then NIC; utilization = bytes / capacity / 4.5 ms
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu0->nvsw0", "gpu1->nvsw0",
                                                            "nic0->leaf0"]
    assert [b.get_width() for b in bars] == pytest.approx([2e8 / 450e9 / 4.5e-3 * 100,
                                                           1e8 / 450e9 / 4.5e-3 * 100, 50.0])
    ax2 = plot_links(res, new_figure().add_subplot(), top=1)
    assert len(ax2.containers[0]) == 1


def test_binned_utilization():
    edges = np.linspace(0, 4.5e-3, 10)  # 9 bins of 0.5 ms
    u = binned_utilization([(0.0, 0.0), (1e-3, 450e9), (1.5e-3, 0.0)], 450e9, edges)
    np.testing.assert_allclose(u, [0, 0, 1, 0, 0, 0, 0, 0, 0], atol=1e-12)
    # half a bin at full rate → 50 %; rate 0 before the first point
    u = binned_utilization([(3.75e-3, 50e9)], 50e9, edges)
    np.testing.assert_allclose(u, [0] * 7 + [0.5, 1.0], atol=1e-12)


def test_links_series():
    res = hot_expert_result()
    res.links.series = {0: [(0.0, 0.0), (1e-3, 450e9), (1.5e-3, 0.0)],
                        1: [(0.0, 225e9)], 3: [(3.5e-3, 50e9), (4e-3, 0.0)]}
    fig = new_figure()
    ax = plot_links(res, fig.add_subplot(), bins=9)
    mesh = next(c for c in ax.collections if c.get_gid() == "links:heatmap")
    img = np.asarray(mesh.get_array()).reshape(3, -1)
    # 3 links carried bytes; 4.5 ms in at most 9 bins: 9 bins of 0.5 ms on the true axis
    np.testing.assert_allclose(mesh.get_coordinates()[0, :, 0], np.arange(10) * 0.5)
    assert ax.get_xlim() == pytest.approx((0.0, 4.5))
    np.testing.assert_allclose(img[0], [0, 0, 100, 0, 0, 0, 0, 0, 0], atol=1e-9)  # gpu0 NVLink
    np.testing.assert_allclose(img[1], [50] * 9, atol=1e-9)                        # gpu1 NVLink
    np.testing.assert_allclose(img[2], [0] * 7 + [100, 0], atol=1e-9)              # NIC
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].startswith("NVLink: gpu0->nvsw0") and labels[2].startswith("NIC: nic0")
    assert len(fig.axes) == 2  # with its colorbar


def test_no_data_plots_say_so():
    res = hot_expert_result()
    res.expert_tokens = None
    res.links = None
    assert "no expert" in plot_experts(res, new_figure().add_subplot()).texts[0].get_text()
    assert "no link" in plot_links(res, new_figure().add_subplot()).texts[0].get_text()


def test_links_without_bytes_say_so(recwarn):
    res = hot_expert_result()
    res.links.bytes = [0.0] * len(res.links.names)
    ax = plot_links(res, new_figure().add_subplot())
    assert ax.texts[0].get_text() == "no link carried bytes in this run"
    res.summary["shortcuts"] = [{"name": "no_link_bytes", "detail": "", "bound": ""}]
    ax = plot_links(res, new_figure().add_subplot())
    assert "--set engine.mode=exact" in ax.texts[0].get_text()
    assert not [w for w in recwarn if "ylims" in str(w.message)]


def test_links_ranked_by_utilization_not_bytes():
    """Issue 20 item 9: ten NVLinks carrying 200 MB each at 450 GB/s (0.44 ms at full
    rate) and a NIC carrying 112.5 MB at 50 GB/s (2.25 ms: the link bounding the
    all-to-all) in a 4.5 ms step: the NIC is shown first among the top 3, at 50 %."""
    from moesim.trace.plots import busiest_links, link_group
    from moesim.trace.result import LinkStats

    res = hot_expert_result()
    names = [f"gpu{i}->nvsw0" for i in range(10)] + ["nic0->leaf0"]
    res.links = LinkStats(names=names, kinds=["nvlink"] * 10 + ["ib"],
                          capacity_Bps=np.array([450e9] * 10 + [50e9]),
                          bytes=np.array([2e8 - i * 1e6 for i in range(10)] + [1.125e8]))
    ax = plot_links(res, new_figure().add_subplot(), top=3)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["gpu0->nvsw0", "gpu1->nvsw0", "nic0->leaf0"]   # grouped NVLink first
    assert ax.containers[0][2].get_width() == pytest.approx(50.0)
    groups = [link_group(n, k) for n, k in zip(res.links.names, res.links.kinds, strict=True)]
    ls = res.links
    assert busiest_links(ls.bytes, ls.capacity_Bps, groups, 4.5e-3, 1) == [10]
    # every kind that carried bytes keeps its busiest link among the rows
    ls.bytes[10] = 1e6           # the NIC now least utilized: still shown, replacing gpu1
    assert busiest_links(ls.bytes, ls.capacity_Bps, groups, 4.5e-3, 2) == [0, 10]
    assert busiest_links(ls.bytes, ls.capacity_Bps, groups, 4.5e-3, 0) == []
