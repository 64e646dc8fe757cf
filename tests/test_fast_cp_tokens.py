"""The step's tokens under context parallelism, the same in both engines: cp ranks share
each sequence, so a step holds dp x micro-batches x micro_batch_size x seq_len tokens
(worked by hand on the toy model, two GPUs)."""

from __future__ import annotations

import pytest

from moesim.scenario import load_scenario
from moesim.wiring import resolve, simulate
from tests._util import two_gpu_scenario


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_tokens_per_step_counts_every_cp_rank_once(tmp_path, mode):
    # cp 2 on two GPUs: dp 1; 2 micro-batches of one 512-token sequence = 1024 tokens
    # (each rank holds 256 tokens of each sequence)
    path = two_gpu_scenario(tmp_path, parallel={"tp": 1, "pp": 1, "ep": 1, "cp": 2},
                            schedule={"microbatches": 2, "seq_len": 512},
                            engine={"mode": mode})
    res = resolve(load_scenario(path))
    assert res.layout.dp == 1 and res.layout.cp == 2
    s = simulate(res).summary
    assert s["tokens_per_step"] == 1024
    assert s["tokens_per_s"] == pytest.approx(1024 / s["step_time_s"])
