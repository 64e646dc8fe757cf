"""One module of length distributions for serving traffic and RL (moesim.traffic.lengths):
the registry, one check for ``load.*_tokens`` and ``rl.*_tokens`` (the same refusal, the
same distribution), draws worked out by hand, and a made-up distribution registered here,
used by both sections, then unregistered."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.rl.config import rl_from_dict
from moesim.scenario.sections.lengths import LengthDist
from moesim.traffic import lengths
from moesim.traffic.config import load_from_dict
from moesim.traffic.lengths import DISTRIBUTIONS, REQUIRED, check, draw

LOAD = {"arrival": {"rate_rps": 1}, "requests": 4}
RL = {"prompts_per_step": 2, "samples_per_prompt": 2, "rollout": {"gpus": 8},
      "train": {"gpus": 8}}


def _load(**tokens):
    return load_from_dict({**LOAD, **tokens}, "s.yaml")


def _rl(**tokens):
    return rl_from_dict({**RL, **tokens}, "s.yaml", world=16)


def test_the_registered_distributions():
    assert DISTRIBUTIONS.names() == ("fixed", "uniform", "lognormal", "empirical")
    assert dict(DISTRIBUTIONS.get("lognormal").fields) == {"mean": REQUIRED, "sigma": 0.5}
    assert dict(DISTRIBUTIONS.get("uniform").fields) == {"max": REQUIRED}


def test_one_refusal_for_an_unknown_distribution_in_both_sections():
    names = "['fixed', 'uniform', 'lognormal', 'empirical']"
    with pytest.raises(InputError) as a:
        _load(prompt_tokens={"dist": "zeta", "mean": 4})
    with pytest.raises(InputError) as b:
        _rl(response_tokens={"dist": "zeta", "mean": 4})
    assert str(a.value) == f"s.yaml: load.prompt_tokens.dist: expected one of {names}, " \
                           "got 'zeta'"
    assert str(b.value) == f"s.yaml: rl.response_tokens.dist: expected one of {names}, " \
                           "got 'zeta'"


@pytest.mark.parametrize("d, key", [
    ({"dist": "uniform", "min": 5}, "max"),               # uniform needs its max
    ({"dist": "lognormal", "mean": 500, "max": 100}, "mean"),
    ({"dist": "uniform", "min": 9, "max": 3}, "max"),
    ({"dist": "fixed", "mean": 4, "colour": 1}, "colour"),
    ({"dist": "lognormal", "mean": 4, "sigma": 11}, "sigma"),
])
def test_the_same_field_is_blamed_in_both_sections(d, key):
    with pytest.raises(InputError) as a:
        _load(output_tokens=d)
    with pytest.raises(InputError) as b:
        _rl(response_tokens=d)
    assert a.value.field == f"load.output_tokens.{key}"
    assert b.value.field == f"rl.response_tokens.{key}"
    assert a.value.expected.replace("load.output_tokens", "X") == \
        b.value.expected.replace("rl.response_tokens", "X")


def test_one_distribution_in_both_sections_draws_the_same_lengths():
    d = {"dist": "lognormal", "mean": 300, "sigma": 0.7, "max": 900}
    a, b = _load(prompt_tokens=d).prompt_tokens, _rl(prompt_tokens=d).prompt_tokens
    assert a == b == LengthDist(dist="lognormal", mean=300.0, sigma=0.7, max=900)
    x = draw(a, np.random.default_rng(3), 5000)
    assert x.min() >= 1 and x.max() == 900
    # the section's default sigma where none is given: load 1.0, rl 0.5 (as before)
    assert _load(prompt_tokens={"dist": "lognormal", "mean": 9}).prompt_tokens.sigma == 1.0
    assert _rl(prompt_tokens={"dist": "lognormal", "mean": 9}).prompt_tokens.sigma == 0.5


def test_fixed_uniform_and_the_cut_by_hand():
    rng = np.random.default_rng(0)
    assert draw(check({"dist": "fixed", "mean": 2.6}, "s", "f"), rng, 3).tolist() == [3] * 3
    u = draw(check({"dist": "uniform", "min": 3, "max": 5}, "s", "f"), rng, 3000)
    assert set(u.tolist()) == {3, 4, 5}
    assert draw(LengthDist(dist="fixed", mean=50, min=60), rng, 2).tolist() == [60, 60]


def test_an_empirical_file_with_comments_and_a_header_in_both_sections(tmp_path):
    f = tmp_path / "lens.csv"
    f.write_text("# prompt lengths\nprompt,output\n100,7\n300,9  # the long one\n")
    lc = load_from_dict({**LOAD, "prompt_tokens": {"dist": "empirical", "file": "lens.csv",
                                                    "column": "output"}}, "s.yaml",
                        base=str(tmp_path))
    assert {r.prompt for r in lc.requests_list()} <= {7, 9}
    cfg = _rl(prompt_tokens={"dist": "empirical", "file": str(f), "max": 200})
    x = draw(cfg.prompt_tokens, np.random.default_rng(1), 400)
    assert set(x.tolist()) == {100, 200}          # the first column, cut at max 200
    f.write_text("100\n12.5\n")
    with pytest.raises(InputError) as e:
        draw(cfg.prompt_tokens, np.random.default_rng(1), 4, source="s.yaml",
             field="rl.prompt_tokens")
    assert e.value.field == "rl.prompt_tokens.file" and "whole numbers" in str(e.value)


@pytest.fixture
def two_point():
    """A made-up distribution: ``min`` and ``max`` in turn (max required)."""

    def sample(d, rng, n, values):
        return np.where(np.arange(n) % 2 == 0, d.min, d.max).astype(np.int64)

    lengths.register("two_point", sample, {"max": REQUIRED}, "min and max in turn")
    yield
    DISTRIBUTIONS.unregister("two_point")


def test_a_made_up_distribution_in_both_sections(two_point):
    d = {"dist": "two_point", "min": 10, "max": 30}
    rs = _load(prompt_tokens=d, output_tokens=d).requests_list()
    assert [r.prompt for r in rs] == [10, 30, 10, 30] == [r.output for r in rs]
    cfg = _rl(response_tokens=d)
    assert draw(cfg.response_tokens, np.random.default_rng(0), 4).tolist() == [10, 30, 10, 30]
    with pytest.raises(InputError) as e:
        _load(prompt_tokens={"dist": "two_point", "min": 10})
    assert e.value.field == "load.prompt_tokens.max"
    with pytest.raises(ValueError):            # fields must be LengthDist's
        lengths.register("bad", sample_none, {"offset": 1})


def sample_none(d, rng, n, values):
    return np.zeros(n, dtype=np.int64)
