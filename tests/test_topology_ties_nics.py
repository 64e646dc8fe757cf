"""Explicit topologies: a hop-count tie goes to the higher-bandwidth path; the cluster
builder's nics_per_node (issue 12 item 21)."""

from __future__ import annotations

import pytest
import simpy

from moesim.errors import InputError
from moesim.network import FlowNetwork
from moesim.topology.loader import load_topology, parse_topology


def _tie_graph(routing: str = "shortest") -> dict:
    # two GPUs joined twice in two hops: over a PCIe switch (listed first, so its links
    # have the lower ids and the same latency) and over an NVSwitch
    return {"name": "tie", "routing": routing,
            "nodes": [{"id": "g0", "kind": "gpu", "host": 0, "local": 0},
                      {"id": "g1", "kind": "gpu", "host": 0, "local": 1},
                      {"id": "pcie", "kind": "pcie_switch", "host": 0},
                      {"id": "nvsw", "kind": "nvswitch", "host": 0}],
            "links": [{"src": "g0", "dst": "pcie", "kind": "pcie", "bandwidth_GBps": 63,
                       "latency_us": 1.0},
                      {"src": "g1", "dst": "pcie", "kind": "pcie", "bandwidth_GBps": 63,
                       "latency_us": 1.0},
                      {"src": "g0", "dst": "nvsw", "kind": "nvlink", "bandwidth_GBps": 450,
                       "latency_us": 1.0},
                      {"src": "g1", "dst": "nvsw", "kind": "nvlink", "bandwidth_GBps": 450,
                       "latency_us": 1.0}]}


def test_shortest_breaks_hop_tie_toward_nvlink():
    topo = parse_topology(_tie_graph(), "tie.yaml")
    assert topo.path_nodes("g0", "g1") == ["g0", "nvsw", "g1"]
    assert topo.path_nodes("g1", "g0") == ["g1", "nvsw", "g0"]
    # a 1 GB transfer then takes 1e9 / 450e9 s + 2 µs, not 1e9 / 63e9 s
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    ev = net.transfer("g0", "g1", 1e9)
    env.run(ev)
    assert env.now == pytest.approx(1e9 / 450e9 + 2e-6, rel=1e-12)


def test_fewer_hops_still_beat_bandwidth():
    g = _tie_graph()
    g["links"].append({"src": "g0", "dst": "g1", "kind": "pcie", "bandwidth_GBps": 10,
                       "latency_us": 5.0})
    topo = parse_topology(g, "tie.yaml")
    assert topo.path_nodes("g0", "g1") == ["g0", "g1"]


def _two_nodes(**params):
    return load_topology("dgx-h100", nodes=2, **params)


def test_one_nic_per_node_is_shared_by_all_gpus():
    topo = _two_nodes(nics_per_node=1)
    assert sum(1 for n, k in topo.graph.nodes(data="kind") if k == "nic") == 2
    for i in range(8):
        assert topo.path_nodes(f"n0.gpu{i}", f"n1.gpu{i}") == [
            f"n0.gpu{i}", "n0.nic0", "leaf0.rail0", "n1.nic0", f"n1.gpu{i}"]
    # inside a node NVLink, not the shared NIC
    assert topo.path_nodes("n0.gpu0", "n0.gpu5") == ["n0.gpu0", "n0.nvswitch", "n0.gpu5"]


def test_one_nic_per_node_bytes_and_time_by_hand():
    # 8 flows of 1 GB, GPU i of node 0 -> GPU i of node 1: all cross n0.nic0 -> leaf at
    # 50 GB/s x 0.95 = 47.5 GB/s (topologies/dgx-h100.yaml), 8 GB in all, each flow a
    # fair eighth: they end together after 8e9 / 47.5e9 s + the path latency
    # 0 + 1.4 + 1.4 + 0 µs (PCIe, NIC-leaf, leaf-NIC, PCIe)
    topo = _two_nodes(nics_per_node=1)
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    ev = net.transfer_many([(f"n0.gpu{i}", f"n1.gpu{i}", 1e9) for i in range(8)])
    env.run(ev)
    assert env.now == pytest.approx(8e9 / 47.5e9 + 2.8e-6, rel=1e-9)
    names = topo.link_names
    nbytes = dict(zip(names, net.link_bytes(), strict=True))
    assert nbytes["n0.nic0->leaf0.rail0"] == pytest.approx(8e9)
    assert nbytes["n0.gpu3->n0.nic0"] == pytest.approx(1e9)
    # one NIC per GPU (the default): 8 rails in parallel, each flow alone on its NIC
    env = simpy.Environment()
    net = FlowNetwork(env, _two_nodes())
    ev = net.transfer_many([(f"n0.gpu{i}", f"n1.gpu{i}", 1e9) for i in range(8)])
    env.run(ev)
    assert env.now == pytest.approx(1e9 / 47.5e9 + 2.8e-6, rel=1e-9)


def test_two_nics_per_node_rails_and_relay():
    topo = _two_nodes(nics_per_node=2)
    # GPUs 0-3 on NIC 0, 4-7 on NIC 1; GPU 1 -> GPU 6 of node 1 relays over NVLink to
    # local GPU 6 (the destination's rail), as NCCL PXN does
    assert topo.path_nodes("n0.gpu1", "n1.gpu2") == [
        "n0.gpu1", "n0.nic0", "leaf0.rail0", "n1.nic0", "n1.gpu2"]
    assert topo.path_nodes("n0.gpu1", "n1.gpu6") == [
        "n0.gpu1", "n0.nvswitch", "n0.gpu6", "n0.nic1", "leaf0.rail1", "n1.nic1", "n1.gpu6"]


def test_nics_per_node_must_divide_the_gpus():
    with pytest.raises(InputError) as ei:
        _two_nodes(nics_per_node=3)
    assert ei.value.field == "params.nics_per_node"
    with pytest.raises(InputError) as ei:
        _two_nodes(nics_per_node=-1)
    assert ei.value.field == "params.nics_per_node"
