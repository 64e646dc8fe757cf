"""Max-min solver: hand-computed allocations and hypothesis properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.network.maxmin import link_load, maxmin_pairs, maxmin_rates


def csr(paths: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    indptr = np.cumsum([0] + [len(p) for p in paths])
    indices = np.array([link for p in paths for link in p], dtype=np.int64)
    return indptr, indices


def assert_maxmin(paths: list[list[int]], cap: np.ndarray, rates: np.ndarray) -> None:
    """Feasible, and every flow has a saturated link on which its rate is the largest."""
    indptr, indices = csr(paths)
    load = link_load(indptr, indices, np.where(np.isfinite(rates), rates, 0.0), len(cap))
    assert np.all(load <= cap * (1 + 1e-8))
    for f, path in enumerate(paths):
        if not path:
            assert rates[f] == np.inf
            continue
        assert rates[f] > 0
        ok = False
        for link in path:
            on_link = [rates[g] for g, p in enumerate(paths) if link in p]
            if load[link] >= cap[link] * (1 - 1e-8) and rates[f] >= max(on_link) * (1 - 1e-8):
                ok = True
        assert ok, f"flow {f} (rate {rates[f]}) has no saturated bottleneck link"


def test_two_equal_flows_share_one_link() -> None:
    rates = maxmin_rates(*csr([[0], [0]]), np.array([100.0]))
    assert rates.tolist() == [50.0, 50.0]


def test_parking_lot_unequal_capacities() -> None:
    # links 0,1,2 in a row with capacities 100, 60, 100; flow 0 crosses all three,
    # flows 1,2,3 cross one link each. Link 1 saturates first at 60/2 = 30: flows 0 and 1
    # freeze at 30; links 0 and 2 then give their single remaining flow 100 - 30 = 70.
    paths = [[0, 1, 2], [0], [1], [2]]
    rates = maxmin_rates(*csr(paths), np.array([100.0, 60.0, 100.0]))
    np.testing.assert_allclose(rates, [30.0, 70.0, 30.0, 70.0], rtol=1e-12)
    assert_maxmin(paths, np.array([100.0, 60.0, 100.0]), rates)


def test_classic_two_level_example() -> None:
    # link 0 (capacity 1) carries flows 0,1,2; link 1 (capacity 2) carries flows 2,3.
    # Level 1/3 saturates link 0; flow 3 then gets 2 - 1/3 = 5/3.
    rates = maxmin_rates(*csr([[0], [0], [0, 1], [1]]), np.array([1.0, 2.0]))
    np.testing.assert_allclose(rates, [1 / 3, 1 / 3, 1 / 3, 5 / 3], rtol=1e-12)


def test_flow_without_links_is_infinite_and_others_unaffected() -> None:
    rates = maxmin_rates(*csr([[], [0]]), np.array([8.0]))
    assert rates[0] == np.inf and rates[1] == 8.0


def test_no_flows() -> None:
    assert maxmin_pairs(np.array([], dtype=np.int64), np.array([], dtype=np.int64), 0,
                        np.array([1.0])).shape == (0,)


def test_zero_capacity_link_rejected() -> None:
    with pytest.raises(ValueError, match="capacity_Bps > 0"):
        maxmin_rates(*csr([[0]]), np.array([0.0]))


@st.composite
def incidence(draw):
    n_links = draw(st.integers(1, 6))
    cap = np.array(draw(st.lists(st.floats(1.0, 1e3), min_size=n_links, max_size=n_links)))
    paths = draw(st.lists(st.lists(st.integers(0, n_links - 1), max_size=4, unique=True),
                          min_size=1, max_size=12))
    return paths, cap


@settings(max_examples=60, deadline=None)
@given(incidence())
def test_random_allocations_are_maxmin(case) -> None:
    paths, cap = case
    rates = maxmin_rates(*csr(paths), cap)
    assert_maxmin(paths, cap, rates)

