"""Disaggregated serving: KV caches move as max-min flows over the topology (issue 23).

Worked by hand on a star of GPUs around one switch, every link ``bw`` bytes/s each way,
no latency: a transfer of B bytes alone takes B / bw; two that start together from one
GPU share its uplink max-min, each at bw / 2, so each takes 2 B / bw.
"""

from __future__ import annotations

import pytest

from moesim.topology.loader import parse_topology
from moesim.traffic.deploy import build_sim
from moesim.traffic.request import Request
from moesim.traffic.step_costs import LinearStepCosts

#: prefill 0.01 s + 0.001 s per prompt token; decode 0.02 s per step
C = LinearStepCosts(prefill_base_s=0.010, prefill_per_token_s=0.001, decode_base_s=0.020)


def links(n: int, bw: float):
    """GPUs g0..g{n-1}, each linked to one switch at ``bw`` bytes/s, latency 0."""
    data = {"name": "star",
            "nodes": [{"id": f"g{i}", "kind": "gpu", "host": i, "local": 0} for i in range(n)]
            + [{"id": "sw", "kind": "leaf"}],
            "links": [{"src": f"g{i}", "dst": "sw", "kind": "ib", "bandwidth_GBps": bw / 1e9,
                       "latency_us": 0} for i in range(n)]}
    return parse_topology(data, "star")


def _sim(n_decode: int, gpus_per_member: int = 1, bw: float = 1e6):
    members = 1 + n_decode
    names = [tuple(f"g{m * gpus_per_member + i}" for i in range(gpus_per_member))
             for m in range(members)]
    return build_sim(C, [[m] for m in range(members)], 100_000, scheduler="disaggregated",
                     router="round_robin", kv_bytes_per_token=1000.0,
                     links=links(members * gpus_per_member, bw), gpus_of=names)


def test_star_links_are_as_written():
    topo = links(3, 1e6)
    assert [float(topo.capacity_Bps[i]) for i in topo.route("g0", "g1")] == [1e6, 1e6]
    assert float(topo.latency_s.max()) == 0.0


def test_one_transfer_alone_takes_bytes_over_bandwidth():
    sim = _sim(1)
    sim.submit([Request(0, 0.0, 100, 2)])
    sim.run()
    (rid, src, dst, t0, t1), = sim.transfer.log
    assert (rid, src, dst) == (0, 0, 1)
    assert t0 == pytest.approx(0.010 + 0.100)           # after its prefill step
    assert t1 - t0 == pytest.approx(100 * 1000 / 1e6)   # 1e5 B at 1e6 B/s: 0.1 s
    assert sim.transfer.bytes == 100_000


def test_two_transfers_on_one_link_each_take_twice_as_long():
    # two prompts prefill in one step (0.01 + 0.2 s), then leave g0 together for g1 and
    # g2: both cross g0 -> sw, each at 0.5e6 B/s, so each 1e5 B takes 0.2 s (0.1 alone)
    sim = _sim(2)
    sim.submit([Request(0, 0.0, 100, 2), Request(1, 0.0, 100, 2)])
    sim.run()
    log = sorted(sim.transfer.log)
    assert [(src, dst) for _, src, dst, _, _ in log] == [(0, 1), (0, 2)]
    for _, _, _, t0, t1 in log:
        assert t0 == pytest.approx(0.010 + 0.200)
        assert t1 - t0 == pytest.approx(2 * 0.1)
    # each then decodes one token on its own decode rank: 0.02 s after its transfer
    for r in sim.finished:
        assert r.finish_s == pytest.approx(0.210 + 0.2 + 0.020)
    assert sim.transfer.busy_s == pytest.approx(0.4)


def test_transfer_that_starts_later_gets_the_rest():
    # two prefill ranks, one decode rank: both transfers cross sw -> g2. A (1e5 B) leaves
    # at 0.11, B (110 tokens: 1.1e5 B) at 0.12: A alone for 0.01 s (1e4 B), then both at
    # 0.5e6 B/s until A's other 9e4 B are through at 0.12 + 0.18 = 0.30; B has sent 9e4
    # by then and sends its last 2e4 alone by 0.32
    sim = build_sim(C, [[0], [1], [2]], 100_000, scheduler="disaggregated",
                    router="round_robin", kv_bytes_per_token=1000.0, prefill_groups=2,
                    links=links(3, 1e6), gpus_of=[("g0",), ("g1",), ("g2",)])
    sim.submit([Request(0, 0.0, 100, 2), Request(1, 0.0, 110, 2)])
    sim.run()
    ends = {rid: (t0, t1) for rid, _, _, t0, t1 in sim.transfer.log}
    assert ends[0] == pytest.approx((0.110, 0.300))
    assert ends[1] == pytest.approx((0.120, 0.320))


def test_tp_ranks_move_their_shards_in_parallel():
    # members of 2 GPUs: 2 flows g0->g2 and g1->g3 on separate links: as one alone
    sim = _sim(1, gpus_per_member=2)
    sim.submit([Request(0, 0.0, 100, 2)])
    sim.run()
    (_, _, _, t0, t1), = sim.transfer.log
    assert t1 - t0 == pytest.approx(0.1)
    assert sim.transfer.bytes == 2 * 100_000
