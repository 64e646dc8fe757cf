"""Three-tier (leaf / spine / core) rail-optimized fat-trees, worked out by hand, and the
GPU limit of a topology."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.cli import main
from moesim.errors import InputError
from moesim.topology import load_topology
from moesim.topology.bounds import MAX_GPUS, MAX_SEARCHED_GPUS
from moesim.topology.link_routing import ClusterRouter, GraphRouter
from moesim.topology.loader import cluster_spec, read_yaml, resolve

GB = 1e9

# dgx-h100's numbers (NIC 50 GB/s x 0.95, NIC 1.4 µs, spine 0.45 µs, NVLink 1.665 µs) on a
# tiny tree: 8 servers of 2 GPUs, 2 servers per leaf group (2 rails: 2 leaves a group),
# 4 servers per pod (2 groups, 4 leaves), so 2 pods; spines 0 -> 4 leaves / 2 = 2 a pod;
# cores 0 -> 2 planes x ceil(2 pods / 2) = 2 cores, one per plane.
TINY = {"nodes": 8, "gpus_per_node": 2, "nodes_per_leaf": 2, "nodes_per_pod": 4,
        "oversubscription": 2.0, "spine_oversubscription": 4.0, "core_latency_us": 0.5}


def kinds(t):
    out: dict[str, int] = {}
    for _, k in t.graph.nodes(data="kind"):
        out[k] = out.get(k, 0) + 1
    return out


def test_tiny_three_tier_tree_counts_and_bandwidth_per_tier():
    t = load_topology("dgx-h100", **TINY)
    assert kinds(t) == {"gpu": 16, "nvswitch": 8, "nic": 16, "leaf": 8, "spine": 4, "core": 2}
    # per direction: 16 gpu-nvswitch, 16 gpu-nic, 16 nic-leaf, 8 leaves x 2 spines of
    # their pod, 4 spines x 1 core of their plane; x 2 directions
    assert len(t.links) == 2 * (16 + 16 + 16 + 16 + 4) == 136
    lid = t.link_id
    # a leaf: 2 NIC ports x 50 GB/s down / oversubscription 2 = 50 GB/s up, over 2 spines
    up = lid[("leaf0.rail1", "pod0.spine1")]
    assert t.line_rate_Bps[up] == pytest.approx(25 * GB)
    assert t.capacity_Bps[up] == pytest.approx(25 * 0.95 * GB)
    # a spine: 4 leaves x 25 GB/s down / spine_oversubscription 4 = 25 GB/s up, 1 core
    top = lid[("pod1.spine0", "core0")]
    assert t.line_rate_Bps[top] == pytest.approx(25 * GB)
    assert t.latency_s[top] == pytest.approx(0.5e-6)
    assert t.line_rate_Bps[lid[("core1", "pod0.spine1")]] == pytest.approx(25 * GB)
    # spine k of every pod reaches only plane k's core; leaves only their pod's spines
    assert ("pod0.spine0", "core1") not in lid and ("leaf0.rail0", "pod1.spine0") not in lid
    assert {v for u, v in t.links if u == "core1"} == {"pod0.spine1", "pod1.spine1"}
    # without oversubscription: leaf->spine 2 x 50 / 2 spines = 50 GB/s, spine->core
    # 4 leaves x 50 = 200 GB/s
    t1 = load_topology("dgx-h100", **{**TINY, "oversubscription": 1.0,
                                      "spine_oversubscription": 1.0})
    assert t1.line_rate_Bps[t1.link_id[("pod0.spine0", "core0")]] == pytest.approx(200 * GB)


def test_route_between_pods_climbs_to_the_core_of_the_spines_plane():
    t = load_topology("dgx-h100", **TINY)
    # rail (PXN): to gpu1's rail first over NVLink, then leaf -> spine k -> core k ->
    # spine k of pod 1 -> leaf of group 3 (servers 6, 7), rail 1
    k = zlib.crc32(b"n0.gpu0>n7.gpu1#3@leaf0.rail1") % 2
    nodes = t.path_nodes("n0.gpu0", "n7.gpu1", key=3)
    assert nodes == ["n0.gpu0", "n0.nvswitch", "n0.gpu1", "n0.nic1", "leaf0.rail1",
                     f"pod0.spine{k}", f"core{k}", f"pod1.spine{k}", "leaf3.rail1",
                     "n7.nic1", "n7.gpu1"]
    path = t.route("n0.gpu0", "n7.gpu1", 3)
    # 2 NVLink x 1.665 + 2 NIC x 1.4 + 2 leaf-spine x 0.45 + 2 spine-core x 0.5 µs
    assert sum(t.latency_s[i] for i in path) == pytest.approx(8.03e-6)
    assert min(t.capacity_Bps[i] for i in path) == pytest.approx(25 * 0.95 * GB)
    # shortest: no relay; out of gpu0's own NIC (rail 0), over spine 0 and core 0
    s = load_topology("dgx-h100", routing="shortest", **TINY)
    assert s.path_nodes("n0.gpu0", "n7.gpu1") == [
        "n0.gpu0", "n0.nic0", "leaf0.rail0", "pod0.spine0", "core0", "pod1.spine0",
        "leaf3.rail1", "n7.nic1", "n7.gpu1"]
    # inside one pod, across leaf groups: no core
    assert s.path_nodes("n0.gpu0", "n3.gpu0") == [
        "n0.gpu0", "n0.nic0", "leaf0.rail0", "pod0.spine0", "leaf1.rail0", "n3.nic0", "n3.gpu0"]


SHAPES = [TINY,
          {**TINY, "nodes": 7},                                  # last pod partial
          {**TINY, "nodes": 10, "cores": 4, "spines": 2},        # 3 pods, 2 cores a plane
          {**TINY, "rail_optimized": False, "spines": 3},        # one leaf per group
          {**TINY, "nodes": 6, "nodes_per_pod": 2, "gpus_per_node": 1, "intra": "none"}]


@pytest.mark.parametrize("routing", ["shortest", "ecmp", "rail"])
@pytest.mark.parametrize("params", SHAPES)
def test_structural_router_equals_graph_search_on_three_tiers(params, routing):
    t = load_topology("dgx-h100", routing=routing, **params)
    assert isinstance(t._router, ClusterRouter) and kinds(t)["core"] > 0
    search = GraphRouter(t.graph, routing)
    for s in t.gpus:
        for d in t.gpus:
            for key in (0, 1, 5):
                assert t.route(s, d, key) == search.route(s, d, key), (s, d, key)


@settings(max_examples=25, deadline=None)
@given(nodes=st.integers(3, 9), per_leaf=st.integers(1, 2), pod_groups=st.integers(1, 2),
       spines=st.integers(0, 3), cores_per_plane=st.integers(0, 2), gpus=st.integers(1, 2),
       rail=st.booleans(), routing=st.sampled_from(["shortest", "ecmp", "rail"]))
def test_structural_router_equals_graph_search_on_random_trees(nodes, per_leaf, pod_groups,
                                                               spines, cores_per_plane, gpus,
                                                               rail, routing):
    params = {"nodes": nodes, "nodes_per_leaf": per_leaf, "nodes_per_pod": per_leaf * pod_groups,
              "spines": spines, "gpus_per_node": gpus, "rail_optimized": rail,
              "core_latency_us": 0.3}
    t = load_topology("dgx-h100", routing=routing, **params)
    n_spp = sum(1 for n in t.graph if n.startswith("pod0.spine"))  # spines a pod
    if cores_per_plane and n_spp:
        t = load_topology("dgx-h100", routing=routing, cores=n_spp * cores_per_plane, **params)
        assert kinds(t)["core"] == n_spp * cores_per_plane
    search = GraphRouter(t.graph, routing)
    for s in t.gpus:
        for d in t.gpus:
            assert t.route(s, d, 4) == search.route(s, d, 4)


def test_one_pod_is_the_two_tier_fabric():
    a = load_topology("dgx-h100", nodes=4, nodes_per_leaf=2)
    b = load_topology("dgx-h100", nodes=4, nodes_per_leaf=2, nodes_per_pod=4)
    assert a.describe()["links"] == b.describe()["links"] and "core" not in kinds(b)


@pytest.mark.parametrize("name, gpus, pods, cores", [("superpod-h100-16k", 16384, 16, 256),
                                                      ("superpod-h100-100k", 100000, 98, 1568)])
def test_shipped_three_tier_presets_by_hand(name, gpus, pods, cores):
    spec = cluster_spec("cluster", read_yaml(resolve(name))["params"], name)
    # 8 GPUs a server; 32 servers a leaf group (8 rail leaves), 128 a pod (32 leaves)
    assert spec.nodes * spec.gpus_per_node == gpus and spec.n_pods == pods
    assert spec.leaves_per_pod == 32 and spec.spines_per_pod == 32 and spec.n_cores == cores
    # non-blocking: a leaf's 32 NICs x 50 GB/s over 32 spines; a spine's 32 leaves x 50
    # GB/s over the cores of its plane (256 / 32 = 8, 1568 / 32 = 49)
    assert spec.uplink_GBps == pytest.approx(50.0)
    assert spec.core_uplink_GBps == pytest.approx(32 * 50 / (cores // 32))


def test_meta_llama3_preset_by_hand():
    spec = cluster_spec("cluster", read_yaml(resolve("meta-llama3-24k"))["params"], "meta")
    # 3,072 servers; a ToR (leaf) per 2 servers, not rail-optimized: 1,536 leaves, 192 a
    # pod of 384 servers (3,072 GPUs), 8 pods; spines 0 -> 96 a pod; cores 0 -> 96 x 4
    assert spec.nodes * spec.gpus_per_node == 24576 and spec.n_pods == 8
    assert spec.leaves_per_pod == 192 and spec.spines_per_pod == 96 and spec.n_cores == 384
    # a ToR: 16 NICs x 50 GB/s up (full bisection) over 96 spines; a spine: 192 x that,
    # / 7 (the 1:7 aggregation tier), over 4 cores
    assert spec.uplink_GBps == pytest.approx(16 * 50 / 96)
    assert spec.core_uplink_GBps == pytest.approx(192 * 16 * 50 / 96 / 7 / 4)
    # so a pod leaves through 96 x 4 core links = its 3,072 GPUs x 50 GB/s / 7
    assert 96 * 4 * spec.core_uplink_GBps == pytest.approx(3072 * 50 / 7)


def test_two_pods_of_the_16k_preset_built():
    t = load_topology("superpod-h100-16k", nodes=256)
    assert kinds(t) == {"gpu": 2048, "nvswitch": 256, "nic": 2048, "leaf": 64, "spine": 64,
                        "core": 256}
    # per direction: 2048 each of gpu-nvswitch, gpu-nic, nic-leaf; 64 leaves x 32
    # spines of their pod; 64 spines x 8 cores of their plane
    assert len(t.links) == 2 * (3 * 2048 + 64 * 32 + 64 * 8)
    assert t.line_rate_Bps[t.link_id[("pod1.spine31", "core255")]] == pytest.approx(200 * GB)
    # same rail, pod 0 -> pod 1 (server 255: group 7): ECMP at the leaf over 32 spines,
    # at the spine over the 8 cores of its plane
    k = zlib.crc32(b"n0.gpu3>n255.gpu3#0@leaf0.rail3") % 32
    m = zlib.crc32(f"n0.gpu3>n255.gpu3#0@pod0.spine{k}".encode()) % 8
    assert t.path_nodes("n0.gpu3", "n255.gpu3", 0) == [
        "n0.gpu3", "n0.nic3", "leaf0.rail3", f"pod0.spine{k}", f"core{8 * k + m}",
        f"pod1.spine{k}", "leaf7.rail3", "n255.nic3", "n255.gpu3"]


@pytest.mark.parametrize("field, value, expected", [
    ("spine_oversubscription", 0, "a finite number > 0 (spine downlink"),
    ("spine_oversubscription", -2.0, "a finite number > 0 (spine downlink"),
    ("spine_oversubscription", float("nan"), "a finite number"),
    ("oversubscription", float("nan"), "a finite number"),
    ("oversubscription", 0, "a finite number > 0 (leaf downlink"),
    ("nodes_per_pod", 3, "a multiple of nodes_per_leaf = 2"),
    ("cores", 3, "a multiple of the 2 spines per pod"),
])
def test_bad_tier_parameters_are_one_line(field, value, expected):
    with pytest.raises(InputError) as e:
        load_topology("dgx-h100", **{**TINY, field: value})
    msg = str(e.value)
    assert f"params.{field}" in msg and expected in msg and "\n" not in msg


@pytest.mark.parametrize("value", ["0", "-1", ".nan"])
def test_bad_oversubscription_on_the_command_line_exits_2(capsys, value):
    assert main(["topology", "dgx-h100", "--set", "nodes=8", "--set", "nodes_per_pod=4",
                 "--set", "nodes_per_leaf=2", "--set", f"spine_oversubscription={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "spine_oversubscription" in err[0], err


def test_gpu_limit_is_one_line():
    assert MAX_GPUS == 131072
    # 16,384 nodes x 8 GPUs = 131,072: at the limit; one more node is over it
    with pytest.raises(InputError) as e:
        load_topology("dgx-h100", nodes=16385)
    assert "params.nodes" in str(e.value)
    assert "at most 131072 GPUs in the cluster (131080 asked" in str(e.value)
    # routed by graph search (a PCIe tree): 1,025 servers x 8 GPUs = 8,200 > 8,192
    with pytest.raises(InputError) as e:
        load_topology("pcie-8gpu", nodes=1025)
    assert f"at most {MAX_SEARCHED_GPUS} GPUs in the cluster (8200 asked: routes found by " \
        "graph search" in str(e.value)


def test_servers_without_internal_links_are_still_searched_for_unreachable_gpus():
    # a fabric joins servers and NVSwitch joins one server's GPUs, so those skip the
    # search; one server of 2 GPUs with no internal links has no path between them
    with pytest.raises(InputError) as e:
        load_topology("fat-tree", nodes=1, gpus_per_node=2)
    assert "a path between every pair of GPUs" in str(e.value)
    assert load_topology("fat-tree", nodes=1, gpus_per_node=1).n_gpus == 1
