"""Shadow links (moesim.network.shadow): links that always carry the same flows as a
slower link are left out of the max-min problem; the same rates bit for bit, and put
back when a route breaks the premise."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from moesim.network import FlowNetwork, jit
from moesim.network.shadow import MARGIN, link_ends, partial_classes, shadow_classes
from tests._util import run_flows
from tests.test_network_fast import skewed_case
from tests.test_network_flow import TinyLinks


def test_classes_of_a_relay_chain_by_hand() -> None:
    # a - r1 - r2 - b, both directions; r1 and r2 have two neighbours each (relays):
    # a->r1, r1->r2, r2->b carry one flow set, b->r2, r2->r1, r1->a the other
    links = [("a", "r1"), ("r1", "a"), ("r1", "r2"), ("r2", "r1"), ("r2", "b"), ("b", "r2"),
             ("b", "x"), ("x", "b"), ("b", "y"), ("y", "b")]   # b has three neighbours
    cap = np.array([4.0, 3.0, 2.0, 2.0, 3.0, 2.0 * (1 + MARGIN / 2), 1.0, 1.0, 1.0, 1.0])
    cls, master = shadow_classes(links, cap)
    assert cls.tolist() == [0, 1, 0, 1, 0, 1, -1, -1, -1, -1]
    # class 0: master r1->r2 (2.0); a->r1 (4) and r2->b (3) are shadows
    # class 1: master r2->r1 (2.0); r1->a (3) a shadow; b->r2 within MARGIN of the
    # master: kept in the problem
    assert master.tolist() == [2, 3, -1, -1, 2, -1, -1, -1, -1, -1]
    # an endpoint is never a relay: with r2 an endpoint, a->r1 and r1->r2 alone
    cls, master = shadow_classes(links, cap, endpoints={"r2"})
    assert cls.tolist() == [0, 1, 0, 1, -1, -1, -1, -1, -1, -1]
    assert master.tolist() == [2, 3, -1, -1, -1, -1, -1, -1, -1, -1]
    size = np.bincount(cls[cls >= 0])
    assert partial_classes([0, 2], cls, size) == []          # a -> r1 -> r2: all of class 0
    assert partial_classes([0, 2, 4], cls, size) == []
    assert partial_classes([0], cls, size) == [0]            # a -> r1 ends at the relay
    assert partial_classes([3, 2], cls, size) == [1, 0]


def test_link_names_parsed_and_malformed_rejected() -> None:
    assert link_ends(["n0.gpu0->n0.nic0"]) == [("n0.gpu0", "n0.nic0")]
    with pytest.raises(ValueError, match="'ab'"):
        link_ends(["ab"])


def test_link_names_without_arrows_leave_every_link_in() -> None:
    # a link set whose names do not say "u->v" has no graph to read: nothing left out,
    # and the flow runs as on any network (1 byte at 1 B/s through the slower link)
    links = TinyLinks([("a", "r"), ("r", "b")], [2.0, 1.0], [0.0, 0.0])
    links.link_names = ["first", "second"]
    done, net = run_flows(FlowNetwork, links, [(0.0, "a", "b", 1.0)])
    assert not net._drop.any() and done[0] == 1.0


@pytest.mark.parametrize("numba", [False, True])
def test_shadow_put_back_when_a_route_ends_at_the_relay(numba) -> None:
    # a -> r -> b: a->r (2 B/s) shadows r->b (1 B/s). Flow 0: a->b, 1 byte at t=0, rate
    # 1 (r->b). At t=0.5 flow 1: a->r, 1 byte, ends at the relay: a->r is put back for
    # flow 0 too. a->r (2) is shared: flow 0 keeps 1 (r->b), flow 1 gets 2 - 1 = 1;
    # flow 0 ends at 1.0, then flow 1 alone at 2: its 0.5 bytes left by 1.25.
    # Were a->r still left out, flow 1 would run at 2 and end at 1.0.
    if numba and not jit.numba_available():
        pytest.skip("numba not installed")
    links = TinyLinks([("a", "r"), ("r", "a"), ("r", "b"), ("b", "r")],
                      [2.0, 2.0, 1.0, 1.0], [0.0] * 4)
    old = jit.use_numba(numba)
    try:
        if numba:
            jit.kernels()
        env = simpy.Environment()
        net = FlowNetwork(env, links)
        assert net._drop.tolist() == [True, True, False, False]
        done = {}

        def record(e) -> None:
            done[e.value] = env.now

        net.transfer("a", "b", 1.0, tag=0).callbacks.append(record)
        env.run(until=0.5)
        assert net.link_bytes().tolist() == [0.5, 0.0, 0.5, 0.0]   # a->r mirrors r->b
        net.transfer("a", "r", 1.0, tag=1).callbacks.append(record)
        env.run()
    finally:
        jit.use_numba(old)
    assert done == {0: 1.0, 1: 1.25}
    assert net.n_restores == 1 and net._drop.tolist() == [False, True, False, False]
    assert net.link_bytes().tolist() == [2.0, 0.0, 1.0, 0.0]


def test_queued_flows_get_the_shadow_back_too() -> None:
    # the same links; both flows start at t=0: the second route (a->r) puts a->r back,
    # and the first, queued (or routed earlier in the same transfer_many) with a->r left
    # out, gets it too: a->r (2) shared by two flows, flow 0 capped at 1 by r->b, flow
    # 1 gets 1; each 1 byte: both end at 1.0 (left out: flow 1 at 2, ending at 0.5)
    links = TinyLinks([("a", "r"), ("r", "a"), ("r", "b"), ("b", "r")],
                      [2.0, 2.0, 1.0, 1.0], [0.0] * 4)
    done, net = run_flows(FlowNetwork, links, [(0.0, "a", "b", 1.0), (0.0, "a", "r", 1.0)])
    assert [done[0], done[1]] == [1.0, 1.0]
    assert net.n_restores == 1
    env = simpy.Environment()
    net = FlowNetwork(env, links)
    ev = net.transfer_many([("a", "b", 1.0), ("a", "r", 1.0)])
    env.run()
    assert ev.processed and env.now == 1.0 and net.n_restores == 1
    assert net.link_bytes().tolist() == [2.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("numba", [False, True])
def test_same_bits_with_and_without_shadow_links(numba) -> None:
    # 16 GPUs on 2 dgx-h100 nodes, skewed all-to-all-v: the PCIe links in front of
    # each NIC (63 GB/s, the NIC 47.5 GB/s) are left out; delivery times and link
    # bytes are the same bits, the per-link loads seen by on_solve the same up to the
    # order of the sum, and no link is loaded over its capacity
    if numba and not jit.numba_available():
        pytest.skip("numba not installed")
    topo, flows = skewed_case(2)
    cap = np.asarray(topo.capacity_Bps)

    def run(shadow: bool):
        loads = []

        def hook(now, pf, pl, rate):
            load = np.bincount(pl, weights=rate[pf], minlength=len(cap))
            assert np.all(load <= cap * (1 + 1e-12))
            loads.append(load)

        env = simpy.Environment()
        net = FlowNetwork(env, topo, shadow_links=shadow, on_solve=hook)
        done = np.zeros(len(flows))
        for i, f in enumerate(flows):
            net.transfer(*f, tag=i).callbacks.append(
                lambda e: done.__setitem__(e.value, env.now))
        env.run()
        return done, net.link_bytes(), np.array(loads), net.counters(), int(net._drop.sum())

    old = jit.use_numba(numba)
    try:
        if numba:
            jit.kernels()
        d0, b0, l0, c0, n0 = run(False)
        d1, b1, l1, c1, n1 = run(True)
    finally:
        jit.use_numba(old)
    assert n0 == 0 and n1 == 32   # one PCIe link each way per GPU
    assert d1.tobytes() == d0.tobytes()
    assert b1.tobytes() == b0.tobytes()
    assert l1.shape == l0.shape and np.allclose(l1, l0, rtol=1e-14, atol=0.0)
    assert c1["solves"] == c0["solves"] and c1["whole"] == c0["whole"]
    assert c1["pairs"] < c0["pairs"]
