"""Megatron-Core's moe_pad_expert_input_to_capacity (routing.pad_to_capacity): every
(source, expert) slot is padded up to its capacity, worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moesim.errors import InputError
from moesim.gating import make_placement, route_microbatch, routing_from_dict


def _route(d, *, e=8, k=2, ep=4, tokens=1000, path="token"):
    cfg = routing_from_dict({**d, "path": path}, "t.yaml")
    pl = make_placement(e, ep)
    return route_microbatch(cfg, n_experts=e, top_k=k, tokens_per_rank=np.full(ep, tokens),
                            placement=pl, hidden=64, seed=3, step=0, layer=0, microbatch=0,
                            ranks_per_node=None, dispatch_dtype="bf16", combine_dtype="bf16")


@pytest.mark.parametrize("path", ["token", "counts"])
def test_padding_makes_every_expert_compute_exactly_its_capacity(path):
    # capacity per (source, expert) = ceil(1000 · 2 / 8 · 1.25) = 313 rows
    cap = math.ceil(1000 * 2 / 8 * 1.25)
    skew = {"kind": "zipf", "zipf_s": 1.2, "capacity_factor": 1.25}
    plain = _route(skew, path=path)
    pad = _route({**skew, "pad_to_capacity": True}, path=path)
    assert cap == 313 and np.all(plain.capacity == cap)
    assert np.all(pad.kept + pad.padding == cap)              # every slot padded full
    # each expert computes 4 sources x capacity rows (rank r holds experts 2r, 2r+1)
    computed = pad.rank_expert_tokens.sum(axis=0)
    assert np.all(computed == 4 * cap)
    assert np.array_equal(pad.expert_tokens, plain.expert_tokens)   # real tokens kept
    # each of the 4 ranks holds 2 experts: receives 4 sources x 2 experts x 313 rows
    assert np.all(pad.rank_tokens == 4 * 2 * cap)
    assert np.all(pad.dispatch_tokens == 2 * cap)             # per (source, rank)
    # the same tokens were routed and dropped; padding only adds empty rows
    assert np.array_equal(pad.assign, plain.assign)
    assert np.array_equal(pad.dropped, plain.dropped)
    assert plain.kept.sum() < (pad.kept + pad.padding).sum() == 4 * 8 * cap
    assert np.all(plain.padding == 0)
    # bytes on the wire: every padded row travels (64 features, bf16)
    assert pad.dispatch_bytes.sum() == 4 * 8 * cap * 64 * 2


def test_padding_needs_a_capacity_factor():
    with pytest.raises(InputError) as ei:
        routing_from_dict({"kind": "uniform", "pad_to_capacity": True}, "t.yaml")
    assert ei.value.field == "routing.pad_to_capacity"
    with pytest.raises(InputError):
        routing_from_dict({"kind": "uniform", "capacity_factor": 1.0, "pad_to_capacity": 1},
                          "t.yaml")
