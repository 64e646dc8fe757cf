"""Topology facts that can be worked out by hand from the preset YAML numbers."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.topology import load_topology, parse_topology
from moesim.topology.link_routing import ClusterRouter, GraphRouter, find_unreachable
from moesim.topology.summary import bisection_Bps, link_classes

GB = 1e9


def link(topo, u, v):
    return topo.link_id[(u, v)]


def test_dgx_h100_two_nodes_counts_and_rank_order():
    t = load_topology("dgx-h100", nodes=2)
    assert len(t.gpus) == 16 and t.n_nodes == 2 and t.gpus_per_node == 8
    assert t.gpus[:3] == ["n0.gpu0", "n0.gpu1", "n0.gpu2"] and t.gpus[8] == "n1.gpu0"
    assert [t.host_of(g) for g in t.gpus] == [0] * 8 + [1] * 8
    assert [t.local_of(g) for g in t.gpus] == list(range(8)) * 2
    kinds = [k for _, k in t.graph.nodes(data="kind")]
    # 16 GPUs, 2 NVSwitch, 16 NICs, 8 rail leaves (one group), leaves/2 = 4 spines
    assert {k: kinds.count(k) for k in set(kinds)} == {
        "gpu": 16, "nvswitch": 2, "nic": 16, "leaf": 8, "spine": 4}
    # per direction: 16 gpu-nvswitch + 16 gpu-nic + 16 nic-leaf + 8*4 leaf-spine, x2
    assert len(t.links) == 2 * (16 + 16 + 16 + 32)
    assert len(t.link_names) == len(t.link_kinds) == len(t.capacity_Bps) == len(t.links)
    assert t.link_names[0] == f"{t.links[0][0]}->{t.links[0][1]}"
    for lid, (u, v) in enumerate(t.links):
        assert t.graph.edges[u, v]["id"] == lid


def test_in_node_path_is_gpu_nvswitch_gpu_with_preset_numbers():
    t = load_topology("dgx-h100", nodes=2)
    path = t.route("n0.gpu0", "n0.gpu5")
    assert path == (link(t, "n0.gpu0", "n0.nvswitch"), link(t, "n0.nvswitch", "n0.gpu5"))
    for lid in path:
        assert t.link_kinds[lid] == "nvlink"
        assert t.line_rate_Bps[lid] == pytest.approx(450 * GB)       # 900 GB/s bidir / 2
        assert t.capacity_Bps[lid] == pytest.approx(450 * 0.822 * GB)  # 369.9 GB/s
        assert t.latency_s[lid] == pytest.approx(1.665e-6)           # 3.33 µs / 2 links
    assert t.route("n1.gpu2", "n1.gpu2") == ()
    # H800: 400 GB/s bidirectional -> 200 per direction x 0.8 = 160 GB/s achievable
    h800 = load_topology("dgx-h800")
    lid = link(h800, "n0.gpu0", "n0.nvswitch")
    assert h800.capacity_Bps[lid] == pytest.approx(160 * GB)


def test_rail_routing_uses_pxn_then_the_destination_rail():
    t = load_topology("dgx-h100", nodes=2)
    assert t.routing == "rail"
    assert t.path_nodes("n0.gpu0", "n1.gpu3") == [
        "n0.gpu0", "n0.nvswitch", "n0.gpu3", "n0.nic3", "leaf0.rail3", "n1.nic3", "n1.gpu3"]
    # same rail: straight out of the own NIC
    assert t.path_nodes("n0.gpu3", "n1.gpu3") == [
        "n0.gpu3", "n0.nic3", "leaf0.rail3", "n1.nic3", "n1.gpu3"]
    nic = link(t, "n0.nic3", "leaf0.rail3")
    assert t.capacity_Bps[nic] == pytest.approx(50 * 0.95 * GB)  # NDR 50 GB/s x 0.95
    # end to end latency: NVLink 3.33 µs + IB same leaf 2.8 µs
    lat = sum(t.latency_s[i] for i in t.route("n0.gpu0", "n1.gpu3"))
    assert lat == pytest.approx(3.33e-6 + 2.8e-6)


def test_shortest_goes_cross_rail_over_spine0_and_ecmp_spreads_by_crc32():
    t = load_topology("dgx-h100", nodes=2, routing="shortest")
    # GPUs do not relay: cross-rail traffic climbs to a spine; ties -> lowest link id
    assert t.path_nodes("n0.gpu0", "n1.gpu3") == [
        "n0.gpu0", "n0.nic0", "leaf0.rail0", "spine0", "leaf0.rail3", "n1.nic3", "n1.gpu3"]
    assert t.route("n0.gpu0", "n1.gpu3", key=7) == t.route("n0.gpu0", "n1.gpu3", key=0)
    e = load_topology("dgx-h100", nodes=2, routing="ecmp")
    spines = []
    for key in range(64):
        nodes = e.path_nodes("n0.gpu0", "n1.gpu3", key)
        expect = zlib.crc32(f"n0.gpu0>n1.gpu3#{key}@leaf0.rail0".encode()) % 4
        assert nodes[3] == f"spine{expect}"
        assert e.route("n0.gpu0", "n1.gpu3", key) == e.route("n0.gpu0", "n1.gpu3", key)
        spines.append(nodes[3])
    assert set(spines) == {"spine0", "spine1", "spine2", "spine3"}


def test_rail_crosses_spines_between_leaf_groups():
    t = load_topology("dgx-h100", nodes=4, nodes_per_leaf=2, spines=3)
    assert len(t.graph) == 4 * 17 + 16 + 3  # 2 groups x 8 rails = 16 leaves
    nodes = t.path_nodes("n0.gpu1", "n3.gpu6", key=2)
    spine = zlib.crc32(b"n0.gpu1>n3.gpu6#2@leaf0.rail6") % 3
    assert nodes == ["n0.gpu1", "n0.nvswitch", "n0.gpu6", "n0.nic6", "leaf0.rail6",
                     f"spine{spine}", "leaf1.rail6", "n3.nic6", "n3.gpu6"]


def test_fat_tree_oversubscription_sets_uplink_bandwidth():
    t = load_topology("fat-tree")
    up = link(t, "leaf0", "spine0")
    # 4 hosts x 50 GB/s down / oversubscription 2 = 100 GB/s up, over 2 spines = 50 each
    assert t.line_rate_Bps[up] == pytest.approx(50 * GB)
    assert t.capacity_Bps[up] == pytest.approx(50 * 0.95 * GB)
    t1 = load_topology("fat-tree", oversubscription=1.0, spines=4)
    assert t1.line_rate_Bps[link(t1, "spine3", "leaf2")] == pytest.approx(4 * 50 / 4 * GB)
    t4 = load_topology("fat-tree", oversubscription=4.0)
    assert t4.line_rate_Bps[up] == pytest.approx(4 * 50 / 4 / 2 * GB)
    # bisection: hosts 0-7 (leaves 0,1) to 8-15: 2 leaves x 2 uplinks x 47.5 GB/s
    assert bisection_Bps(t) == pytest.approx(4 * 47.5 * GB)
    assert t.path_nodes("n0.gpu0", "n1.gpu0") == ["n0.gpu0", "n0.nic0", "leaf0", "n1.nic0", "n1.gpu0"]


def test_pcie_tree_paths():
    t = load_topology("pcie-8gpu")
    assert t.n_nodes == 1 and len(t.gpus) == 8
    assert t.path_nodes("n0.gpu0", "n0.gpu1") == ["n0.gpu0", "n0.pcie0", "n0.gpu1"]
    assert t.path_nodes("n0.gpu0", "n0.gpu2") == ["n0.gpu0", "n0.pcie0", "n0.cpu0", "n0.pcie1",
                                                  "n0.gpu2"]
    assert t.path_nodes("n0.gpu0", "n0.gpu7") == ["n0.gpu0", "n0.pcie0", "n0.cpu0", "n0.cpu1",
                                                  "n0.pcie3", "n0.gpu7"]
    assert not any(k == "nvlink" for k in t.link_kinds)
    # two servers: 4 NICs each on the group's one leaf
    t2 = load_topology("pcie-8gpu", nodes=2)
    assert t2.path_nodes("n0.gpu0", "n1.gpu7") == [
        "n0.gpu0", "n0.pcie0", "n0.nic0", "leaf0", "n1.nic3", "n1.pcie3", "n1.gpu7"]


SMALL = [("dgx-h100", {"nodes": 3, "nodes_per_leaf": 2}),
         ("hgx-a100", {"nodes": 5, "nodes_per_leaf": 2, "spines": 3}),
         ("fat-tree", {"nodes": 6, "gpus_per_node": 2, "nodes_per_leaf": 2, "spines": 3}),
         ("fat-tree", {"nodes": 4, "gpus_per_node": 2, "nodes_per_leaf": 2, "rail_optimized": True})]


@pytest.mark.parametrize("routing", ["shortest", "ecmp", "rail"])
@pytest.mark.parametrize(("name", "params"), SMALL)
def test_structural_router_equals_graph_search(name, params, routing):
    t = load_topology(name, routing=routing, **params)
    assert isinstance(t._router, ClusterRouter)
    search = GraphRouter(t.graph, routing)
    for s in t.gpus:
        for d in t.gpus:
            for key in (0, 1, 5):
                assert t.route(s, d, key) == search.route(s, d, key), (s, d, key)


@pytest.mark.parametrize("routing", ["shortest", "ecmp", "rail"])
@pytest.mark.parametrize("name", ["dgx-h100", "pcie-8gpu", "fat-tree", "example-explicit"])
def test_routes_are_chained_paths_that_never_relay_through_other_gpus(name, routing):
    t = load_topology(name, routing=routing, **({"nodes": 2} if "dgx" in name or "pcie" in name else {}))
    for s in t.gpus:
        for d in t.gpus:
            nodes = t.path_nodes(s, d, key=3)
            assert nodes[0] == s and nodes[-1] == d
            assert len(set(nodes)) == len(nodes)  # no loops
            hops = t.route(s, d, key=3)
            for a, lid in zip(nodes, hops, strict=False):
                assert t.links[lid][0] == a
            relays = [n for n in nodes[1:-1] if t.graph.nodes[n]["kind"] == "gpu"]
            if routing == "rail" and relays:  # the PXN relay: local GPU with dst's index
                assert relays == [f"n{t.host_of(s)}.gpu{t.local_of(d)}"]
            else:
                assert relays == []


def test_explicit_graph_efficiency_and_direction(tmp_path):
    t = load_topology("example-explicit")
    assert t.gpus == ["h0.gpu0", "h0.gpu1", "h1.gpu0", "h1.gpu1"] and t.n_nodes == 2
    assert t.path_nodes("h0.gpu1", "h1.gpu0") == ["h0.gpu1", "h0.pcie", "tor", "h1.pcie", "h1.gpu0"]
    eth = link(t, "h0.pcie", "tor")
    assert t.capacity_Bps[eth] == pytest.approx(12.5 * 0.95 * GB)  # kind efficiency
    assert t.latency_s[eth] == pytest.approx(1.8e-6)
    data = {"nodes": [{"id": "a", "kind": "gpu"}, {"id": "b", "kind": "gpu"},
                      {"id": "s", "kind": "nvswitch"}],
            "links": [{"src": "a", "dst": "s", "kind": "nvlink", "bandwidth_GBps": 100,
                       "latency_us": 1, "efficiency": 0.5},
                      {"src": "s", "dst": "b", "kind": "nvlink", "bandwidth_GBps": 100,
                       "latency_us": 1, "bidirectional": False},
                      {"src": "b", "dst": "a", "kind": "nvlink", "bandwidth_GBps": 10,
                       "latency_us": 0, "bidirectional": False}]}
    t = parse_topology(data, "mem.yaml")
    assert len(t.links) == 4 and not t.graph.has_edge("b", "s")
    assert t.capacity_Bps[link(t, "a", "s")] == pytest.approx(50 * GB)
    assert t.local_of("b") == 1 and t.host_of("b") == 0
    assert t.path_nodes("b", "a") == ["b", "a"]     # direct one-way link
    assert t.path_nodes("a", "b") == ["a", "s", "b"]


def test_gpus_do_not_relay_unless_gpu_transit():
    ring = {"nodes": [{"id": f"g{i}", "kind": "gpu"} for i in range(3)],
            "links": [{"src": "g0", "dst": "g1", "kind": "nvlink", "bandwidth_GBps": 1,
                       "latency_us": 0}, {"src": "g1", "dst": "g2", "kind": "nvlink",
                                          "bandwidth_GBps": 1, "latency_us": 0}]}
    t = parse_topology({**ring, "gpu_transit": True}, "chain.yaml")
    assert t.path_nodes("g0", "g2") == ["g0", "g1", "g2"]
    assert find_unreachable(t.graph, t.gpus, gpu_transit=False) in {("g0", "g2"), ("g2", "g0")}


def test_shortest_prefers_lower_latency_among_equal_hops():
    data = {"nodes": [{"id": "a", "kind": "gpu"}, {"id": "b", "kind": "gpu"},
                      {"id": "slow", "kind": "pcie_switch"}, {"id": "fast", "kind": "pcie_switch"}],
            "links": [{"src": "a", "dst": "slow", "kind": "pcie", "bandwidth_GBps": 1, "latency_us": 5},
                      {"src": "slow", "dst": "b", "kind": "pcie", "bandwidth_GBps": 1, "latency_us": 5},
                      {"src": "a", "dst": "fast", "kind": "pcie", "bandwidth_GBps": 1, "latency_us": 1},
                      {"src": "fast", "dst": "b", "kind": "pcie", "bandwidth_GBps": 1, "latency_us": 1}]}
    for routing in ("shortest", "ecmp"):
        t = parse_topology(data, "x.yaml", routing=routing)
        for key in range(8):
            assert t.path_nodes("a", "b", key) == ["a", "fast", "b"]


def test_describe_is_json_and_matches_arrays():
    t = load_topology("dgx-h100", nodes=2)
    d = json.loads(json.dumps(t.describe()))
    assert (d["name"], d["routing"], d["n_gpus"], d["n_nodes"], d["gpus_per_node"]) == (
        "dgx-h100", "rail", 16, 2, 8)
    assert len(d["links"]) == len(t.links) and len(d["nodes"]) == len(t.graph)
    first = d["links"][0]
    assert first["bandwidth_GBps"] == pytest.approx(t.capacity_Bps[0] / GB)
    assert first["latency_us"] == pytest.approx(t.latency_s[0] * 1e6)
    classes = {(c.kind, c.between): c.count for c in link_classes(t)}
    assert classes[("ib", "leaf-spine")] == 64 and classes[("nvlink", "gpu-nvswitch")] == 32
    assert bisection_Bps(t) == pytest.approx(8 * 47.5 * GB)  # 8 NICs x 47.5 GB/s


def test_same_input_same_routes_and_description():
    a = load_topology("fat-tree", routing="ecmp")
    b = load_topology("fat-tree", routing="ecmp")
    assert json.dumps(a.describe()) == json.dumps(b.describe())
    rng = np.random.default_rng(0)
    for s, d in rng.integers(0, len(a.gpus), size=(50, 2)).tolist():
        assert a.route(a.gpus[s], a.gpus[d], 11) == b.route(b.gpus[s], b.gpus[d], 11)


@pytest.mark.slow
def test_2048_gpu_rail_fabric_builds_and_routes():
    # how fast it builds and routes is benchmarks/bench_topology.py's (no clock in tests)
    t = load_topology("dgx-h800", nodes=256)
    assert len(t.gpus) == 2048
    # 8 rails x 8 groups of 32 = 64 leaves, 32 spines (SuperPOD ratio), 400 GB/s x 32 / 32 each
    assert sum(1 for _, k in t.graph.nodes(data="kind") if k == "leaf") == 64
    assert sum(1 for _, k in t.graph.nodes(data="kind") if k == "spine") == 32
    assert t.line_rate_Bps[link(t, "leaf0.rail0", "spine0")] == pytest.approx(32 * 50 / 32 * GB)
    pairs = np.random.default_rng(1).integers(0, 2048, size=(100_000, 2)).tolist()
    gpus = t.gpus
    for key, (s, d) in enumerate(pairs):
        assert (len(t.route(gpus[s], gpus[d], key)) > 0) == (s != d), (s, d)
    # a cross-group, cross-rail route: PXN, then rail 5 through a spine
    nodes = t.path_nodes("n0.gpu2", "n200.gpu5", 9)
    assert nodes[:6] == ["n0.gpu2", "n0.nvswitch", "n0.gpu5", "n0.nic5", "leaf0.rail5",
                         nodes[5]] and nodes[5].startswith("spine")
    assert nodes[6:] == ["leaf6.rail5", "n200.nic5", "n200.gpu5"]


@pytest.mark.slow
def test_routes_do_not_depend_on_python_hash_seed(tmp_path):
    import subprocess
    import sys

    code = ("from moesim.topology import load_topology as L; t = L('dgx-h100', nodes=4, "
            "nodes_per_leaf=2, routing='ecmp'); print([t.route(s, d, k) for k in range(3) "
            "for s in t.gpus[::5] for d in t.gpus[::3]])")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout
            for seed in ("1", "2")}
    assert len(outs) == 1 and len(next(iter(outs))) > 100


@settings(max_examples=30, deadline=None)
@given(nodes=st.integers(2, 5), per_leaf=st.integers(1, 3), spines=st.integers(0, 3),
       gpus=st.integers(1, 3), intra=st.sampled_from(["nvswitch", "none"]), rail=st.booleans(),
       routing=st.sampled_from(["shortest", "ecmp", "rail"]))
def test_structural_router_equals_graph_search_on_random_shapes(nodes, per_leaf, spines, gpus,
                                                                 intra, rail, routing):
    t = load_topology("dgx-h100", routing=routing, nodes=nodes, nodes_per_leaf=per_leaf,
                      spines=spines, gpus_per_node=gpus, intra=intra, rail_optimized=rail)
    search = GraphRouter(t.graph, routing)
    for s in t.gpus:
        for d in t.gpus:
            assert t.route(s, d, 4) == search.route(s, d, 4)


def test_device_name_comes_from_the_file():
    assert load_topology("dgx-h800").device == "H800"
    assert load_topology("fat-tree").device is None
    assert load_topology("dgx-h100").describe()["device"] == "H100"
