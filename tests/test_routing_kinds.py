"""The registry of token-routing kinds (moesim.gating.kinds): routing.kind and the keys
each kind reads are validated from it, and the shares of a layer come from the kind
registered under the name."""

from __future__ import annotations

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.gating import expert_shares, kinds, make_placement, route_microbatch, routing_from_dict
from moesim.gating.kinds import RoutingKind
from moesim.gating.section import keys
from moesim.scenario.checks import routing_ignored_warnings

BUILT_IN = ("uniform", "zipf", "hot", "dirichlet", "file")


def first_two(cfg, n_experts, seed, layer, source):
    """A made-up kind: experts 0 and 1 take half of the assignments each."""
    q = np.zeros(n_experts)
    q[:2] = 0.5
    return q


def test_built_in_kinds_their_keys_and_flags():
    assert kinds.names() == BUILT_IN
    assert kinds.names(files=False) == ("uniform", "zipf", "hot", "dirichlet")
    assert [k.name for k in kinds.kinds() if k.exact] == ["hot"]
    assert kinds.keys_by_kind() == {
        "zipf_s": ("zipf",), "hot_experts": ("hot",), "hot_fraction": ("hot",),
        "hot_token_fraction": ("hot",), "alpha": ("dirichlet",), "file": ("file",)}
    assert keys()[:7] == ("kind", "zipf_s", "hot_experts", "hot_fraction",
                          "hot_token_fraction", "alpha", "file")


def test_lookup_gives_each_kind_its_shares():
    # zipf s=1 over 4 experts: 1, 1/2, 1/3, 1/4 over 25/12
    cfg = routing_from_dict({"kind": "zipf", "zipf_s": 1.0}, "s.yaml")
    q = kinds.get_kind("zipf").shares(cfg, 4, 0, 0, "s.yaml")
    np.testing.assert_allclose(q, np.array([12, 6, 4, 3]) / 25, rtol=1e-15)
    # hot: 0.6 on experts [1, 2] (0.3 each), 0.4 over the other 3
    cfg = routing_from_dict({"kind": "hot", "hot_experts": [1, 2], "hot_fraction": 0.6}, "s")
    np.testing.assert_allclose(kinds.get_kind("hot").shares(cfg, 5, 0, 0, "s"),
                               [0.4 / 3, 0.3, 0.3, 0.4 / 3, 0.4 / 3], rtol=1e-15)


def test_unknown_kind_is_one_line_naming_the_field_and_the_kinds():
    with pytest.raises(InputError) as ei:
        routing_from_dict({"kind": "pareto"}, "scen.yaml")
    assert str(ei.value) == ("scen.yaml: routing.kind: expected one of uniform, zipf, hot, "
                             "dirichlet, file, got 'pareto'")
    with pytest.raises(InputError) as ei:
        kinds.get_kind("pareto", "scen.yaml")
    assert ei.value.field == "routing.kind" and "\n" not in str(ei.value)


def test_made_up_kind_routes_then_is_gone():
    with kinds.registered_kind(RoutingKind("first_two", first_two)):
        assert kinds.names() == (*BUILT_IN, "first_two")
        cfg = routing_from_dict({"kind": "first_two"}, "s.yaml")
        np.testing.assert_array_equal(
            expert_shares(cfg, 8, seed=0, step=0, layer=0), [0.5, 0.5, 0, 0, 0, 0, 0, 0])
        # top-2 of 8 experts on 4 EP ranks, 100 tokens each: every token picks experts 0
        # and 1 (pi = 2 x 0.5 = 1), both homed on rank 0
        r = route_microbatch(cfg, n_experts=8, top_k=2, tokens_per_rank=np.full(4, 100),
                             placement=make_placement(8, 4), ranks_per_node=None,
                             hidden=16, dispatch_dtype="bf16", combine_dtype="bf16", seed=0,
                             step=0, layer=0, microbatch=0)
        np.testing.assert_array_equal(r.expert_tokens, [400, 400, 0, 0, 0, 0, 0, 0])
        np.testing.assert_array_equal(r.rank_tokens, [800, 0, 0, 0])
    assert kinds.names() == BUILT_IN
    with pytest.raises(InputError) as ei:
        routing_from_dict({"kind": "first_two"}, "s.yaml")
    assert ei.value.field == "routing.kind"


def test_a_kinds_own_key_is_checked_and_warned_about_under_another_kind():
    def read(d, source):
        if not isinstance(d.get("zipf_s", 1.0), int | float):
            raise InputError(source, "routing.zipf_s", "a number", d["zipf_s"])
        return {}

    with kinds.registered_kind(RoutingKind("flat_zipf", first_two, ("zipf_s",), read)):
        assert kinds.keys_by_kind()["zipf_s"] == ("zipf", "flat_zipf")
        assert routing_ignored_warnings({"kind": "flat_zipf", "zipf_s": 2}) == []
        assert routing_ignored_warnings({"kind": "hot", "zipf_s": 2}) == [
            "routing.zipf_s applies to routing.kind zipf or flat_zipf only: ignored with "
            "kind hot"]
    assert routing_ignored_warnings({"kind": "hot", "zipf_s": 2}) == [
        "routing.zipf_s applies to routing.kind zipf only: ignored with kind hot"]


def test_registering_twice_or_forgetting_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        kinds.register_kind(RoutingKind("zipf", first_two))
    with pytest.raises(KeyError, match="not registered"):
        kinds.unregister_kind("first_two")
    assert kinds.names() == BUILT_IN
