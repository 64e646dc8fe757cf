"""EPLB (moesim.gating.eplb): replicas and placement worked out by hand for both modes,
DeepSeek's published example, and the plan as the routing uses it."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.gating.eplb import balanced_packing, rebalance, replicate_experts
from moesim.gating.placement import Placement

# one layer, 4 experts: expert 0 is hot
W = np.array([[6.0, 2.0, 1.0, 1.0]])


def test_balanced_packing_heaviest_first_into_the_lightest_pack_with_room():
    # 5, 4, 3, 2 into 2 packs of 2: 5 -> 0, 4 -> 1, 3 -> 1 (4 < 5), 2 -> 0 (1 is full)
    pack, pos = balanced_packing(np.array([[2.0, 5.0, 3.0, 4.0]]), 2)
    assert pack.tolist() == [[0, 0, 1, 1]]
    assert pos.tolist() == [[1, 0, 1, 0]]


def test_replication_gives_each_slot_to_the_highest_load_per_replica():
    # 6/1 = 6 is highest -> expert 0 (now 3 each); 3 > 2 -> expert 0 again (2 each)
    phy2log, replica, logcnt = replicate_experts(W, 6)
    assert phy2log.tolist() == [[0, 1, 2, 3, 0, 0]]
    assert replica.tolist() == [[0, 0, 0, 0, 1, 2]]
    assert logcnt.tolist() == [[3, 1, 1, 1]]


def test_global_mode_by_hand():
    # 6 slots on 2 GPUs (3 each). Replicas' loads [2, 2, 1, 1, 2, 2] (expert 0: 6 / 3);
    # packed heaviest first (slots 0, 1, 4, 5, then 2, 3), lowest GPU on ties:
    # slot 0 -> GPU 0, 1 -> GPU 1, 4 -> GPU 0, 5 -> GPU 1, 2 -> GPU 0 (4 = 4), 3 -> GPU 1
    plan = rebalance(W, slots=6, gpus=2, nodes=2, groups=1)
    assert plan.mode == "global"            # 2 nodes do not divide 1 group
    assert plan.phy2log.tolist() == [[0, 0, 2, 1, 0, 3]]
    assert plan.logcnt.tolist() == [[3, 1, 1, 1]]
    assert plan.gpu_load.tolist() == [[5.0, 5.0]]       # 2 + 2 + 1 each
    assert plan.max_over_mean.tolist() == [1.0]
    assert plan.holders(0) == ((0, 0, 1), (1,), (0,), (1,))


def test_hierarchical_mode_by_hand():
    # groups {0, 1} (load 8) and {2, 3} (load 2), one per node; each node replicates
    # within its 3 slots: node 0 [6, 2] -> expert 0 twice (6 > 2); node 1 [1, 1] ->
    # expert 2 twice (tie: lowest id). One GPU per node: node 0 holds 3 + 3 + 2 = 8,
    # node 1 holds 0.5 + 0.5 + 1 = 2: groups stay on their node, at a cost in balance.
    # In a GPU, slots in decreasing load (stable): node 0 shares [3, 2, 3] -> 0, 0, 1;
    # node 1 shares [0.5, 1, 0.5] (experts 2, 3, 2) -> 3, 2, 2
    plan = rebalance(W, slots=6, gpus=2, nodes=2, groups=2)
    assert plan.mode == "hierarchical"
    assert plan.phy2log.tolist() == [[0, 0, 1, 3, 2, 2]]
    assert plan.logcnt.tolist() == [[2, 1, 2, 1]]
    assert plan.gpu_load.tolist() == [[8.0, 2.0]]
    assert plan.max_over_mean.tolist() == [1.6]          # 8 / 5
    forced = rebalance(W, slots=6, gpus=2, nodes=2, groups=2, mode="global")
    assert forced.phy2log.tolist() == [[0, 0, 2, 1, 0, 3]]


def test_deepseek_readme_example():
    # github.com/deepseek-ai/EPLB README.md (commit d52c72d5): 2 layers, 12 experts,
    # 4 groups, 16 replicas on 2 nodes of 4 GPUs; its printed phy2log
    weight = np.array([[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
                       [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]])
    plan = rebalance(weight, slots=16, gpus=8, nodes=2, groups=4)
    assert plan.mode == "hierarchical"
    assert plan.phy2log.tolist() == [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                                     [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]
    # every replica accounted for: each layer's GPU loads add up to its total load
    assert plan.gpu_load.sum(axis=1).tolist() == pytest.approx(weight.sum(axis=1).tolist())


def test_eplb_placement_splits_each_expert_evenly_over_its_replicas():
    # the global plan above: expert 0 on GPU 0 twice and GPU 1 once
    pl = Placement(n_experts=4, ep=2, holders=((0, 0, 1), (1,), (0,), (1,)))
    kept = np.array([[3, 1, 1, 0], [3, 1, 0, 1]], dtype=np.int64)
    dispatch, rank_expert = pl.split_counts(kept, None)
    # expert 0: 3 tokens per source, one per replica: GPU 0 gets 2, GPU 1 gets 1
    assert rank_expert.tolist() == [[4, 0, 1, 0], [2, 2, 0, 1]]
    # source 0: GPU 0 gets 2 (expert 0) + 1 (expert 2); GPU 1 gets 1 + 1 (expert 1)
    assert dispatch.tolist() == [[3, 2], [2, 3]]


def test_even_split_rotates_the_leftovers_by_source():
    # 5 tokens over 3 holders: 1 each, the 2 left over to holders (src + j) mod 3
    pl = Placement(n_experts=2, ep=3, holders=((0, 1, 2), (1,)))
    kept = np.array([[5, 0], [5, 0], [5, 0]], dtype=np.int64)
    _, rank_expert = pl.split_counts(kept, None)
    # src 0 -> holders 0, 1; src 1 -> 1, 2; src 2 -> 2, 0: every holder 3 + 2 = 5
    assert rank_expert[:, 0].tolist() == [5, 5, 5]
    assert pl._split_one(np.array([5, 5, 5]), (0, 1, 2), None).tolist() == [
        [2, 2, 1], [1, 2, 2], [2, 1, 2]]
