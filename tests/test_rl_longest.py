"""``rl.longest_response: limit``: each step's longest response is set to the generation
limit (``rl.response_tokens.max``), so a synchronous generation runs to it. Worked by hand
on the toy RL scenario of test_rl_run (16 samples over 8 replicas, linear step costs)."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.cli import main
from moesim.rl.run import draw_batch, resolve_rl, simulate_rl
from tests.test_rl_run import ROLL, TRAIN, hand_generate, scenario


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


FIXED_128_UP_TO_200 = {"dist": "fixed", "mean": 128, "max": 200}


def test_the_longest_response_is_set_to_the_limit_and_the_rest_kept(tmp_path):
    p = scenario(tmp_path, response_tokens=FIXED_128_UP_TO_200, longest_response="limit")
    b = draw_batch(resolve_rl(p), 0)
    assert sorted(b.response.tolist()) == [128] * 15 + [200]
    drawn = draw_batch(resolve_rl(p, ["rl.longest_response=drawn"]), 0)
    assert drawn.response.tolist() == [128] * 16


def test_generation_runs_to_the_limit_by_hand(tmp_path):
    """The replica holding the 200-token sample: one prefill of 2 x 64 tokens, 127 decode
    steps at batch 2 (contexts 65 .. 191, both samples alike), then 72 at batch 1 (contexts
    192 .. 263): 0.01128 + 127 x 0.022 + 2e-6 x 16,256 + 72 x 0.021 + 1e-6 x 16,380
    = 4.366172 s, against 2.837792 s when every response is 128 tokens."""
    p = scenario(tmp_path, response_tokens=FIXED_128_UP_TO_200, longest_response="limit")
    run = simulate_rl(resolve_rl(p), 1, rollout_costs=ROLL, trainer_costs=TRAIN)
    pre = 0.01 + 1e-5 * 128
    both = sum(0.02 + 1e-3 * 2 + 1e-6 * 2 * c for c in range(65, 192))
    alone = sum(0.02 + 1e-3 + 1e-6 * c for c in range(192, 264))
    assert pre + both + alone == pytest.approx(4.366172, abs=1e-9)
    gen = run.works[0].generation
    assert gen.time_s == pytest.approx(4.366172, rel=1e-9)
    assert np.sort(gen.finish_s)[-2] == pytest.approx(hand_generate(), rel=1e-9)
    assert hand_generate() == pytest.approx(2.837792, abs=1e-9)


def test_limit_without_a_max_is_one_line_exit_2(tmp_path, capsys):
    p = scenario(tmp_path, longest_response="limit")
    assert main(["rl", str(p), "--quiet", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "rl.response_tokens.max" in err and "Traceback" not in err
    assert main(["rl", str(p), "--quiet", "--set", "rl.longest_response=longest"]) == 2
    assert "rl.longest_response" in capsys.readouterr().err
