"""Fast-path results that must not mislead (issue 12 items 17 and 18): per-link bytes
equal the exact engine's, every stall names its blocking rank, the stall total covers
every rank, the spans kept are the ranks that explain the step and the summary says
which."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.engine.fast.engine import simulate_fast
from moesim.trace.plots import new_figure, plot_links
from moesim.trace.report import full_summary, render_markdown
from moesim.trace.stalls import stall_table
from moesim.wiring import resolve_path, simulate

SMALL_64 = ["engine.mode=exact", "model.layers=8", "schedule.microbatches=4"]


@pytest.fixture(scope="module")
def ident():
    """mixtral-8x7b-64gpu cut to 8 layers, 4 micro-batches, identical replicas: both
    engines (the exact one simulates 32 representatives, the fast one 4 chains of 2)."""
    res = resolve_path("mixtral-8x7b-64gpu", [*SMALL_64, "engine.replicas=identical"])
    return res, simulate(res, record_series=False), simulate_fast(res)


def test_link_bytes_equal_the_exact_engine():
    # every flow's bytes on every link of its path: EP all-to-alls, pipeline sends,
    # gradient reduce-scatters and ZeRO all-gathers (tp 1: no TP all-reduce)
    res = resolve_path("mixtral-8x7b-ep8", ["engine.mode=exact", "model.layers=2",
                                            "schedule.microbatches=2"])
    exact, fast = simulate(res, record_series=False), simulate_fast(res)
    assert fast.links.bytes.sum() > 0
    np.testing.assert_allclose(fast.links.bytes, exact.links.bytes, rtol=1e-9, atol=0)


def test_link_bytes_with_identical_replicas_count_the_mirrors(ident):
    _, exact, fast = ident
    np.testing.assert_allclose(fast.links.bytes, exact.links.bytes, rtol=1e-9, atol=0)


def test_links_plot_draws_fast_path_bytes(ident):
    _, _, fast = ident
    ax = plot_links(fast, new_figure().add_subplot())
    assert len(ax.containers[0]) == 8 and not ax.texts[0].get_text().startswith("per-link")


@pytest.mark.parametrize("engine", ["exact", "fast"])
def test_every_stall_has_a_blocking_rank_and_the_total_covers_every_rank(ident, engine):
    _, exact, fast = ident
    result = exact if engine == "exact" else fast
    rows = stall_table(result)
    assert rows and all(r["blocking_rank"] >= 0 for r in rows)
    s = full_summary(result, rows=rows)
    per_rank = sum(r["breakdown_s"]["stall"] for r in result.summary["per_rank"])
    # mirrors have no spans of their own: they count their (copied) breakdown stall, so
    # the total is the per-rank sum (above it only by stalls hidden under compute)
    assert s["stalls"]["total_s"] >= per_rank - 1e-12
    assert s["stalls"]["total_s"] == pytest.approx(per_rank, rel=1e-3)
    assert s["stalls"]["total_s"] > 1.9 * s["stalls"]["spans_total_s"]   # 2 replicas


def test_fast_summary_keeps_the_ranks_that_explain_the_step():
    res = resolve_path("mixtral-8x7b-64gpu", SMALL_64)
    calls = []
    out = simulate_fast(res, span_ranks=4, progress=lambda st, n: calls.append((st, n)))
    # the chain run again for its spans is announced: the work done is the last total
    built = [n for st, n in calls if st == "built"]
    assert len(built) == 2 and sum(n for st, n in calls if st != "built") == built[-1]
    s = full_summary(out)
    kept = s["spans_kept"]
    assert sorted({sp.rank for sp in out.spans}) == kept["ranks"]
    stall = np.array([r["breakdown_s"]["stall"] for r in out.summary["per_rank"]])
    assert kept["most_stalled_rank"] == int(np.argmax(stall))
    # per stage of the focus chain: its most-stalled rank is kept
    stage = res.layout.coords["pp"]
    focus = {int(r) for r in kept["per_stage"]}
    for st in range(res.layout.pp):
        mine = [r for r in focus if stage[r] == st]
        assert mine, f"no rank of stage {st} kept"
    md = render_markdown(s)
    top = md.split("## Top stalls")[1].split("## Critical path")[0]
    assert "| -1 |" not in top and "rank -1" not in top
    assert "Ranks whose spans were kept (" in top and "per stage (most-stalled" in top
    assert s["stalls"]["total_s"] == pytest.approx(stall.sum(), rel=1e-3)
    # the critical path runs through kept ranks' work, not through gaps
    cp = s["critical_path"]
    assert cp["by_kind"].get("idle", 0.0) < 0.05 * out.step_time_s
    assert s["hot_rule"] in md
