"""The engines price ring collectives as NCCL runs them (``overlap.nccl_tuning``,
moesim.collectives.nccl.choice): NCCL's latency term of its choice plus the flow
network's ring flows carrying bytes / the protocol's efficiency, without link latencies.

Hand-worked figures, from NVIDIA/nccl src/graph/tuning.cc at 5067397c (constants in
moesim/collectives/nccl/constants.py) and the dgx-h100 preset's links: a NIC carries
50 GB/s x 0.95 = 47.5e9 B/s; on 2 nodes x 2 GPUs NCCL's search finds 4 ring channels.
"""

from __future__ import annotations

import dataclasses

import pytest
import simpy

from moesim.collectives import CollectiveSpec, Communicator
from moesim.collectives.nccl.choice import (
    PROTOCOL_EFFICIENCY,
    engine_tuning,
    group_shape,
)
from moesim.collectives.simulate import rank_hosts
from moesim.engine.fast.dp import RingCost
from moesim.network import FlowNetwork
from moesim.topology import load_topology
from moesim.wiring import resolve_path, simulate
from tests._util import TOY_TP4

NIC_BPS = 50e9 * 0.95
US = 1e-6


def _two_by_two():
    topo = load_topology("dgx-h100", nodes=2, gpus_per_node=2)
    return topo, rank_hosts(topo)


def _exact_time(topo, hosts, nccl, op, nbytes, group):
    env = simpy.Environment()
    comm = Communicator(env, FlowNetwork(env, topo), topo.gpus, rank_host=hosts, nccl=nccl)
    spec = CollectiveSpec(op, group, nbytes=nbytes)
    events = [comm.join("k", r, spec) for r in group]
    env.run()
    return max(ev.value.end_s for ev in events)


# (bytes, protocol, NCCL's latency in µs by hand) for an all-reduce on 2 x 2 GPUs, ring:
# base + (2(n-1) - 2) x max(hwLat[NVLink], net overhead 1.0 (x3 Simple)) + 2 x hwLat[NET]
#   LL:     6.6 + 4 x max(0.6, 1.0) + 2 x 2.7 = 16.0
#   LL128: 14.0 + 4 x max(1.9, 1.0) + 2 x 4.0 = 29.6
CASES = [(128 * 1024, "LL", 16.0), (1 << 20, "LL128", 29.6)]


@pytest.mark.parametrize("nbytes,proto,lat_us", CASES)
def test_ring_all_reduce_on_two_nodes_by_hand_both_engines(nbytes, proto, lat_us):
    topo, hosts = _two_by_two()
    nccl = engine_tuning(topo)
    group = (0, 1, 2, 3)
    c = nccl.for_group("all_reduce", group, nbytes, hosts)
    assert (c.algo, c.protocol) == ("ring", proto)
    assert c.latency_s == pytest.approx(lat_us * US, rel=1e-12)
    assert c.bw_efficiency == {"LL": 0.5, "LL128": 120 / 128}[proto]
    # 2 rings (one per GPU of a node), 6 steps; per step every member sends
    # S / eff / (4 x 2) to its successor in each ring; the inter-node flows (one per NIC
    # and direction) are the slowest
    want = lat_us * US + 6 * (nbytes / c.bw_efficiency / 8) / NIC_BPS
    exact = _exact_time(topo, hosts, nccl, "all_reduce", nbytes, group)
    fast = RingCost(topo, topo.gpus, hosts, nccl=nccl).time("all_reduce", group, nbytes)
    assert exact == pytest.approx(want, rel=1e-9)
    assert fast == pytest.approx(want, rel=1e-9)


def test_simple_ring_is_priced_as_without_the_knob():
    topo, hosts = _two_by_two()
    nccl = engine_tuning(topo)
    group, nbytes = (0, 1, 2, 3), 64 << 20
    assert nccl.choice("all_reduce", 2, 2, nbytes).protocol == "Simple"
    assert nccl.for_group("all_reduce", group, nbytes, hosts) is None
    assert (_exact_time(topo, hosts, nccl, "all_reduce", nbytes, group)
            == _exact_time(topo, hosts, None, "all_reduce", nbytes, group))
    assert (RingCost(topo, topo.gpus, hosts, nccl=nccl).time("all_reduce", group, nbytes)
            == RingCost(topo, topo.gpus, hosts).time("all_reduce", group, nbytes))


def test_tree_on_two_dgx_h100_nodes_takes_nccls_latency():
    """128 B and 512 KiB all-reduces on 2 x 8 H100: NCCL's tree with LL and LL128,
    latency 6.8 + 2 x (7 x 0.6 + 1 x 5.0) = 25.2 µs and 14.0 + 2 x (7 x 1.25 + 8.5)
    = 48.5 µs; the flow network adds only the bytes (its 30 ring steps' link latencies,
    183.9 µs without the knob, are gone)."""
    topo = load_topology("dgx-h100", nodes=2)
    hosts = rank_hosts(topo)
    nccl = engine_tuning(topo)
    group = tuple(range(16))
    for nbytes, proto, lat_us in ((128, "LL", 25.2), (512 * 1024, "LL128", 48.5)):
        c = nccl.for_group("all_reduce", group, nbytes, hosts)
        assert (c.algo, c.protocol) == ("tree", proto)
        assert c.latency_s == pytest.approx(lat_us * US, rel=1e-12)
        exact = _exact_time(topo, hosts, nccl, "all_reduce", nbytes, group)
        fast = RingCost(topo, topo.gpus, hosts, nccl=nccl).time("all_reduce", group, nbytes)
        assert exact == pytest.approx(fast, rel=1e-9)
        # the bytes: 30 steps of S / eff / 128 per flow, at least at the NIC's rate
        floor = 30 * nbytes / c.bw_efficiency / 128 / NIC_BPS
        assert lat_us * US + floor <= exact * (1 + 1e-9)
        assert exact < lat_us * US + 2 * floor + 1e-9
    assert _exact_time(topo, hosts, None, "all_reduce", 128, group) > 180 * US


def test_send_recv_all_to_all_and_uneven_groups_keep_todays_pricing():
    topo, hosts = _two_by_two()
    nccl = engine_tuning(topo)
    for op in ("send_recv", "all_to_all", "all_to_all_v"):
        assert nccl.for_group(op, (0, 2), 4096, hosts) is None
    assert group_shape((0, 1, 2), hosts) is None
    assert nccl.for_group("all_reduce", (0, 1, 2), 4096, hosts) is None
    assert nccl.for_group("all_reduce", (0,), 4096, hosts) is None
    assert PROTOCOL_EFFICIENCY == {"LL": 0.5, "LL128": 0.9375, "Simple": 1.0}


def test_a_topology_nccls_model_does_not_know_is_priced_as_before():
    topo = load_topology("dgx-h100", nodes=2, gpus_per_node=2)
    nccl = engine_tuning(topo, device="cpu")
    assert nccl.for_group("all_reduce", (0, 1, 2, 3), 4096, rank_hosts(topo)) is None




def _tuning(res, on: bool):
    """``res`` with ``overlap.nccl_tuning`` set to ``on`` (the default is on)."""
    ov = dataclasses.replace(res.scenario.overlap, nccl_tuning=on)
    return dataclasses.replace(res, scenario=dataclasses.replace(res.scenario, overlap=ov))


def test_a_step_prices_its_tp_all_reduces_by_nccls_choice(tmp_path):
    """The toy model with TP4 over 2 nodes x 2 GPUs: a TP all-reduce is 128 tokens x 512
    x 2 bytes = 128 KiB, NCCL's ring/LL: 16.0 µs + 6 x (262144 / 8) B at 47.5e9 B/s =
    20.1391 µs in both engines (38.85 µs without the knob: 6 ring steps' link latencies)."""
    path = tmp_path / "toy-tp4.yaml"
    path.write_text(TOY_TP4)
    res = resolve_path(path)
    want = 16.0 * US + 6 * (2 * 128 * 512 * 2 / 8) / NIC_BPS
    link_bytes = {}
    for mode in ("exact", "fast"):
        before = simulate(_tuning(res, False), engine=mode)
        after = simulate(res, engine=mode)
        assert res.scenario.overlap.nccl_tuning          # the default
        tp = [s.end_s - s.start_s for s in after.spans
              if s.rank == 0 and s.kind == "tp" and s.name.startswith("fwd.")]
        assert len(tp) == 4
        assert tp == pytest.approx([want] * 4, rel=1e-9)
        old = [s.end_s - s.start_s for s in before.spans
               if s.rank == 0 and s.kind == "tp" and s.name.startswith("fwd.")]
        assert min(old) > 38 * US
        assert after.summary["step_time_s"] < before.summary["step_time_s"]
        link_bytes[mode] = (before.links.bytes.sum(), after.links.bytes.copy())
    # LL's flags cross the links too, counted alike by both engines
    assert link_bytes["exact"][1] == pytest.approx(link_bytes["fast"][1], rel=1e-12)
    assert link_bytes["exact"][1].sum() > link_bytes["exact"][0]
