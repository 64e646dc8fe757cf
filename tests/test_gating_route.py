"""route_microbatch: conservation, skew, capacity, node limit, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.gating import make_placement, route_microbatch, routing_from_dict
from moesim.gating.router import assign_tokens, drop_tokens, node_probs
from moesim.gating.sampling import cap_probs


def _route(d: dict, *, e=8, k=2, ep=4, tokens=4096, rpn=None, hidden=4096, disp="bf16",
           seed=0, step=0, layer=0, mb=0, placement=None, tokens_per_rank=None):
    cfg = routing_from_dict(d, "scen.yaml")
    pl = placement or make_placement(e, ep, cfg.replicate, cfg.replica_split)
    t = np.full(ep, tokens) if tokens_per_rank is None else np.asarray(tokens_per_rank)
    return route_microbatch(cfg, n_experts=e, top_k=k, tokens_per_rank=t, placement=pl,
                            ranks_per_node=rpn, hidden=hidden, dispatch_dtype=disp,
                            combine_dtype="bf16", seed=seed, step=step, layer=layer,
                            microbatch=mb)


CASES = [
    ({"kind": "uniform", "path": "token"}, {}),
    ({"kind": "uniform", "path": "counts"}, {}),
    ({"kind": "zipf", "zipf_s": 1.2, "capacity_factor": 1.0}, {}),
    ({"kind": "hot", "hot_experts": [3], "hot_fraction": 0.3, "capacity_factor": 1.1,
      "path": "token", "jitter": 0.5}, {}),
    ({"kind": "dirichlet", "alpha": 0.3, "max_nodes": 2, "path": "counts"},
     {"e": 64, "k": 8, "ep": 16, "rpn": 4, "tokens": 512}),
    ({"kind": "dirichlet", "alpha": 0.3, "max_nodes": 2, "path": "token"},
     {"e": 64, "k": 8, "ep": 16, "rpn": 4, "tokens": 64}),
    ({"kind": "zipf", "replicate": {"expert": 0, "ranks": [3]}, "capacity_factor": 2.0}, {}),
]


@pytest.mark.parametrize("d,kw", CASES)
def test_conservation(d, kw):
    r = _route(d, tokens_per_rank=None, **kw)
    k = kw.get("k", 2)
    tokens = kw.get("tokens", 4096)
    s = kw.get("ep", 4)
    # every token makes exactly k assignments
    assert np.all(r.assign.sum(axis=1) == k * tokens)
    assert np.all(r.assign <= tokens)  # an expert at most once per token
    assert np.array_equal(r.assign, r.kept + r.dropped)
    assert np.all(r.dropped >= 0)
    assert np.all(r.kept <= r.capacity[:, None])
    # every kept assignment is sent exactly once, to a holder of its expert
    assert np.array_equal(r.dispatch_tokens.sum(axis=1), r.kept.sum(axis=1))
    assert np.array_equal(r.rank_expert_tokens.sum(axis=0), r.kept.sum(axis=0))
    assert np.array_equal(r.expert_tokens, r.kept.sum(axis=0))
    assert np.array_equal(r.rank_tokens, r.rank_expert_tokens.sum(axis=1))
    assert np.array_equal(r.rank_tokens, r.dispatch_tokens.sum(axis=0))
    assert np.array_equal(r.combine_tokens, r.dispatch_tokens.T)
    # bytes = tokens × bytes per token (bf16: 2 bytes × hidden 4096 = 8192)
    hidden = 4096
    assert np.array_equal(r.dispatch_bytes, r.dispatch_tokens * 2.0 * hidden)
    assert np.array_equal(r.combine_bytes, r.dispatch_tokens.T * 2.0 * hidden)
    assert r.dispatch_bytes.dtype == np.float64
    assert r.dispatch_tokens.shape == (s, s)
    np.testing.assert_allclose(r.f.sum(), 1.0)
    np.testing.assert_allclose(r.router_prob_mean.sum(), 1.0)


def test_fp8_dispatch_bytes_deepseek():
    # fp8: 1 byte per value + one fp32 scale per 128 values: 7168 + 4·56 = 7392 bytes
    # per token; combine in bf16: 2·7168 = 14336 (DeepSeek-V3 report §3.3)
    r = _route({"kind": "uniform"}, e=16, k=4, ep=4, tokens=100, hidden=7168, disp="fp8")
    assert np.array_equal(r.dispatch_bytes, r.dispatch_tokens * 7392.0)
    assert np.array_equal(r.combine_bytes, r.dispatch_tokens.T * 14336.0)


def test_dispatch_counts_every_assignment_to_a_rank():
    # 4 experts on a single EP rank, k = 4: every token goes to all 4 experts on the
    # same rank; Megatron's alltoall dispatcher sends one copy per assignment (4 per token).
    r = _route({"kind": "uniform"}, e=4, k=4, ep=1, tokens=10)
    assert r.dispatch_tokens.tolist() == [[40]]
    assert r.assign.tolist() == [[10, 10, 10, 10]]


@pytest.mark.parametrize("path", ["token", "counts"])
def test_uniform_loads_near_uniform(path):
    # 8 experts, top-2, 4 ranks × 4096 tokens: each expert count is a sum of
    # Binomial(4096, 1/4) over 4 ranks: mean 4096, sd sqrt(4·4096·0.25·0.75) = 55.4;
    # every expert lies within 5 sd.
    r = _route({"kind": "uniform", "path": path, "jitter": 1.0})
    assert r.path == path
    counts = r.assign.sum(axis=0)
    assert np.all(np.abs(counts - 4096) < 5 * 55.4)
    # P_i = mean softmax of ln(1/8) + N(0, 1) noise; one token's softmax entry has sd
    # 0.116 (measured over 2e5 draws), so over >= 128 probe tokens P_i is within 5 sd,
    # 5·0.116/sqrt(128) = 0.052, of 1/8 (by symmetry). lb_loss = 1 + E·Σ δf_i·δP_i
    # with |δf| < 5·55.4/32768 = 0.0085, so |lb − 1| < 8·8·0.0085·0.052 = 0.028.
    assert np.all(np.abs(r.router_prob_mean - 1 / 8) < 0.052)
    assert abs(r.lb_loss - 1.0) < 0.028


@pytest.mark.parametrize("path", ["token", "counts"])
def test_hot_expert_gets_its_fraction(path):
    # hot expert 3 takes 30 % of the assignments: with k = 2 each token includes it with
    # probability 0.6; over 4 × 4096 tokens the count is Binomial(16384, 0.6):
    # mean 9830.4, sd sqrt(16384·0.24) = 62.7.
    r = _route({"kind": "hot", "hot_experts": [3], "hot_fraction": 0.3, "path": path})
    c3 = r.assign[:, 3].sum()
    assert abs(c3 - 9830.4) < 5 * 62.7
    np.testing.assert_allclose(r.shares[3], 0.3)
    # P = shares when jitter = 0: loss = 8·(0.3·f3 + 0.1·(1 − f3)) ≈ 8·(0.09 + 0.07) = 1.28
    assert abs(r.lb_loss - 8 * (0.3 * r.f[3] + 0.1 * (1 - r.f[3]))) < 1e-12
    assert abs(r.lb_loss - 1.28) < 0.02


def test_hot_fraction_impossible_with_top_k():
    # one expert cannot take 30 % of the assignments when each token picks 8 distinct
    # experts: the most it can take is 1/8.
    with pytest.raises(InputError) as ei:
        _route({"kind": "hot", "hot_experts": 1, "hot_fraction": 0.3}, e=256, k=8, ep=8,
               tokens=16)
    assert ei.value.field == "routing.hot_fraction"
    assert "1/top_k" in str(ei.value)


@pytest.mark.parametrize("path", ["token", "counts"])
def test_capacity_drops_exactly_over_capacity(path):
    # capacity = ceil(4096·2/8·1.0) = 1024 per source rank per expert; the hot expert
    # gets ~0.6·4096 = 2458 per rank, so exactly assign − 1024 are dropped there.
    r = _route({"kind": "hot", "hot_experts": [3], "hot_fraction": 0.3,
                "capacity_factor": 1.0, "path": path})
    assert r.capacity.tolist() == [1024] * 4
    assert np.all(r.kept[:, 3] == 1024)
    assert np.array_equal(r.dropped[:, 3], r.assign[:, 3] - 1024)
    assert np.array_equal(r.kept, np.minimum(r.assign, 1024))


def test_capacity_rounds_up():
    # ceil(10·2/8·1.25) = ceil(3.125) = 4
    r = _route({"kind": "uniform", "capacity_factor": 1.25}, tokens_per_rank=[10, 0, 3, 5])
    assert r.capacity.tolist() == [4, 0, math.ceil(3 * 2 / 8 * 1.25), math.ceil(5 * 2 / 8 * 1.25)]
    assert np.all(r.kept <= r.capacity[:, None])
    assert r.assign[1].sum() == 0


def test_drop_policies_pick_which_tokens():
    # tokens 0..5 all chose experts (0, 1); capacity 2
    chosen = np.array([[0, 1]] * 6)
    scores = np.zeros((6, 2))
    scores[:, 0] = [0.1, 0.9, 0.2, 0.8, 0.3, 0.7]
    scores[:, 1] = 0.5
    keep = drop_tokens(chosen, scores, 2, "position")
    assert keep[:, 0].tolist() == [True, True, False, False, False, False]
    keep = drop_tokens(chosen, scores, 2, "probability")
    assert keep[:, 0].tolist() == [False, True, False, True, False, False]
    # ties in probability fall back to position
    assert keep[:, 1].tolist() == [True, True, False, False, False, False]


def test_node_limited_tokens_use_at_most_m_nodes():
    # 64 experts on 16 EP ranks, 4 ranks per node → 4 nodes of 16 experts; M = 2
    rng = np.random.default_rng(9)
    pl = make_placement(64, 16)
    node = pl.node_of_expert(4)
    pi = cap_probs(np.random.default_rng(1).dirichlet(np.full(64, 0.3)), 8)
    chosen = assign_tokens(rng, pi, 3000, 8, node, 2)
    assert np.all(np.diff(np.sort(chosen, axis=1), axis=1) > 0)
    nodes_per_token = np.array([len(set(node[c])) for c in chosen])
    assert nodes_per_token.max() <= 2
    # without the limit, tokens do spread over more nodes
    free = assign_tokens(rng, pi, 3000, 8)
    assert max(len(set(node[c])) for c in free) > 2


def test_node_probs_sum_to_m():
    pl = make_placement(64, 16)
    pi = cap_probs(np.arange(1.0, 65.0), 8)
    rho = node_probs(pi, pl.node_of_expert(4), 2)
    np.testing.assert_allclose(rho.sum(), 2.0)
    assert np.all(rho <= 1.0)


def test_node_limited_counts_keep_node_loads():
    # uniform shares, 4 nodes, M = 2: each node holds 1/4 of the assignments
    r = _route({"kind": "uniform", "max_nodes": 2, "path": "counts"}, e=64, k=8, ep=16,
               rpn=4, tokens=2048)
    node = make_placement(64, 16).node_of_expert(4)
    per_node = np.bincount(node, weights=r.assign.sum(axis=0))
    total = 16 * 2048 * 8
    assert np.all(np.abs(per_node / total - 0.25) < 0.01)


def test_node_limit_needs_enough_experts():
    with pytest.raises(InputError) as ei:
        # 8 experts on 4 nodes (2 per node); M = 1 cannot hold top-4
        _route({"kind": "uniform", "max_nodes": 1}, e=8, k=4, ep=8, rpn=2, tokens=4)
    assert ei.value.field == "routing.max_nodes"


def test_same_seed_same_bytes_and_order_independence():
    d = {"kind": "zipf", "drift": "walk", "drift_rate": 0.1, "capacity_factor": 1.2,
         "jitter": 0.3}
    kw = {"e": 32, "k": 4, "ep": 8, "tokens": 300, "step": 3, "layer": 2}
    a0 = _route(d, mb=0, **kw)
    a1 = _route(d, mb=1, **kw)
    b1 = _route(d, mb=1, **kw)  # evaluated in the other order
    b0 = _route(d, mb=0, **kw)
    for x, y in ((a0, b0), (a1, b1)):
        for name in ("assign", "kept", "dispatch_bytes", "combine_bytes", "router_prob_mean"):
            assert getattr(x, name).tobytes() == getattr(y, name).tobytes()
    assert a0.assign.tobytes() != a1.assign.tobytes()
    assert _route(d, mb=0, seed=1, **kw).assign.tobytes() != a0.assign.tobytes()


@pytest.mark.parametrize("bad,field", [
    ({"tokens_per_rank": [1, 2, 3]}, "tokens_per_rank"),
    ({"tokens_per_rank": [1, -2, 3, 4]}, "tokens_per_rank"),
    ({"tokens_per_rank": [1, 2.5, 3, 4]}, "tokens_per_rank"),
    ({"k": 9}, "routing.top_k"),
    ({"disp": "int3"}, "dispatch_dtype"),
    ({"seed": -1}, "seed"),
    ({"layer": 1.5}, "layer"),
])
def test_bad_call_arguments_raise_input_error(bad, field):
    with pytest.raises(InputError) as ei:
        _route({"kind": "uniform"}, **bad)
    assert ei.value.field == field


def test_top_k_from_config_overrides_model():
    r = _route({"kind": "uniform", "top_k": 3}, k=2, tokens=10)
    assert r.top_k == 3 and np.all(r.assign.sum(axis=1) == 30)


def test_node_limited_tokens_keep_inclusion_when_no_cap_binds():
    # zipf s = 0.5 over 64 experts on 4 nodes of 16, top-8, M = 2: the hottest node
    # holds 46 % of the shares, m_0 = 3.7 < k/M = 4, so rho = M·m/k is not capped and
    # the two-stage design keeps each expert's inclusion at pi_e exactly: its count
    # over T tokens is Binomial(T, pi_e), within 5 sd.
    w = 1.0 / np.arange(1, 65) ** 0.5
    pi = cap_probs(w, 8)
    node = make_placement(64, 16).node_of_expert(4)
    rho = node_probs(pi, node, 2)
    assert rho.max() < 1.0
    t = 20000
    chosen = assign_tokens(np.random.default_rng(21), pi, t, 8, node, 2)
    assert max(len(set(node[c])) for c in chosen) <= 2
    counts = np.bincount(chosen.ravel(), minlength=64)
    assert np.all(np.abs(counts - t * pi) < 5 * np.sqrt(t * pi * (1 - pi)))
