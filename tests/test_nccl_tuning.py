"""NCCL's tuning model (moesim.collectives.nccl), checked by hand on tuning.cc's formulas
(NVIDIA/nccl 5067397c) for one message per protocol, its selection rule, forcing, and
the ``moesim collective`` flags."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.collectives.nccl import GraphFacts, NcclFacts, estimate, facts_from_params
from moesim.errors import InputError
from moesim.topology import load_topology

# 2 x DGX H100 as NCCL's search sees it: 8 ring/tree channels of 48 GB/s (one 400 Gb/s
# NIC per GPU behind PCIe Gen5 = 48 GB/s), 16 comm channels, Intel CPUs.
G48 = GraphFacts(n_channels=8, bw_intra=48.0, bw_inter=48.0)
TWO_NODES = NcclFacts(nodes=2, ranks_per_node=8, compcap="hopper", cpu_vendor="intel",
                      intra="nvlink", graphs={"ring": G48, "tree": G48}, comm_channels=16)


def us(op, nbytes, **kw):
    t, a, p, bd = estimate(op, nbytes, 8, 2, TWO_NODES, **kw)
    return t * 1e6, a, p, bd


def test_tree_ll_128_bytes_by_hand():
    # latency = baseLat[tree][LL] + 2 x ((ppn-1) x hwLat[NVLink][tree][LL]
    #           + log2(nodes) x hwLat[NET][tree][LL]) = 6.8 + 2 x (7 x 0.6 + 1 x 5.0) = 25.2
    # bandwidth: busBw = 8 ch x 48 = 384; all-reduce tree: min(384 x .92, 8 x 41.4) = 331.2;
    #   LL: min(331.2 / 3.8, llMaxBw[Intel][2 nodes] = 39.0) = 39.0; tree algbw x .5 = 19.5;
    #   treeCorrectionFactor[LL][log2(128 >> 6) = 1] = 1.0
    t, a, p, bd = us("all_reduce", 128, algo="tree", protocol="LL")
    assert bd["latency_us"] == pytest.approx(25.2)
    assert bd["bandwidth_GBps"] == pytest.approx(19.5)
    assert t == pytest.approx(25.2 + 128 / (1000 * 19.5))
    assert (a, p) == ("tree", "LL")


def test_ring_ll128_512KiB_by_hand():
    # latency = 14.0 + (nsteps 30 - 2 net steps) x max(hwLat[NVLink][ring][LL128] 1.9,
    #           net overhead 1.0) + 2 x hwLat[NET][ring][LL128] 4.0 = 14 + 53.2 + 8 = 75.2
    # bandwidth = min(384 x .92, 8 x perChMaxRingLL128Bw 36.7 = 293.6) x nRanks/nsteps 16/30
    t, _, _, bd = us("all_reduce", 512 * 1024, algo="ring", protocol="LL128")
    bw = 293.6 * 16 / 30
    assert bd["latency_us"] == pytest.approx(75.2)
    assert bd["bandwidth_GBps"] == pytest.approx(bw)
    assert t == pytest.approx(75.2 + 524288 / (1000 * bw))


def test_ring_simple_1MiB_by_hand():
    # latency = 8.4 + 28 x max(3.4, 3 x 1.0) + 2 x 14.0 = 131.6, x 1.4 ring plateau because
    # 1 MiB / (16 comm channels x 16 ranks) = 4096 >= 64 bytes -> 184.24
    # bandwidth = 384 x 16/30 = 204.8 GB/s
    t, _, _, bd = us("all_reduce", 1 << 20, algo="ring", protocol="Simple")
    assert bd["latency_us"] == pytest.approx(131.6 * 1.4)
    assert t == pytest.approx(131.6 * 1.4 + (1 << 20) / (1000 * 204.8))


def test_ring_ll_all_gather_one_node_by_hand():
    # one node, 12 channels of 30 GB/s: latency = 6.6 + 7 x 0.6 = 10.8;
    # bandwidth = min(llMaxBw[Hopper][1 node] 141.0, 360 x .5) x 8/7
    g = GraphFacts(12, 30.0, 30.0)
    one = NcclFacts(nodes=1, ranks_per_node=8, graphs={"ring": g, "tree": g}, comm_channels=24)
    t, a, p, bd = estimate("all_gather", 16384, 8, 1, one)
    assert (a, p) == ("ring", "LL")
    assert bd["latency_us"] == pytest.approx(10.8)
    assert t * 1e6 == pytest.approx(10.8 + 16384 / (1000 * 141.0 * 8 / 7))


def test_selection_ll_for_tiny_simple_for_large():
    assert us("all_reduce", 8)[1:3] == ("tree", "LL")
    assert us("all_reduce", 1 << 30)[2] == "Simple"
    assert us("all_gather", 64)[2] == "LL"
    assert us("all_gather", 1 << 30)[2] == "Simple"
    # the chosen one is the minimum of the candidates
    t, _, _, bd = us("all_reduce", 512 * 1024)
    assert t == pytest.approx(min(bd["candidates"].values()))


def test_forcing_and_refusal():
    assert us("all_reduce", 8, protocol="Simple")[2] == "Simple"
    assert us("all_reduce", 8, algo="ring")[1] == "ring"
    with pytest.raises(InputError, match="broadcast"):
        us("broadcast", 8, algo="tree")  # NCCL runs broadcast as a ring only
    with pytest.raises(InputError):
        us("all_reduce", 8, protocol="LL256")


def test_graph_facts_of_dgx_h100():
    # 1 node: 18 NVLinks x 20.6 = 370.8 GB/s; 6 rings of 60 GB/s, doubled to 12 x 30
    t1 = load_topology("dgx-h100", nodes=1)
    f1 = facts_from_params(t1.params, t1.device, 1, 8)
    assert (f1.graphs["ring"].n_channels, f1.graphs["ring"].bw_intra) == (12, 30.0)
    assert f1.comm_channels == 24
    # 2 nodes: one channel per NIC at min(50 GB/s NIC, 48 GB/s PCIe Gen5) = 48, not doubled
    t2 = load_topology("dgx-h100", nodes=2)
    f2 = facts_from_params(t2.params, t2.device, 2, 8)
    assert (f2.graphs["ring"].n_channels, f2.graphs["ring"].bw_intra) == (8, 48.0)
    assert f2.comm_channels == 16


def test_p2p_protocol_and_pricing_by_hand():
    # a peer's send takes one channel per 64 KiB and uses LL while its bytes <= channels x
    # 16 KiB: 16 ranks -> 16 KiB per peer is LL, 16 bytes more is Simple
    assert us("all_to_all", 16 * 16384)[2] == "LL"
    assert us("all_to_all", 16 * 16384 + 16)[2] == "Simple"
    # 16 MiB all_to_all on 2 x 8: per peer 1 MiB, Simple; latency = ring base 8.4 + one
    # network step 14.0 = 22.4 µs; 8 peers on other nodes x 1 MiB through the rank's share
    # of the network, 8 channels x 48 GB/s / 8 ranks = 48 GB/s (7 MiB over NVLink, here
    # the ring's 8 x 48 GB/s as no NVLink figure is given, end sooner)
    t, a, p, bd = us("all_to_all", 16 << 20)
    assert (a, p, bd["nccl_model"]) == ("p2p", "Simple", False)
    assert bd["latency_us"] == pytest.approx(22.4)
    assert t == pytest.approx(22.4 + 8 * (1 << 20) / (1000 * 48.0))


def test_cli_prints_nccl_choice(capsys):
    argv = ["collective", "--op", "all_reduce", "--bytes", "128", "--topology", "dgx-h100",
            "--nodes", "2"]
    assert main(argv) == 0
    assert "NCCL: tree/LL (NCCL's choice): 25.21 us" in capsys.readouterr().out
    assert main([*argv, "--protocol", "Simple", "--algo", "ring", "--json"]) == 0
    n = json.loads(capsys.readouterr().out)["nccl"]
    assert (n["algo"], n["protocol"]) == ("ring", "Simple")
    assert n["forced"] == {"algo": "ring", "protocol": "Simple"}
    # 128 B is below the plateau threshold: 131.6 µs + 128 B at 204.8 GB/s
    assert n["time_s"] == pytest.approx((131.6 + 128 / 204800) * 1e-6)


def test_cli_bad_protocol_is_one_line_exit_2(capsys):
    argv = ["collective", "--op", "all_reduce", "--bytes", "128", "--topology", "dgx-h100",
            "--protocol", "LL256"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["moesim collective: error: command line: --protocol: expected one of "
                   "LL, LL128, Simple, got 'LL256'"]
