"""Replicated experts in a training step (EPLB's redundant experts, ``routing.replicate``):
tokens split among the replicas, the replicas' gradient all-reduce before the
data-parallel reduce, their bytes in the EDP bucket and the optimizer. Hand-worked on a
tiny topology: GPUs on one switch, 100 GB/s and 1 us per GPU link (2 us GPU to GPU).

The toy model's expert: 3 matrices of 512 x 1024 = 1,572,864 parameters, 3,145,728 B
of BF16 gradient. A ring all-reduce of B bytes on n GPUs runs 2 (n - 1) steps of B / n
bytes per GPU link, each step B / n / 100 GB/s + 2 us.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from moesim.program import recipe
from moesim.program.build import Builder
from moesim.wiring import resolve_path, simulate
from tests._util import refused

EXPERT_B = 3 * 512 * 1024 * 2            # 3,145,728 B: one toy expert's BF16 gradient
REPLICATE = {"replicate": [{"expert": 0, "ranks": [2]}]}
EPLB4 = {"placement": {"kind": "eplb", "redundant": 4}}


def _topo(n: int) -> dict:
    return {"name": "switch",
            "nodes": [{"id": f"g{i}", "kind": "gpu", "host": 0, "local": i} for i in range(n)]
            + [{"id": "sw", "kind": "nvswitch"}],
            "links": [{"src": f"g{i}", "dst": "sw", "kind": "nvlink", "bandwidth_GBps": 100,
                       "latency_us": 1} for i in range(n)]}


def _scenario(tmp_path, gpus: int, ep: int, routing: dict, **over):
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(_topo(gpus)))
    data = {"name": "hand", "seed": 3,
            "cluster": {"topology": str(tmp_path / "t.yaml"), "device": "H100",
                        "network": "flow"},
            "model": {"preset": "toy", "layers": 1},
            "routing": {"kind": "hot", "hot_experts": [0], "hot_fraction": 0.45, **routing},
            "parallel": {"tp": 1, "pp": 1, "ep": ep},
            "schedule": {"kind": "1f1b", "microbatches": 1, "micro_batch_size": 1,
                         "seq_len": 512},
            "compute": {"kind": "roofline", "model": "roofline"},
            # buckets after the whole backward: the replicas' all-reduce has the links alone
            "overlap": {"dp_overlap": False}}
    for k, v in over.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _replica_spans(r):
    return [s for s in r.spans if s.name.endswith(".replicas") and s.kind == "dp"]


def test_one_replica_all_reduce_by_hand(tmp_path):
    # expert 0 (home GPU 0) also on GPU 2: one all-reduce of its gradient on {0, 2}:
    # 2 steps of 1,572,864 B / 100 GB/s + 2 us = 17.72864 us each, 35.45728 us
    r = simulate(_scenario(tmp_path, 4, 4, REPLICATE), engine="exact")
    sp = _replica_spans(r)
    assert sorted(s.rank for s in sp) == [0, 2]
    for s in sp:
        assert s.peers == (0, 2) and s.bytes == EXPERT_B
        assert s.dur_s == pytest.approx(2 * (EXPERT_B / 2 / 100e9 + 2e-6), rel=1e-9)
        assert s.dur_s == pytest.approx(35.45728e-6, rel=1e-9)
    # it runs before the dense gradients' all-reduce of GPUs 0 and 2
    dense = {s.rank: s for s in r.spans if s.name == "dp.bucket0.dense" and s.kind == "dp"}
    assert all(dense[s.rank].start_s >= s.end_s for s in sp)


def test_eplb_redundant_experts_all_reduce_by_hand(tmp_path):
    # policy loads: expert 0's inclusion probability 2 x 0.45 = 0.9, the others'
    # 2 x 0.55 / 7 = 0.157; four redundant slots all go to expert 0 (0.9 / 5 = 0.18 >
    # 0.157), so its 5 replicas span all 4 GPUs (one GPU holds two, summed locally):
    # one all-reduce on 4 GPUs, 6 steps of 786,432 B / 100 GB/s + 2 us = 59.18592 us
    for engine in ("exact", "fast"):
        r = simulate(_scenario(tmp_path, 4, 4, EPLB4), engine=engine)
        assert r.summary["eplb"]["layers"][0]["replicas"] == {"0": 5}
        if engine == "exact":
            sp = _replica_spans(r)
            assert sorted(s.rank for s in sp) == [0, 1, 2, 3]
            for s in sp:
                assert s.peers == (0, 1, 2, 3) and s.bytes == EXPERT_B
                assert s.dur_s == pytest.approx(6 * (EXPERT_B / 4 / 100e9 + 2e-6), rel=1e-9)
                assert s.dur_s == pytest.approx(59.18592e-6, rel=1e-9)
            exact = r
    # the fast engine prices the same plan: same step, same dp time on every rank
    assert r.step_time_s == pytest.approx(exact.step_time_s, rel=1e-9)
    for a, b in zip(r.summary["per_rank"], exact.summary["per_rank"], strict=True):
        assert a["breakdown_s"]["dp"] == pytest.approx(b["breakdown_s"]["dp"], rel=1e-9)


def test_the_edp_bucket_and_optimizer_carry_the_replicas(tmp_path):
    # 8 GPUs, EP4: EDP 2 (GPU i and i + 4 hold the same experts). EPLB with 4 redundant:
    # 3 slots per GPU, so each EDP bucket carries 3 experts' gradients, 9,437,184 B,
    # against 2 experts, 6,291,456 B, without; the replica all-reduce runs on each EP
    # group ({0..3} and {4..7}) before it, and the optimizer steps 3 experts
    ops, opt = {}, {}
    for name, routing in (("plain", {}), ("eplb", EPLB4)):
        res = resolve_path(_scenario(tmp_path, 8, 4, routing))
        b = Builder(res, 0, "independent", False)
        plan = b.build()
        ops[name] = {r: [(o.name, o.coll.group, o.nbytes) for o in prog
                         if o.kind == "dp"] for r, prog in enumerate(plan.programs)}
        opt[name] = [o.flops for o in plan.programs[0] if o.name == "opt.adam"][0]
    per = {op[0]: op for op in ops["plain"][0]}
    assert per["dp.bucket0.experts"][1:] == ((0, 4), 2 * EXPERT_B)
    assert [o[0] for o in ops["eplb"][0]] == ["dp.bucket0.replicas", "dp.bucket0.dense",
                                              "dp.bucket0.experts"]
    for r in range(8):
        rep, dense, experts = ops["eplb"][r]
        group = (0, 1, 2, 3) if r < 4 else (4, 5, 6, 7)
        assert rep[1:] == (group, EXPERT_B)
        assert experts[1:] == ((r % 4, r % 4 + 4), 3 * EXPERT_B) and 3 * EXPERT_B == 9_437_184
        assert dense == ops["plain"][r][0]
    # the optimizer steps one more expert (its own replica's Adam state)
    one = sum(k.flops for k in recipe.optimizer(EXPERT_B // 2))
    assert opt["eplb"] - opt["plain"] == pytest.approx(one, rel=1e-12)


def test_tokens_are_conserved_across_replicas(tmp_path):
    # every routed (token, expert) is computed once: summed over the replicas' GPUs, each
    # expert's tokens equal its routed count; expert 0's 5 replicas split its tokens
    # evenly (every source sends n // 5 to each, the n % 5 left over rotated by source)
    r = simulate(_scenario(tmp_path, 4, 4, EPLB4), engine="exact")
    routed = np.array(r.summary["experts"]["tokens_per_expert"])[0]     # the one MoE layer
    assert routed.sum() == 4 * 512 * 2              # 512 tokens per GPU x 4 GPUs x top-2
    computed = np.zeros(8, dtype=np.int64)
    per_gpu0 = {}
    for s in r.spans:
        if s.name == "fwd.experts":
            for e, n in s.args["expert_tokens"].items():
                computed[int(e)] += n
            per_gpu0[s.rank] = s.args["expert_tokens"][0]
    assert (computed == routed).all()
    # GPU 0 holds two replicas of expert 0, the others one: 2/5 and 1/5 of its tokens,
    # each replica within one token per source (4 sources) of an even fifth
    shares = np.array([per_gpu0[g] for g in range(4)])
    assert shares.sum() == routed[0]
    assert np.abs(shares - routed[0] * np.array([2, 1, 1, 1]) / 5).max() <= 2 * 4


def test_same_seed_same_bytes(tmp_path):
    path = _scenario(tmp_path, 4, 4, EPLB4)
    a, b = (simulate(path, engine="exact") for _ in range(2))
    for s in (a.summary, b.summary):
        s.pop("sim_wall_s")                    # the simulator's own wall time
    assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)
    assert (a.links.bytes == b.links.bytes).all()
    assert [s.bytes for s in _replica_spans(a)] == [s.bytes for s in _replica_spans(b)]


def test_bad_input_is_one_line(capsys, tmp_path):
    # 8 experts on 4 GPUs: at most 8 x 3 = 24 redundant experts
    path = _scenario(tmp_path, 4, 4, {"placement": {"kind": "eplb", "redundant": 28}})
    line = refused(capsys, ["run", path, "--no-files", "--quiet"], "s.yaml",
                   "routing.placement.redundant", "at most experts x (ep - 1)", "24", "got 28")
    assert "every expert on every GPU" in line
    refused(capsys, ["run", _scenario(tmp_path, 4, 4, {"placement": {"kind": "eplb",
                                                                      "redundant": 3}}),
                     "--no-files", "--quiet"],
            "routing.placement.redundant", "multiple of ep = 4", "got 3")
    # ZeRO-3's expert gathers and DualPipe's gradient stage are not planned with replicas
    refused(capsys, ["run", _scenario(tmp_path, 4, 4, EPLB4, parallel={"zero": 3}),
                     "--no-files", "--quiet"],
            "routing.placement.redundant", "ZeRO-3 or a DualPipe schedule", "got 4")
    refused(capsys, ["run", _scenario(tmp_path, 4, 4, REPLICATE, parallel={"zero": 3}),
                     "--no-files", "--quiet"], "routing.replicate", "got 1")


def test_both_engines_run_the_same_replica_plan_bucket_by_bucket(tmp_path):
    # 2 MoE layers, a 1 MB bucket (one per layer), 8 GPUs in two EP groups of 4;
    # expert 0 on GPUs {0, 2, 3} of its group, expert 5 on {0, 2}: per bucket and EP group
    # two all-reduces, in (layer, GPUs) order; the exact and fast steps agree
    rep = {"replicate": [{"expert": 0, "ranks": [2, 3]}, {"expert": 5, "ranks": [0]}]}
    path = _scenario(tmp_path, 8, 4, rep, model={"layers": 2},
                     schedule={"dp_bucket_MB": 1, "microbatches": 2})
    exact, fast = (simulate(path, engine=e) for e in ("exact", "fast"))
    got = sorted({(s.name, s.peers) for s in _replica_spans(exact)})
    assert got == [(f"dp.bucket{b}.replicas", g) for b in (0, 1)
                   for g in ((0, 2), (0, 2, 3), (4, 6), (4, 6, 7))]
    assert fast.step_time_s == pytest.approx(exact.step_time_s, rel=1e-12)
    for a, b in zip(fast.summary["per_rank"], exact.summary["per_rank"], strict=True):
        assert a["breakdown_s"]["dp"] == pytest.approx(b["breakdown_s"]["dp"], rel=1e-9)
