"""Phase times from the engines (moesim.rl.engine_costs) on the toy model: grid points
are the serving / training steps simulated directly, between them linear, memoised."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.compute.select import parse as parse_compute
from moesim.rl.engine_costs import EngineTrainerCosts, rollout_costs
from moesim.rl.run import resolve_rl
from moesim.scenario.sections.serve import ServeConfig
from moesim.serve.config import serving_scenario
from moesim.serve.run import simulate_serve
from moesim.wiring import resolve, simulate
from tests.test_rl_run import scenario


def _setup(tmp_path):
    return resolve_rl(scenario(tmp_path))


def test_rollout_costs_are_serving_steps_of_one_replica(tmp_path):
    scn = _setup(tmp_path).scenario
    sc = rollout_costs(scn, 2, 8, tp=1, ep=2, kv_dtype="bf16", max_batch=64, prompt=64,
                       response_max=128, cache=False)
    assert sc.batches.tolist() == [1, 4, 16, 64] and sc.contexts.tolist() == [64, 128, 192]
    direct = dataclasses.replace(scn, cluster=scn.cluster.pool(2, 8), serve=None,
                                 engine=dataclasses.replace(scn.engine, mode="fast"))
    # 4 sequences on one attention-DP rank (TP1, EP2: two ranks per replica)
    cfg = ServeConfig(phase="decode", batch_per_gpu=4, prompt=64, context=192, output=1,
                      tp=1, ep=2)
    want = simulate_serve(resolve(serving_scenario(direct, cfg)), cfg).summary["step_time_s"]
    assert sc.decode_s(4, 192) == pytest.approx(want, rel=1e-9)
    mid = sc.decode_s(4, 160)
    assert mid == pytest.approx((sc.decode_s(4, 128) + sc.decode_s(4, 192)) / 2, rel=1e-9)


def test_rollout_cuda_graphs_price_decode_at_the_graph_floor(tmp_path):
    # rl.rollout.cuda_graphs: the replica's decode steps are serve.cuda_graphs steps (no
    # host launch paid, each kernel the device's graph floor: the same step as
    # compute.launch_overhead_us = that floor); prefill eager
    scn = _setup(tmp_path).scenario
    kw = dict(tp=1, ep=2, kv_dtype="bf16", max_batch=16, prompt=64, response_max=128,
              cache=False)
    eager = rollout_costs(scn, 2, 8, **kw)
    graphed = rollout_costs(scn, 2, 8, cuda_graphs=True, **kw)
    floor_us = 65536 / 52e9 * 1e6       # H100: gpu-benches' H200 graph replay, 1.26 µs
    floor = dataclasses.replace(scn, compute=parse_compute(
        {**scn.compute.as_dict(), "launch_overhead_us": floor_us}, scn.source))
    at_floor = rollout_costs(floor, 2, 8, **kw)
    for b in (1, 16):
        assert graphed.decode_s(b, 192) == pytest.approx(at_floor.decode_s(b, 192), rel=1e-12)
        assert graphed.decode_s(b, 192) < eager.decode_s(b, 192)
    assert graphed.prefill_s(8 * 64, 8) == eager.prefill_s(8 * 64, 8)


def test_training_step_is_the_engine_step_over_the_rows(tmp_path):
    setup = _setup(tmp_path)
    scn = setup.scenario
    tc = EngineTrainerCosts(scn, 8, 8, tp=1, pp=1, ep=8, seq_len=512)
    # 20 rows on 8 data-parallel replicas: the busiest gets 3 micro-batches of one row
    par = dataclasses.replace(scn.parallel, tp=1, pp=1, ep=8, dp=None)
    direct = dataclasses.replace(
        scn, cluster=scn.cluster.pool(8, 8), parallel=par, serve={},
        schedule=dataclasses.replace(scn.schedule, microbatches=3, micro_batch_size=1,
                                     seq_len=512))
    want = simulate(resolve(direct)).summary["step_time_s"]
    assert tc.train_step_s(20) == pytest.approx(want, rel=1e-12)
    assert tc.train_step_s(17) == tc.train_step_s(24) and tc.simulated == 1
    # a log-prob pass is linear in the rows each data-parallel group holds
    assert tc.forward_s(16) == pytest.approx(2 * tc.forward_s(8), rel=1e-12)
    assert tc.reward_model_s(8) == pytest.approx(tc.forward_s(8), rel=1e-12)


def test_trainer_passes_launch_experts_one_by_one_rollouts_grouped(tmp_path):
    # the trainer's log-prob pass is Megatron's (each expert its own launches) although it
    # is priced as a serving prefill step, whose default is grouped; a scenario's own
    # compute.expert_launches still wins
    scn = _setup(tmp_path).scenario
    ep = 2                                        # the toy's 8 experts: 4 per rank

    def fwd(s):
        return EngineTrainerCosts(s, 2, 8, tp=1, pp=1, ep=ep, seq_len=128).forward_s(2)
    per = dataclasses.replace(scn, compute=parse_compute(
        {**scn.compute.as_dict(), "expert_launches": "per_expert"}, scn.source))
    grouped = dataclasses.replace(scn, compute=parse_compute(
        {**scn.compute.as_dict(), "expert_launches": "grouped"}, scn.source))
    assert fwd(scn) == fwd(per)
    assert fwd(grouped) < fwd(per)
