"""Identical-replica shortcut (one representative per expert-data-parallel class)
against the full simulation of every rank, on configurations small enough for both.

Both runs use ``replicas="identical"`` (the same token sampling in every replica);
the only difference is whether the mirrors are simulated one by one.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.layout.mesh import Layout
from moesim.program.replicas import replica_map
from moesim.trace.report import jsonable
from moesim.wiring import simulate

# 128 GPUs, 4 layers: DeepSeek-V3 shape (H800, EP over 2 nodes, node-limited routing,
# fp8 dispatch, EP overlap, ZeRO-1), PP2, EP16, DP64 -> 4 replicas of each EP group
DEEPSEEK_128 = ("deepseek-v3-2048", ["model.mtp_layers=0",       # as cut: no MTP, even split
                                     "parallel.decoder_first_pipeline_num_layers=null",
                                     "parallel.decoder_last_pipeline_num_layers=null",
                                     "schedule.kind=1f1b", "overlap.kind=none",
                                     "parallel.ep_backend.kind=nccl",
                                     "engine.mode=exact", "overlap.ep_comm_overlap=true",
                                     "cluster.nodes=16", "parallel.pp=2", "parallel.ep=16",
                                     "model.layers=4", "model.first_dense_layers=0",
                                     "schedule.microbatches=4", "routing.max_nodes=null"])
# 128 GPUs: Mixtral, interleaved PP4 (v=2), EP8 inside each node, DP32 -> edp 4
MIXTRAL_128 = ("mixtral-8x7b-64gpu", ["engine.mode=exact", "cluster.nodes=16",
                                      "model.layers=8", "schedule.microbatches=4"])


def per_rank(result, key):
    return np.array([row["breakdown_s"][key] for row in result.summary["per_rank"]])


@pytest.mark.slow
@pytest.mark.parametrize("case", [DEEPSEEK_128, MIXTRAL_128], ids=["deepseek128", "mixtral128"])
def test_representatives_match_full_simulation(case):
    name, over = case
    full = simulate(name, over, replicas="identical", dedup=False, record_series=False)
    fast = simulate(name, over, replicas="identical", record_series=False)
    world = full.n_ranks
    assert world == 128
    sc = fast.summary["shortcuts"]
    assert [s["name"] for s in sc] == ["identical_replicas"]
    assert sc[0]["simulated_ranks"] == world // 4   # edp 4: one rank in four simulated
    assert full.summary["shortcuts"] == []
    # the fast path really simulated fewer ranks
    assert len({s.rank for s in fast.spans}) == world // 4
    assert len({s.rank for s in full.spans}) == world
    # step time, mean breakdown and per-rank stall totals within 1 %
    step = full.step_time_s
    assert fast.step_time_s == pytest.approx(step, rel=0.01)
    for k, v in full.summary["breakdown_s"].items():
        assert fast.summary["breakdown_s"][k] == pytest.approx(v, abs=0.01 * step), k
    for k in ("stall", "bubble", "compute"):
        np.testing.assert_allclose(per_rank(fast, k), per_rank(full, k), rtol=0.01,
                                   atol=1e-3 * step)
    assert per_rank(full, "stall").sum() > 0           # there is something to compare
    # statistics count every rank: routed tokens, FLOPs, per-rank memory
    fe, ue = fast.summary["experts"], full.summary["experts"]
    for k in ue:   # counts exactly; the load-balancing loss up to summation order
        if k.startswith("lb_loss"):
            np.testing.assert_allclose(fe[k], ue[k], rtol=1e-12)
        else:
            assert fe[k] == ue[k], k
    assert fast.summary["model_flops"] == pytest.approx(full.summary["model_flops"], rel=1e-12)
    assert fast.summary["memory"] == full.summary["memory"]


def test_identical_equals_independent_without_replicas(tmp_path):
    """edp = 1: nothing to share; identical draws exactly what independent draws."""
    strip = lambda s: json.dumps(jsonable({k: v for k, v in s.items()  # noqa: E731
                                           if k not in ("sim_wall_s", "replicas")}))
    a = simulate("hot-expert", replicas="independent")
    b = simulate("hot-expert", replicas="identical")
    assert strip(a.summary) == strip(b.summary)
    assert b.summary["shortcuts"] == [] and b.summary["replicas"] == "identical"


def test_replica_map_follows_layout_groups():
    # worked example of docs/scenarios.md: world 16, tp2 pp2 dp4 ep2 etp2 -> expert-dp (0,4) ...
    m = replica_map(Layout(world=16, tp=2, pp=2, dp=4, ep=2, etp=2))
    assert m.rep.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 8, 9, 10, 11, 8, 9, 10, 11]
    assert m.mirrors == {0: (4,), 1: (5,), 2: (6,), 3: (7,), 8: (12,), 9: (13,), 10: (14,),
                         11: (15,)}
    assert m.representatives == [0, 1, 2, 3, 8, 9, 10, 11]


def test_identical_replicas_share_routing_and_mirrors_report_their_representative():
    over = ["engine.mode=exact", "cluster.nodes=4", "model.layers=8",   # 32 GPUs, edp 2
            "schedule.microbatches=4"]
    r = simulate("mixtral-8x7b-64gpu", over, replicas="identical", record_series=False)
    assert r.n_ranks == 32
    rows = r.summary["per_rank"]
    m = replica_map(Layout(world=32, pp=4, dp=8, ep=8))
    for rep, mirrors in m.mirrors.items():
        for q in mirrors:
            assert rows[q]["breakdown_s"] == rows[rep]["breakdown_s"]
            assert (r.summary["memory"]["per_rank"][q]["peak_bytes"]
                    == r.summary["memory"]["per_rank"][rep]["peak_bytes"])
    # conservation: every routed assignment of every replica is counted once
    # 4096 tokens x top-2 x dp 8 x 4 micro-batches per MoE layer
    tok = np.array(r.summary["experts"]["tokens_per_expert"])
    assert (tok.sum(axis=1) == 4096 * 2 * 8 * 4).all()


def test_unknown_replica_mode_is_an_input_error():
    with pytest.raises(InputError) as e:
        simulate("toy-cpu", replicas="clones")
    assert "engine.replicas" in str(e.value)


def test_engine_section_sets_replicas_and_coalescing():
    r = simulate("toy-cpu", ["engine.replicas=identical", "engine.coalesce_rtol=0.01"])
    assert r.summary["replicas"] == "identical"
    with pytest.raises(InputError) as e:
        simulate("toy-cpu", ["engine.coalesce_rtol=2"])
    assert "engine.coalesce_rtol" in str(e.value)
