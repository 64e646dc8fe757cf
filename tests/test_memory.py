"""Per-rank memory accounting, checked by hand on the toy model."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesim.compute import get_device
from moesim.errors import InputError
from moesim.memory.model import layer_activation_bytes, memory_per_rank, split_layers
from moesim.model import PRESETS, count_params

TOY = PRESETS["toy"]            # 2 MoE layers, h 512, 8 heads, 8 experts top-2, f 1024
H, F, E, V, A = 512, 1024, 8, 32000, 8
T, S = 256, 128                 # micro-batch tokens, sequence length


def mem(**kw):
    args = {"micro_batch_tokens": T, "seq_len": S}
    args.update(kw)
    return memory_per_rank(TOY, **args)


def test_zero0_is_16_bytes_per_param():
    c = count_params(TOY)
    m = mem()
    assert m.dense_params + m.expert_params == c.total
    assert m.weights + m.gradients + m.optimizer == 16 * c.total


def test_zero_stages_by_hand():
    c = count_params(TOY)
    d, e = c.total - c.routed_experts, c.routed_experts / 2   # ep = 2: 4 experts per rank
    dp, edp = 4, 2                                           # edp = tp·dp/ep = 4/2
    z = {zs: mem(ep=2, dp=4, zero=zs) for zs in range(4)}
    assert z[0].weights == 2 * (d + e) and z[0].optimizer == 12 * (d + e)
    assert z[1].optimizer == 12 * (d / dp + e / edp)
    assert z[1].gradients == 2 * (d + e) and z[1].weights == 2 * (d + e)
    assert z[2].gradients == 2 * (d / dp + e / edp) and z[2].weights == 2 * (d + e)
    assert z[3].weights == 2 * (d / dp + e / edp)
    assert z[3].optimizer == z[1].optimizer


def test_activations_by_hand():
    recv = T * 2                                   # balanced: tokens · top_k
    # permuted input, gate+up, act output, and the fp32 routing probability the weighted
    # SwiGLU keeps (Megatron-Core keeps no expert output for the combine)
    per_assignment = 2 * H + 2 * F * 3 + 4
    # attention 11h (MHA) and a fused kernel's fp32 log-sum-exp per head and query (no
    # scores), both norms' inputs 4h, the MoE block's input 2h and output dropout mask h,
    # fp32 router probabilities
    layer = (11 * T * H + 4 * A * T + 4 * T * H + 2 * T * H + T * H + 4 * E * T
             + recv * per_assignment)
    m = mem()
    assert layer_activation_bytes(TOY, 0, T, S, 1, "none", recv) == layer
    # 2 layers + embedding output + final norm input + fp32 logits
    assert m.activations == 2 * layer + 2 * T * H + 2 * T * H + 4 * T * V
    # dispatch + combine buffers (send and receive, bf16): (sent + received)·h·(2 + 2)
    assert m.token_buffers == (2 * T + recv) * H * 4


def test_dense_layer_reduces_to_korthikanti():
    dense = dataclasses.replace(TOY, n_experts=0, top_k=0, gated=False, dense_ffn=4 * H)
    for tp in (1, 2, 4):
        got = layer_activation_bytes(dense, 0, T, S, tp, "none", 0,
                                     attention_kernel="materialized")
        assert got == (34 * T * H + 5 * A * S * T) / tp          # Korthikanti Eq. 2
        fused = layer_activation_bytes(dense, 0, T, S, tp, "none", 0)
        assert fused == (34 * T * H + 4 * A * T) / tp            # + log-sum-exp, no scores
        assert layer_activation_bytes(dense, 0, T, S, tp, "selective", 0) == 34 * T * H / tp
        assert layer_activation_bytes(dense, 0, T, S, tp, "full", 0) == 2 * T * H / tp


def test_inflight_microbatches_gpipe_vs_1f1b():
    p, m_ = 4, 8
    one = mem(pp=2, stage=0)
    gpipe = mem(pp=2, stage=0, inflight_microbatches=m_)
    f1b = mem(pp=2, stage=0, inflight_microbatches=p)
    assert gpipe.activations == m_ * one.activations
    assert f1b.activations == p * one.activations
    assert gpipe.weights == one.weights and gpipe.token_buffers == one.token_buffers


def test_hot_expert_rank_holds_more():
    cold = mem(received_tokens=100)
    hot = mem(received_tokens=[100, 1100])
    per_assignment = 2 * H + 2 * F * 3 + 4         # + the fp32 routing probability
    assert hot.activations - cold.activations == 1000 * per_assignment
    assert hot.token_buffers - cold.token_buffers == 1000 * H * 4
    with pytest.raises(InputError) as ei:
        mem(received_tokens=[1, 2, 3])
    assert ei.value.field == "received_tokens"


def test_full_recompute_keeps_layer_inputs_plus_workspace():
    full = mem(recompute="full")
    none = mem(recompute="none")
    layer_none = layer_activation_bytes(TOY, 0, T, S, 1, "none", 2 * T)
    assert full.recompute_workspace == layer_none
    assert full.activations == 2 * (2 * T * H) + 2 * T * H + 2 * T * H + 4 * T * V
    assert full.peak_bytes < none.peak_bytes


def test_oom_flag_flips_at_capacity():
    peak = mem().peak_bytes
    assert not mem(capacity_bytes=peak).oom
    assert mem(capacity_bytes=peak - 1).oom
    assert mem(device=get_device("H100")).capacity_bytes == 81559 * 1024**2   # nvidia-smi MiB
    assert mem().capacity_bytes == float("inf")


def test_stage_placement():
    assert [len(r) for r in split_layers(61, 16)] == [3] + [4] * 13 + [3, 3]
    assert [len(r) for r in split_layers(8, 4)] == [2, 2, 2, 2]
    assert sum(len(r) for r in split_layers(61, 16)) == 61
    c = count_params(TOY)
    first, last = mem(pp=2, stage=0), mem(pp=2, stage=1)
    assert first.dense_params + last.dense_params == c.total - c.routed_experts
    tied = dataclasses.replace(TOY, tied_embeddings=True)
    t_last = memory_per_rank(tied, micro_batch_tokens=T, seq_len=S, pp=2, stage=1)
    assert t_last.dense_params == last.dense_params   # holds its own copy of the embedding


def test_deepseek_v3_dims_plausible():
    # PP16 EP64 ZeRO-1 on 2048 H800 (DeepSeek-V3 report §3.2): a middle stage's static state fits
    m = memory_per_rank(PRESETS["deepseek-v3"], micro_batch_tokens=4096, seq_len=4096, pp=16,
                        ep=64, dp=128, zero=1, stage=8, recompute="selective",
                        device=get_device("H800"))
    assert m.expert_params == 4 * (256 // 64) * 3 * 7168 * 2048
    assert m.weights + m.gradients + m.optimizer < 80e9


@pytest.mark.parametrize("kw, field", [
    ({"ep": 3}, "parallel.ep"),
    ({"ep": 8, "dp": 2}, "parallel.ep"),
    ({"tp": 3}, "parallel.tp"),
    ({"pp": 3}, "parallel.pp"),
    ({"zero": 4}, "parallel.zero"),
    ({"recompute": "some"}, "parallel.recompute"),
    ({"dp": 0}, "parallel.dp"),
])
def test_bad_layout(kw, field):
    with pytest.raises(InputError) as ei:
        mem(source="s.yaml", **kw)
    assert ei.value.field == field and ei.value.source == "s.yaml"


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 5000), st.integers(0, 5000), st.sampled_from([1, 2, 4, 8]))
def test_more_received_or_higher_zero_never_costs_more(r1, extra, dp):
    a = mem(dp=dp, ep=2 if dp >= 2 else 1, received_tokens=r1)
    b = mem(dp=dp, ep=2 if dp >= 2 else 1, received_tokens=r1 + extra)
    assert b.peak_bytes >= a.peak_bytes
    peaks = [mem(dp=dp, zero=z).peak_bytes for z in range(4)]
    assert peaks == sorted(peaks, reverse=True)


def test_recompute_none_keeps_no_score_matrix_unless_materialized():
    # issue 20.11: the score term 5·a·s·T appears only with an explicit materialising kernel
    none = mem(recompute="none")
    mat = mem(recompute="none", attention_kernel="materialized")
    sel = mem(recompute="selective")
    assert mat.activations - none.activations == 2 * (5 * A * S * T - 4 * A * T)
    assert none.activations - sel.activations == 2 * 4 * A * T      # 2 layers of LSE
    # selective recomputes the core attention: the kernel choice does not matter
    assert mem(recompute="selective", attention_kernel="materialized").activations \
        == sel.activations
    with pytest.raises(InputError) as ei:
        mem(attention_kernel="flash")
    assert ei.value.field == "memory.attention"


def test_grad_and_param_dtypes_by_hand():
    c = count_params(TOY)
    base = mem(zero=1, dp=2)
    fp32 = mem(zero=1, dp=2, grad_dtype="fp32")          # Megatron's main_grad with bf16
    fp8 = mem(zero=1, dp=2, param_dtype="fp8")           # TE fp8 primary weights
    assert fp32.gradients == 4 * c.total and base.gradients == 2 * c.total
    assert fp8.weights == 1 * c.total and base.weights == 2 * c.total
    assert fp8.optimizer == base.optimizer == fp32.optimizer
    with pytest.raises(InputError) as ei:
        mem(grad_dtype="int4")
    assert ei.value.field == "memory.grad_dtype"
