"""``moesim collective`` and ``simulate_collective`` on real topology presets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moesim.cli import main
from moesim.collectives import simulate_collective
from moesim.collectives.algorithms import PIPELINE_CHUNKS
from moesim.topology import load_topology


def run_json(capsys, *argv):
    assert main(["collective", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def nvswitch_hop(topo):
    """Bandwidth and latency of the GPU -> NVSwitch -> GPU path inside node 0."""
    path = list(topo.route(topo.gpus[0], topo.gpus[1]))
    return float(topo.capacity_Bps[path].min()), float(topo.latency_s[path].sum())


def test_ring_all_reduce_one_dgx_matches_closed_form(capsys):
    topo = load_topology("dgx-h100", nodes=1)
    B, alpha = nvswitch_hop(topo)
    S, n = 2**30, 8
    res = run_json(capsys, "--topology", "dgx-h100", "--nodes", "1", "--op", "all_reduce",
                   "--bytes", "1GiB")
    # each ring step uses each GPU's up- and downlink once: no sharing
    expect = 2 * (n - 1) / n * S / B + 2 * (n - 1) * alpha
    assert res["time_s"] == pytest.approx(expect, rel=1e-9)
    assert res["algbw_GBps"] == pytest.approx(S / expect / 1e9)
    assert res["busbw_GBps"] == pytest.approx(S / expect / 1e9 * 2 * 7 / 8)
    assert (res["op"], res["algo"], res["ranks"], res["bytes"]) == ("all_reduce", "ring",
                                                                    list(range(8)), S)
    assert res["flows"] == 2 * (n - 1) * n


def test_all_gather_subset_ranks_and_readable_line(capsys):
    topo = load_topology("dgx-h100", nodes=1)
    B, alpha = nvswitch_hop(topo)
    assert main(["collective", "--topology", "dgx-h100", "--nodes", "1", "--op", "all_gather",
                 "--bytes", "64MB", "--ranks", "0,2,4-5"]) == 0
    line = capsys.readouterr().out.strip()
    assert "all_gather ring on 4 ranks" in line and " ms, algbw " in line and "GB/s" in line
    res = run_json(capsys, "--topology", "dgx-h100", "--nodes", "1", "--op", "all_gather",
                   "--bytes", "64MB", "--ranks", "0,2,4-5")
    assert res["ranks"] == [0, 2, 4, 5]
    assert res["time_s"] == pytest.approx(3 / 4 * 64e6 / B + 3 * alpha, rel=1e-9)


def test_same_input_same_output_bytes(capsys):
    argv = ["collective", "--topology", "dgx-h100", "--nodes", "2", "--op", "all_to_all",
            "--bytes", "8MiB", "--algo", "hierarchical", "--json"]
    outs = []
    for _ in range(2):
        assert main(argv) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]


def test_matrix_file_all_to_all_v(tmp_path, capsys):
    topo = load_topology("dgx-h100", nodes=2)
    m = np.zeros((4, 4))
    m[1:, 0] = 1e6  # three ranks send 1 MB each to rank 0 (= global rank 0)
    f = tmp_path / "m.json"
    f.write_text(json.dumps({"matrix": m.tolist()}))
    res = run_json(capsys, "--topology", "dgx-h100", "--nodes", "2", "--op", "all_to_all",
                   "--matrix", str(f), "--ranks", "0,1,8,9")
    assert res["op"] == "all_to_all_v" and res["algo"] == "direct"
    assert res["bytes"] == pytest.approx(3e6 / 4)  # nccl-tests S: mean bytes per rank
    down = topo.route(topo.gpus[1], topo.gpus[0])[-1]  # rank 0's NVSwitch downlink
    assert res["time_s"] >= 3e6 / topo.capacity_Bps[down]


def test_hierarchical_all_to_all_uses_fewer_network_flows():
    topo = load_topology("dgx-h100", nodes=4)
    rng = np.random.default_rng(0)
    m = rng.integers(1, 5, size=(32, 32)) * 1e5
    d = simulate_collective(topo, "all_to_all", matrix=m, algo="direct")
    h = simulate_collective(topo, "all_to_all", matrix=m, algo="hierarchical")
    assert d["flows"] == 32 * 31
    # leg 1: 3 remote nodes + 7 local peers per rank; leg 2: 7 local peers per relay;
    # pipelined in PIPELINE_CHUNKS chunks, each leg's transfers start once per chunk
    # (in the middle phases a relay's leg-2 transfer to a local peer merges with its
    # own leg-1 transfer to that peer, the same (src, dst) pair)
    C = PIPELINE_CHUNKS
    assert h["flows"] == C * 32 * (3 + 7) + 32 * 7
    assert d["bytes"] == h["bytes"] == pytest.approx(m.sum() / 32)


def test_analytical_model_runs(capsys):
    res = run_json(capsys, "--topology", "dgx-h100", "--nodes", "1", "--op", "broadcast",
                   "--bytes", "1MB", "--algo", "tree", "--model", "analytical")
    assert res["model"] == "analytical" and res["time_s"] > 0
    assert res["busbw_GBps"] == pytest.approx(res["algbw_GBps"])


@pytest.mark.parametrize("extra, field", [
    (["--op", "all_scatter", "--bytes", "1MB"], "op"),
    (["--op", "all_gather", "--bytes", "1MB", "--algo", "tree"], "algo"),
    (["--op", "all_reduce", "--bytes", "lots"], "--bytes"),
    (["--op", "all_reduce"], "--bytes"),
    (["--op", "all_reduce", "--bytes", "1MB", "--ranks", "0-8"], "--ranks"),
    (["--op", "all_reduce", "--bytes", "1MB", "--ranks", "3-1"], "--ranks"),
    (["--op", "all_reduce", "--bytes", "1MB", "--model", "packet"], "--model"),
    (["--op", "all_reduce", "--bytes", "1MB", "--ranks", "0,1,8", "--algo", "hierarchical",
      "--nodes", "2"], "ranks"),
])
def test_bad_flags_exit_2_with_one_line(capsys, extra, field):
    assert main(["collective", "--topology", "dgx-h100", "--nodes", "1", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err and "expected" in err


@pytest.mark.parametrize("content, field", [
    ("[[0, 1], [1, 0]]", "matrix"),              # 2x2 for 8 ranks
    ("[[0, 1, 2]", "matrix"),                    # malformed JSON
    ('{"rows": []}', "matrix"),                  # wrong shape of document
    (json.dumps([[0] * 8] * 7 + [[0] * 7 + [-1]]), "matrix[7][7]"),  # negative
])
def test_bad_matrix_file_exit_2_naming_file_and_field(tmp_path, capsys, content, field):
    f = tmp_path / "m.json"
    f.write_text(content)
    assert main(["collective", "--topology", "dgx-h100", "--nodes", "1", "--op", "all_to_all",
                 "--matrix", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(f) in err and field in err


def test_unknown_topology_exit_2(capsys):
    assert main(["collective", "--topology", "no-such-cluster", "--op", "all_reduce",
                 "--bytes", "1MB"]) == 2
    assert "no-such-cluster" in capsys.readouterr().err


def test_two_node_ring_all_reduce_spreads_over_every_nic():
    import simpy

    from moesim.collectives import CollectiveSpec, Communicator
    from moesim.collectives.simulate import rank_hosts
    from moesim.network import FlowNetwork

    topo = load_topology("dgx-h100", nodes=2)
    S, n, L = 2**30, 16, 8
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    comm = Communicator(env, net, topo.gpus, rank_host=rank_hosts(topo))
    spec = CollectiveSpec("all_reduce", tuple(range(n)), nbytes=S)
    events = [comm.join("ar", r, spec) for r in range(n)]
    env.run()
    assert all(ev.processed for ev in events)
    lb = net.link_bytes()
    ib_out = [i for i, name in enumerate(topo.link_names)
              if topo.link_kinds[i] == "ib" and ".nic" in name.split("->")[0]]
    assert len(ib_out) == 2 * L  # one NIC uplink per GPU
    # 8 rings, each crossing each way once per step: 2(n-1) steps of S/(n·L) per NIC
    np.testing.assert_allclose(lb[ib_out], 2 * (n - 1) * S / (n * L))


def test_benchmark_runs_on_a_tiny_cluster(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_collectives.py"
    spec = importlib.util.spec_from_file_location("bench_collectives", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    m = bench.skewed_matrix(16, 1e6, np.random.default_rng(0))
    np.testing.assert_allclose(m.sum(axis=1), 1e6)  # every rank sends --per-rank bytes
    np.testing.assert_array_equal(m, bench.skewed_matrix(16, 1e6, np.random.default_rng(0)))
    assert bench.main(["--gpus", "16", "--sizes", "8,16", "--repeats", "1", "--exact-gpus", "16",
                       "--rtols", "1e-2", "--algo", "hierarchical", "--per-rank", "1MiB"]) == 0
    out = capsys.readouterr().out
    # pipelined: 8 chunks of leg 1, 16·(1 + 7) transfers each, then the last chunk of
    # leg 2 (16·7); the middle chunks of leg 2 merge with leg-1 transfers of the same pair
    assert "16 GPUs, 1136 flows, coalesce_rtol=0 (exact)" in out  # 8·16·(1 + 7) + 16·7
    assert "16 GPUs, 1136 flows, coalesce_rtol=0.01: wall median" in out
    assert "fitted exponent" in out


def test_help_and_errors_list_every_op(capsys):
    """Issue 20 item 12: `collective --help` lists every --op the command takes
    (dist_topk included), and an unknown one is refused naming all of them."""
    assert main(["collective", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    ops = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv",
           "all_to_all", "all_to_all_v", "ep_dispatch", "ep_combine", "dist_topk")
    op_help = help_text.split("options:", 1)[1].split("--op OP", 1)[1].split("--bytes", 1)[0]
    for op in ops:
        assert op in op_help, op
    assert main(["collective", "--topology", "dgx-h100", "--op", "foo"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "command line: --op" in err
    assert all(op in err for op in ops)
