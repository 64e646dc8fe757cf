"""verl's parameter offloads around each phase (rl.train.offload: verl,
moesim.rl.offload_verl), by hand on the toy model."""

from __future__ import annotations

import pytest

from moesim.rl.offload import PAGEABLE_D2H_Bps
from moesim.rl.offload_verl import VerlMoves, verl_moves
from moesim.rl.run import resolve_rl
from tests.test_rl_run import RL, scenario

#: the toy's bf16 parameters on one EP8 rank: (34,875,904 + 25,165,824 / 8) x 2
W = 2 * (34_875_904 + 25_165_824 // 8)
COLO = {"colocated": True, "rollout": {"gpus": 8, "tp": 1, "ep": 1},
        "train": {**RL["train"], "offload": "verl"}, "weight_sync": {"method": "ipc"}}


def test_the_moves_by_hand():
    """10 GB of parameters, 64 GB/s from and into pinned memory, 2.8 GB/s into pageable:
    the actor in and out is 10/64 + 10/2.8 s; the reference's round trip 2 x 10/64 s; the
    level-2 sleep copies nothing."""
    m = VerlMoves(10e9, 64e9, 2.8e9)
    trip = 10 / 64 + 10 / 2.8
    assert m.round_trip_s == pytest.approx(trip)
    assert (m.engine_sleep_s, m.refit_s, m.train_prep_s) == (0.0, m.round_trip_s,
                                                             m.round_trip_s)
    assert m.logprob_prep_s == pytest.approx(trip + 2 * 10 / 64)
    assert m.bytes_per_step == 2 * 4 * 10e9      # rollout, old, reference, update
    # no reference pass (verl builds no reference worker without a KL term)
    nref = VerlMoves(10e9, 64e9, 2.8e9, reference=False)
    assert nref.logprob_prep_s == pytest.approx(trip)
    assert nref.bytes_per_step == 2 * 3 * 10e9


def test_a_colocated_run_takes_them_in_its_phases(tmp_path):
    """The toy colocated on 8 GPUs: the busiest GPU's bf16 parameters (76,043,264 B) at
    the host link's 64 GB/s and the published pageable 2.8 GB/s; the switch out of
    training is the rollout's round trip, the one into training nothing."""
    setup = resolve_rl(scenario(tmp_path, **COLO))
    m = verl_moves(setup, 64e9)
    assert isinstance(m, VerlMoves) and m.weights_bytes == W == 76_043_264
    assert m.pageable_Bps == PAGEABLE_D2H_Bps == 2.8e9
    trip = W / 64e9 + W / 2.8e9
    from moesim.rl.run import simulate_rl
    from moesim.rl.summary import details, moves_line, summarize
    from tests.test_rl_run import ROLL, TRAIN

    run = simulate_rl(setup, 1, rollout_costs=ROLL, trainer_costs=TRAIN)
    s = summarize(run)
    assert s["phases_s"]["logprob_prep"] == pytest.approx(trip + 2 * W / 64e9)
    assert s["phases_s"]["train_prep"] == pytest.approx(trip)
    assert s["phases_s"]["switch"] == pytest.approx(trip)
    det = details(run)
    assert det["host_moves"]["framework"] == "verl"
    assert "verl's parameter offloads" in moves_line(det["host_moves"])[0]


def test_disaggregated_pools_refuse_it(tmp_path):
    from moesim.errors import InputError

    with pytest.raises(InputError) as e:
        resolve_rl(scenario(tmp_path, train={**RL["train"], "offload": "verl"}))
    assert e.value.field == "rl.train.offload"
