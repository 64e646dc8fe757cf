"""The rollout knobs that wrap a rollout engine's step costs (``rl.rollout.sampler``,
``post_process``, ``executor``, ``prefix_cache``): the RL summary echoes each only when
it is on, and a value it does not know is one line, exit 2. What each one prices is in
its own test file (test_rl_sampler_v1.py, test_rl_worker_post.py, test_rl_executor.py,
test_rl_prefix_cache.py)."""

from __future__ import annotations

import dataclasses

import pytest

from moesim.cli import main
from moesim.rl.run import resolve_rl
from moesim.scenario.sections.rl import summary_dict
from tests.test_rl_run import scenario

# (field, a value that turns it on, a value it refuses)
KNOBS = [("sampler", "vllm-v1", "vllm-v2"),
         ("post_process", "nemo-v03", "nemo"),
         ("executor", "ray", "mp"),
         ("prefix_cache", "vllm", "sglang")]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """moesim rl writes out/<name> by default: run every test in its own folder."""
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("field,on,bad", KNOBS)
def test_the_rl_summary_echoes_the_knob_only_when_on(tmp_path, field, on, bad):
    cfg = resolve_rl(scenario(tmp_path)).scenario.rl
    assert field not in summary_dict(cfg)["rollout"]
    turned = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout,
                                                                  **{field: on}))
    assert summary_dict(turned)["rollout"][field] == on


@pytest.mark.parametrize("field,on,bad", KNOBS)
def test_a_bad_value_is_one_line_exit_2(tmp_path, capsys, field, on, bad):
    p = scenario(tmp_path)
    assert main(["rl", str(p), "--quiet", "--set", f"rl.rollout.{field}={bad}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"rl.rollout.{field}" in err and "Traceback" not in err


@pytest.mark.parametrize("field,on", [("post_process", "nemo-v03"), ("prefix_cache", "vllm")])
def test_a_batch_knob_under_a_stream_is_one_line_exit_2(tmp_path, capsys, field, on):
    """post_process and prefix_cache price a batch's generate call, which a streamed
    generation has not: refused in one line naming the knob, not silently ignored."""
    p = scenario(tmp_path, colocated=False, max_lag=1, generation="stream")
    assert main(["rl", str(p), "--quiet", "--set", f"rl.rollout.{field}={on}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"rl.rollout.{field}" in err and "stream" in err
    assert main(["rl", str(p), "--quiet"]) == 0      # the same stream without it runs
