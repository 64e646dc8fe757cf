"""Pure collective expansion: phases worked out by hand, and byte conservation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.collectives.algorithms import (
    ALGOS,
    PIPELINE_CHUNKS,
    expand,
    hierarchical_legs,
    hierarchical_routes,
    ring_broadcast,
    ring_orders,
    tree_all_reduce,
)
from moesim.collectives.cost import bus_factor, busbw_Bps
from moesim.errors import InputError


def sent(phases):
    out: dict[int, float] = {}
    for ph in phases:
        for s, _d, b in ph:
            out[s] = out.get(s, 0.0) + b
    return out


def received(phases):
    out: dict[int, float] = {}
    for ph in phases:
        for _s, d, b in ph:
            out[d] = out.get(d, 0.0) + b
    return out


def test_ring_all_reduce_is_2n_minus_2_steps_of_s_over_n():
    group = (4, 5, 6, 7)
    phases = expand("all_reduce", group, 800.0)
    assert len(phases) == 6
    for ph in phases:
        assert ph == [(4, 5, 200.0), (5, 6, 200.0), (6, 7, 200.0), (7, 4, 200.0)]


def test_all_gather_and_reduce_scatter_n_minus_1_steps():
    for op in ("all_gather", "reduce_scatter"):
        phases = expand(op, (0, 2, 4), 300.0)
        assert phases == [[(0, 2, 100.0), (2, 4, 100.0), (4, 0, 100.0)]] * 2


def test_send_recv_single_transfer_and_single_rank_is_empty():
    assert expand("send_recv", (3, 9), 5.0) == [[(3, 9, 5.0)]]
    assert expand("all_reduce", (3,), 5.0) == []


def test_ring_broadcast_pipeline_by_hand():
    # 3 ranks, root 1, 2 chunks: 1->2 c0 | 1->2 c1, 2->0 c0 | 2->0 c1
    phases = ring_broadcast((0, 1, 2), 10.0, root=1, chunks=2)
    assert phases == [[(1, 2, 5.0)], [(1, 2, 5.0), (2, 0, 5.0)], [(2, 0, 5.0)]]


@pytest.mark.parametrize("algo", ["ring", "tree"])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_broadcast_every_non_root_receives_s_once(algo, n):
    group = tuple(range(10, 10 + n))
    rec = received(expand("broadcast", group, 64.0, algo=algo, root=group[-1]))
    assert rec == {r: pytest.approx(64.0) for r in group[:-1]}


def test_tree_all_reduce_two_ranks_by_hand():
    # tree 1 rooted at 0, tree 2 at 1; each half S/2 in k chunks of S/(2k).
    # Step 0: reduce chunk 0 of both trees; steps 1..k-1: reduce chunk c and broadcast
    # chunk c-1 (S/k each way); step k: broadcast the last chunks.
    k = 8
    phases = tree_all_reduce((0, 1), 16.0, chunks=k)
    assert len(phases) == k + 1
    assert phases[0] == [(0, 1, 1.0), (1, 0, 1.0)]
    assert all(ph == [(0, 1, 2.0), (1, 0, 2.0)] for ph in phases[1:k])
    assert phases[k] == [(0, 1, 1.0), (1, 0, 1.0)]


@pytest.mark.parametrize("n", [2, 3, 4, 7, 8, 16])
def test_tree_all_reduce_moves_2_n_minus_1_s_and_balances(n):
    S = 1024.0
    phases = expand("all_reduce", tuple(range(n)), S, algo="tree")
    total = sum(b for ph in phases for _s, _d, b in ph)
    # two trees of n-1 edges; each edge carries S/2 up (reduce) and S/2 down (broadcast)
    assert total == pytest.approx(2 * (n - 1) * S)
    # every rank receives the broadcast of both halves except as root: at least S/2
    assert all(v >= S / 2 - 1e-9 for v in received(phases).values())
    # mirrored trees: no rank sends or receives more than 2S (one tree's inner node with
    # two children: S/2 up + 2 x S/2 down, plus S/2 as a leaf of the other tree); a
    # single tree over the whole buffer would make an inner node send 3S
    for per_rank in (sent(phases), received(phases)):
        assert len(per_rank) == n
        assert max(per_rank.values()) <= 2 * S + 1e-9
        assert min(per_rank.values()) >= min(S, 2 * (n - 1) / n * S) - 1e-9


def test_hierarchical_all_reduce_phases_by_hand():
    S = 400.0
    phases = expand("all_reduce", (0, 1, 2, 3), S, algo="hierarchical", rank_host=[0, 0, 1, 1])
    intra = [(0, 1, 200.0), (1, 0, 200.0), (2, 3, 200.0), (3, 2, 200.0)]
    inter = [(0, 2, 100.0), (1, 3, 100.0), (2, 0, 100.0), (3, 1, 100.0)]
    assert phases == [intra, inter, inter, intra]


def test_uniform_all_to_all_direct_is_one_phase_of_s_over_n():
    phases = expand("all_to_all", (0, 1, 2, 3), 400.0)
    assert len(phases) == 1
    assert phases[0] == [(i, j, 100.0) for i in range(4) for j in range(4) if i != j]


def _check_routes(group, m, hosts):
    routes = hierarchical_routes(group, m, hosts)
    pos = {r: i for i, r in enumerate(group)}
    got = np.zeros_like(m)
    for s, d, b, hops in routes:
        assert hops[0] == s and hops[-1] == d and len(hops) in (2, 3)
        assert len(set(hops)) == len(hops)
        if len(hops) == 3:  # network leg to the same local index, then intra-node
            assert hosts[hops[1]] == hosts[d] != hosts[s]
        got[pos[s], pos[d]] += b
    off = m * (1 - np.eye(len(group)))
    np.testing.assert_allclose(got, off)  # every byte routed exactly once
    # the vectorized legs are the routes' hops summed per (src, dst)
    want: list[dict] = [{}, {}]
    for _s, _d, b, hops in routes:
        for k in range(len(hops) - 1):
            want[k][hops[k], hops[k + 1]] = want[k].get((hops[k], hops[k + 1]), 0.0) + b
    for leg, w in zip(hierarchical_legs(group, m, hosts), want, strict=True):
        assert {(s, d): pytest.approx(b) for s, d, b in leg} == w
    pipelined = expand("all_to_all_v", group, matrix=m, algo="hierarchical", rank_host=hosts)
    relayed = any(len(r[3]) == 3 for r in routes)
    C = PIPELINE_CHUNKS
    assert len(pipelined) == (0 if not off.any() else C + 1 if relayed else 1)
    # the two legs: phase 0 holds only chunk 0 of leg 1, the last phase only the last
    # chunk of leg 2; each chunk is 1/C of the leg, and phase c in between carries
    # chunk c of leg 1 plus chunk c-1 of leg 2 (both legs in flight together)
    if relayed:
        phases = [[(s, d, b * C) for s, d, b in pipelined[0]],
                  [(s, d, b * C) for s, d, b in pipelined[-1]]]
        mid = {}
        for leg in phases:
            for s, d, b in leg:
                mid[(s, d)] = mid.get((s, d), 0.0) + b / C
        for ph in pipelined[1:-1]:
            assert {(s, d): pytest.approx(b) for s, d, b in ph} == mid
    else:
        phases = pipelined + [[]] * (2 - len(pipelined))
    assert all(hosts[s] == hosts[d] for s, d, _ in phases[1])  # phase 2 is NVLink only
    # phase 1 aggregates per destination node: at most one network transfer per
    # (source, destination node)
    nets = [(s, hosts[d]) for s, d, _ in phases[0] if hosts[s] != hosts[d]]
    assert len(nets) == len(set(nets))
    # what each rank receives = what the matrix sends it + what it relays on
    rec = received(phases)
    for r in group:
        fwd = sum(b for s, _d, b in phases[1] if s == r)
        assert rec.get(r, 0.0) == pytest.approx(off[:, pos[r]].sum() + fwd)
        assert sent(phases[:1]).get(r, 0.0) == pytest.approx(off[pos[r]].sum())
    # network bytes = bytes whose source and destination nodes differ
    cross = sum(m[pos[s], pos[d]] for s in group for d in group if hosts[s] != hosts[d])
    assert sum(b for s, d, b in phases[0] if hosts[s] != hosts[d]) == pytest.approx(cross)
    return phases


def test_hierarchical_all_to_all_v_by_hand():
    # node 0: ranks 0, 1; node 1: ranks 2, 3. Rank 0 sends 1 to 1, 10 to 2, 100 to 3.
    m = np.zeros((4, 4))
    m[0, 1], m[0, 2], m[0, 3] = 1, 10, 100
    phases = _check_routes((0, 1, 2, 3), m, [0, 0, 1, 1])
    # 0 -> 2 (its peer on node 1) carries 110 over the network, 0 -> 1 over NVLink;
    # then 2 forwards 100 to 3
    assert phases == [[(0, 1, 1.0), (0, 2, 110.0)], [(2, 3, 100.0)]]
    # pipelined in 8 chunks: 9 phases; 2 forwards chunk c-1 while 0 sends chunk c
    got = expand("all_to_all_v", (0, 1, 2, 3), matrix=m, algo="hierarchical",
                 rank_host=[0, 0, 1, 1])
    C = PIPELINE_CHUNKS
    assert got == ([[(0, 1, 1 / C), (0, 2, 110 / C)]]
                   + [[(0, 1, 1 / C), (0, 2, 110 / C), (2, 3, 100 / C)]] * (C - 1)
                   + [[(2, 3, 100 / C)]])


@settings(max_examples=40, deadline=None)
@given(nodes=st.integers(1, 4), per=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_hierarchical_all_to_all_v_conserves_bytes(nodes, per, seed):
    rng = np.random.default_rng(seed)
    n = nodes * per
    hosts = [r // per for r in range(n)]
    perm = tuple(int(r) for r in rng.permutation(n))  # any group order
    m = rng.integers(0, 5, size=(n, n)).astype(float) * 1000
    _check_routes(perm, m, hosts)


def test_bad_inputs_raise_input_error():
    with pytest.raises(InputError, match="op"):
        expand("all_scatter", (0, 1), 1.0)
    with pytest.raises(InputError, match="algo"):
        expand("all_gather", (0, 1), 1.0, algo="tree")
    with pytest.raises(InputError, match="matrix"):
        expand("all_to_all_v", (0, 1), matrix=[[0, 1, 2], [0, 0, 0]])
    with pytest.raises(InputError, match="matrix"):
        expand("all_to_all_v", (0, 1), matrix=[[0, -1], [0, 0]])
    with pytest.raises(InputError, match="ranks"):
        expand("all_reduce", (0, 1, 2), 8.0, algo="hierarchical", rank_host=[0, 0, 1])
    with pytest.raises(InputError, match="root"):
        expand("broadcast", (0, 1), 8.0, root=5)
    with pytest.raises(InputError, match="ranks"):
        expand("all_reduce", (0, 0), 8.0)


def test_every_op_has_a_default_algo():
    assert set(ALGOS) >= {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                          "all_to_all", "all_to_all_v", "send_recv"}


def test_bus_factors_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("all_to_all", 4) == pytest.approx(3 / 4)
    assert bus_factor("broadcast", 8) == 1.0
    # 1 GB all-reduce on 8 ranks in 10 ms: algbw 100 GB/s, busbw 175 GB/s
    assert busbw_Bps("all_reduce", 8, 1e9, 0.01) == pytest.approx(175e9)


def test_ring_orders_one_ring_per_local_index_across_nodes():
    hosts = [0, 0, 0, 1, 1, 1]
    assert ring_orders((0, 1, 2), hosts) == [[0, 1, 2]]            # one node: one ring
    assert ring_orders((0, 1, 2, 3, 4, 5), None) == [[0, 1, 2, 3, 4, 5]]
    assert ring_orders((0, 1, 3, 5), hosts) == [[0, 1, 3, 5], [1, 0, 5, 3]]
    rings = ring_orders((0, 1, 2, 3, 4, 5), hosts)
    assert rings == [[0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3], [2, 0, 1, 5, 3, 4]]
    # each ring leaves node 0 from a different GPU and enters node 1 at a different one
    exits = {(ring[2], ring[3]) for ring in rings}
    assert {a for a, _ in exits} == {0, 1, 2} and {b for _, b in exits} == {3, 4, 5}
    assert ring_orders((0, 1, 2, 3), [0, 0, 0, 1]) == [[0, 1, 2, 3]]  # uneven: one ring


def test_multi_node_ring_all_reduce_splits_data_over_rings():
    hosts = [0, 0, 1, 1]
    phases = expand("all_reduce", (0, 1, 2, 3), 800.0, rank_host=hosts)
    # 2 rings (0,1,2,3) and (1,0,3,2), 6 steps, each sending 800/4/2 = 100 per hop
    assert len(phases) == 6
    expect = sorted([(0, 1, 100.0), (1, 2, 100.0), (2, 3, 100.0), (3, 0, 100.0),
                     (1, 0, 100.0), (0, 3, 100.0), (3, 2, 100.0), (2, 1, 100.0)])
    assert all(ph == expect for ph in phases)
    # total bytes are those of one ring: 2(n-1)/n · S per rank
    assert sent(phases) == {r: pytest.approx(2 * 3 / 4 * 800.0) for r in range(4)}


@settings(max_examples=30, deadline=None)
@given(nodes=st.integers(1, 4), per=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_multi_ring_every_rank_sends_and_receives_one_rings_worth(nodes, per, seed):
    rng = np.random.default_rng(seed)
    n = nodes * per
    hosts = [r // per for r in range(n)]
    group = tuple(int(r) for r in rng.permutation(n))
    for ring in ring_orders(group, hosts):
        assert sorted(ring) == sorted(group)  # each ring visits every member once
    S = 1000.0
    phases = expand("all_reduce", group, S, rank_host=hosts)
    if n > 1:
        assert len(phases) == 2 * (n - 1)
        assert sent(phases) == {r: pytest.approx(2 * (n - 1) / n * S) for r in group}
        assert received(phases) == {r: pytest.approx(2 * (n - 1) / n * S) for r in group}
