"""The lockstep fast path (moesim.engine.fast) against hand arithmetic and the exact
flow-level engine."""

from __future__ import annotations

import json

import numpy as np
import pytest
import simpy

from moesim.collectives.communicator import CollectiveSpec, Communicator
from moesim.collectives.simulate import make_network, rank_hosts, simulate_collective
from moesim.compute.devices import get_device
from moesim.compute.roofline import RooflineModel
from moesim.engine.fast import network as fast_network
from moesim.engine.fast.dp import RingCost
from moesim.engine.fast.engine import simulate_fast
from moesim.engine.fast.network import FastNetwork
from moesim.errors import InputError
from moesim.model import costs, model_from_dict
from moesim.trace.report import jsonable
from moesim.wiring import resolve_path, simulate
from tests._util import two_gpu_scenario

#: deepseek-v3-2048 ships DeepSeek's MTP module and its first/last stage split; the
#: cuts below take them off (a pp 2 cut of a few layers cannot hold that split).
NO_MTP = ("model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
          "parallel.decoder_last_pipeline_num_layers=null")

# DeepSeek-V3 shape small enough for the exact engine: 128 GPUs, PP2, EP16 over two
# nodes (all-to-alls cross InfiniBand), ZeRO-1, 4 MoE layers, 4 micro-batches
# engine.mode=exact: `simulate` must run the exact engine (the shipped scenario selects
# the fast path); the overlap setting is given explicitly in each case
# the shipped scenario trains with DualPipe and DeepEP; these cases measure the 1F1B
# NCCL path (tests/test_ep_engine.py and benchmarks/bench_deepseek.py the others)
FIDELITY = [*NO_MTP, "schedule.kind=1f1b", "overlap.kind=none", "parallel.ep_backend.kind=nccl",
            "engine.mode=exact", "cluster.nodes=16", "parallel.pp=2", "parallel.ep=16",
            "model.layers=4", "model.first_dense_layers=0", "schedule.microbatches=4",
            "routing.max_nodes=null", "overlap.ep_comm_overlap=false"]


def two_rank(tmp_path, **over):
    return resolve_path(two_gpu_scenario(tmp_path, **over))


def spans_of(result, rank, name, kind=None):
    return [s for s in result.spans if s.rank == rank and s.name == name
            and (kind is None or s.kind == kind)]


def test_two_rank_hot_expert_stall_by_hand_and_equal_to_exact(tmp_path):
    res = two_rank(tmp_path)
    fast, exact = simulate_fast(res), simulate(res)
    spec = model_from_dict({"preset": "toy", "layers": 1}, "t")
    model = RooflineModel(get_device("H100"))
    exp = {rk: spans_of(fast, rk, "fwd.experts")[0] for rk in (0, 1)}
    ex_exp = {rk: spans_of(exact, rk, "fwd.experts")[0] for rk in (0, 1)}
    t_exp = {rk: sum(model.time_s(k) for n in ex_exp[rk].args["expert_tokens"].values()
                     for k in costs.expert_kernels(spec, n)) for rk in (0, 1)}
    for rk in (0, 1):
        assert exp[rk].dur_s == pytest.approx(t_exp[rk], rel=1e-12)
        assert exp[rk].tokens == ex_exp[rk].tokens
    # the cold rank 1 waits at the combine for hot expert 0 on rank 0, by the difference
    # of their expert times (both leave the dispatch together)
    stall = spans_of(fast, 1, "fwd.combine", "stall")
    assert len(stall) == 1
    assert stall[0].dur_s == pytest.approx(t_exp[0] - t_exp[1], rel=1e-9)
    assert stall[0].waited_on == 0 and stall[0].expert == 0
    assert not spans_of(fast, 0, "fwd.combine", "stall")
    ex_stall = spans_of(exact, 1, "fwd.combine", "stall")[0]
    assert stall[0].dur_s == pytest.approx(ex_stall.dur_s, rel=1e-9)
    # one flow per link each way: the link bound is the flow model, so the whole step
    # and its breakdown agree with the exact engine
    assert fast.step_time_s == pytest.approx(exact.step_time_s, rel=1e-9)
    for k, v in exact.summary["breakdown_s"].items():
        assert fast.summary["breakdown_s"][k] == pytest.approx(v, rel=1e-6, abs=1e-12), k


def test_summary_keys_tokens_and_flops_equal_exact(tmp_path):
    res = two_rank(tmp_path, schedule={"kind": "1f1b", "microbatches": 3,
                                       "micro_batch_size": 1, "seq_len": 256})
    fast, exact = simulate_fast(res), simulate(res)
    fs, es = fast.summary, exact.summary
    assert set(es) - {"replicas", "sim_wall_s"} <= set(fs)
    assert fs["engine"] == "fast" and fs["shortcuts"]
    assert fs["experts"] == es["experts"]            # same routing calls, same seeds
    assert fs["memory"] == es["memory"]
    assert fs["model_flops"] == pytest.approx(es["model_flops"], rel=1e-12)
    # tokens conserved: every routed assignment of every micro-batch lands on an expert
    spec = res.model
    tok = np.asarray(fs["experts"]["tokens_per_expert"])
    assert (tok.sum(axis=1) == fs["tokens_per_step"] * spec.top_k).all()
    for row in fs["per_rank"]:      # each rank's categories sum to the step
        assert sum(row["breakdown_s"].values()) == pytest.approx(fs["step_time_s"], rel=1e-9)


def test_progress_protocol_matches_the_exact_engine(tmp_path):
    calls = []
    simulate_fast(two_rank(tmp_path), progress=lambda stage, n: calls.append((stage, n)))
    assert calls[0][0] == "built"
    assert sum(n for _, n in calls[1:]) == calls[0][1] == 2    # F0 and B0 of one chain


def test_same_seed_same_bytes(tmp_path):
    res = two_rank(tmp_path)
    a, b = simulate_fast(res).summary, simulate_fast(res).summary
    a.pop("sim_wall_s")
    b.pop("sim_wall_s")
    assert json.dumps(jsonable(a), sort_keys=True) == json.dumps(jsonable(b), sort_keys=True)


def test_unknown_replicas_mode_is_an_input_error(tmp_path):
    with pytest.raises(InputError):
        simulate_fast(two_rank(tmp_path), replicas="mirrored")


def test_ring_closed_form_equals_flow_engine():
    res = resolve_path("deepseek-v3-2048", FIDELITY)
    topo = res.topology
    gpus = list(topo.gpus)
    rh = [topo.host_of(g) for g in gpus]
    rc = RingCost(topo, gpus, rh)
    for kind in ("dp", "edp"):
        g = res.layout.group_of(0, kind)
        for op in ("reduce_scatter", "all_reduce"):
            exact = simulate_collective(topo, op, 1e9, ranks=list(g))["time_s"]
            assert rc.time(op, tuple(g), 1e9) == pytest.approx(exact, rel=1e-9), (kind, op)


def flow_a2a_ends(topo, group, matrix, arrivals=None) -> np.ndarray:
    """Per member (group order): end of its part of a direct all-to-all-v in the
    flow-level engine, member i joining at ``arrivals[i]`` (the exact engine's
    communicator and max-min network)."""
    env = simpy.Environment()
    comm = Communicator(env, make_network(env, topo, "flow"), topo.gpus,
                        rank_host=rank_hosts(topo))
    spec = CollectiveSpec("all_to_all_v", tuple(int(r) for r in group), nbytes=0.0,
                          matrix=np.asarray(matrix, float), algo="direct")
    arr = np.zeros(len(group)) if arrivals is None else np.asarray(arrivals, float)
    events = {}

    def join(r, t):
        yield env.timeout(t)
        events[r] = comm.join("a2a", r, spec)

    for r, t in zip(group, arr, strict=True):
        env.process(join(int(r), float(t)))
    env.run()
    return np.array([events[int(r)].value.end_s for r in group])


def fidelity_net():
    res = resolve_path("deepseek-v3-2048", FIDELITY)
    topo = res.topology
    gpus = list(topo.gpus)
    return res, topo, FastNetwork(topo, gpus, [topo.host_of(g) for g in gpus])


def zipf_matrix(rng, k: float, n: int) -> np.ndarray:
    """MoE-like bytes: zipf expert popularity times lognormal noise, 8 MB per sender
    per 16 members, no self traffic."""
    pop = 1.0 / np.arange(1, n + 1)
    rng.shuffle(pop)
    m = pop[None, :] * rng.lognormal(0.0, 0.5, (n, n))
    m = m / m.sum(axis=1, keepdims=True) * 8e6 * n / 16 * k
    np.fill_diagonal(m, 0)
    return m


def test_processor_sharing_on_one_link_by_hand():
    """Three flows into GPU 0 of one node (its NVLink down link is shared, each
    sender's link carries one flow): processor sharing ends the flow of s bytes at
    Σ_j min(s_j, s) / C, i.e. 3 s1 / C, (s1 + 2 s2) / C, (s1 + s2 + s3) / C; the
    flow engine gives the same per member."""
    _, topo, net = fidelity_net()
    gpus = list(topo.gpus)
    g = (0, 1, 2, 3)
    m = np.zeros((4, 4))
    m[1, 0], m[2, 0], m[3, 0] = 1e6, 2e6, 3e6
    path = topo.route(gpus[1], gpus[0])
    cap = float(np.asarray(topo.capacity_Bps)[list(path)].min())
    lat = float(topo.latency_s[list(path)].sum())
    end = net.a2a_finish(g, m, np.zeros(4))
    want = np.array([6e6, 3e6, 5e6, 6e6]) / cap + lat
    assert end == pytest.approx(want, rel=1e-9)
    assert end == pytest.approx(flow_a2a_ends(topo, g, m), rel=1e-9)
    # the old link bound ended every member at the drain of the shared link, 6 MB / C


# measured worst member error, fast vs flow engine (the old staggered link bound in
# brackets): 1 node 0 (64.9 % skew, 31.3 % skew staggered, 1.2 % zipf staggered);
# 2 nodes uniform 0 (0), zipf 5.3 % (25.6 %), zipf staggered 0.6 % (1.5 %), skew 10.8 %
# (52.2 %); 8 nodes zipf 0 (62.0 %), zipf staggered 44.8 % (60.3 %); the end of the
# whole all-to-all within 0.5 % in every case
@pytest.mark.parametrize(("nodes", "kind", "stagger", "bound"), [
    (1, "uniform", 0.0, 1e-6), (1, "skew", 0.0, 1e-6), (1, "skew", 1e-3, 1e-6),
    (1, "zipf", 1e-3, 1e-6), (2, "uniform", 0.0, 1e-6), (2, "zipf", 0.0, 0.06),
    (2, "zipf", 3e-3, 0.01), (2, "skew", 0.0, 0.12), (8, "zipf", 0.0, 1e-6),
    (8, "zipf", 1e-3, 0.5),
])
def test_all_to_all_per_member_against_flow_engine(nodes, kind, stagger, bound, monkeypatch):
    """Per-member ends of one all-to-all-v (members joining at random times within
    ``stagger``) against the flow engine, as a fraction of the all-to-all's span. One
    node (flows share only their GPUs' NVLink ports) is exact; across nodes, flows
    relayed over NVLink to another GPU's NIC are held back by two links in turn, which
    per-link sharing does not see, and members joining late cut in on flows already
    running (not counted)."""
    monkeypatch.setattr(fast_network, "SHARING_MAX_MEMBERS", 64)   # sharing at 8 nodes too
    res, topo, net = fidelity_net()
    g = tuple(range(8 * nodes))
    n = len(g)
    rng = np.random.default_rng(1)
    if kind == "uniform":
        m = np.full((n, n), 1e6)
        np.fill_diagonal(m, 0)
    elif kind == "skew":
        m = rng.integers(1, 100, (n, n)).astype(float) * 1e5
        m[3] *= 5
        np.fill_diagonal(m, 0)
    else:
        m = zipf_matrix(rng, 1.0, n)
    arr = rng.uniform(0, stagger, n) if stagger else np.zeros(n)
    exact = flow_a2a_ends(topo, g, m, arr)
    fast = net.a2a_finish(g, m, arr)
    span = exact.max() - arr.min()
    assert np.abs(fast - exact).max() / span < bound
    assert abs(fast.max() / exact.max() - 1) < 0.006


def test_groups_above_the_sharing_limit_take_the_staggered_link_bound():
    """Above SHARING_MAX_MEMBERS (cost: docs/fast-path.md) an all-to-all ends every
    flow when all links of its path have drained: on a 64-member zipf all-to-all the
    members end within 0.04 % of the flow engine's end (measured), but not at their
    own ends (62 % of the span off, measured; per-link sharing: 0)."""
    res, topo, net = fidelity_net()
    g = tuple(range(64))
    assert len(g) > fast_network.SHARING_MAX_MEMBERS
    m = zipf_matrix(np.random.default_rng(1), 1.0, 64)
    end = net.a2a_finish(g, m, np.zeros(64))
    inc = net.incidence(g)
    drain, _ = inc.drain_finish(m, np.zeros(64))
    drain = np.where(m.ravel() > 0, drain, -np.inf).reshape(64, 64)
    assert end == pytest.approx(np.maximum(drain.max(axis=1), drain.max(axis=0)), rel=1e-12)
    exact = flow_a2a_ends(topo, g, m)
    assert abs(end.max() / exact.max() - 1) < 0.001
    assert np.abs(end - exact).max() / exact.max() > 0.5


def test_all_to_all_skewed_two_nodes_max_end_against_flow_engine():
    """A skewed matrix over two nodes: flows relayed to the other node's NIC over
    NVLink are held back by the NIC early and by NVLink late, which per-link sharing
    does not see; the end of the all-to-all stays within 2 % (measured -1.7 %)."""
    res, topo, net = fidelity_net()
    g = res.layout.group_of(0, "ep")          # 16 GPUs on 2 nodes
    rng = np.random.default_rng(0)
    skew = rng.integers(1, 100, (16, 16)).astype(float) * 1e5
    skew[3] *= 5
    np.fill_diagonal(skew, 0)
    exact = simulate_collective(topo, "all_to_all_v", ranks=list(g), matrix=skew)["time_s"]
    bound = net.a2a_finish(g, skew, np.zeros(16)).max()
    assert abs(bound / exact - 1) < 0.02


def test_late_member_starts_the_flows_it_is_in():
    """Rank 0 arrives 1 ms late: every flow touching it starts then, the others at 0."""
    res = resolve_path("deepseek-v3-2048", FIDELITY)
    topo = res.topology
    gpus = list(topo.gpus)
    net = FastNetwork(topo, gpus, [topo.host_of(g) for g in gpus])
    g = res.layout.group_of(0, "ep")[:8]      # one node: NVLink through one switch
    m = np.full((8, 8), 1e6)
    np.fill_diagonal(m, 0)
    cap = float(topo.capacity_Bps[topo.route(gpus[g[0]], gpus[g[1]])[0]])
    lat = float(topo.latency_s[list(topo.route(gpus[g[0]], gpus[g[1]]))].sum())
    arr = np.zeros(8)
    arr[0] = 1e-3
    end = net.a2a_finish(g, m, arr)
    # rank 0's out-link carries 7 MB, all starting at 1 ms
    assert end[0] == pytest.approx(1e-3 + 7e6 / cap + lat, rel=1e-9)
    # rank 1's link drained 6 MB by 6e6/cap < 1 ms; its flows with rank 0 need 1 MB more
    assert end[1] == pytest.approx(1e-3 + 7e6 / cap + lat, rel=1e-9)


def assert_close_to_exact(fast, exact, step_tol, cat_tol, stall_tol):
    step = exact.step_time_s
    assert abs(fast.step_time_s - step) / step < step_tol
    for k, v in exact.summary["breakdown_s"].items():
        assert abs(fast.summary["breakdown_s"][k] - v) / step < cat_tol, k
    fs = np.array([r["breakdown_s"]["stall"] for r in fast.summary["per_rank"]])
    es = np.array([r["breakdown_s"]["stall"] for r in exact.summary["per_rank"]])
    assert np.abs(fs - es).max() / step < stall_tol


@pytest.mark.slow
def test_fidelity_128_gpus_against_exact_engine(monkeypatch):
    """The issue's check: step, every breakdown category and every rank's stall within
    1 % of the step. EP16 spans two nodes, so the fast path runs its all-to-alls on the
    flow network (measured: step -0.45 %, worst category 0.33 %, worst stall 0.51 %);
    with per-link sharing instead (groups over one host forced onto it) the stall
    misses: -0.49 %, 0.58 %, 1.52 % (docs/fast-path.md)."""
    res = resolve_path("deepseek-v3-2048", FIDELITY)
    exact = simulate(res, record_series=False)
    fast = simulate_fast(res)
    assert_close_to_exact(fast, exact, 0.01, 0.01, 0.01)
    assert fast.summary["experts"] == exact.summary["experts"]
    monkeypatch.setattr(fast_network, "EXACT_MAX_MEMBERS", 0)
    shared = simulate_fast(res)
    assert_close_to_exact(shared, exact, 0.01, 0.01, 0.02)


@pytest.mark.slow
@pytest.mark.parametrize("shape, tol", [
    # measured -0.46 % on the scenario's routing and recompute of the time (zipf 0.3,
    # full), pinned here
    ([*FIDELITY[:-1], "overlap.ep_comm_overlap=true", "routing.kind=zipf",
      "routing.zipf_s=0.3", "memory.recompute=full"], 0.015),
    # the balanced routing the scenario ships: stage 0's forward sends share the NICs
    # with the other micro-batch's all-to-all (moesim.engine.fast.flow_a2a); measured
    # -0.09 %, -1.66 % with the sends alone on their path (docs/fast-path.md)
    ([*FIDELITY[:-1], "overlap.ep_comm_overlap=true"], 0.005),
    ([*NO_MTP, "schedule.kind=1f1b", "overlap.kind=none", "parallel.ep_backend.kind=nccl",
      "engine.mode=exact", "cluster.nodes=8", "parallel.pp=8", "parallel.ep=8",
      "model.layers=8", "model.first_dense_layers=0", "schedule.microbatches=16",
      "routing.max_nodes=null", "overlap.ep_comm_overlap=true"], 0.015),    # measured +0.77 %
], ids=["zipf", "balanced", "pp8"])
def test_fidelity_with_ep_overlap_step_only(shape, tol):
    """EP overlap (DeepSeek's setting): the step within ``tol`` of the exact engine's
    (docs/fast-path.md)."""
    res = resolve_path("deepseek-v3-2048", shape)
    fast, exact = simulate_fast(res), simulate(res, record_series=False)
    assert exact.summary.get("engine") != "fast"
    assert abs(fast.step_time_s / exact.step_time_s - 1) < tol


@pytest.mark.slow
def test_mixtral_64gpu_fast_against_exact():
    """The shipped 64-GPU Mixtral (interleaved PP4 v=2, EP8 in a node, 8 nodes) with 8
    micro-batches instead of 16 (half the exact engine's 25 s): fast path against the
    exact engine, measured step +0.015 %, worst category 0.105 % of the step, worst
    per-rank stall 0.210 % of the step (as shipped, 16 micro-batches: +0.008 %, 0.058 %,
    0.115 %; docs/fast-path.md)."""
    res = resolve_path("mixtral-8x7b-64gpu", ["engine.mode=exact", "schedule.microbatches=8"])
    exact = simulate(res, record_series=False)
    assert exact.summary.get("engine") != "fast"
    assert_close_to_exact(simulate_fast(res), exact, 0.002, 0.003, 0.004)


def test_spans_bounded_to_lowest_and_hot_ranks_per_rank_covers_all():
    res = resolve_path("hot-expert")
    out = simulate_fast(res, span_ranks=2)
    hot = set(out.summary["hot_ranks"])
    assert hot and not hot <= {0, 1}                 # some hot rank beyond the lowest two
    kept = out.summary["spans_kept"]
    assert {s.rank for s in out.spans} == set(kept["ranks"])
    # the lowest two, the hot ranks and the most-stalled rank (one stage, one chain)
    stall = [r["breakdown_s"]["stall"] for r in out.summary["per_rank"]]
    worst = int(np.argmax(stall))
    assert set(kept["ranks"]) == {0, 1, worst} | hot and kept["most_stalled_rank"] == worst
    assert [r["rank"] for r in out.summary["per_rank"]] == list(range(res.layout.world))
    full = simulate_fast(res)                        # the spans kept do not change results
    assert full.summary["per_rank"] == out.summary["per_rank"]


def test_multi_host_groups_run_flow_by_flow_exactly():
    """EP16 over two nodes: a2a_finish takes the flow network, per member equal to the
    exact engine's communicator (pairwise starts, max-min), arrivals staggered."""
    res, topo, net = fidelity_net()
    g = tuple(res.layout.group_of(0, "ep"))
    rng = np.random.default_rng(7)
    m = zipf_matrix(rng, 1.0, len(g))
    arr = 3.0 + rng.uniform(0, 2e-3, len(g))
    got = net.a2a_finish(g, m, arr)
    np.testing.assert_allclose(got, flow_a2a_ends(topo, g, m, arr), rtol=0, atol=1e-12)
    assert np.all(got >= arr)


@pytest.mark.slow
def test_link_bound_of_an_ep64_all_to_all():
    """Groups over 32 members keep the staggered link bound: on one EP64 all-to-all of
    deepseek-v3-2048 (8 nodes, zipf bytes, arrivals staggered over 1 ms) its last
    member ends within 1.5 % of the all-to-all's span of the flow engine's (measured
    -0.92 %), and no member ends earlier than its exact end by more (members end
    together: up to 60 % of the span late, measured)."""
    res = resolve_path("deepseek-v3-2048")
    topo = res.topology
    gpus = list(topo.gpus)
    net = FastNetwork(topo, gpus, [topo.host_of(gp) for gp in gpus])
    g = tuple(res.layout.group_of(0, "ep"))
    assert len(g) > fast_network.EXACT_MAX_MEMBERS
    rng = np.random.default_rng(0)
    m = zipf_matrix(rng, 3.0, len(g))
    arr = rng.uniform(0, 1e-3, len(g))
    exact = net.exact_finish(g, m, arr)
    bound = net.a2a_finish(g, m, arr)
    span = exact.max() - arr.min()
    assert abs(bound.max() - exact.max()) / span < 0.015
    assert (bound - exact).min() / span > -0.015
