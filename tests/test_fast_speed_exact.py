"""The fast path's speed-ups change no number: each shortcut against the plain
computation it replaces, bit for bit (docs/fast-path.md, "Speed and memory")."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.collectives.algorithms import expand
from moesim.engine.fast import engine as fast_engine
from moesim.engine.fast.engine import simulate_fast
from moesim.engine.fast.links import LinkBytes
from moesim.engine.fast.network import _Incidence
from moesim.engine.fast.stash import RecordStash
from moesim.gating.sampling import sample_counts_fast
from moesim.wiring import resolve_path

#: deepseek-v3-2048 ships DeepSeek's MTP module and its first/last stage split; the
#: cuts below take them off (a pp 2 cut of a few layers cannot hold that split).
NO_MTP = ("model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
          "parallel.decoder_last_pipeline_num_layers=null")

# 32 H800 (4 nodes), DualPipe PP2, EP8 in a node (timed in closed form, so its records
# are stashed), DeepEP as shipped
SMALL = [*NO_MTP, "cluster.nodes=4", "parallel.pp=2", "parallel.ep=8", "model.layers=3",
         "model.first_dense_layers=1", "schedule.microbatches=4", "routing.max_nodes=null"]


def _topo():
    res = resolve_path("deepseek-v3-2048", [*NO_MTP, "cluster.nodes=16", "parallel.pp=2"])
    topo = res.topology
    gpus = list(topo.gpus)
    return topo, gpus, [topo.host_of(g) for g in gpus]


def test_ring_link_loads_equal_phase_by_phase_sums():
    topo, gpus, hosts = _topo()
    lb = LinkBytes(topo, gpus, hosts)
    for op, group, algo in [("reduce_scatter", tuple(range(0, 64, 8)), None),
                            ("all_reduce", tuple(range(16)), "ring"),
                            ("all_gather", (3, 17, 40, 9, 63), None),
                            ("all_reduce", tuple(range(8)), "tree")]:
        acc = np.zeros(len(topo.link_names))
        for ph in expand(op, group, 1.0, algo=algo, rank_host=hosts):
            for s, d, b in ph:
                for lk in topo.route(gpus[s], gpus[d]):
                    acc[lk] += b
        ids, vals = lb._ring_per_byte(op, group, algo)
        assert np.array_equal(ids, np.flatnonzero(acc))
        assert vals.tobytes() == acc[ids].tobytes()


def test_deferred_whole_bytes_equal_call_by_call_adds():
    topo, gpus, hosts = _topo()
    rng = np.random.default_rng(3)
    group = tuple(range(16))
    calls = [rng.integers(0, 10_000, (16, 16)).astype(float) * 7472 for _ in range(20)]
    lazy = LinkBytes(topo, gpus, hosts)
    eager = np.zeros(len(topo.link_names))
    pair, local, ids = lazy._pair_links(group)
    link = ids[local]
    for m in calls:
        lazy.a2a(group, m)
        eager += np.bincount(link, weights=m.ravel()[pair], minlength=len(eager))
        lazy.p2p(2, 9, 3.0e6)
        for lk in topo.route(gpus[2], gpus[9]):
            eager[lk] += 3.0e6
    assert lazy.bytes.tobytes() == eager.tobytes()
    # a fraction of a byte: pending sums go onto the links first, then call by call
    lazy.p2p(1, 2, 0.5)
    for lk in topo.route(gpus[1], gpus[2]):
        eager[lk] += 0.5
    lazy.a2a(group, calls[0])
    eager += np.bincount(link, weights=calls[0].ravel()[pair], minlength=len(eager))
    assert lazy.bytes.tobytes() == eager.tobytes()


def test_link_bound_over_pairs_with_bytes_equals_every_pair():
    topo, gpus, _ = _topo()
    inc = _Incidence(topo, gpus, tuple(range(64)))
    rng = np.random.default_rng(0)
    for arrivals in (np.zeros(64), np.full(64, 2e-3), rng.random(64) * 1e-3):
        m = rng.integers(0, 4, (64, 64)) * 1e6 * (rng.random((64, 64)) < 0.25)
        flat = m.ravel()
        start = np.maximum(arrivals[:, None], arrivals[None, :]).ravel()
        live = flat > 0
        taus = np.unique(arrivals)
        taus = taus[taus >= start[live].min()]
        if len(taus) > 6:
            taus = taus[np.unique(np.linspace(0, len(taus) - 1, 6).round().astype(int))]
        # the bound as written before: over every pair
        w = np.where(start[None, :] >= taus[:, None], flat[None, :], 0.0)
        load = np.stack([np.bincount(inc.link, weights=wk[inc.pair], minlength=inc.n_links)
                         for wk in w], axis=1)
        drain = np.where(load > 0, taus[None, :] + load / inc.cap[:, None], -np.inf)
        f_link = np.append(drain.max(axis=1), -np.inf)
        f_pair = f_link.take(inc.pad_t[0])
        for row in inc.pad_t[1:]:
            np.maximum(f_pair, f_link.take(row), out=f_pair)
        want = np.where(live, np.maximum(f_pair, start) + inc.lat, -np.inf)
        got, got_live = inc.drain_finish(m, arrivals)
        assert np.array_equal(got_live, live)
        assert np.where(live, got, -np.inf).tobytes() == want.tobytes()


def test_counts_of_equal_rows_equal_the_general_path():
    rng = np.random.default_rng(5)
    for e, k, n in [(256, 8, 4096), (64, 2, 100_000), (16, 1, 5000)]:
        pi = rng.dirichlet(np.full(e, 50.0)) * k
        rows = np.full(7, n)
        one = sample_counts_fast(np.random.default_rng(1), rows, pi, k)      # row path
        full = sample_counts_fast(np.random.default_rng(1), rows, np.tile(pi, (7, 1)), k)
        assert np.array_equal(one, full)
        assert (one.sum(axis=1) == k * n).all()


class _Counting(RecordStash):
    served = 0

    def take(self, key):
        rec = super().take(key)
        _Counting.served += rec is not None
        return rec


def test_span_rerun_from_stashed_records_equals_routing_again(monkeypatch):
    monkeypatch.setattr(fast_engine, "RecordStash", _Counting)
    kept = simulate_fast(resolve_path("deepseek-v3-2048", SMALL), span_ranks=2)
    assert _Counting.served > 0                   # the rerun took stashed records
    monkeypatch.setattr(fast_engine, "RecordStash", lambda: RecordStash(max_bytes=0))
    again = simulate_fast(resolve_path("deepseek-v3-2048", SMALL), span_ranks=2)
    assert repr(kept.spans) == repr(again.spans)
    kept.summary.pop("sim_wall_s", None)
    again.summary.pop("sim_wall_s", None)
    assert kept.summary == again.summary
    assert np.asarray(kept.links.bytes).tobytes() == np.asarray(again.links.bytes).tobytes()


def test_compiled_link_bound_equals_numpy_bit_for_bit(monkeypatch):
    """The numba loop of an all-to-all whose members arrive together (every DeepEP
    exchange on EP64) gives the numpy link bound's ends bit for bit."""
    pytest.importorskip("numba")
    from moesim.engine.fast.jit_loops import drain_equal_ends
    from moesim.network import jit

    # finish: numpy (numba may be imported already: the threshold alone does not hold it)
    monkeypatch.setitem(jit._state, "want", False)

    topo, gpus, _ = _topo()
    inc = _Incidence(topo, gpus, tuple(range(64)))
    rng = np.random.default_rng(3)
    for t0, dens, frac in ((0.0, 0.25, False), (2e-3, 0.05, True), (1.5, 1.0, True),
                           (0.0, 0.0, False)):
        m = rng.integers(0, 4, (64, 64)) * 1e6 * (rng.random((64, 64)) < dens)
        if frac:       # fractional bytes (the loads' order matters)
            m = m * rng.random((64, 64)) / 3.0
        a = np.full(64, t0)
        want = inc.finish(m, a)      # numpy
        got = drain_equal_ends(np.ascontiguousarray(m, dtype=float).ravel(), inc.pad_t,
                               inc.cap, inc.lat, 64, t0)
        assert got.tobytes() == want.tobytes()


def test_ll_pair_pass_equals_two_link_bounds_bit_for_bit(monkeypatch):
    """The compiled call that builds and times a DeepEP low-latency dispatch and its combine at once
    gives the byte matrices of ``ll_matrix`` and, for each, the ends of the numpy link
    bound, bit for bit (integer messages, zero rows and a dense case)."""
    pytest.importorskip("numba")
    from moesim.engine.fast.jit_loops import ll_pair_ends
    from moesim.ep.messages import ll_bytes_per_message
    from moesim.ep.plan import ll_matrix
    from moesim.network import jit

    monkeypatch.setitem(jit._state, "want", False)      # inc.finish: numpy
    topo, gpus, _ = _topo()
    inc = _Incidence(topo, gpus, tuple(range(64)))
    rng = np.random.default_rng(5)
    bd = ll_bytes_per_message("fp8", 7168, combine=False)
    bc = ll_bytes_per_message("bf16", 7168, combine=True)
    for lam, dens in ((3.0, 1.0), (1.0, 0.1), (40.0, 0.6), (0.0, 0.0)):
        tok = rng.poisson(lam, (64, 64)) * (rng.random((64, 64)) < dens)
        tok[5] = 0                                      # a rank that sends nothing
        m_d, m_c = np.empty((64, 64)), np.empty((64, 64))
        end_d, end_c = ll_pair_ends(tok.astype(np.int64), float(bd), float(bc), inc.pad_t,
                                    inc.cap, inc.lat, 0.0, m_d, m_c)
        want_d = ll_matrix(tok, "fp8", 7168, combine=False)
        want_c = ll_matrix(tok, "bf16", 7168, combine=True)
        assert m_d.tobytes() == want_d.tobytes()
        assert np.ascontiguousarray(m_c.T).tobytes() == np.ascontiguousarray(want_c).tobytes()
        assert end_d.tobytes() == inc.finish(want_d, np.zeros(64)).tobytes()
        assert end_c.tobytes() == inc.finish(want_c, np.zeros(64)).tobytes()
        if lam:
            assert end_c.max() > end_d.max() > 0    # bf16 combine messages are larger


def test_compiled_link_bound_follows_the_numba_switch(monkeypatch):
    """``use_numba(False)`` (or MOESIM_NUMBA=0) keeps the fast path's link bound on
    numpy; with numba wanted and importable the compiled loop takes over after
    ``JIT_AFTER_CALLS`` calls, or at once once numba is imported."""
    from moesim.engine.fast import network as fast_network
    from moesim.network import jit

    monkeypatch.setattr(fast_network, "JIT_AFTER_CALLS", 0)
    old = jit.use_numba(False)
    try:
        assert fast_network._compiled_drain() is None
        jit.use_numba(True)
        if jit.numba_available():
            assert fast_network._compiled_drain() is not None
    finally:
        jit.use_numba(old)


def test_compiled_link_bound_at_once_when_numba_is_imported(monkeypatch):
    """Once numba is imported (e.g. by the routing sampler) the compiled link bound
    runs from the first call: the import the threshold waits out is paid."""
    pytest.importorskip("numba")
    import numba  # noqa: F401

    from moesim.engine.fast import network as fast_network
    from moesim.network import jit

    monkeypatch.setattr(fast_network, "JIT_AFTER_CALLS", 10**12)
    monkeypatch.setattr(fast_network, "_jit", {"calls": 0, "kernel": None})
    monkeypatch.setitem(jit._state, "want", True)
    assert fast_network._compiled_drain() is not None
    monkeypatch.setitem(jit._state, "want", False)
    assert fast_network._compiled_drain() is None


def test_deepep_plans_from_shared_token_sums_equal_their_own_sums(monkeypatch):
    """The internode plans of one routed micro-batch multiply the token copies summed
    once per counts by their whole bytes per token; every array equals the plan summing
    its own byte products (fp8 dispatch, bf16 dispatch and combine)."""
    from moesim.ep import plan as ep_plan
    from moesim.gating.tokens import DedupCounts

    rng = np.random.default_rng(11)
    n, per = 64, 8
    for _ in range(3):
        gpu = rng.integers(0, 3000, (n, n))
        node = gpu.reshape(n, n // per, per).sum(axis=2) // 2
        counts = DedupCounts(pair_tokens=gpu * 2, gpu_tokens=gpu, node_tokens=node,
                             tokens=gpu.sum(axis=1), ranks_per_node=per)
        for op, dtype in (("ep_dispatch", "fp8"), ("ep_combine", "bf16"),
                          ("ep_dispatch", "bf16")):
            got = ep_plan.plan_ep_exchange(counts, op, "deepep", dtype, 7168, 8)
            with monkeypatch.context() as m:
                m.setattr(ep_plan, "_forwarded", lambda *a: None)
                want = ep_plan.plan_ep_exchange(counts, op, "deepep", dtype, 7168, 8)
            assert [s.matrix.tobytes() for s in got.stages] == \
                [s.matrix.tobytes() for s in want.stages]
            for f in ("sm_write_bytes", "rdma_bytes_per_rank", "nvl_bytes_per_rank"):
                assert getattr(got, f).tobytes() == getattr(want, f).tobytes()


def test_dedup_estimate_from_the_dispatch_equals_its_own_sums():
    """Without replicas or padding, routing hands its dispatch (assignments per source
    and home rank) to the dedup estimate: the same copies as summing ``kept`` again."""
    from moesim.gating import dedup

    rng = np.random.default_rng(2)
    home = np.repeat(np.arange(64), 4)      # Megatron-Core: expert e on rank e // 4
    ratios = (rng.random(64) * 0.5 + 0.4, rng.random(8) * 0.3 + 0.2)
    for _ in range(3):
        kept = rng.integers(0, 200, (64, 256))
        by_rank = np.zeros((64, 64), dtype=np.int64)
        for e, h in enumerate(home):
            by_rank[:, h] += kept[:, e]
        want = dedup.estimate(kept, home, 8, ratios)
        got = dedup.estimate(kept, home, 8, ratios, by_rank=by_rank)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(want, got, strict=True))


def test_compiled_staggered_link_bound_equals_numpy_bit_for_bit(monkeypatch):
    """The numba loop of an all-to-all whose members arrive apart (start levels, the
    staggered link bound of groups over ``SHARING_MAX_MEMBERS``) gives the numpy
    ``drain_finish`` ends bit for bit: distinct arrivals, more arrivals than levels
    (quantiles), ties, fractional and negative bytes, no bytes."""
    pytest.importorskip("numba")
    from moesim.engine.fast import network as fast_network
    from moesim.network import jit

    topo, gpus, _ = _topo()
    inc = _Incidence(topo, gpus, tuple(range(64)))
    rng = np.random.default_rng(7)
    cases = []
    for dens, frac, spread in ((0.25, False, 3), (0.05, True, 64), (1.0, True, 10),
                               (0.6, True, 2), (0.0, False, 5), (0.3, False, 64)):
        m = rng.integers(0, 4, (64, 64)) * 1e6 * (rng.random((64, 64)) < dens)
        if frac:
            m = m * rng.random((64, 64)) / 3.0
        a = rng.integers(0, spread, 64) * 1.7e-4 + 0.25
        cases.append((m, a))
    m, a = cases[1]
    m = m.copy()
    m[0, 1] = -5.0                      # bytes below zero: loaded, not a live flow
    cases.append((m, a))
    cases.append((cases[0][0].T, cases[0][1]))    # a transposed view
    monkeypatch.setitem(jit._state, "want", False)
    want = [inc.finish(m, a) for m, a in cases]
    monkeypatch.setitem(jit._state, "want", True)
    monkeypatch.setattr(fast_network, "JIT_AFTER_CALLS", 0)
    assert fast_network._compiled_drain(levels=True) is not None
    for (m, a), w in zip(cases, want, strict=True):
        assert inc.finish(m, a).tobytes() == w.tobytes()
