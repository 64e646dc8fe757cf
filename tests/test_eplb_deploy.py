"""EPLB's redundant experts where they cost: each replica's weights (and, in `moesim
memory`, its gradients and optimizer states) on the GPU holding it, serving's KV room
shrinking by them, a training step taking them (their gradients summed:
tests/test_eplb_training.py), and the plan in the summary. Figures worked out by hand."""

from __future__ import annotations

import json

import pytest

from moesim.cli import main
from moesim.gating.config import EplbSpec, ReplicaSpec, RoutingConfig
from moesim.gating.eplb_placement import experts_held
from moesim.memory.model import memory_per_rank, rank_params
from moesim.model import PRESETS

EPLB8 = "routing.placement={kind: eplb, redundant: 8}"
HOT = ["routing.kind=hot", "routing.hot_experts=[3]", "routing.hot_fraction=0.4"]
# Mixtral 8x7B's expert: 3 matrices of 4096 x 14336 (w1, w3, w2)
MIXTRAL_EXPERT = 3 * 4096 * 14336            # 176,160,768 parameters


def _json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _sets(*items: str) -> list[str]:
    return [a for it in items for a in ("--set", it)]


def test_deepseek_v3_replica_is_88_1_mb_per_layer_in_bf16():
    # DeepSeek-V3's routed expert: 3 x 7168 x 2048 = 44,040,192 parameters, 88,080,384
    # bytes in BF16; EP32 with 32 redundant: (256 + 32) / 32 = 9 experts per GPU, not 8
    spec = PRESETS["deepseek-v3"]
    one = [3]                                          # its first MoE layer
    _, plain = rank_params(spec, one, tp=1, ep=32, first=False, last=False)
    _, held = rank_params(spec, one, tp=1, ep=32, first=False, last=False,
                          experts_per_rank=9)
    assert plain == 8 * 44_040_192 and held - plain == 44_040_192
    assert (held - plain) * spec.weight_bytes == 88_080_384


def test_a_replica_brings_its_weights_gradients_and_optimizer_states():
    # one Mixtral MoE layer, one extra expert on the rank, ZeRO-0: 2 + 2 + 12 bytes each
    spec = PRESETS["mixtral-8x7b"]
    kw = dict(micro_batch_tokens=16, seq_len=16, ep=8, dp=8, layers=[0])
    a = memory_per_rank(spec, **kw)
    b = memory_per_rank(spec, **kw, experts_per_rank=2)
    assert b.expert_params - a.expert_params == MIXTRAL_EXPERT
    assert b.weights - a.weights == 2 * MIXTRAL_EXPERT
    assert b.gradients - a.gradients == 2 * MIXTRAL_EXPERT
    assert b.optimizer - a.optimizer == 12 * MIXTRAL_EXPERT
    assert b.activations == a.activations


def test_experts_held_per_gpu():
    # EPLB: (E + redundant) / ep on every GPU; routing.replicate: the fullest rank
    assert experts_held(RoutingConfig(), n_experts=8, ep=8, source="s") == 1
    assert experts_held(RoutingConfig(placement=EplbSpec(redundant=8)), n_experts=8, ep=8,
                        source="s") == 2
    assert experts_held(RoutingConfig(placement=EplbSpec(redundant=24)), n_experts=16, ep=4,
                        source="s") == 10
    # expert 3 also on ranks 5 and 6, expert 2 also on rank 5: rank 5 holds 3
    rep = (ReplicaSpec(expert=3, ranks=(5, 6)), ReplicaSpec(expert=2, ranks=(5,)))
    assert experts_held(RoutingConfig(replicate=rep), n_experts=8, ep=8, source="s") == 3


def test_moesim_memory_counts_the_replicas(capsys):
    # hot-expert: Mixtral 8x7B cut to 4 MoE layers, EP8, ZeRO-0, BF16 weights and
    # gradients. 8 redundant: 2 experts per GPU, one more per layer: 4 x 176,160,768 =
    # 704,643,072 more parameters, x 2 B weights and gradients, x 12 B optimizer states
    base = _json(capsys, ["memory", "hot-expert", "--json"])["stages"][0]
    more = _json(capsys, ["memory", "hot-expert", "--json", *_sets(EPLB8)])["stages"][0]
    extra = 4 * MIXTRAL_EXPERT
    assert more["expert_params"] - base["expert_params"] == extra == 704_643_072
    assert more["weights"] - base["weights"] == 2 * extra == 1_409_286_144
    assert more["gradients"] - base["gradients"] == 2 * extra
    assert more["optimizer"] - base["optimizer"] == 12 * extra == 8_455_716_864
    assert more["peak_bytes"] - base["peak_bytes"] == 16 * extra
    # re-packing only (redundant 0) holds E / ep, as without EPLB
    zero = _json(capsys, ["memory", "hot-expert", "--json", *_sets(
        "routing.placement={kind: eplb, redundant: 0}")])["stages"][0]
    assert zero["peak_bytes"] == base["peak_bytes"]


def test_training_step_takes_redundant_experts(capsys):
    # hot-expert with 8 redundant: the plan of the serving test below (expert 3 on 5
    # GPUs, experts 0, 1, 2, 4 on 2), each a gradient all-reduce per MoE layer (the
    # hand-worked bytes and times: tests/test_eplb_training.py); the hot GPU's 3.2x
    # max/mean falls to 1.0286 and the step with it
    argv = ["run", "hot-expert", "--no-files", "--quiet", "--json", "--set",
            "engine.mode=fast"]
    base = _json(capsys, argv)
    more = _json(capsys, argv + _sets(EPLB8))
    e = more["eplb"]
    assert e["slots_per_gpu"] == 2
    assert e["layers"][0]["replicas"] == {"0": 2, "1": 2, "2": 2, "3": 5, "4": 2}
    assert e["max_over_mean_mean"] == pytest.approx(7.2 / 7)
    assert more["step_time_s"] < base["step_time_s"]
    assert more["breakdown_s"]["dp"] > base["breakdown_s"]["dp"]


def test_training_re_packs_and_the_summary_carries_the_plan(capsys):
    # hot-expert, policy loads: expert 3's inclusion probability 2 x 0.4 = 0.8, the
    # others' 2 x 0.6 / 7; N = 4096 tokens x 8 GPUs x 2 micro-batches = 65,536 routed
    # tokens: one expert per GPU, the max GPU load 0.8 N = 52,428.8 tokens, the mean
    # 2 N / 8 = 16,384, max / mean 3.2; one node and one group: EPLB's auto mode picks
    # hierarchical (1 node divides 1 group)
    s = _json(capsys, ["run", "hot-expert", "--no-files", "--quiet", "--json", *_sets(
        "routing.placement={kind: eplb, redundant: 0}", "engine.mode=fast")])
    e = s["eplb"]
    assert (e["mode"], e["redundant"], e["loads"], e["slots_per_gpu"]) == (
        "hierarchical", 0, "policy", 1)
    assert [x["layer"] for x in e["layers"]] == [0, 1, 2, 3]
    for x in e["layers"]:
        assert x["replicas"] == {}
        assert x["max_gpu_tokens"] == pytest.approx(52_428.8)
        assert x["mean_gpu_tokens"] == pytest.approx(16_384)
        assert x["max_over_mean"] == pytest.approx(3.2)
    assert e["max_over_mean_mean"] == pytest.approx(3.2)


@pytest.mark.slow
def test_serving_holds_the_replicas_and_fits_fewer_requests(capsys):
    # mixtral-8x7b-serve (decode, 32 requests per GPU, EP8, 2048 tokens of KV cache
    # each) with hot-expert's skew and 8 redundant experts:
    # - replicas: expert 3's load per replica 0.8 / R drops below the others' 1.2 / 7 =
    #   0.1714 at R = 5; the 4 slots left go to 0, 1, 2, 4 (lowest ids on ties);
    # - GPU loads: 256 tokens x top-2 = 512 over 8 GPUs = 64 mean; 16 slots, 2 per GPU:
    #   the fullest pairs an unreplicated cold expert with half of a replicated one,
    #   (1 + 1/2) x 0.1714 x 256 = 65.83 tokens, max / mean 7.2 / 7 = 1.0286;
    # - weights: 32 MoE layers x one more expert per GPU x 176,160,768 x 2 B =
    #   11,274,289,152 bytes, exactly 42 requests' KV cache (32 layers x 2 x 8 KV heads x
    #   128 x 2 B x 2048 tokens = 268,435,456 B each): the largest batch drops by 42
    argv = ["serve", "mixtral-8x7b-serve", "--no-files", "--json", *_sets(*HOT)]
    base = _json(capsys, argv)
    more = _json(capsys, argv + _sets(EPLB8))
    assert "eplb" not in base
    assert more["memory"]["kv_per_request_bytes"] == 268_435_456
    extra = more["memory"]["weights_bytes"] - base["memory"]["weights_bytes"]
    assert extra == 32 * MIXTRAL_EXPERT * 2 == 11_274_289_152 == 42 * 268_435_456
    assert (base["memory"]["largest_batch_per_gpu"]
            - more["memory"]["largest_batch_per_gpu"]) == 42
    e = more["eplb"]
    assert (e["mode"], e["slots_per_gpu"], len(e["layers"])) == ("hierarchical", 2, 32)
    first = e["layers"][0]
    assert first["replicas"] == {"0": 2, "1": 2, "2": 2, "3": 5, "4": 2}
    assert first["mean_gpu_tokens"] == pytest.approx(64)
    assert first["max_gpu_tokens"] == pytest.approx(1.5 * 1.2 / 7 * 256)
    assert first["max_over_mean"] == pytest.approx(7.2 / 7)
