"""DeepEP exchanges inside a step: the collective's timing rule by hand, the routed
micro-batch's deduplicated copies, and the two engines against each other."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from moesim.collectives.communicator import Communicator
from moesim.collectives.ep_exchange import EPExchangeSpec
from moesim.gating import RoutingConfig, make_placement, route_microbatch
from moesim.gating.dedup import from_choices
from moesim.network import FlowNetwork
from moesim.units import GB
from moesim.wiring import simulate

#: deepseek-v3-2048 ships DeepSeek's MTP module and its first/last stage split; the
#: cuts below take them off (a pp 2 cut of a few layers cannot hold that split).
NO_MTP = ("model.mtp_layers=0", "parallel.decoder_first_pipeline_num_layers=null",
          "parallel.decoder_last_pipeline_num_layers=null")


class OneLink:
    capacity_Bps = np.full(2, 100 * GB)
    latency_s = np.zeros(2)
    link_names = ["g0->g1", "g1->g0"]
    link_kinds = ["ib"] * 2

    def route(self, src: str, dst: str, key: int = 0) -> tuple[int, ...]:
        return (0,) if (src, dst) == ("g0", "g1") else (1,)


def test_exchange_rule_by_hand():
    # 1 GB over 100 GB/s = 10 ms after a 2 ms notify; rank 0's SM bound (5 ms) is below
    # its network time, rank 1's (20 ms) above; both add 1 ms of fill/drain
    env = simpy.Environment()
    comm = Communicator(env, FlowNetwork(env, OneLink()), ["g0", "g1"], rank_host=[0, 1])
    spec = EPExchangeSpec(group=(0, 1), kernel="deepep", ep_op="ep_dispatch",
                          matrix=np.array([[0.0, 1 * GB], [0.0, 0.0]]),
                          sm_s=np.array([0.005, 0.020]),
                          fill_s=0.001, notify_s=0.002, sms=20)
    ends = {}
    for r in (0, 1):
        comm.join("x", r, spec).callbacks.append(lambda e, r=r: ends.__setitem__(r, e.value))
    env.run()
    assert ends[0].end_s == pytest.approx(0.002 + 0.010 + 0.001, rel=1e-12)
    assert ends[1].end_s == pytest.approx(0.002 + 0.020 + 0.001, rel=1e-12)


def test_exchange_waits_for_every_member():
    env = simpy.Environment()
    comm = Communicator(env, FlowNetwork(env, OneLink()), ["g0", "g1"], rank_host=[0, 1])
    spec = EPExchangeSpec(group=(0, 1), kernel="deepep", ep_op="ep_combine",
                          matrix=np.array([[0.0, 0.0], [1 * GB, 0.0]]), sm_s=np.zeros(2))
    ends = {}

    def late():
        yield env.timeout(0.004)
        ev = comm.join("x", 1, spec)
        ends[1] = (yield ev)

    ends0 = comm.join("x", 0, spec)
    env.process(late())
    env.run()
    assert ends0.value.wait_s == pytest.approx(0.004) and ends0.value.blocking_rank == 1
    assert ends0.value.end_s == pytest.approx(0.014, rel=1e-12)


def _route(path: str, k: int = 2, max_nodes=None, tokens: int = 64):
    cfg = RoutingConfig(kind="zipf", zipf_s=1.0, path=path, max_nodes=max_nodes)
    pl = make_placement(16, 8)
    return route_microbatch(cfg, n_experts=16, top_k=k, tokens_per_rank=np.full(8, tokens),
                            placement=pl, ranks_per_node=2, hidden=256,
                            dispatch_dtype="bf16", combine_dtype="bf16", seed=3, step=0,
                            layer=0, microbatch=0, dedup_ranks_per_node=2), pl


def test_token_path_copies_are_bounded_by_assignments():
    r, pl = _route("token", k=4)
    pair = r.dispatch_tokens
    by_node = pair.reshape(8, 4, 2).sum(axis=2)
    gpu_node = r.gpu_tokens.reshape(8, 4, 2).sum(axis=2)
    # one copy per (token, GPU) <= one per (token, expert); per node fewer still
    assert np.all(r.gpu_tokens <= pair) and np.all(r.node_tokens <= gpu_node)
    assert np.all(gpu_node <= by_node)
    # every token with a kept expert on a GPU / node counts there at least once
    assert np.all((r.gpu_tokens > 0) == (pair > 0))
    # a token touches at most top_k GPUs, and reaches at least one
    assert np.all(r.gpu_tokens.sum(axis=1) <= 4 * 64) and np.all(r.node_tokens.sum(axis=1) >= 64)


def test_top1_copies_equal_assignments():
    r, _ = _route("token", k=1)
    assert np.array_equal(r.gpu_tokens, r.dispatch_tokens)
    assert np.array_equal(r.node_tokens, r.dispatch_tokens.reshape(8, 4, 2).sum(axis=2))


def test_from_choices_by_hand():
    # 2 ranks per node, 4 ranks; expert e on rank e. Source 0's tokens: (0, 1) both on
    # node 0, ranks 0 and 1; (2, 3) node 1, ranks 2, 3; (1, 1 dropped=-1)
    choices = [np.array([[0, 1], [2, 3], [1, -1]]), np.zeros((0, 2), dtype=int),
               np.zeros((0, 2), dtype=int), np.zeros((0, 2), dtype=int)]
    gpu, node = from_choices(choices, np.arange(4), 2)
    assert gpu[0].tolist() == [1, 2, 1, 1]
    assert node[0].tolist() == [2, 1]


def test_counts_path_estimate_is_close_to_the_exact_count():
    # the same routing law on the counts path (probe estimate) and the token path
    # (exact): totals within 3 % (measured: see the assertion message)
    exact, _ = _route("token", k=4, tokens=512)
    est, _ = _route("counts", k=4, tokens=512)
    for name in ("gpu_tokens", "node_tokens"):
        a, b = getattr(exact, name).sum(), getattr(est, name).sum()
        assert abs(b / a - 1) < 0.03, (name, a, b)


CASE = [*NO_MTP, "schedule.kind=1f1b", "overlap.kind=none", "parallel.ep_backend.kind=nccl",
        "cluster.nodes=2", "parallel.pp=1", "parallel.ep=16", "model.layers=3",
        "model.first_dense_layers=1", "schedule.microbatches=2", "routing.max_nodes=null"]


@pytest.mark.parametrize("kind", ["deepep", "deepep-ll"])
def test_fast_engine_matches_exact_on_deepep(kind):
    ov = [*CASE, f"parallel.ep_backend.kind={kind}"]
    e = simulate("deepseek-v3-2048", [*ov, "engine.mode=exact"])
    f = simulate("deepseek-v3-2048", [*ov, "engine.mode=fast"])
    assert f.step_time_s == pytest.approx(e.step_time_s, rel=0.01)
    for k, v in e.summary["breakdown_s"].items():
        assert abs(f.summary["breakdown_s"][k] - v) <= 0.01 * e.step_time_s, k


def test_deepep_sends_fewer_bytes_than_nccl_and_is_faster_across_nodes():
    # memory kernels at the streaming rate list no reference kernels: Megatron's
    # sort_chunks_by_idxs, which only the all-to-all dispatcher runs, is then left out
    stream = "compute.memory_kernels=stream"
    n = simulate("deepseek-v3-2048", [*CASE, "engine.mode=exact", stream])
    d = simulate("deepseek-v3-2048", [*CASE, "engine.mode=exact", stream,
                                      "parallel.ep_backend.kind=deepep"])
    ib = [i for i, k in enumerate(n.links.kinds) if k == "ib"]
    assert d.links.bytes[ib].sum() < n.links.bytes[ib].sum()
    nb, db = n.summary["breakdown_s"], d.summary["breakdown_s"]
    assert db["ep_dispatch"] < nb["ep_dispatch"] and db["ep_combine"] < nb["ep_combine"]
    # same routing, same experts: compute is the same
    assert db["compute"] == pytest.approx(nb["compute"], rel=1e-12)


def test_timeline_names_the_sms_deepep_kernels_hold():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from moesim.trace.plots import plot_timeline

    r = simulate("hot-expert", ["model.layers=1", "schedule.microbatches=1",
                                "parallel.ep_backend.kind=deepep"])
    spans = [s for s in r.spans if s.kind == "ep_dispatch"]
    assert spans and all(s.stream == "ep" and s.args["sms"] == 20 for s in spans)
    assert spans[0].args["sm_share"] == pytest.approx(20 / 132)
    fig, ax = plt.subplots()
    assert plot_timeline(r, ax) is ax
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    # the share of the step (issue 20 item 9), then the SMs the kernel holds
    share = r.summary["breakdown_s"]["ep_dispatch"] / r.step_time_s * 100
    assert f"ep_dispatch {share:.1f} % (20 SMs, 15%)" in labels
    plt.close(fig)
