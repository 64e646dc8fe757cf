"""The fast path's flow budget (issue 25): a step that would run more multi-host
all-to-all flows flow by flow than ``EXACT_FLOW_BUDGET`` times them by per-link
sharing instead and says so in its shortcuts; the estimate is worked out by hand."""

from __future__ import annotations

import moesim.engine.fast.engine as fast_engine
import moesim.engine.fast.network as fast_network
from moesim.wiring import simulate

#: deepseek-v3-2048 ships DeepSeek's MTP module and its first/last stage split; the
#: cuts below take them off (a pp 2 cut of a few layers cannot hold that split).
NO_MTP = ("model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
          "parallel.decoder_last_pipeline_num_layers=null")

# deepseek-v3-2048 cut to 32 GPUs: PP2, EP16 over two nodes per stage, 4 MoE layers,
# 4 micro-batches, NCCL direct all-to-alls, 1F1B
CASE = [*NO_MTP, "cluster.nodes=4", "parallel.pp=2", "parallel.ep=16", "routing.max_nodes=null",
        "parallel.ep_backend.kind=nccl", "schedule.kind=1f1b", "overlap.kind=none",
        "overlap.ep_comm_overlap=false", "model.layers=4", "model.first_dense_layers=0",
        "schedule.microbatches=4", "engine.mode=fast"]

# one chain of two stages, each an EP16 group over two hosts: per stage 4 / 2 MoE
# layers x 4 micro-batches x 4 all-to-alls x 16 x 15 flows
BY_HAND = 2 * (4 // 2) * 4 * 4 * 16 * 15


def run(monkeypatch, budget: int):
    monkeypatch.setattr(fast_network, "EXACT_FLOW_BUDGET", budget)
    monkeypatch.setattr(fast_engine, "EXACT_FLOW_BUDGET", budget)
    return simulate("deepseek-v3-2048", CASE).summary


def test_estimate_by_hand_and_budget_switch(monkeypatch):
    seen = []
    orig = fast_network.FastNetwork.exact_flow_estimate

    def spy(self, chains, moe_layers, microbatches):
        n = orig(self, chains, moe_layers, microbatches)
        seen.append(n)
        return n

    monkeypatch.setattr(fast_network.FastNetwork, "exact_flow_estimate", spy)
    exact = run(monkeypatch, BY_HAND)          # at the budget: flow by flow
    over = run(monkeypatch, BY_HAND - 1)       # one flow over: per-link sharing
    assert seen == [BY_HAND, BY_HAND]
    names = [s["name"] for s in exact["shortcuts"]]
    assert "a2a_sharing_over_budget" not in names
    sc = {s["name"]: s for s in over["shortcuts"]}
    assert f"{BY_HAND:,} flows" in sc["a2a_sharing_over_budget"]["detail"]
    assert sc["a2a_sharing_over_budget"]["bound"]
    # the same ops, timed another way: compute is unchanged, the step moves a little
    assert over["breakdown_s"]["compute"] == exact["breakdown_s"]["compute"]
    assert abs(over["step_time_s"] / exact["step_time_s"] - 1) < 0.05
