"""DeepEP dispatch/combine plans and kernel times (moesim.ep), worked by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moesim.cli import main
from moesim.ep.messages import (
    internode_bytes_per_token,
    intranode_bytes_per_token,
    ll_bytes_per_message,
    logical_bytes_per_token,
)
from moesim.ep.plan import plan_ep_exchange
from moesim.ep.simulate import simulate_ep
from moesim.ep.timing import SM_WRITE_BPS, flow_finish_times, time_plan
from moesim.errors import InputError
from moesim.gating.placement import make_placement
from moesim.gating.section import routing_from_dict
from moesim.gating.tokens import dedup_counts, sample_choices
from moesim.topology import load_topology

# 2-node toy: ranks 0, 1 on node 0 and 2, 3 on node 1; 8 experts, 2 per rank
EXPERT_RANK = np.repeat(np.arange(4), 2)
H, K = 128, 2
# rank 0's tokens: [0, 1] own GPU; [4, 5] both on rank 2; [2, 6] rank 1 + rank 3;
# [5, 7] ranks 2 and 3 (one node). Other ranks hold no tokens.
TOY = [np.array([[0, 1], [4, 5], [2, 6], [5, 7]]), np.zeros((0, 2), int),
       np.zeros((0, 2), int), np.zeros((0, 2), int)]


def toy_counts():
    return dedup_counts(TOY, EXPERT_RANK, 2)


def test_message_sizes_follow_the_kernel_layouts():
    # internode.cu get_num_bytes_per_token: align16(7168 + 8 + 56·4 + 8·4 + 8·4) = 7472
    assert internode_bytes_per_token("fp8", 7168, 8, combine=False) == 7472
    # combine: align16(2·7168 + 8 + 8·4) = 14384
    assert internode_bytes_per_token("bf16", 7168, 8, combine=True) == 14384
    assert internode_bytes_per_token("fp8", 128, 2, combine=False) == 160  # 156 -> 160
    # intranode.cu buffers: 7168 + 224 + 4 (src idx) + 8·8 (int64 idx) + 8·4
    assert intranode_bytes_per_token("fp8", 7168, 8, combine=False) == 7492
    assert intranode_bytes_per_token("bf16", 7168, 8, combine=True) == 14336 + 4 + 32
    # internode_ll.cu: 16-byte header + fp8 payload; combine bf16 payload only
    assert ll_bytes_per_message("fp8", 7168, combine=False) == 16 + 7168 + 224
    assert ll_bytes_per_message("bf16", 7168, combine=True) == 14336
    # what DeepEP's tests count: bf16 2H; fp8 2H·(1 + 4/128)/2
    assert logical_bytes_per_token("deepep", "fp8", 7168) == pytest.approx(7392)
    assert logical_bytes_per_token("deepep-ll", "fp8", 7168) == pytest.approx(7408)
    with pytest.raises(InputError, match="hidden"):
        internode_bytes_per_token("fp8", 1000, 8, combine=False)


def test_dedup_counts_by_hand():
    c = toy_counts()
    np.testing.assert_array_equal(c.pair_tokens[0], [2, 1, 3, 2])
    # a token for two experts on one GPU counts once per GPU: [4, 5] -> rank 2 once
    np.testing.assert_array_equal(c.gpu_tokens[0], [1, 1, 2, 2])
    np.testing.assert_array_equal(c.node_tokens[0], [2, 3])
    assert c.gpu_tokens[1:].sum() == c.node_tokens[1:].sum() == 0
    # dropped slots (-1) count nowhere
    d = dedup_counts([np.array([[0, -1]]), *TOY[1:]], EXPERT_RANK, 2)
    assert d.pair_tokens.sum() == d.gpu_tokens.sum() == d.node_tokens.sum() == 1


def test_deepep_dispatch_plan_by_hand():
    msg = internode_bytes_per_token("fp8", H, K, combine=False)
    p = plan_ep_exchange(toy_counts(), "ep_dispatch", "deepep", "fp8", H, K, sms=4)
    rdma, nvl = (dict(((s, d), b) for s, d, b in st.flows) for st in p.stages)
    # IB: 3 tokens have experts on node 1 -> one copy each to rank 2 (same local index)
    assert rdma == {(0, 2): 3 * msg}
    # NVLink: rank 2 forwards tokens [2,6], [5,7] to rank 3; [4,5] and [5,7] stay on 2;
    # own node: [2, 6] goes 0 -> 1 over NVLink only
    assert nvl == {(0, 1): 1 * msg, (2, 3): 2 * msg}
    lg = logical_bytes_per_token("deepep", "fp8", H)
    assert p.rdma_bytes_per_rank[0] == pytest.approx(5 * lg)  # own node's share included
    np.testing.assert_allclose(p.nvl_bytes_per_rank, np.array([1, 1, 2, 2]) * lg)
    assert p.concurrent and p.sms == 4 and p.latency["rdma_hops"] == 1
    assert p.flows() == [(0, 2, 3.0 * msg, "rdma"), (0, 1, 1.0 * msg, "nvl"),
                         (2, 3, 2.0 * msg, "nvl")]


def test_deepep_combine_mirrors_dispatch_with_the_combine_dtype():
    d = plan_ep_exchange(toy_counts(), "ep_dispatch", "deepep", "fp8", H, K, sms=4)
    c = plan_ep_exchange(toy_counts(), "ep_combine", "deepep", "bf16", H, K, sms=4)
    dm = internode_bytes_per_token("fp8", H, K, combine=False)
    cm = internode_bytes_per_token("bf16", H, K, combine=True)
    fwd = {(s, dd): b / dm for st in d.stages for s, dd, b in st.flows}
    back = {(dd, s): b / cm for st in c.stages for s, dd, b in st.flows}
    assert fwd == back
    # combine reduces inside node 1 (rank 3 -> rank 2) before one IB send per token
    assert dict(((s, dd), b) for s, dd, b in c.stages[1].flows) == {(2, 0): 3 * cm}
    lg = logical_bytes_per_token("deepep", "bf16", H)
    assert c.rdma_bytes_per_rank[0] == pytest.approx(5 * lg)
    assert c.latency == {"rdma_hops": 0, "nvl_hops": 0, "launches": 0}  # no notify


def test_low_latency_sends_one_message_per_token_and_expert():
    p = plan_ep_exchange(toy_counts(), "ep_dispatch", "deepep-ll", "fp8", H, K)
    msg = ll_bytes_per_message("fp8", H, combine=False)
    flows = {(s, d): b for st in p.stages for s, d, b in st.flows}
    # no dedup: [4, 5] is two messages to rank 2; rank 0's own experts stay local
    assert flows == {(0, 1): 1 * msg, (0, 2): 3 * msg, (0, 3): 2 * msg}
    assert {st.name: st.medium for st in p.stages} == {"rdma": "rdma", "nvl": "nvl"}
    assert dict(((s, d), b) for s, d, b in p.stages[0].flows) == {(0, 2): 3 * msg, (0, 3): 2 * msg}
    # DeepEP's test: tokens × top-k × message size (its fp8 size), local ones included
    assert p.rdma_bytes_per_rank[0] == pytest.approx(4 * K * logical_bytes_per_token(
        "deepep-ll", "fp8", H))
    assert p.sms == 0  # holds no SMs while in flight


def test_flow_finish_times_by_hand():
    # two flows share one link of 10 B/s: 5 B/s each until the 10-byte flow ends at
    # t = 2, then the 30-byte flow has 20 bytes left at 10 B/s: ends at t = 4
    t, solves = flow_finish_times([(0,), (0,), ()], np.array([10.0, 30.0, 5.0]), np.array([10.0]))
    np.testing.assert_allclose(t, [2.0, 4.0, 0.0])
    assert solves == 2


def _time(topo, choices, op="ep_dispatch", kernel="deepep", dtype="fp8", sms=24,
          experts=None, hidden=7168, k=8):
    n = len(choices)
    e = experts or 4 * n
    counts = dedup_counts(choices, np.arange(e) // (e // n), topo.gpus_per_node)
    plan = plan_ep_exchange(counts, op, kernel, dtype, hidden, k, sms)
    return plan, time_plan(plan, topo, topo.gpus[:n], 4e-6)


def _uniform_choices(n, tokens, experts, k, seed=0):
    rng = np.random.default_rng(seed)
    return [np.stack([rng.choice(experts, k, replace=False) for _ in range(tokens)])
            for _ in range(n)]


def test_single_node_dispatch_is_bounded_by_nvlink():
    topo = load_topology("dgx-h800", nodes=1)
    plan, tm = _time(topo, _uniform_choices(8, 256, 32, 8))
    nvl = topo.capacity_Bps[list(topo.route(topo.gpus[0], topo.gpus[1]))].min()
    inbound = np.zeros(8)
    outbound = np.zeros(8)
    for s, d, b in plan.stages[0].flows:
        inbound[d] += b
        outbound[s] += b
    bound = max(inbound.max(), outbound.max()) / nvl
    lat = float(topo.latency_s[list(topo.route(topo.gpus[0], topo.gpus[1]))].sum())
    assert tm.rank_sm_s.max() < bound  # 24 SMs are not the bound here
    assert tm.time_s >= bound
    assert tm.time_s <= bound * 1.02 + tm.fill_drain_s + lat


def test_two_node_dispatch_all_remote_is_bounded_by_the_nic():
    topo = load_topology("dgx-h800", nodes=2)
    rng = np.random.default_rng(1)
    # 4 experts per rank; every token of node 0 picks 2 experts on node 1 and vice versa.
    # A token reaches at most 2 GPUs there: NVLink forwarding carries <= 2·7/8 of the IB
    # bytes at 160/47.5 times the rate, so the NIC binds
    choices = []
    for s in range(16):
        other = 32 if s < 8 else 0
        choices.append(other + np.argsort(rng.random((1024, 32)), axis=1)[:, :2])
    plan, tm = _time(topo, choices, k=2)
    msg = internode_bytes_per_token("fp8", 7168, 2, combine=False)
    rdma = plan.stages[0]
    assert rdma.medium == "rdma" and len(rdma.flows) == 16
    assert all(b == 1024 * msg for _s, _d, b in rdma.flows)  # one copy per token and node
    path = list(topo.route(topo.gpus[0], topo.gpus[8]))
    nic = topo.capacity_Bps[path].min()
    bound = 1024 * msg / nic
    assert tm.time_s >= bound
    assert tm.rank_net_s.max() >= bound
    # the NVLink forwarding runs concurrently: the kernel ends near the NIC bound
    lat = sum(float(topo.latency_s[list(topo.route(topo.gpus[0], g))].sum())
              for g in (topo.gpus[8], topo.gpus[1]))
    assert tm.time_s <= bound * 1.02 + tm.fill_drain_s + lat


def test_kernel_time_never_below_the_sm_bound():
    topo = load_topology("dgx-h800", nodes=2)
    ch = _uniform_choices(16, 128, 64, 8)
    for sms in (2, 24):
        plan, tm = _time(topo, ch, sms=sms)
        sm = plan.sm_write_bytes / (sms * SM_WRITE_BPS)
        np.testing.assert_allclose(tm.rank_sm_s, sm)
        assert tm.time_s >= sm.max()
        np.testing.assert_allclose(tm.rank_time_s,
                                   np.maximum(tm.rank_net_s, sm) + tm.fill_drain_s)
    # with 2 SMs (one channel) the SM budget binds
    plan, tm = _time(topo, ch, sms=2)
    assert tm.rank_sm_s.max() > tm.rank_net_s.max()


def test_simulate_ep_same_seed_same_bytes_and_node_limit():
    topo = load_topology("dgx-h800", nodes=4)
    cfg = routing_from_dict({"max_nodes": 2}, "test")
    a = simulate_ep(topo, "ep_dispatch", "deepep", tokens=64, hidden=1024, experts=64,
                    top_k=8, dtype="fp8", routing=cfg, seed=3)
    b = simulate_ep(topo, "ep_dispatch", "deepep", tokens=64, hidden=1024, experts=64,
                    top_k=8, dtype="fp8", routing=cfg, seed=3)
    assert a == b
    pl = make_placement(64, 32)
    ch = sample_choices(cfg, n_experts=64, top_k=8, tokens_per_rank=[64] * 32, placement=pl,
                        ranks_per_node=8, seed=3)
    for c in ch:
        assert (c.shape == (64, 8)) and all(len(set(row // 16)) <= 2 for row in c)
    # every (token, node) copy appears once: at most max_nodes per token
    assert a["token_node_copies"] <= 2 * 64 * 32
    assert a["token_gpu_copies"] <= a["token_expert_pairs"] == 64 * 32 * 8


def test_cli_json_fields(capsys):
    assert main(["collective", "--topology", "dgx-h800", "--nodes", "2", "--op", "ep_combine",
                 "--kernel", "deepep-ll", "--tokens", "16", "--hidden", "512", "--experts", "32",
                 "--top-k", "4", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    for key in ("op", "kernel", "ranks", "tokens", "time_s", "rdma_GBps", "nvl_GBps",
                "rdma_bytes_per_rank", "nvl_bytes_per_rank", "sms"):
        assert key in res
    assert res["ranks"] == 16 and res["dtype"] == "bf16" and res["sms"] == 0
    # LL combine: every rank logically moves tokens × top-k × 2H
    assert res["rdma_bytes_per_rank"] == 16 * 4 * 2 * 512
    assert res["rdma_GBps"] == pytest.approx(res["rdma_bytes_per_rank"] / res["time_s"] / 1e9)


@pytest.mark.parametrize("extra, field", [
    (["--kernel", "deepep2"], "--kernel"),
    (["--sms", "3"], "--sms"),
    (["--dtype", "fp16"], "--dtype"),
    (["--hidden", "1000"], "--hidden"),
    (["--experts", "100"], "--experts"),
    (["--tokens", "0"], "--tokens"),
    (["--routing", "weird"], "--routing"),
    (["--max-nodes", "0"], "--max-nodes"),
    (["--ranks", "0-8"], "--ranks"),
])
def test_cli_bad_inputs_one_line(capsys, extra, field):
    rc = main(["collective", "--topology", "dgx-h800", "--nodes", "2", "--op", "ep_dispatch",
               "--tokens", "8", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and field in err and "Traceback" not in err


def test_nccl_kernel_is_the_direct_all_to_all_of_the_same_routing():
    from moesim.collectives import simulate_collective
    from moesim.ep.messages import hidden_bytes

    topo = load_topology("dgx-h800", nodes=2)
    ch = _uniform_choices(16, 32, 64, 8, seed=2)
    counts = dedup_counts(ch, np.arange(64) // 4, 8)
    plan = plan_ep_exchange(counts, "ep_dispatch", "nccl", "fp8", 7168, 8)
    tm = time_plan(plan, topo, topo.gpus, 4e-6, rtol=1e-9)
    # one copy per (token, expert) of the fp8 hidden vector, the pairwise all-to-all
    m = counts.pair_tokens * float(hidden_bytes("fp8", 7168))
    ref = simulate_collective(topo, "all_to_all", matrix=m, algo="direct")
    assert tm.time_s == pytest.approx(ref["time_s"], rel=1e-9)


def test_node_limit_that_cannot_hold_top_k_is_an_input_error():
    cfg = routing_from_dict({"max_nodes": 1}, "test")
    with pytest.raises(InputError, match="max_nodes"):
        # 2 nodes of 4 experts each: one node cannot hold 8 distinct experts
        sample_choices(cfg, n_experts=8, top_k=8, tokens_per_rank=[4] * 4,
                       placement=make_placement(8, 4), ranks_per_node=2)
