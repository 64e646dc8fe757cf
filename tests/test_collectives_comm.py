"""Collectives through a network model: exact times on tiny link sets, and the
communicator's arrival semantics (who waited for whom)."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from moesim.collectives.communicator import CollectiveSpec, Communicator
from moesim.collectives.cost import ring_all_reduce_time_s
from moesim.network import AnalyticalNetwork, FlowNetwork

B = 1e9        # bytes/s per link
ALPHA = 2e-6   # seconds per link


class RingLinks:
    """n GPUs, link i: g{i} -> g{i+1 mod n}, bandwidth B, latency ALPHA."""

    def __init__(self, n: int) -> None:
        self.gpus = [f"g{i}" for i in range(n)]
        self.capacity_Bps = np.full(n, B)
        self.latency_s = np.full(n, ALPHA)
        self.link_names = [f"g{i}->g{(i + 1) % n}" for i in range(n)]
        self.link_kinds = ["nvlink"] * n

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        i, j = int(src[1:]), int(dst[1:])
        if i == j:
            return ()
        assert j == (i + 1) % len(self.gpus), f"{src}->{dst} is not a ring edge"
        return (i,)


class Crossbar:
    """n GPUs on one switch: uplink i (g{i} -> sw) and downlink n+i (sw -> g{i})."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.gpus = [f"g{i}" for i in range(n)]
        self.capacity_Bps = np.full(2 * n, B)
        self.latency_s = np.full(2 * n, ALPHA)
        self.link_names = [f"g{i}->sw" for i in range(n)] + [f"sw->g{i}" for i in range(n)]
        self.link_kinds = ["nvlink"] * (2 * n)

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        i, j = int(src[1:]), int(dst[1:])
        return () if i == j else (i, self.n + j)


def run_all(links, spec, arrive=None, model=FlowNetwork, rank_host=None):
    """Every member of ``spec`` joins at arrive[rank] (default 0); returns records."""
    env = simpy.Environment()
    net = model(env, links)
    comm = Communicator(env, net, links.gpus, rank_host=rank_host)
    arrive = arrive or {}
    events = {}

    def member(r):
        yield env.timeout(arrive.get(r, 0.0))
        events[r] = comm.join("c", r, spec)
        rec = yield events[r]
        assert rec.end_s == env.now
        return rec

    procs = {r: env.process(member(r)) for r in spec.group}
    env.run()
    return {r: p.value for r, p in procs.items()}, net


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_all_reduce_exact_time(n):
    S = 8e6
    recs, _ = run_all(RingLinks(n), CollectiveSpec("all_reduce", tuple(range(n)), nbytes=S))
    expect = 2 * (n - 1) / n * S / B + 2 * (n - 1) * ALPHA
    assert expect == pytest.approx(ring_all_reduce_time_s(n, S, B, ALPHA))
    for r in range(n):
        assert recs[r].end_s == pytest.approx(expect, rel=1e-9)
        assert recs[r].start_s == 0.0 and recs[r].wait_s == 0.0 and recs[r].blocking_rank == -1


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_all_gather_reduce_scatter_exact_time(op):
    n, S = 5, 5e6
    recs, net = run_all(RingLinks(n), CollectiveSpec(op, tuple(range(n)), nbytes=S))
    expect = (n - 1) / n * S / B + (n - 1) * ALPHA
    assert max(r.end_s for r in recs.values()) == pytest.approx(expect, rel=1e-9)
    # every ring link carried (n-1) chunks of S/n
    np.testing.assert_allclose(net.link_bytes(), np.full(n, (n - 1) * S / n))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_uniform_all_to_all_on_crossbar_closed_form(n):
    S = 4e6
    recs, net = run_all(Crossbar(n), CollectiveSpec("all_to_all", tuple(range(n)), nbytes=S))
    # every uplink and downlink is shared by n-1 flows of S/n: (n-1)/n·S/B, plus 2 hops
    expect = (n - 1) / n * S / B + 2 * ALPHA
    for r in range(n):
        assert recs[r].end_s == pytest.approx(expect, rel=1e-9)
    # bytes conserved: each uplink and downlink carried (n-1)·S/n, no more
    np.testing.assert_allclose(net.link_bytes(), np.full(2 * n, (n - 1) * S / n))


def test_skewed_all_to_all_v_bounded_by_receiver_link():
    n, X = 6, 3e6
    m = np.zeros((n, n))
    m[1:, 0] = X * np.arange(1, n)  # everyone sends to rank 0, unequal amounts
    recs, net = run_all(Crossbar(n), CollectiveSpec("all_to_all_v", tuple(range(n)), matrix=m))
    into0 = m[:, 0].sum()
    t = max(r.end_s for r in recs.values())
    assert t >= into0 / B  # rank 0's downlink is the bound ...
    assert t == pytest.approx(into0 / B + 2 * ALPHA, rel=1e-9)  # ... and max-min reaches it
    assert recs[0].end_s == pytest.approx(t)
    assert net.link_bytes()[n + 0] == pytest.approx(into0)


def test_tree_all_reduce_two_ranks_exact_time():
    # 9 steps (see test_collectives_algorithms): S/16, 7 x S/8, S/16 each way, so S/B of
    # bandwidth time plus 9 crossbar paths of 2 hops
    S = 16e6
    recs, _ = run_all(Crossbar(2), CollectiveSpec("all_reduce", (0, 1), nbytes=S, algo="tree"))
    assert recs[0].end_s == pytest.approx(S / B + 9 * 2 * ALPHA, rel=1e-9)


def test_hierarchical_all_to_all_v_delivers_all_bytes_through_network():
    rng = np.random.default_rng(7)
    n = 8
    m = rng.integers(0, 4, size=(n, n)).astype(float) * 1e5
    hosts = [r // 4 for r in range(n)]
    spec = CollectiveSpec("all_to_all_v", tuple(range(n)), matrix=m, algo="hierarchical")
    recs, net = run_all(Crossbar(n), spec, rank_host=hosts)
    # into each GPU's downlink: its column (off-diagonal) plus what it relays on
    down = net.link_bytes()[n:]
    off = m * (1 - np.eye(n))
    relayed = np.zeros(n)
    for s in range(n):
        for d in range(n):
            if hosts[s] != hosts[d] and (s % 4) != (d % 4):
                relayed[hosts[d] * 4 + s % 4] += m[s, d]
    np.testing.assert_allclose(down, off.sum(axis=0) + relayed)
    assert max(r.end_s for r in recs.values()) > 0


def test_late_member_delays_start_by_its_lateness_and_is_named():
    n, S, late = 4, 8e6, 5e-3
    spec = CollectiveSpec("all_reduce", tuple(range(n)), nbytes=S)
    recs, _ = run_all(RingLinks(n), spec, arrive={2: late})
    T = 2 * (n - 1) / n * S / B + 2 * (n - 1) * ALPHA
    for r in range(n):
        assert recs[r].start_s == pytest.approx(late)
        assert recs[r].end_s == pytest.approx(late + T, rel=1e-9)
        assert recs[r].arrivals == {0: 0.0, 1: 0.0, 2: late, 3: 0.0}
        if r == 2:
            assert recs[r].blocking_rank == -1 and recs[r].wait_s == 0.0
        else:
            assert recs[r].blocking_rank == 2 and recs[r].wait_s == pytest.approx(late)


def test_direct_all_to_all_late_rank_delays_only_its_partners():
    n, X, Y, late = 4, 2e6, 3e6, 1e-2
    m = np.zeros((n, n))
    m[0, 1] = m[1, 0] = X   # 0 <-> 1
    m[2, 3] = m[3, 2] = Y   # 2 <-> 3, rank 2 arrives late
    spec = CollectiveSpec("all_to_all_v", tuple(range(n)), matrix=m)
    recs, _ = run_all(Crossbar(n), spec, arrive={2: late, 1: 1e-3})
    # 0 waits 1 ms for rank 1 only; nobody is delayed by rank 2 except rank 3
    assert recs[0].blocking_rank == 1 and recs[0].wait_s == pytest.approx(1e-3)
    assert recs[0].end_s == pytest.approx(1e-3 + X / B + 2 * ALPHA, rel=1e-9)
    assert recs[1].blocking_rank == -1 and recs[1].wait_s == 0.0
    assert recs[1].end_s == pytest.approx(recs[0].end_s)
    assert recs[3].blocking_rank == 2 and recs[3].wait_s == pytest.approx(late)
    assert recs[3].start_s == pytest.approx(late)
    assert recs[3].end_s == pytest.approx(late + Y / B + 2 * ALPHA, rel=1e-9)
    assert recs[2].blocking_rank == -1 and recs[2].end_s == pytest.approx(recs[3].end_s)


def test_rank_without_traffic_finishes_on_arrival():
    m = np.zeros((3, 3))
    m[0, 1] = 1e6
    spec = CollectiveSpec("all_to_all_v", (0, 1, 2), matrix=m)
    recs, _ = run_all(Crossbar(3), spec, arrive={2: 0.5, 0: 0.25})
    assert recs[2].end_s == 0.5 and recs[2].wait_s == 0.0 and recs[2].blocking_rank == -1
    assert recs[1].blocking_rank == 0 and recs[1].wait_s == pytest.approx(0.25)


def test_send_recv_starts_when_both_ends_arrived():
    spec = CollectiveSpec("send_recv", (1, 0), nbytes=1e6)
    recs, _ = run_all(Crossbar(2), spec, arrive={0: 0.1})
    assert recs[1].blocking_rank == 0 and recs[1].wait_s == pytest.approx(0.1)
    assert recs[1].end_s == pytest.approx(0.1 + 1e6 / B + 2 * ALPHA, rel=1e-9)


def test_analytical_model_agrees_on_contention_free_ring():
    n, S = 4, 8e6
    spec = CollectiveSpec("all_reduce", tuple(range(n)), nbytes=S)
    flow, _ = run_all(RingLinks(n), spec)
    ana, _ = run_all(RingLinks(n), spec, model=AnalyticalNetwork)
    assert ana[0].end_s == pytest.approx(flow[0].end_s, rel=1e-9)


def test_join_misuse_is_rejected():
    env = simpy.Environment()
    links = Crossbar(2)
    comm = Communicator(env, FlowNetwork(env, links), links.gpus)
    spec = CollectiveSpec("all_reduce", (0, 1), nbytes=8.0)
    comm.join("k", 0, spec)
    with pytest.raises(ValueError, match="twice"):
        comm.join("k", 0, spec)
    with pytest.raises(ValueError, match="not in group"):
        comm.join("k2", 5, CollectiveSpec("all_reduce", (0, 1), nbytes=8.0))
    with pytest.raises(ValueError, match="joined with"):
        comm.join("k", 1, CollectiveSpec("all_reduce", (0, 1), nbytes=16.0))


def test_same_key_can_be_reused_after_completion():
    env = simpy.Environment()
    links = RingLinks(2)
    comm = Communicator(env, FlowNetwork(env, links), links.gpus)
    spec = CollectiveSpec("all_reduce", (0, 1), nbytes=2e6)
    ends = []

    def member(r):
        for _ in range(2):
            rec = yield comm.join("k", r, spec)
            ends.append((r, rec.end_s))

    env.process(member(0))
    env.process(member(1))
    env.run()
    step = 2e6 / 2 / B + ALPHA
    assert sorted(ends) == [(0, pytest.approx(2 * step)), (0, pytest.approx(4 * step)),
                            (1, pytest.approx(2 * step)), (1, pytest.approx(4 * step))]
