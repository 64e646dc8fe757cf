"""FlowNetwork.send (a callback at delivery, no per-flow event), the communicator's use
of it, and the collector paused around a step (moesim.engine.collector)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import simpy

from moesim.collectives.communicator import CollectiveSpec, Communicator
from moesim.engine import collector
from moesim.engine.exact.mirrored import MirroredNetwork
from moesim.network import FlowNetwork
from tests.test_network_flow import LAT, TinyLinks, chain


def send_flows(links, flows, **kw):
    """flows: (start_s, src, dst, bytes) started with send(); (delivery times, calls)."""
    env = simpy.Environment()
    net = FlowNetwork(env, links, **kw)
    done: dict[int, float] = {}
    calls: list[int] = []

    def start(i, t, src, dst, nbytes):
        yield env.timeout(t)

        def cb(_ev, i=i):
            calls.append(i)
            done[i] = env.now

        net.send(src, dst, nbytes, cb)

    for i, f in enumerate(flows):
        env.process(start(i, *f))
    env.run()
    return [done[i] for i in range(len(flows))], calls, net


def test_send_parking_lot_exact_times() -> None:
    # the parking lot of test_network_flow, flows started with send(): long a->d 600 B,
    # s1 a->b 100 B, s2 b->c 300 B, s3 c->d 100 B on 100 B/s links: s1, s3 at 2 s,
    # s2 at 6 s, the long one at 9 s, each plus its path latency
    links = chain([100.0, 100.0, 100.0], [1e-6, 2e-6, 3e-6])
    flows = [(0, "a", "d", 600), (0, "a", "b", 100), (0, "b", "c", 300), (0, "c", "d", 100)]
    times, calls, net = send_flows(links, flows)
    assert times == pytest.approx([9 + 6e-6, 2 + 1e-6, 6 + 2e-6, 2 + 3e-6], rel=1e-12)
    assert sorted(calls) == [0, 1, 2, 3]   # each callback once
    assert net.link_bytes().tolist() == [700.0, 900.0, 700.0]
    assert net.active_flows() == 0 and not net._groups


def test_send_and_transfer_share_links_as_one_network() -> None:
    # a send() and a transfer() of 1000 B each on one 100 B/s link: 50 B/s each, both
    # delivered at 20 s + latency
    links = chain([100.0], [LAT])
    env = simpy.Environment()
    net = FlowNetwork(env, links)
    got = {}
    net.send("a", "b", 1000, lambda _e: got.setdefault("send", env.now))
    net.transfer("a", "b", 1000, tag="t").callbacks.append(
        lambda e: got.setdefault(e.value, env.now))
    env.run()
    assert got == pytest.approx({"send": 20 + LAT, "t": 20 + LAT}, rel=1e-12)


@pytest.mark.parametrize(("src", "dst", "nbytes", "at"), [
    ("a", "a", 10**9, 0.0),        # no link crossed: delivered at once
    ("a", "c", 0, 3e-6),           # zero bytes: the path latency alone
])
def test_send_degenerate_flows(src, dst, nbytes, at) -> None:
    links = chain([100.0, 50.0], [1e-6, 2e-6])
    times, calls, _ = send_flows(links, [(0, src, dst, nbytes)])
    assert times == pytest.approx([at], abs=1e-15)
    assert calls == [0]


def test_send_rejects_bad_bytes() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, chain([100.0], [LAT]))
    with pytest.raises(ValueError, match="bytes must be finite"):
        net.send("a", "b", float("nan"), lambda _e: None)


class EventsOnly:
    """A FlowNetwork seen without its send(): the communicator falls back to events."""

    def __init__(self, net: FlowNetwork) -> None:
        self.net, self.env = net, net.env

    def transfer(self, *a, **kw):
        return self.net.transfer(*a, **kw)

    def transfer_many(self, *a, **kw):
        return self.net.transfer_many(*a, **kw)


@pytest.mark.parametrize("arrivals", [(0.0, 0.0, 0.0, 0.0), (0.0, 3.0, 1.0, 0.5)])
def test_communicator_direct_all_to_all_same_with_and_without_send(arrivals) -> None:
    """A direct all_to_all_v among 4 ranks of a star (one 100 B/s link each way per
    rank), members arriving at different times: the records are the same bits whether
    the flows report by callback (send) or by event (transfer)."""
    hub = [("h", f"g{i}") for i in range(4)] + [(f"g{i}", "h") for i in range(4)]
    links = TinyLinks(hub, [100.0] * 8, [1e-6] * 8)
    m = np.array([[0, 300, 100, 200], [50, 0, 400, 100], [100, 100, 0, 600],
                  [200, 0, 300, 0]], dtype=float)
    spec = CollectiveSpec("all_to_all_v", (0, 1, 2, 3), matrix=m, algo="direct")
    out = []
    for wrap in (False, True):
        env = simpy.Environment()
        net = FlowNetwork(env, links)
        comm = Communicator(env, EventsOnly(net) if wrap else net, [f"g{i}" for i in range(4)])
        assert (comm._send is None) == wrap
        recs = {}

        def member(r, t, comm=comm, env=env, recs=recs):
            yield env.timeout(t)
            recs[r] = yield comm.join("a2a", r, spec)

        for r, t in enumerate(arrivals):
            env.process(member(r, t))
        env.run()
        out.append({r: (rec.start_s, rec.end_s, rec.wait_s, rec.blocking_rank)
                    for r, rec in sorted(recs.items())})
        assert net.link_bytes().sum() == 2 * m.sum()   # every byte over two links
    assert out[0] == out[1]
    if arrivals[1] == 3.0:   # rank 1 last, at 3 s: rank 0 waits 3 s for it, rank 3 2.5 s
        start, _, wait, blocking = out[0][1]
        assert (start, wait, blocking) == (3.0, 0.0, -1)
        assert out[0][0][2:] == (3.0, 1) and out[0][3][2:] == (2.5, 1)
    else:                    # all at 0: rank 2 sends 800 B over its 100 B/s link: >= 8 s
        assert all(w == 0.0 for _, _, w, _ in out[0].values())
        assert out[0][2][1] >= 8.0


def test_mirrored_network_is_not_bypassed_by_send() -> None:
    """The identical-replicas proxy starts copies of each flow for the mirrors; it
    delegates other attributes to the network, but not send(): the communicator must
    start flows through the proxy's transfer, or the mirrors' bytes go missing."""
    links = TinyLinks([("h", "g0"), ("h", "g1"), ("g0", "h"), ("g1", "h"), ("h", "m0"),
                       ("h", "m1"), ("m0", "h"), ("m1", "h")], [100.0] * 8, [0.0] * 8)
    env = simpy.Environment()
    net = FlowNetwork(env, links)
    proxy = MirroredNetwork(net, {"g0": ("m0",), "g1": ("m1",)})
    comm = Communicator(env, proxy, ["g0", "g1"])
    assert comm._send is None
    spec = CollectiveSpec("all_to_all_v", (0, 1), matrix=np.array([[0.0, 500], [300, 0]]),
                          algo="direct")
    evs = [comm.join("a2a", r, spec) for r in (0, 1)]
    env.run()
    assert all(ev.processed for ev in evs)
    # 500 + 300 B for the group and again for the mirrors, each over two links
    assert net.link_bytes().sum() == 2 * 2 * 800
    assert proxy.n_mirrored == 2


def test_collector_paused_restores_state() -> None:
    assert gc.isenabled()
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():   # nested: still off, and not turned on by the inner one
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()   # off before, off after
    finally:
        gc.enable()


def test_collector_paused_restores_on_error_and_freezes_on_request() -> None:
    with pytest.raises(RuntimeError), collector.paused():
        raise RuntimeError("inside")
    assert gc.isenabled()
    before = gc.get_freeze_count()
    keep = [[i] for i in range(1000)]   # tracked objects alive at the end of the block
    try:
        with collector.paused(freeze=True):
            keep.append([0])
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(keep)
    finally:
        gc.unfreeze()


def test_moesim_run_freezes_only_as_its_own_process(tmp_path, monkeypatch, capsys) -> None:
    """``moesim run`` called in a process that goes on (here: pytest) leaves the
    collector as it was; from the process's own command line it freezes what the step
    left (the process exits next). It writes out/toy-cpu/ under tmp_path."""
    from moesim.cli import main
    monkeypatch.chdir(tmp_path)
    before = gc.get_freeze_count()
    assert main(["run", "toy-cpu", "--quiet"]) == 0
    assert gc.get_freeze_count() == before and gc.isenabled()
    monkeypatch.setattr("sys.argv", ["moesim", "run", "toy-cpu", "--quiet"])
    try:
        assert main() == 0
        assert gc.get_freeze_count() > before and gc.isenabled()
    finally:
        gc.unfreeze()
    assert "toy-cpu" in capsys.readouterr().out
