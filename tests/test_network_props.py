"""Property tests of FlowNetwork on random graphs and random flow sets (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.network import AnalyticalNetwork, FlowNetwork
from tests._util import run_flows
from tests.test_network_flow import TinyLinks


@st.composite
def scenario(draw):
    n = draw(st.integers(2, 6))
    nodes = [f"v{i}" for i in range(n)]
    edges = set()
    for i in range(1, n):  # random spanning tree keeps the graph connected
        j = draw(st.integers(0, i - 1))
        edges.add((i, j))
    for _ in range(draw(st.integers(0, n))):
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if i != j and (i, j) not in edges and (j, i) not in edges:
            edges.add((i, j))
    links = []
    for i, j in sorted(edges):
        links += [(nodes[i], nodes[j]), (nodes[j], nodes[i])]
    caps = draw(st.lists(st.floats(1.0, 100.0), min_size=len(links), max_size=len(links)))
    lats = draw(st.lists(st.sampled_from([0.0, 1e-6, 1e-3]), min_size=len(links),
                         max_size=len(links)))
    flows = draw(st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.5]), st.sampled_from(nodes),
                  st.sampled_from(nodes), st.sampled_from([0.0, 1.0, 10.0, 37.0, 100.0])),
        min_size=1, max_size=15))
    return TinyLinks(links, caps, lats), flows




@settings(max_examples=40, deadline=None)
@given(scenario())
def test_flow_network_invariants(case) -> None:
    links, flows = case
    cap = links.capacity_Bps
    solves = []

    def check(now, pf, pl, rates):
        load = np.bincount(pl, weights=rates[pf], minlength=len(cap))
        # no link over capacity at any solve
        assert np.all(load <= cap * (1 + 1e-8))
        # max-min: each running flow has a saturated link where its rate is the largest
        for f in np.unique(pf):
            mine = pl[pf == f]
            ok = False
            for link in mine:
                top = rates[pf[pl == link]].max()
                if load[link] >= cap[link] * (1 - 1e-8) and rates[f] >= top * (1 - 1e-8):
                    ok = True
            assert ok
        solves.append(now)

    done, net = run_flows(FlowNetwork, links, flows, on_solve=check)
    # every flow finishes, never earlier than alone on its path (the analytical time)
    assert sorted(done) == list(range(len(flows)))
    alone, ana = run_flows(AnalyticalNetwork, links, flows)
    for i in done:
        assert done[i] >= alone[i] * (1 - 1e-9) - 1e-12
    # bytes are conserved: per-link bytes = sum of bytes of the flows crossing it
    expected = np.zeros(len(cap))
    for _t, src, dst, nbytes in flows:
        for link in links.route(src, dst):
            expected[link] += nbytes
    np.testing.assert_allclose(net.link_bytes(), expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ana.link_bytes(), expected, rtol=1e-9, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(scenario())
def test_same_input_same_times(case) -> None:
    links, flows = case
    first, _ = run_flows(FlowNetwork, links, flows)
    second, _ = run_flows(FlowNetwork, links, flows)
    assert first == second


@settings(max_examples=25, deadline=None)
@given(scenario())
def test_series_never_exceeds_capacity_and_ends_idle(case) -> None:
    links, flows = case
    _, net = run_flows(FlowNetwork, links, flows, record_series=True)
    for link, points in net.series().items():
        times = [t for t, _ in points]
        assert times == sorted(times)
        assert all(0 <= r <= links.capacity_Bps[link] * (1 + 1e-8) for _, r in points)
        assert points[-1][1] == 0.0


@settings(max_examples=40, deadline=None)
@given(scenario())
def test_incremental_resolve_equals_full_resolve(case) -> None:
    # re-solving only the affected flows must give the same times as re-solving all
    links, flows = case
    inc, _ = run_flows(FlowNetwork, links, flows)
    full, _ = run_flows(FlowNetwork, links, flows, incremental=False)
    assert inc.keys() == full.keys()
    for i in inc:
        assert inc[i] == pytest.approx(full[i], rel=1e-9, abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(scenario())
def test_flows_that_never_overlap_match_the_analytical_model(case) -> None:
    # space the flows so that each ends before the next starts: no sharing, so the
    # flow model must give exactly latency + bytes / bottleneck, like the analytical one
    links, flows = case
    ana_probe, _ = run_flows(AnalyticalNetwork, links, [(0.0, s, d, b) for _, s, d, b in flows])
    t, spaced = 0.0, []
    for i, (_, src, dst, nbytes) in enumerate(flows):
        spaced.append((t, src, dst, nbytes))
        t += ana_probe[i] + 1.0
    got, _ = run_flows(FlowNetwork, links, spaced)
    want, _ = run_flows(AnalyticalNetwork, links, spaced)
    for i in want:
        assert got[i] == pytest.approx(want[i], rel=1e-12, abs=1e-12)
