"""FlowNetwork and AnalyticalNetwork on tiny hand-built link sets (exact times)."""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import pytest
import simpy

from moesim.network import AnalyticalNetwork, FlowNetwork


@dataclass
class TinyLinks:
    """A minimal LinkSet: directed links (u, v) with capacities and latencies;
    routes are networkx shortest paths by hop count (deterministic)."""

    links: list[tuple[str, str]]
    capacity_Bps: np.ndarray
    latency_s: np.ndarray
    link_names: list[str] = field(init=False)
    link_kinds: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.capacity_Bps = np.asarray(self.capacity_Bps, dtype=float)
        self.latency_s = np.asarray(self.latency_s, dtype=float)
        self.link_names = [f"{u}->{v}" for u, v in self.links]
        self.link_kinds = ["test"] * len(self.links)
        self._g = nx.DiGraph()
        for i, (u, v) in enumerate(self.links):
            self._g.add_edge(u, v, id=i)

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        if src == dst:
            return ()
        nodes = nx.shortest_path(self._g, src, dst)
        return tuple(self._g.edges[u, v]["id"] for u, v in zip(nodes, nodes[1:], strict=False))


def chain(caps: list[float], lats: list[float]) -> TinyLinks:
    """Nodes a, b, c, ... in a row; link i goes from node i to node i+1."""
    names = "abcdefgh"
    return TinyLinks([(names[i], names[i + 1]) for i in range(len(caps))], caps, lats)


def run_flows(net_cls, links, flows, **kw):
    """flows: (start_s, src, dst, bytes); returns (delivery times, network)."""
    env = simpy.Environment()
    net = net_cls(env, links, **kw)
    done: dict[int, float] = {}

    def start(i, t, src, dst, nbytes):
        yield env.timeout(t)
        yield net.transfer(src, dst, nbytes, tag=i)
        done[i] = env.now

    for i, (t, src, dst, nbytes) in enumerate(flows):
        env.process(start(i, t, src, dst, nbytes))
    env.run()
    return [done[i] for i in range(len(flows))], net


LAT = 1e-6


def test_two_equal_flows_each_get_half() -> None:
    # S = 1000 B each on one 100 B/s link: both at 50 B/s, done at 2S/B = 20 s, + latency
    links = chain([100.0], [LAT])
    times, net = run_flows(FlowNetwork, links, [(0, "a", "b", 1000), (0, "a", "b", 1000)])
    assert times == pytest.approx([20 + LAT, 20 + LAT], rel=1e-12)
    assert net.link_bytes().tolist() == [2000.0]
    assert net.n_solves == 2  # one at the common start, one at the common finish


def test_flow_joining_midway_slows_the_first() -> None:
    # A: 1000 B from t=0 alone at 100 B/s -> 200 B sent by t=2, 800 left.
    # B: 200 B joins at t=2; both at 50 B/s: B done at 2 + 200/50 = 6, A has 600 left,
    # then alone again at 100 B/s: done at 6 + 6 = 12.
    links = chain([100.0], [LAT])
    times, net = run_flows(FlowNetwork, links, [(0, "a", "b", 1000), (2, "a", "b", 200)],
                           record_series=True)
    assert times == pytest.approx([12 + LAT, 6 + LAT], rel=1e-12)
    # the link is full from 0 to 12 (100 B/s throughout), then idle
    assert net.series() == {0: [(0.0, 100.0), (pytest.approx(12.0), 0.0)]}


def test_parking_lot_three_links() -> None:
    # links a->b, b->c, c->d at 100 B/s, latencies 1, 2, 3 µs. Long flow a->d (600 B)
    # shares each link with one short flow: s1 a->b 100 B, s2 b->c 300 B, s3 c->d 100 B.
    # All at 50 B/s: s1, s3 done at t=2 (long has 500 left, s2 200).
    # Link b->c still has 2 flows: 50 each; s2 done at 2 + 200/50 = 6 (long 300 left);
    # long alone at 100 B/s: done at 6 + 3 = 9.
    links = chain([100.0, 100.0, 100.0], [1e-6, 2e-6, 3e-6])
    flows = [(0, "a", "d", 600), (0, "a", "b", 100), (0, "b", "c", 300), (0, "c", "d", 100)]
    times, net = run_flows(FlowNetwork, links, flows)
    assert times == pytest.approx([9 + 6e-6, 2 + 1e-6, 6 + 2e-6, 2 + 3e-6], rel=1e-12)
    assert net.link_bytes().tolist() == [700.0, 900.0, 700.0]


def test_parking_lot_analytical_has_no_contention() -> None:
    links = chain([100.0, 100.0, 100.0], [1e-6, 2e-6, 3e-6])
    flows = [(0, "a", "d", 600), (0, "a", "b", 100), (0, "b", "c", 300), (0, "c", "d", 100)]
    times, net = run_flows(AnalyticalNetwork, links, flows)
    assert times == pytest.approx([6 + 6e-6, 1 + 1e-6, 3 + 2e-6, 1 + 3e-6], rel=1e-12)
    assert net.link_bytes().tolist() == [700.0, 900.0, 700.0]


def test_two_equal_flows_analytical() -> None:
    links = chain([100.0], [LAT])
    times, _ = run_flows(AnalyticalNetwork, links, [(0, "a", "b", 1000), (0, "a", "b", 1000)])
    assert times == pytest.approx([10 + LAT, 10 + LAT], rel=1e-12)


@pytest.mark.parametrize("cls", [FlowNetwork, AnalyticalNetwork])
def test_zero_bytes_take_only_latency(cls) -> None:
    links = chain([100.0, 50.0], [1e-6, 2e-6])
    times, net = run_flows(cls, links, [(5, "a", "c", 0)])
    assert times == pytest.approx([5 + 3e-6], rel=1e-12)
    assert net.link_bytes().tolist() == [0.0, 0.0]


@pytest.mark.parametrize("cls", [FlowNetwork, AnalyticalNetwork])
def test_same_src_dst_is_immediate(cls) -> None:
    links = chain([100.0], [1e-3])
    times, net = run_flows(cls, links, [(1.5, "a", "a", 10**9)])
    assert times == [1.5]
    assert net.link_bytes().tolist() == [0.0]


@pytest.mark.parametrize("cls", [FlowNetwork, AnalyticalNetwork])
def test_bottleneck_is_slowest_link(cls) -> None:
    # 1000 B over links of 100 and 50 B/s: the 50 B/s link limits: 20 s + 3 µs
    times, _ = run_flows(cls, chain([100.0, 50.0], [1e-6, 2e-6]), [(0, "a", "c", 1000)])
    assert times == pytest.approx([20 + 3e-6], rel=1e-12)


@pytest.mark.parametrize("cls", [FlowNetwork, AnalyticalNetwork])
def test_transfer_many_waits_for_the_last(cls) -> None:
    # flows a->b 100 B and a->c 300 B on links of 100 B/s; in the flow model they
    # share a->b (50 each): first done at 2, the second has 200 left at 100 B/s -> 4.
    # Analytical: max(1, 3) = 3.
    env = simpy.Environment()
    net = cls(env, chain([100.0, 100.0], [0.0, 0.0]))
    got = []
    ev = net.transfer_many([("a", "b", 100), ("a", "c", 300), ("b", "b", 5)], tag="x")
    ev.callbacks.append(lambda e: got.append((env.now, e.value)))
    env.run()
    expected = 4.0 if cls is FlowNetwork else 3.0
    assert got == [(pytest.approx(expected, rel=1e-12), "x")]


def test_link_bytes_counts_progress_of_running_flows() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, chain([100.0], [0.0]))
    net.transfer("a", "b", 1000)
    env.run(until=3.0)
    assert net.link_bytes() == pytest.approx([300.0], rel=1e-12)
    assert net.active_flows() == 1


def test_many_flows_started_together_cause_one_solve() -> None:
    # 500 flows of 2 B on one 100 B/s link: one solve at t=0, one when all end at t=10
    env = simpy.Environment()
    net = FlowNetwork(env, chain([100.0], [0.0]))
    evs = [net.transfer("a", "b", 2.0) for _ in range(500)]
    env.run()
    assert net.n_solves == 2
    assert all(e.processed for e in evs)
    assert env.now == pytest.approx(10.0, rel=1e-12)


def test_compaction_keeps_state_consistent() -> None:
    # 3000 flows of 1 B and 2000 of 2 B on a 100 B/s link: 5000 flows at 0.02 B/s, the
    # small ones end at 1/0.02 = 50 s; 2000 left with 1 B each at 0.05 B/s: end at 70 s
    # (= 7000 B / 100 B/s). A last 100 B flow started at 70 s ends at 71 s.
    env = simpy.Environment()
    net = FlowNetwork(env, chain([100.0], [0.0]))
    small = net.transfer_many([("a", "b", 1.0)] * 3000)
    big = net.transfer_many([("a", "b", 2.0)] * 2000)
    ends = {}
    small.callbacks.append(lambda e: ends.setdefault("small", env.now))
    big.callbacks.append(lambda e: ends.setdefault("big", env.now))
    env.run()
    assert ends == {"small": pytest.approx(50.0, rel=1e-9), "big": pytest.approx(70.0, rel=1e-9)}
    last = net.transfer("a", "b", 100.0)
    env.run()
    assert last.processed and env.now == pytest.approx(71.0, rel=1e-9)
    assert net.link_bytes() == pytest.approx([7100.0], rel=1e-12)


def test_negative_bytes_rejected() -> None:
    net = FlowNetwork(simpy.Environment(), chain([100.0], [0.0]))
    with pytest.raises(ValueError, match=">= 0"):
        net.transfer("a", "b", -1)


def test_bad_capacity_rejected() -> None:
    with pytest.raises(ValueError, match="capacity_Bps > 0"):
        FlowNetwork(simpy.Environment(), chain([0.0], [0.0]))


@pytest.mark.parametrize(("rtol", "second"), [(0.0, 20.01), (1e-4, 20.01), (1e-2, 20.0)])
def test_coalesce_rtol_completes_near_finishes_together(rtol, second) -> None:
    # 1000 B and 1001 B share a 100 B/s link: both at 50 B/s, the first done at 20 s
    # with 1 B left on the second: alone at 100 B/s it needs 0.01 s more. Its remaining
    # time at t=20 under the shared rate is 1/50 = 0.02 s: within 1e-2 x its age (0.2 s)
    # it completes at 20 s; not within 1e-4 x 20 = 0.002 s.
    env = simpy.Environment()
    net = FlowNetwork(env, chain([100.0], [0.0]), coalesce_rtol=rtol)
    t = {}
    for name, size in (("a", 1000.0), ("b", 1001.0)):
        net.transfer("a", "b", size, tag=name).callbacks.append(
            lambda e: t.__setitem__(e.value, env.now))
    env.run()
    assert t == {"a": pytest.approx(20.0, rel=1e-12), "b": pytest.approx(second, rel=1e-12)}
    assert net.link_bytes().tolist() == [2001.0]
    assert net.n_solves == (2 if rtol == 1e-2 else 3)


def test_coalesce_rtol_out_of_range_rejected() -> None:
    with pytest.raises(ValueError, match="coalesce_rtol"):
        FlowNetwork(simpy.Environment(), chain([100.0], [0.0]), coalesce_rtol=1.0)


class TwoPaths(TinyLinks):
    """a->b over x (key even) or over y (key odd): links a->x, x->b, a->y, y->b."""

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        if src == dst:
            return ()
        return (0, 1) if key % 2 == 0 else (2, 3)


@pytest.mark.parametrize(("keys", "end"), [((0, 1), 10.0), ((0, 2), 20.0)])
def test_per_flow_key_picks_the_path(keys, end) -> None:
    # two 1000 B flows a->b on 100 B/s links: on different paths (keys 0, 1) each runs
    # alone (10 s); on the same path (keys 0, 2) they share it (20 s)
    links = TwoPaths([("a", "x"), ("x", "b"), ("a", "y"), ("y", "b")], [100.0] * 4, [0.0] * 4)
    env = simpy.Environment()
    net = FlowNetwork(env, links)
    ev = net.transfer_many([("a", "b", 1000.0, keys[0]), ("a", "b", 1000.0, keys[1])])
    env.run()
    assert ev.processed and env.now == pytest.approx(end, rel=1e-12)


@pytest.mark.parametrize("cls", [FlowNetwork, AnalyticalNetwork])
def test_rejected_batch_leaves_no_half_started_flows(cls) -> None:
    # a bad size in a batch raises before any of its flows starts; the network goes on
    env = simpy.Environment()
    net = cls(env, chain([100.0], [0.0]))
    with pytest.raises(ValueError):
        net.transfer_many([("a", "b", 100.0), ("a", "b", float("nan"))])
    ok = net.transfer("a", "b", 100.0)
    env.run()
    assert ok.processed and env.now == pytest.approx(1.0, rel=1e-12)
    assert net.link_bytes().tolist() == [100.0]
