"""EP sizes that divide the routed experts plus EPLB's redundant copies (issue 38): SGLang's
EP72 decode (256 + 32 = 288 slots, 4 per GPU) and DeepSeek's EP144 (2 per GPU) run when
serving with ``routing.placement: {kind: eplb, redundant: 32}``; every other EP that does
not divide the experts is refused in one line. Figures worked out by hand."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from moesim.cli import main
from moesim.errors import InputError
from moesim.gating.config import EplbSpec, RoutingConfig
from moesim.gating.eplb_placement import experts_held, plan_placements, step_placement
from moesim.memory.model import rank_params
from moesim.model import PRESETS
from moesim.scenario.expert_slots import serving_redundant

EPLB32 = RoutingConfig(placement=EplbSpec(redundant=32, mode="global"))
# DeepSeek-V3's routed expert: 3 matrices of 7168 x 2048 (gate, up, down)
DSV3_EXPERT = 3 * 7168 * 2048                  # 44,040,192 parameters
# Mixtral 8x7B's expert: 3 matrices of 4096 x 14336
MIXTRAL_EXPERT = 3 * 4096 * 14336              # 176,160,768 parameters


def _plan72():
    return plan_placements(EPLB32, n_experts=256, top_k=8, ep=72, moe_layers=[3],
                           blocks=61, ranks_per_node=8, tokens_per_rank=256,
                           microbatches=1, seed=0, step=0, source="s")


def test_256_experts_and_32_copies_give_72_ranks_4_slots_each():
    pl = _plan72().layer(0)
    assert pl.ep == 72 and pl.n_experts == 256
    per_rank = np.bincount([r for h in pl.holders for r in h], minlength=72)
    assert per_rank.tolist() == [4] * 72                  # 288 slots / 72 ranks
    assert all(len(h) >= 1 for h in pl.holders)           # every expert placed
    assert sum(len(h) for h in pl.holders) == 288
    # uniform routing: every expert the same load, so the 32 copies go to 32 experts
    # (one more replica each)
    assert sorted(len(h) for h in pl.holders).count(2) == 32
    assert experts_held(EPLB32, n_experts=256, ep=72, source="s") == 4


def test_tokens_are_delivered_once_across_replicas():
    pl = _plan72().layer(0)
    rng = np.random.default_rng(0)
    kept = rng.integers(0, 7, size=(72, 256)).astype(np.int64)
    dispatch, rank_expert = pl.split_counts(kept, 8)
    assert (dispatch.sum(axis=1) == kept.sum(axis=1)).all()       # each source's tokens
    assert (rank_expert.sum(axis=0) == kept.sum(axis=0)).all()    # each expert's tokens
    assert dispatch.sum() == rank_expert.sum() == kept.sum()
    for e in range(256):                                          # only to its holders
        assert set(np.flatnonzero(rank_expert[:, e])) <= set(pl.holders[e])
    # a replicated expert: source 0's 5 tokens split 3 / 2 (even rule: the leftover to
    # the holder at position (0 + 0) mod 2, the first), source 1's 5 split 2 / 3
    e = next(x for x, h in enumerate(pl.holders) if len(h) == 2)
    one = np.zeros((72, 256), dtype=np.int64)
    one[0, e] = one[1, e] = 5
    d, re = pl.split_counts(one, 8)
    a, b = pl.holders[e]
    assert (d[0, a], d[0, b], d[1, a], d[1, b]) == (3, 2, 2, 3)
    assert (re[a, e], re[b, e]) == (5, 5)


def test_weights_per_gpu_are_4_experts_worth():
    spec = PRESETS["deepseek-v3"]
    moe = sum(spec.is_moe_layer(i) for i in range(spec.layers))
    assert moe == 58
    _, expert = rank_params(spec, range(spec.layers), tp=1, ep=72, first=True, last=True,
                            experts_per_rank=4)
    assert expert == 58 * 4 * DSV3_EXPERT == 10_217_324_544
    # the same as EP64 without copies: 256 / 64 = 4 experts per GPU
    assert rank_params(spec, range(spec.layers), tp=1, ep=64, first=True,
                       last=True)[1] == expert


def test_the_step_starts_from_a_stand_in_home_until_the_plan():
    pl = step_placement(EPLB32, n_experts=256, ep=72, source="s")
    assert pl.holders[0] == (0,) and pl.holders[255] == (71,)    # 255 x 72 // 256 = 71
    assert len(set(h[0] for h in pl.holders)) == 72
    with pytest.raises(InputError, match="divisor of the number of experts"):
        step_placement(RoutingConfig(placement=EplbSpec(redundant=16)), n_experts=256,
                       ep=72, source="s")                        # 272 over 72: no
    with pytest.raises(InputError, match="trace loads"):
        step_placement(RoutingConfig(placement=EplbSpec(redundant=32, loads="trace")),
                       n_experts=256, ep=72, source="s")


def test_only_a_serving_scenario_counts_the_copies():
    eplb = {"placement": {"kind": "eplb", "redundant": 32}}
    serve = SimpleNamespace(serve=object(), routing=SimpleNamespace(policy=eplb))
    train = SimpleNamespace(serve=None, routing=SimpleNamespace(policy=eplb))
    plain = SimpleNamespace(serve=object(), routing=SimpleNamespace(policy={}))
    assert serving_redundant(serve) == 32
    assert serving_redundant(train) == 0      # training keeps an EP dividing the experts
    assert serving_redundant(plain) == 0


def _refused(capsys, argv: list[str], *parts: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for p in parts:
        assert p in err[0], err[0]
    return err[0]


def test_ep72_without_copies_is_refused_in_one_line(capsys):
    base = ["serve", "deepseek-v3-decode-sglang", "--no-files", "--set", "cluster.nodes=9",
            "--set", "serve.ep=72"]
    _refused(capsys, base + ["--set", "routing.placement=null"], "serve.ep",
             "a divisor of the model's 256 routed experts, or (serving with "
             "routing.placement EPLB) of 256 + its redundant experts, got 72")
    _refused(capsys, base + ["--set", "routing.placement={kind: eplb, redundant: 16}"],
             "serve.ep", "(256 + 16 = 272 here)", "got 72")


def _json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("engine", ["exact", "fast"])
def test_mixtral_ep6_with_4_copies_runs_on_both_engines(capsys, engine):
    # mixtral-8x7b-serve on 6 GPUs (a node of 6), EP6: 8 experts + 4 copies = 12 slots,
    # 2 per GPU, the same weights per GPU as EP4 without copies (8 / 4 = 2); each MoE
    # layer routes 6 x 32 requests x top-2 = 384 assignments, each delivered once
    sets = ["--set", "cluster.params.gpus_per_node=6", "--set", f"engine.mode={engine}"]
    s = _json(capsys, ["serve", "mixtral-8x7b-serve", "--no-files", "--json", *sets,
                       "--set", "serve.ep=6", "--set",
                       "routing.placement={kind: eplb, redundant: 4, mode: global}"])
    four = _json(capsys, ["serve", "mixtral-8x7b-serve", "--no-files", "--json",
                          "--set", "serve.ep=4"])
    assert s["world"] == 6 and s["eplb"]["slots_per_gpu"] == 2
    assert [sum(x) for x in s["experts"]["tokens_per_expert"]] == [384] * 32
    assert s["memory"]["weights_bytes"] == four["memory"]["weights_bytes"]
    # and one slot fewer than EP4 + 4 copies (3 per GPU): 32 layers x 1 expert x 2 B
    three = _json(capsys, ["serve", "mixtral-8x7b-serve", "--no-files", "--json",
                           "--set", "serve.ep=4", "--set",
                           "routing.placement={kind: eplb, redundant: 4, mode: global}"])
    assert (three["memory"]["weights_bytes"] - s["memory"]["weights_bytes"]
            == 32 * MIXTRAL_EXPERT * 2)
