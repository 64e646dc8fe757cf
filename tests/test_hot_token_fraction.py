"""routing.hot_token_fraction (share of tokens) against hot_fraction (share of
(token, expert) assignments), issue 12 item 15."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.gating import make_placement, route_microbatch, routing_from_dict


def _route(d: dict, *, e=8, k=2, ep=4, tokens=4096, path="token"):
    cfg = routing_from_dict({**d, "path": path}, "scen.yaml")
    pl = make_placement(e, ep, cfg.replicate, cfg.replica_split)
    return route_microbatch(cfg, n_experts=e, top_k=k, tokens_per_rank=np.full(ep, tokens),
                            placement=pl, ranks_per_node=None, hidden=64,
                            dispatch_dtype="bf16", combine_dtype="bf16", seed=0, step=0,
                            layer=0, microbatch=0)


@pytest.mark.parametrize("path", ["token", "counts"])
def test_token_fraction_is_share_of_tokens(path):
    # 60 % of the tokens pick expert 3 among their top-2: it receives 0.6 of the 16384
    # tokens = 9830.4 (Binomial sd sqrt(16384·0.6·0.4) = 62.7) and 0.3 of the 32768
    # assignments: the same routing as hot_fraction 0.3
    r = _route({"kind": "hot", "hot_experts": [3], "hot_token_fraction": 0.6}, path=path)
    assert abs(r.assign[:, 3].sum() - 9830.4) < 5 * 62.7
    np.testing.assert_allclose(r.shares[3], 0.3)
    same = _route({"kind": "hot", "hot_experts": [3], "hot_fraction": 0.3}, path=path)
    assert np.array_equal(r.assign, same.assign)


def test_top1_token_fraction_equals_assignment_fraction():
    a = _route({"kind": "hot", "hot_experts": [0], "hot_token_fraction": 0.4}, k=1)
    b = _route({"kind": "hot", "hot_experts": [0], "hot_fraction": 0.4}, k=1)
    assert np.array_equal(a.assign, b.assign)


def test_both_fractions_refused():
    with pytest.raises(InputError) as ei:
        routing_from_dict({"kind": "hot", "hot_fraction": 0.3, "hot_token_fraction": 0.6},
                          "scen.yaml")
    assert ei.value.field == "routing.hot_token_fraction"
    assert "not both" in str(ei.value)


def test_token_fraction_over_one_per_hot_expert_refused():
    # one expert cannot be picked by more than all tokens
    with pytest.raises(InputError) as ei:
        _route({"kind": "hot", "hot_experts": [0], "hot_token_fraction": 1.2})
    assert ei.value.field == "routing.hot_token_fraction"


@pytest.mark.parametrize("bad", [-0.1, float("nan"), "x"])
def test_token_fraction_bad_values(bad):
    with pytest.raises(InputError) as ei:
        routing_from_dict({"kind": "hot", "hot_token_fraction": bad}, "scen.yaml")
    assert ei.value.field == "routing.hot_token_fraction"


def test_dropped_report_names_assignments_summed_over_layers_and_microbatches():
    from moesim.cli.run_cmd import text_summary
    from moesim.trace.report import render_markdown

    s = {"scenario": "x", "world": 2, "step_time_s": 1.0, "tokens_per_s": 1.0, "mfu": 0.1,
         "breakdown_s": {"compute": 1.0},
         "experts": {"max_over_mean": [1.5], "max_over_mean_max": 1.5, "lb_loss_mean": 1.1,
                     "dropped_total": 12, "dropped": [[12, 0]]}}
    line = [x for x in text_summary(s, None).splitlines() if "dropped" in x][0]
    assert "dropped 12 (token, expert) assignments summed over layers and micro-batches" in line
    md = [x for x in render_markdown(s).splitlines() if "dropped" in x][0]
    assert "assignments, summed over MoE layers and micro-batches: 12" in md


def test_null_hot_fraction_lets_token_fraction_in():
    cfg = routing_from_dict({"kind": "hot", "hot_fraction": None, "hot_token_fraction": 0.8},
                            "scen.yaml")
    assert cfg.hot_token_fraction == 0.8 and cfg.hot_fraction == 0.5
