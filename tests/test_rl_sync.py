"""Weight sync (moesim.rl.sync): bytes by hand for a small model, flows within link
capacities, an exact time on a two-GPU topology."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.model.presets import TOY
from moesim.rl.sync import (
    PCIE_Bps,
    holders,
    param_bytes,
    switch_cost,
    sync_flows,
    tensor_count,
    weight_sync,
)
from moesim.topology import load_topology
from tests._util import TWO_GPUS


def _toy(layers=1):
    import dataclasses
    return dataclasses.replace(TOY, layers=layers)


def test_parameter_bytes_and_tensors_by_hand():
    spec = _toy(1)
    # attention q, k, v, o: 4 x 512 x 512; two norms of 512; router 512 x 8;
    # 8 experts x 3 matrices x 512 x 1024; embedding and untied head 32000 x 512; final norm
    params = (4 * 512 * 512 + 2 * 512 + 512 * 8 + 8 * 3 * 512 * 1024
              + 2 * 32000 * 512 + 512)
    assert params == 46_405_120
    assert param_bytes(spec) == 2 * params
    assert tensor_count(spec) == (4 + 2 + 1 + 8 * 3) + 2 + 1


def test_qk_norm_adds_two_tensors_a_layer():
    import dataclasses
    # Qwen3's q_norm and k_norm per layer: 2 layers -> 4 more than without
    spec = dataclasses.replace(_toy(2), qk_norm=True)
    assert tensor_count(spec) == tensor_count(_toy(2)) + 4 == 2 * (4 + 2 + 2 + 1 + 8 * 3) + 3


def test_every_replica_receives_the_model_once():
    gpus = [f"g{i}" for i in range(16)]
    gather, chain = sync_flows(1000.0, gpus[8:12], gpus[:8], replica_gpus=2)
    assert sum(b for *_, b in gather) == pytest.approx(750.0)   # 3 of 4 shards to the root
    into = {}
    for _, dst, b in chain:
        r = gpus.index(dst) // 2
        into[r] = into.get(r, 0.0) + b
    assert into == {r: pytest.approx(1000.0) for r in range(4)}
    assert holders(gpus[8:], tp=2, pp=1, ep=4) == gpus[8:12]


def test_sync_on_two_gpus_is_one_flow_at_link_rate(tmp_path):
    import yaml
    topo_file = tmp_path / "two.yaml"
    topo_file.write_text(yaml.safe_dump(TWO_GPUS))
    topo = load_topology(str(topo_file))
    spec = _toy(1)
    solves = []

    def check(now, pair_flow, pair_link, rates):
        load = np.bincount(pair_link, weights=rates[pair_flow], minlength=len(topo.capacity_Bps))
        assert np.all(load <= np.asarray(topo.capacity_Bps) * (1 + 1e-9))
        solves.append(now)

    r = weight_sync(topo, spec, ["g0"], ["g1"], tp=1, pp=1, ep=1, replica_gpus=1,
                    per_tensor_s=1e-5, ipc=False, hbm_Bps=3.35e12, on_solve=check)
    path = topo.route("g0", "g1")
    cap = min(topo.capacity_Bps[i] for i in path)
    lat = sum(topo.latency_s[i] for i in path)
    nbytes = 2 * 46_405_120
    assert r.flow_s == pytest.approx(nbytes / cap + lat, rel=1e-9)
    assert r.time_s == pytest.approx(r.flow_s + 34 * 1e-5, rel=1e-12)
    assert r.bytes_per_replica == nbytes and r.gather_bytes == 0
    assert solves


def test_sync_over_a_cluster_respects_link_capacities():
    topo = load_topology("dgx-h100", nodes=2)
    gpus = list(topo.gpus)
    spec = _toy(2)
    seen = []

    def check(now, pair_flow, pair_link, rates):
        load = np.bincount(pair_link, weights=rates[pair_flow], minlength=len(topo.capacity_Bps))
        assert np.all(load <= np.asarray(topo.capacity_Bps) * (1 + 1e-9))
        seen.append(now)

    r = weight_sync(topo, spec, gpus[8:], gpus[:8], tp=1, pp=1, ep=4, replica_gpus=2,
                    per_tensor_s=0.0, ipc=False, hbm_Bps=3.35e12, on_solve=check)
    assert seen and r.bytes_per_replica == pytest.approx(param_bytes(spec))
    assert r.flows == 3 + 2 * 4      # 3 shards gathered, 2 chains of 4 replicas
    # each chain hop carries half the model over links no faster than the fastest
    assert r.flow_s >= param_bytes(spec) / 2 / max(topo.capacity_Bps)


def test_switch_cost_by_hand():
    spec = _toy(1)
    into, out = switch_cost(spec, pool_gpus=8, replica_gpus=2)
    one_way = (46_405_120 * 2 / 2 + 46_405_120 * 12 / 8) / PCIE_Bps
    assert into == pytest.approx(one_way) and out == pytest.approx(one_way)


def test_sharded_sync_sends_every_engine_gpu_its_share_from_every_holder():
    from moesim.rl.sync import sharded_flows
    gpus = [f"g{i}" for i in range(16)]
    flows = sharded_flows(1000.0, gpus[8:12], gpus[:8], replica_gpus=2)
    assert len(flows) == 4 * 8                        # every holder to every engine GPU
    assert [b for *_, b in flows] == [1000.0 / (4 * 2)] * 32
    into = {}
    for _, dst, b in flows:
        into[gpus.index(dst)] = into.get(gpus.index(dst), 0.0) + b
    assert into == {i: pytest.approx(500.0) for i in range(8)}     # 1/g of the model each
    sent = {}
    for src, _, b in flows:
        sent[src] = sent.get(src, 0.0) + b
    assert sent == {h: pytest.approx(1000.0) for h in gpus[8:12]}  # its shard, 4 replicas


def test_sharded_sync_on_a_cluster_within_link_capacities_and_faster_than_the_chain():
    topo = load_topology("dgx-h100", nodes=2)
    gpus = list(topo.gpus)
    spec = _toy(2)

    def check(now, pair_flow, pair_link, rates):
        load = np.bincount(pair_link, weights=rates[pair_flow], minlength=len(topo.capacity_Bps))
        assert np.all(load <= np.asarray(topo.capacity_Bps) * (1 + 1e-9))

    kw = dict(tp=1, pp=1, ep=4, replica_gpus=2, per_tensor_s=0.0, ipc=False,
              hbm_Bps=3.35e12, on_solve=check)
    chain = weight_sync(topo, spec, gpus[8:], gpus[:8], **kw)
    sharded = weight_sync(topo, spec, gpus[8:], gpus[:8], sharded=True, **kw)
    assert sharded.flows == 4 * 8 and sharded.gather_bytes == 0
    assert sharded.bytes_per_replica == pytest.approx(param_bytes(spec))
    # all of it crosses from node 1 to node 0: at best over every NIC of a node at once
    nic = topo.capacity_Bps[topo.route(gpus[8], gpus[0])[0]]
    assert sharded.flow_s >= 4 * param_bytes(spec) / (8 * nic) * (1 - 1e-9)
    assert sharded.flow_s < chain.flow_s
