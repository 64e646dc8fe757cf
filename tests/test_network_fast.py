"""The fast paths of the flow model are exact: plain-Python small solves equal the
vectorized solver bit for bit; the lazily-updated FlowNetwork state (bytes left as of
each flow's last rate change, predicted finish times) gives the delivery times of a
naive reference simulation that re-solves every flow and advances every flow's bytes at
every event; and ``coalesce_rtol`` stays within its measured error."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

import moesim.network.maxmin as mm
from moesim.network import FlowNetwork, jit
from moesim.network.maxmin import maxmin_pairs, maxmin_rates
from tests._util import run_flows
from tests.test_network_flow import TinyLinks


@st.composite
def incidence(draw):
    n_links = draw(st.integers(1, 8))
    n_flows = draw(st.integers(1, 12))
    paths = [draw(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=4, unique=True))
             for _ in range(n_flows)]
    caps = draw(st.lists(st.sampled_from([1.0, 2.0, 3.0, 7.5, 10.0, 1 / 3]),
                         min_size=n_links, max_size=n_links))
    pf = np.repeat(np.arange(n_flows), [len(p) for p in paths])
    pl = np.concatenate([np.asarray(p, dtype=np.int64) for p in paths])
    return pf, pl, n_flows, np.asarray(caps)


@settings(max_examples=200, deadline=None)
@given(incidence())
def test_small_python_solver_is_bit_identical_to_vectorized(case) -> None:
    pf, pl, n, cap = case
    old = mm.SMALL_PAIRS
    try:
        mm.SMALL_PAIRS = 10**9
        small = maxmin_pairs(pf, pl, n, cap)
        mm.SMALL_PAIRS = -1
        vec = maxmin_pairs(pf, pl, n, cap)
    finally:
        mm.SMALL_PAIRS = old
    assert small.tobytes() == vec.tobytes()


def test_small_solver_hand_example() -> None:
    # parking lot: flow 0 over links 0,1 (cap 10, 4); flows 1, 2 alone on 0 and 1.
    # link 1: 4 / 2 = 2 each (flows 0, 2); link 0: 10 - 2 = 8 left for flow 1
    rates = maxmin_rates([0, 2, 3, 4], [0, 1, 0, 1], [10.0, 4.0])
    assert rates.tolist() == [2.0, 8.0, 2.0]


def reference(links: TinyLinks, flows: list[tuple[float, str, str, float]]) -> list[float]:
    """Naive fluid simulation: at every start or finish re-solve every running flow
    and advance every flow's bytes; returns each flow's delivery time."""
    paths = [np.asarray(links.route(s, d), dtype=np.int64) for _, s, d, _ in flows]
    lat = [float(links.latency_s[p].sum()) for p in paths]
    left = [b for *_, b in flows]
    t, out, running = 0.0, [np.nan] * len(flows), []
    waiting = sorted(range(len(flows)), key=lambda i: flows[i][0])
    while waiting or running:
        while waiting and flows[waiting[0]][0] <= t:
            i = waiting.pop(0)
            if len(paths[i]) == 0:
                out[i] = t
            elif left[i] == 0:
                out[i] = t + lat[i]
            else:
                running.append(i)
        if not running:
            if waiting:
                t = flows[waiting[0]][0]
            continue
        indptr = np.cumsum([0] + [len(paths[i]) for i in running])
        rates = maxmin_rates(indptr, np.concatenate([paths[i] for i in running]),
                             links.capacity_Bps)
        dt = min(left[i] / r for i, r in zip(running, rates, strict=True))
        if waiting:
            dt = min(dt, flows[waiting[0]][0] - t)
        t += dt
        still = []
        for i, r in zip(running, rates, strict=True):
            left[i] -= r * dt
            if left[i] <= r * (1e-12 + 1e-9 * t):
                out[i] = t + lat[i]
            else:
                still.append(i)
        running = still
    return out


@st.composite
def flow_case(draw):
    n = draw(st.integers(2, 5))
    nodes = [f"v{i}" for i in range(n)]
    links = []
    for i in range(1, n):
        j = draw(st.integers(0, i - 1))
        links += [(nodes[i], nodes[j]), (nodes[j], nodes[i])]
    caps = draw(st.lists(st.sampled_from([1.0, 4.0, 10.0, 25.0]), min_size=len(links),
                         max_size=len(links)))
    lats = draw(st.lists(st.sampled_from([0.0, 1e-3]), min_size=len(links), max_size=len(links)))
    flows = draw(st.lists(st.tuples(st.sampled_from([0.0, 0.3, 1.0, 2.0]), st.sampled_from(nodes),
                                    st.sampled_from(nodes),
                                    st.sampled_from([0.0, 1.0, 7.0, 10.0, 33.0])),
                          min_size=1, max_size=12))
    return TinyLinks(links, caps, lats), flows


def simulate(links, flows, **kw) -> list[float]:
    done, net = run_flows(FlowNetwork, links, flows, **kw)
    assert net.link_bytes() == pytest.approx(
        np.bincount(np.concatenate([np.asarray(links.route(s, d), dtype=np.int64)
                                    for _, s, d, _ in flows] + [np.zeros(0, np.int64)]),
                    weights=np.concatenate([np.full(len(links.route(s, d)), b)
                                            for _, s, d, b in flows] + [np.zeros(0)]),
                    minlength=len(links.capacity_Bps)), rel=1e-12, abs=1e-9)
    return [done[i] for i in range(len(flows))]


@settings(max_examples=60, deadline=None)
@given(flow_case())
def test_lazy_state_matches_naive_reference(case) -> None:
    links, flows = case
    want = reference(links, flows)
    for kw in ({}, {"incremental": False}):
        got = simulate(links, flows, **kw)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


def skewed_case(nodes: int):
    from moesim.topology import load_topology
    topo = load_topology("dgx-h100", nodes=nodes)
    gpus = list(topo.gpus)
    n = len(gpus)
    rng = np.random.default_rng(0)
    pop = 1.0 / np.arange(1, n + 1)
    rng.shuffle(pop)
    w = pop[None, :] * rng.lognormal(0.0, 0.5, size=(n, n))
    m = w / w.sum(axis=1, keepdims=True) * 8e6
    flows = [(gpus[i], gpus[j], float(m[i, j])) for i in range(n) for j in range(n) if i != j]
    return topo, flows


def end_time(topo, flows, rtol: float) -> float:
    env = simpy.Environment()
    net = FlowNetwork(env, topo, coalesce_rtol=rtol)
    net.transfer_many(flows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no RuntimeWarning from any division
        env.run()
    assert net.active_flows() == 0
    return env.now


@pytest.mark.parametrize(("rtol", "bound"), [(1e-4, 1e-4), (1e-3, 1e-3), (1e-2, 1e-2)])
def test_coalescing_error_on_skewed_all_to_all_within_bound(rtol, bound) -> None:
    # 32 GPUs (4 dgx-h100 nodes), MoE-like skewed sizes, 992 flows: the end of the
    # all-to-all with coalescing is early (never late) by less than rtol
    topo, flows = skewed_case(4)
    exact = end_time(topo, flows, 0.0)
    approx = end_time(topo, flows, rtol)
    assert 0.0 <= (exact - approx) / exact <= bound


@settings(max_examples=60, deadline=None)
@given(flow_case(), st.booleans())
def test_incremental_closure_matches_reference(case, compiled) -> None:
    # force the incremental path on tiny problems (by default they are re-solved
    # whole), with the closure walked by the compiled kernels or by numpy: same
    # delivery times as the naive reference
    import moesim.network.flow as flow_mod
    import moesim.network.incremental as inc

    if compiled and not jit.numba_available():
        compiled = False
    links, flows = case
    want = reference(links, flows)
    saved = flow_mod.SMALL_PAIRS, inc.FULL_FRACTION, jit.use_numba(compiled)
    if compiled:
        jit.kernels()   # loaded now: small networks use it once loaded
    try:
        flow_mod.SMALL_PAIRS, inc.FULL_FRACTION = -1, 2.0
        got = simulate(links, flows)
    finally:
        flow_mod.SMALL_PAIRS, inc.FULL_FRACTION = saved[:2]
        jit.use_numba(saved[2])
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


needs_numba = pytest.mark.skipif(not jit.numba_available(), reason="numba not installed")


def both_paths(fn):
    """fn() run on the numpy path, then on the compiled one (loaded first)."""
    old = jit.use_numba(False)
    try:
        a = fn()
        jit.use_numba(True)
        jit.kernels()
        b = fn()
    finally:
        jit.use_numba(old)
    return a, b


@needs_numba
@settings(max_examples=100, deadline=None)
@given(incidence())
def test_compiled_maxmin_is_bit_identical_to_numpy(case) -> None:
    pf, pl, n, cap = case
    old = mm.SMALL_PAIRS
    try:
        mm.SMALL_PAIRS = -1   # the vectorized numpy rounds, not the plain-Python ones
        a, b = both_paths(lambda: maxmin_pairs(pf, pl, n, cap))
    finally:
        mm.SMALL_PAIRS = old
    assert a.tobytes() == b.tobytes()


@needs_numba
@settings(max_examples=100, deadline=None)
@given(incidence())
def test_bottleneck_levels_equal_the_rounds(case) -> None:
    # the compiled network solves by bottleneck levels (a heap), numpy by rounds of local
    # bottlenecks: the same max-min allocation, to rounding; workspaces left zero
    from moesim.network import jit_loops as kernels

    pf, pl, n, cap = case
    want = maxmin_pairs(pf, pl, n, cap)
    starts = np.flatnonzero(np.concatenate(([True], pf[1:] != pf[:-1])))
    ends = np.append(starts[1:], len(pf))
    m = len(cap)
    cnt, frozen = np.zeros(m, dtype=np.int64), np.zeros(m)
    stats = np.zeros(10, dtype=np.int64)
    got = np.empty(len(starts))
    kernels.maxmin_levels(starts, ends, pl, cap, got, mm.CAP_FLOOR, cnt, frozen, stats)
    assert got == pytest.approx(want[pf[starts]], rel=1e-12)
    assert not cnt.any() and not frozen.any()
    assert stats[4] == len(pl) and 1 <= stats[3] <= m   # each pair frozen once; <= 1 level per link


def levels_by_hand(paths: list[list[int]], cap: list[float], fixed: list[float],
                   floor: float) -> list[float]:
    """Progressive filling by levels in plain Python, each level's link found afresh:
    the smallest fair share max(c - load, c x floor) / unfrozen flows, ties to the link
    used first (flows in order, links in path order); its unfrozen flows frozen in order,
    each adding its rate to its links' loads in path order."""
    first: list[int] = []
    for p in paths:
        first += [lk for lk in p if lk not in first]
    load = {lk: fixed[lk] for lk in first}
    left = {lk: sum(lk in p for p in paths) for lk in first}
    out = [0.0] * len(paths)
    done = [False] * len(paths)
    while any(left[lk] for lk in first):
        def share(lk: int) -> float:
            return max(cap[lk] - load[lk], cap[lk] * floor) / left[lk]
        u = min((lk for lk in first if left[lk]), key=lambda lk: (share(lk), first.index(lk)))
        v = share(u)
        for i, p in enumerate(paths):
            if u in p and not done[i]:
                done[i], out[i] = True, v
                for lk in p:
                    load[lk] += v
                    left[lk] -= 1
    return out


@needs_numba
@settings(max_examples=200, deadline=None)
@given(incidence(), st.lists(st.sampled_from([0.0, 0.5, 1 / 3, 2.0]), min_size=8, max_size=8))
def test_bottleneck_levels_lazy_heap_is_bit_identical(case, fixed) -> None:
    # the lazy heap pops the same links in the same order as a fresh search at every level,
    # so the rates are the same bits (caps drawn from few values: many ties), also with a
    # fixed load already on the links (the incremental re-solve's residual capacity)
    from moesim.network import jit_loops as kernels

    pf, pl, n, cap = case
    starts = np.flatnonzero(np.concatenate(([True], pf[1:] != pf[:-1])))
    ends = np.append(starts[1:], len(pf))
    paths = [pl[a:b].tolist() for a, b in zip(starts, ends, strict=True)]
    m = len(cap)
    frozen = np.array(fixed[:m])
    want = levels_by_hand(paths, cap.tolist(), frozen.tolist(), mm.CAP_FLOOR)
    got = np.empty(n)
    kernels.maxmin_levels(starts, ends, pl, cap, got, mm.CAP_FLOOR, np.zeros(m, dtype=np.int64),
                          frozen, np.zeros(10, dtype=np.int64))
    assert got.tobytes() == np.array(want).tobytes()
    untouched = np.array(fixed[:m])
    untouched[np.unique(pl)] = 0.0   # the fixed load is cleared on the links used, only
    assert frozen.tolist() == untouched.tolist()


@needs_numba
def test_bottleneck_levels_hand_example() -> None:
    # parking lot: flow 0 over links 0, 1 (cap 10, 4), flow 1 on link 0, flow 2 on link 1.
    # level 1: link 1, 4 / 2 = 2 (flows 0, 2); level 2: link 0, 10 - 2 = 8 for flow 1
    from moesim.network import jit_loops as kernels

    got = np.empty(3)
    kernels.maxmin_levels(np.array([0, 2, 3]), np.array([2, 3, 4]), np.array([0, 1, 0, 1]),
                          np.array([10.0, 4.0]), got, mm.CAP_FLOOR, np.zeros(2, dtype=np.int64),
                          np.zeros(2), np.zeros(10, dtype=np.int64))
    assert got.tolist() == [2.0, 8.0, 2.0]


@needs_numba
@settings(max_examples=40, deadline=None)
@given(flow_case(), st.booleans(), st.sampled_from([0.0, 2.0]))
def test_compiled_network_matches_numpy(case, whole, fraction) -> None:
    # every event through both implementations (numpy: today's rounds and closure;
    # compiled: bottleneck levels, and every candidate re-solved at fraction 0 or the
    # closure walked at 2): the same delivery times within 1e-12, on the incremental
    # path (forced on tiny problems) and on whole re-solves
    import moesim.network.flow as flow_mod
    import moesim.network.incremental as inc

    links, flows = case
    saved = flow_mod.SMALL_PAIRS, inc.CANDIDATE_FRACTION
    try:
        flow_mod.SMALL_PAIRS = 10**9 if whole else -1
        inc.CANDIDATE_FRACTION = fraction
        a, b = both_paths(lambda: simulate(links, flows))
    finally:
        flow_mod.SMALL_PAIRS, inc.CANDIDATE_FRACTION = saved
    assert b == pytest.approx(a, rel=1e-12, abs=1e-15)


@needs_numba
@pytest.mark.parametrize("fraction", [0.0, 0.1, 2.0])
def test_compiled_skewed_all_to_all_matches_numpy(fraction) -> None:
    # 32 GPUs on 4 dgx-h100 nodes, 992 skewed flows, hundreds of incremental re-solves:
    # the compiled path (candidates re-solved at fraction 0, the default, or always the
    # closure at 2) delivers every flow within 1e-12 of the numpy path, with the same
    # number of solves and link bytes
    import moesim.network.incremental as inc

    topo, flows = skewed_case(4)

    def run():
        env = simpy.Environment()
        net = FlowNetwork(env, topo)
        done = {}
        for i, f in enumerate(flows):
            net.transfer(*f, tag=i).callbacks.append(
                lambda e: done.__setitem__(e.value, env.now))
        env.run()
        return (np.array([done[i] for i in range(len(flows))]), net.link_bytes(),
                net.counters())

    saved = inc.CANDIDATE_FRACTION
    try:
        inc.CANDIDATE_FRACTION = fraction
        (ta, la, ca), (tb, lb, cb) = both_paths(run)
    finally:
        inc.CANDIDATE_FRACTION = saved
    assert ca["solves"] == cb["solves"] > 100
    assert np.max(np.abs(tb - ta) / ta) <= 1e-12
    assert lb == pytest.approx(la, rel=1e-12)
    assert ca["candidates"] == 0 and ca["rounds"] > 0   # numpy: rounds and closures
    if fraction == 0.0:   # compiled: every incremental re-solve over the candidates
        assert cb["candidates"] > 0 and cb["walked"] == 0
    if fraction == 2.0:   # compiled: always the closure (numpy re-solves whole at >= 90 %)
        assert cb["candidates"] == 0 and cb["walked"] >= ca["walked"] > 0


def test_backend_switch_and_environment_variable() -> None:
    import subprocess
    import sys

    old = jit.use_numba(False)
    try:
        assert jit.backend() == "numpy"
        assert jit.kernels() is None
    finally:
        jit.use_numba(old)
    code = "from moesim.network import jit; print(jit.backend())"
    import os

    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MOESIM_NUMBA": "0"},
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "numpy"


@needs_numba
def test_compiled_add_hand_example_and_same_state_as_numpy() -> None:
    # two flows at t = 0.5 on 4 links: flow 0 (5 bytes, group 7) solved over links 1, 2
    # of a 3-link route (one shadow link left out) of latency 6 us, flow 1 (6 bytes,
    # group 9) over link 3, a 1-link route of 8 us
    from moesim.network.slots import NPATH, PLAT, REM, SIZE, START, TFIN, TREF, Slots

    paths = [np.array([1, 2], dtype=np.int64), np.array([3], dtype=np.int64)]

    def state():
        s = Slots(np.ones(4))
        s.add([np.array([0], dtype=np.int64)], [1.0], [3], 0.0, [1e-6], [1])   # slot 0, pair 0
        s.add(paths, [5.0, 6.0], [7, 9], 0.5, [6e-6, 8e-6], [3, 1])
        return s

    a, b = both_paths(state)
    assert b.n == 3 and b.np == 4 and b.np_route == 5
    assert b.f[REM, 1:3].tolist() == [5.0, 6.0] and b.f[SIZE, 1:3].tolist() == [5.0, 6.0]
    assert b.f[TREF, 1:3].tolist() == [0.5, 0.5] and b.f[START, 1:3].tolist() == [0.5, 0.5]
    assert b.f[TFIN, 1:3].tolist() == [np.inf, np.inf]
    assert b.f[PLAT, :3].tolist() == [1e-6, 6e-6, 8e-6]
    assert b.f[NPATH, :3].tolist() == [1.0, 3.0, 1.0]
    assert b.group[:3].tolist() == [3, 7, 9] and b.alive[:3].all()
    assert b.pf[:4].tolist() == [0, 1, 1, 2] and b.pl[:4].tolist() == [0, 1, 2, 3]
    assert b.pstart[:4].tolist() == [0, 1, 3, 4]
    assert b.lcnt.tolist() == [1, 1, 1, 1] and b.counts.tolist() == [3, 4, 0, 0, 5]
    for name in ("f", "group", "alive", "pf", "pl", "pstart", "lcnt", "counts"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name
    assert a.np_route == b.np_route
