"""Shared test helpers: a hand-checkable 2-GPU scenario."""

from __future__ import annotations

import simpy
import yaml

TWO_GPUS = {
    "name": "two-gpus",
    "nodes": [{"id": "g0", "kind": "gpu", "host": 0, "local": 0},
              {"id": "g1", "kind": "gpu", "host": 0, "local": 1},
              {"id": "sw", "kind": "nvswitch"}],
    "links": [{"src": "g0", "dst": "sw", "kind": "nvlink", "bandwidth_GBps": 100, "latency_us": 1},
              {"src": "g1", "dst": "sw", "kind": "nvlink", "bandwidth_GBps": 100, "latency_us": 1}],
}


def two_gpu_scenario(tmp_path, **over):
    topo = tmp_path / "two.yaml"
    topo.write_text(yaml.safe_dump(TWO_GPUS))
    data = {
        "name": "hand", "seed": 3,
        "cluster": {"topology": str(topo), "device": "H100", "network": "flow"},
        "model": {"preset": "toy", "layers": 1},
        "routing": {"kind": "hot", "hot_experts": [0], "hot_fraction": 0.45},
        "parallel": {"tp": 1, "pp": 1, "ep": 2},
        "schedule": {"kind": "1f1b", "microbatches": 1, "micro_batch_size": 1, "seq_len": 512},
        "compute": {"kind": "roofline", "model": "roofline"},   # hand-computed roofline times
    }
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_flows(cls, links, flows, **kw):
    """Run ``flows`` [(start_s, src, dst, bytes)] through network model ``cls`` over
    ``links``; returns ({flow index: delivery time}, the network)."""
    env = simpy.Environment()
    net = cls(env, links, **kw)
    done: dict[int, float] = {}

    def start(i, t, src, dst, nbytes):
        yield env.timeout(t)
        yield net.transfer(src, dst, nbytes)
        done[i] = env.now

    for i, f in enumerate(flows):
        env.process(start(i, *f))
    env.run()
    return done, net


def refused(capsys, argv, *names, absent=()):
    """``moesim ARGV`` exits 2 with one stderr line holding every name (and none of
    ``absent``), nothing on stdout, no traceback; returns that line."""
    from moesim.cli import main

    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"moesim {argv[0]}: error: "), lines[0]
    assert "Traceback" not in err and out == ""
    for name in names:
        assert name in lines[0], (name, lines[0])
    for name in absent:
        assert name not in lines[0], (name, lines[0])
    return lines[0]


#: a toy TP4 step over two nodes of two H100 (its TP all-reduces cross the NICs)
TOY_TP4 = """
name: toy-tp4
cluster: {topology: dgx-h100, nodes: 2, params: {gpus_per_node: 2}}
model: {preset: toy}
routing: {kind: uniform}
parallel: {tp: 4, pp: 1, ep: 1}
schedule: {kind: 1f1b, microbatches: 1, micro_batch_size: 1, seq_len: 128}
compute: {kind: catalog}
"""
