"""routing.placement (EPLB) on a shipped scenario: the step's per-GPU load equals the
plan's own figure; expert-load files in the shapes SGLang and Megatron write; bad input
one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from moesim.gating.loads import layer_table, read_loads
from moesim.program.build import Builder
from moesim.wiring import resolve_path
from tests._util import refused

REPO = Path(__file__).resolve().parents[1]
HOT = yaml.safe_load((REPO / "scenarios" / "hot-expert.yaml").read_text())


def test_hot_expert_after_eplb_has_the_plans_max_over_mean():
    # hot-expert: 8 experts on EP8, expert 3 takes 40 % of the assignments; 8 redundant
    # slots, loads = the router's own draw of the step. Each source splits its n tokens
    # for an expert over its R replicas as n // R or n // R + 1, so each GPU's tokens
    # differ from the plan's (load / R per replica) by less than sources x micro-batches
    # x slots per GPU = 8 x 2 x 2 = 32 tokens.
    res = resolve_path("hot-expert", ["routing.placement={kind: eplb, redundant: 8, "
                                      "loads: trace}"])
    b = Builder(res, 0)
    plan = b.routes.placement.plan
    assert plan.slots_per_gpu == 2 and plan.mode == "hierarchical"   # one node
    group = tuple(res.layout.ep_groups[0])
    m = res.scenario.schedule.microbatches
    for j, layer in enumerate(b.routes.moe_layers):
        got = sum(b.routes.route(0, group, layer, mb).rank_expert_tokens.sum(axis=1)
                  for mb in range(m))
        assert np.abs(got - plan.gpu_load[j]).max() < 32
        bound = 2 * 32 / got.mean()
        assert abs(got.max() / got.mean() - plan.max_over_mean[j]) <= bound
        assert plan.max_over_mean[j] < 1.05        # from 3.2 without EPLB


def test_policy_loads_replicate_the_hot_expert_by_hand():
    # expert 3's inclusion probability 2 x 0.4 = 0.8, the others 2 x 0.6 / 7 = 0.1714;
    # 8 redundant slots: expert 3's load per replica 0.8 / R falls below 0.1714 only at
    # R = 5 (0.16), so it gets 4 extra replicas and 4 others one each (the lowest ids on
    # ties: 0, 1, 2, 4)
    res = resolve_path("hot-expert", ["routing.placement={kind: eplb, redundant: 8}"])
    plan = Builder(res, 0).routes.placement.plan
    assert plan.logcnt[0].tolist() == [2, 2, 2, 5, 2, 1, 1, 1]


def test_sglang_long_csv(tmp_path):
    p = tmp_path / "expert_distribution_rank0.csv"
    p.write_text("layer_id,expert_id,count\n3,0,10\n3,2,5\n4,1,7\n3,0,1\n")
    arr, sparse = read_loads(p, "s.yaml")
    assert sparse and arr.tolist() == [[0, 0, 0], [0, 0, 0], [0, 0, 0], [11, 0, 5],
                                       [0, 7, 0]]
    # rows are the model's layers (5 here, MoE layers 3 and 4), missing experts zeros
    out = layer_table(arr, sparse, n_experts=4, blocks=5, moe_layers=[3, 4], where="f")
    assert out.tolist() == [[11, 0, 5, 0], [0, 7, 0, 0]]


def test_sglang_logical_count_json_sums_the_buffered_steps(tmp_path):
    p = tmp_path / "lc.json"
    p.write_text(json.dumps({"logical_count": [[[1, 2], [3, 4]], [[10, 20], [30, 40]]]}))
    arr, sparse = read_loads(p, "s.yaml")
    assert not sparse and arr.tolist() == [[11, 22], [33, 44]]


def test_summary_json_and_megatron_rows(tmp_path):
    p = tmp_path / "summary.json"
    p.write_text(json.dumps({"experts": {"tokens_per_expert": [[1, 2, 3]]}}))
    assert read_loads(p, "s.yaml")[0].tolist() == [[1, 2, 3]]
    q = tmp_path / "megatron.csv"
    q.write_text("5,6,7\n1,1,1\n")
    arr, _ = read_loads(q, "s.yaml")
    # one row per layer of the model: the MoE layers' rows are taken; one row: all
    assert layer_table(arr, False, n_experts=3, blocks=2, moe_layers=[1],
                       where="f").tolist() == [[1, 1, 1]]
    assert layer_table(arr[:1], False, n_experts=3, blocks=2, moe_layers=[0, 1],
                       where="f").tolist() == [[5, 6, 7], [5, 6, 7]]


# ------------------------------------------------------------------ bad input, exit 2

def _scenario(tmp_path, placement: dict) -> Path:
    data = {**HOT, "routing": {**HOT["routing"], "placement": placement}}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _refused(capsys, path, *names, command=("run", "--no-files", "--quiet")):
    return refused(capsys, [command[0], path, *command[1:]], *names)


def test_more_redundant_experts_than_slots(capsys, tmp_path):
    # 8 experts on 8 GPUs: at most 8 x 7 = 56 redundant (every expert on every GPU);
    # `moesim memory` prices the replicas (a training step: test_eplb_training)
    line = _refused(capsys, _scenario(tmp_path, {"kind": "eplb", "redundant": 64}),
                    "s.yaml", "routing.placement.redundant", "56", "got 64",
                    command=("memory",))
    assert "every expert on every GPU" in line
    _refused(capsys, _scenario(tmp_path, {"kind": "eplb", "redundant": 3}),
             "routing.placement.redundant", "multiple of ep = 8", "got 3", command=("memory",))


@pytest.mark.parametrize("text, expected", [
    ("1,2,3,4,5,6,7,8\n" * 3, "1 or 4 rows x 8 experts"),      # 3 rows, 4 MoE layers
    ("1,2,3,4,5,6,7\n", "1 or 4 rows x 8 experts"),             # 7 experts, not 8
    ("1,2,3,-4,5,6,7,8\n", "counts >= 0"),
    ("1,2,3,nan,5,6,7,8\n", "finite counts"),
])
def test_a_load_file_of_the_wrong_shape_or_values(capsys, tmp_path, text, expected):
    (tmp_path / "loads.csv").write_text(text)
    _refused(capsys, _scenario(tmp_path, {"kind": "eplb", "redundant": 0,
                                          "loads": "loads.csv"}),
             "loads.csv", "routing.placement.loads", expected)


def test_bad_keys_and_modes(capsys, tmp_path):
    _refused(capsys, _scenario(tmp_path, {"kind": "eplb", "mode": "local"}),
             "routing.placement.mode", "auto, hierarchical, global")
    _refused(capsys, _scenario(tmp_path, {"kind": "eplb", "groups": 3}),
             "routing.placement.groups", "a divisor of the 8 experts")
    _refused(capsys, _scenario(tmp_path, {"kind": "lplb"}), "routing.placement.kind", "eplb")
    _refused(capsys, _scenario(tmp_path, {"kind": "eplb", "loads": "missing.csv"}),
             "routing.placement.loads", "an existing counts file")


def test_redundant_experts_with_deepep_normal_kernels_are_refused(capsys):
    # the normal kernels' plan sends a token's copies to each expert's one home GPU
    # (serving; a training step refuses them the same way)
    refused(capsys, ["serve", "mixtral-8x7b-serve", "--no-files", "--quiet", "--set",
                     "serve.ep_backend=deepep", "--set",
                     "routing.placement={kind: eplb, redundant: 8}"],
            "routing.placement.redundant", "DeepEP's normal kernels", "got 8")


def test_the_shipped_sample_load_file_replicates_expert_3():
    # scenarios/loads/hot-expert-sglang.csv: SGLang's form, 4 layers x 8 experts. Layer 0:
    # expert 3 has 52538, the others 11070 .. 11307. Per replica 52538 / 4 = 13134 > 11307
    # but / 5 = 10508 < 11247: expert 3 takes 4 of the 8 redundant slots, the 4 heaviest
    # others (5: 11307, 6: 11300, 4: 11257, 7: 11247) one each
    arr, sparse = read_loads(REPO / "scenarios" / "loads" / "hot-expert-sglang.csv", "s")
    assert sparse and arr.shape == (4, 8)
    assert arr[0].tolist() == [11220, 11133, 11070, 52538, 11257, 11307, 11300, 11247]
    res = resolve_path("hot-expert", ["routing.placement={kind: eplb, redundant: 8, "
                                      "loads: loads/hot-expert-sglang.csv}"])
    plan = Builder(res, 0).routes.placement.plan
    assert plan.logcnt[0].tolist() == [1, 1, 1, 5, 2, 2, 2, 2]
    assert plan.logcnt[:, 3].tolist() == [5] * 4


def test_hierarchical_needs_the_nodes_to_divide_the_groups():
    from moesim.errors import InputError
    from moesim.gating.config import EplbSpec
    from moesim.gating.eplb_placement import check_spec

    # 2 groups on 4 nodes: EPLB's hierarchical policy packs whole groups onto nodes
    with pytest.raises(InputError, match=r"routing.placement.mode: expected global, or "
                       r"groups \(2\) a multiple of the EP group's 4 nodes"):
        check_spec(EplbSpec(mode="hierarchical", groups=2), n_experts=8, ep=8, nodes=4,
                   source="s.yaml")
    # auto falls back to global there, and is hierarchical on 8 groups
    assert check_spec(EplbSpec(groups=2), n_experts=8, ep=8, nodes=4, source="s") == "global"
    assert check_spec(EplbSpec(groups=8), n_experts=8, ep=8, nodes=4,
                      source="s") == "hierarchical"
